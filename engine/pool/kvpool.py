"""Many sequences in one llama.cpp context: a shared pool of KV cells, and a
scheduler that batches every running sequence's tokens into one ``llama_decode``.

Decoding a token of a small model on a CPU (or of an 8B model on a GPU) is bound
by reading the weights, so one step for eight sequences costs far less than
eight steps (docs/multiseq.md: 2.1x tokens/s at 8 sequences on 2 cores).

Shape: each sequence is a ``Slot``, a per-sequence view of the context with the
interface a ``Session`` already uses (decode, logits, seq_rm, seq_shift), so the
session's eviction, cell map and capture are per sequence by construction. A
session's ``decode`` puts a step in the queue and blocks; the scheduler thread
waits a moment for the other running sequences' steps (continuous batching:
a prefill chunk of a new request and the one-token steps of running ones go in
one batch), decodes them together, and hands each sequence its logits and its
own attention rows (capture.py ``Segment``).

Memory: llama.cpp's ``kv_unified`` pool, one set of cells for every sequence,
each tagged with its sequence; attention masks other sequences' cells to
probability exactly 0, so each sequence's ``CellMap`` learns only its own cells.
The pool holds ``cells`` (the global KV budget); a sequence is admitted with a
*share* of it and its policy evicts to stay inside the share. Shares are given
by length (``share="length"``): a request that fits whole takes only the cells
it needs, a long one takes up to a full session's budget or what is free (at
least ``MIN_SHARE``); ``share="even"`` gives every sequence ``cells / max_seqs``
(the baseline it is measured against, BENCHMARKS.md). Split streams
(``kv_unified=false``) were rejected: each stream is a fixed ``cells/N`` that a
150-token request would hold whole, and a stream cannot grow.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import CacheFullError, Cancelled, ConfigError, ContextOverflowError, EngineError
from ..native.capture import AttentionCapture, Captured, Segment
from ..native.context import NativeContext
from ..native.kvmemory import CacheSettings, pad
from ..native.model import Model
from ..policies import Policy
from ..session.core import Session, SessionConfig
from ..stats import KVStats

MIN_SHARE = 320  # cells: a 256-token budget and a 64-token chunk
QUESTION_ROOM = 64  # cells a share keeps for the question's observation window
SLACK = 16  # cells beyond a job's estimated length (a BOS, a template's extra token)
SHARES = ("length", "even")
LAYOUTS = ("shared", "streams")


@dataclass(eq=False)
class _Step:
    """One sequence's tokens waiting for the next batch."""

    seq: int
    tokens: Sequence[int]
    pos0: int
    logits: bool
    every: bool
    capture: Segment | None
    order: int
    done: threading.Event = field(default_factory=threading.Event)
    taken: bool = False
    out: np.ndarray | None = None  # logits rows: (1 or len(tokens), n_vocab)
    captured: Captured | None = None
    error: BaseException | None = None
    requeue: bool = False  # put back in the queue instead of answered (no free cells)
    retries: int = 0


class Slot:
    """One sequence of a ``KVPool``, seen as the context a ``Session`` decodes in.

    ``n_ctx`` is the sequence's share of cells; ``n_cells`` the pool's cell count
    (the numbering of the attention columns its cell map learns)."""

    def __init__(
        self, pool: KVPool, seq: int, share: int, label: str, want: int, evicts: bool
    ) -> None:
        self.pool = pool
        self.seq = seq
        self.n_ctx = share  # the pool lowers it when others come, raises it when they go
        self.want = want
        self.evicts = evicts
        self.least = 0  # cells its session needs to read on (set as it reads)
        self.n_cells = pool.ctx.n_cells
        self.n_batch = pool.ctx.n_batch
        self.swa_cells = pool.ctx.swa_cells // pool.max_seqs
        self.label = label
        self.cancel_event = threading.Event()
        self.stats: KVStats | None = None  # the session's, for /metrics
        self.started = time.time()
        self.last_done = 0.0  # monotonic time its last step was decoded (the scheduler's)
        self._out: np.ndarray | None = None
        self._closed = False

    def decode(
        self,
        tokens: Sequence[int],
        pos0: int,
        *,
        logits: bool,
        every: bool = False,
        capture: Segment | None = None,
    ) -> Captured | None:
        """Decode ``tokens`` at ``pos0...`` in the next batch (blocks until it ran)."""
        if capture is not None and self.pool.ctx.capture is None:
            raise EngineError("this pool was made without attention capture")
        step = self.pool._submit(self, tokens, pos0, logits, every, capture)
        if step.out is not None:
            self._out = step.out
        return step.captured

    def last_logits(self) -> np.ndarray:
        if self._out is None:
            raise EngineError("no logits available")
        return self._out[-1]

    def logits_rows(self, n: int) -> np.ndarray:
        if self._out is None or len(self._out) < n:
            raise EngineError("no logits available")
        return self._out[-n:]

    @property
    def cache_settings(self) -> CacheSettings:
        """The pool's K/V types, flash attention and sliding-window cache."""
        return self.pool.cache

    def busy(self) -> threading.Lock:
        """Held around this session's CPU work between decodes (scoring, sampling):
        it then never runs beside a decode, whose threads spin-wait for each other
        and stall when another thread takes their core (docs/multiseq.md §5)."""
        return self.pool._cpu

    def _native(self) -> NativeContext:
        """The context, while the pool has one (call with ``_ctx_lock`` held)."""
        if self.pool._ctx_closed:
            raise Cancelled("the pool is closed")
        return self.pool.ctx

    def seq_rm(self, p0: int, p1: int) -> None:
        with self.pool._ctx_lock:
            self._native().seq_rm(p0, p1, self.seq)

    def seq_shift(self, p0: int, p1: int, delta: int) -> None:
        with self.pool._ctx_lock:
            self._native().seq_shift(p0, p1, delta, self.seq)

    def pos_max(self) -> int:
        with self.pool._ctx_lock:
            return self._native().pos_max(self.seq)

    def clear(self) -> None:
        self.seq_rm(0, -1)
        self._out = None

    def resized(self, n_ctx: int) -> Slot:
        raise EngineError("a pooled sequence keeps the share it was given")

    def close(self) -> None:
        """Free the sequence's cells and its id for the next request."""
        if not self._closed:
            self._closed = True
            self.pool._release(self)


class KVPool:
    """One llama.cpp context of ``cells`` KV cells shared by up to ``max_seqs``
    sequences, with the scheduler thread that batches their decodes."""

    def __init__(
        self,
        model: Model,
        *,
        cells: int,
        max_seqs: int,
        n_threads: int,
        reads_attention: bool = True,
        flash_attn: str = "auto",
        kv_type: str = "f16",
        swa_cache: str = "window",
        n_batch: int = 512,
        share: str = "length",
        gather_s: float = 0.03,
        layout: str = "shared",
    ) -> None:
        """``cells``: the global KV budget (rounded up to 256 by llama.cpp);
        ``gather_s``: how long a step waits at most for the other running sequences
        (a quarter of the last decode's time, within 2 ms..``gather_s``)."""
        if not 1 <= max_seqs <= 64:
            raise ConfigError(f"parallel sequences must be 1..64, got {max_seqs}")
        if share not in SHARES:
            raise ConfigError(f"share must be one of {', '.join(SHARES)}")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}")
        if cells < MIN_SHARE:
            raise ConfigError(f"a pool needs at least {MIN_SHARE} cells, got {cells}")
        capture = None
        if reads_attention:
            if not model.info.global_layers:
                raise ConfigError(f"kvtrim cannot read attention on {model.info.arch}")
            capture = AttentionCapture(model.info.global_layers)
        info = model.info
        # decided as for a lone session, so a request gets the same cache either way
        self.cache = cache = CacheSettings.decide(
            reads_attention=reads_attention,
            kv_type=kv_type,
            flash_attn=flash_attn,
            swa_cache=swa_cache,
            window_layers_unknown=info.n_swa > 0 and not info.n_swa_layers,
            who="a pool that reads attention",
        )
        self.model = model
        self.cells = cells
        self.max_seqs = max_seqs
        self.share = share
        self.gather_s = gather_s
        self.layout = layout
        # streams: each sequence its own cells/N (a multiple of 256, as llama.cpp
        # rounds a stream), whatever the others use
        per_stream = max(256, cells // max_seqs // 256 * 256)
        self.ctx = NativeContext(
            model,
            n_ctx=pad(cells) if layout == "shared" else per_stream * max_seqs,
            n_batch=n_batch,
            n_threads=n_threads,
            capture=capture,
            flash_attn=cache.flash_attn,
            swa_full=cache.swa_full,
            type_k=cache.type_k,
            type_v=cache.type_v,
            n_seq_max=max_seqs,
            kv_unified=layout == "shared",
        )
        self.stream_cells = self.ctx.n_ctx_seq  # a sequence's cells at most
        self.kv_layout = model.info.kv_layout(cache.type_k, cache.type_v)
        self._cond = threading.Condition()
        self._ctx_lock = threading.Lock()  # llama.cpp's context is not thread-safe
        self._cpu = threading.Lock()  # a decode or one session's CPU work, not both
        self._free = list(range(max_seqs))
        self._slots: dict[int, Slot] = {}
        self._pending: list[_Step] = []
        self._order = itertools.count()
        self._closed = False
        self._ctx_closed = False
        self._stall = False
        self._split_next = False
        self.error: BaseException | None = None  # what stopped the scheduler, if anything
        self.steps = 0  # llama_decode calls
        self.tokens = 0  # tokens decoded
        self.peak_seqs = 0
        self.peak_cells = 0  # most cells held by all sequences at once
        self.decode_s = 0.0
        self._last_decode_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="kvtrim-pool", daemon=True)
        self._thread.start()

    # -- admission and shares ---------------------------------------------

    def shares(self, wants: dict[int, tuple[int, bool]]) -> dict[int, int]:
        """Cells for each sequence, from ``{key: (cells it wants, evicts)}``.

        A sequence that never evicts gets what it wants. The rest are split by
        ``share``: ``length`` is max-min fair (water-filling): a sequence that
        needs less than an equal part takes only what it needs and the others
        split what it leaves; ``even`` gives each an equal part whatever it needs.
        """
        if self.layout == "streams":  # each its own stream: no cells to share
            return {k: min(w, self.stream_cells) for k, (w, _) in wants.items()}
        fixed = {k: w for k, (w, evicts) in wants.items() if not evicts}
        left = self.cells - sum(fixed.values())
        flex = sorted((w, k) for k, (w, evicts) in wants.items() if evicts)
        out = dict(fixed)
        if self.share == "even":
            return out | {k: left // len(flex) for _, k in flex} if flex else out
        for i, (want, key) in enumerate(flex):
            level = left // (len(flex) - i)
            out[key] = min(want, level)
            left -= out[key]
        return out

    def _admit(self, want: int, least: int, evicts: bool) -> dict[int, int] | None:
        """The shares if one more sequence came in, or None if it must wait: no free
        id, or a share would fall under what its sequence needs at least."""
        if not self._free:
            return None
        new = -1
        wants = {seq: (s.want, s.evicts) for seq, s in self._slots.items()}
        wants[new] = (want, evicts)
        shares = self.shares(wants)
        floor = {
            seq: max(min(s.want, MIN_SHARE), s.least) if s.evicts else s.want
            for seq, s in self._slots.items()
        }
        floor[new] = least
        if self.layout == "streams":
            floor = {k: min(f, self.stream_cells) for k, f in floor.items()}
        if any(shares[k] < floor[k] for k in shares):
            return None
        if self.layout == "shared" and sum(shares.values()) > self.cells:
            return None  # sequences that never evict would hold more than the pool
        return shares

    def acquire(
        self,
        want: int,
        least: int,
        *,
        evicts: bool = True,
        cancel: threading.Event | None = None,
        label: str = "",
    ) -> Slot:
        """A sequence wanting ``want`` cells, admitted once every share stays at
        ``least`` or more (``MIN_SHARE`` for the running ones); the running ones'
        shares shrink to make room (each evicts down to its new share at its next
        step). Waits for a free id and room, or raises ``Cancelled``."""
        most = self.cells if self.layout == "shared" else self.stream_cells
        if least > most and not (evicts and self.layout == "streams"):
            raise ContextOverflowError(
                f"the request needs {least} KV cells; the pool gives at most {most}"
            )
        with self._cond:
            while True:
                if self._closed:
                    raise Cancelled("the pool is closed")
                if cancel is not None and cancel.is_set():
                    raise Cancelled("cancelled while waiting for KV memory")
                shares = self._admit(want, least, evicts)
                if shares is not None:
                    seq = self._free.pop(0)
                    slot = Slot(self, seq, shares.pop(-1), label, want, evicts)
                    for other, cells in shares.items():
                        self._slots[other].n_ctx = cells
                    self._slots[seq] = slot
                    self.peak_seqs = max(self.peak_seqs, len(self._slots))
                    return slot
                self._cond.wait(0.05)

    def open(
        self,
        policy: Policy,
        config: SessionConfig,
        n_tokens: int,
        *,
        cancel: threading.Event | None = None,
        label: str = "",
    ) -> Session:
        """A ``Session`` in a new sequence, for a job of ``n_tokens`` (prompt and
        answer). It wants the job whole when that fits a session's capacity (it
        never evicts then, so needs no room for the question's observation), else
        ``budget + chunk`` and the question's room; the budget follows the share
        (``Session.budget``), the chunk is at most a fifth of the share."""
        n_tokens += SLACK
        whole = config.budget_tokens + config.chunk()
        if not policy.evicts:
            want = least = n_tokens
        else:
            want = n_tokens if n_tokens <= whole else whole + QUESTION_ROOM
            least = min(want, MIN_SHARE)
        slot = self.acquire(want, least, evicts=policy.evicts, cancel=cancel, label=label)
        try:
            if policy.evicts and slot.n_ctx < want:
                chunk = max(32, min(config.chunk(), (slot.n_ctx - QUESTION_ROOM) // 5))
                config = replace(config, chunk_tokens=chunk)
            return Session(self.model, policy, config, slot=slot)
        except BaseException:
            slot.close()
            raise

    def _release(self, slot: Slot) -> None:
        with self._ctx_lock:
            if not self._ctx_closed:
                self.ctx.seq_rm(0, -1, slot.seq)
        with self._cond:
            self._slots.pop(slot.seq, None)
            self._free.append(slot.seq)
            self._free.sort()
            wants = {seq: (s.want, s.evicts) for seq, s in self._slots.items()}
            for seq, cells in self.shares(wants).items():  # the others may grow again
                self._slots[seq].n_ctx = cells
            self._cond.notify_all()

    # -- the scheduler ----------------------------------------------------

    def _submit(
        self,
        slot: Slot,
        tokens: Sequence[int],
        pos0: int,
        logits: bool,
        every: bool,
        capture: Segment | None,
    ) -> _Step:
        if not 0 < len(tokens) <= self.ctx.n_batch:
            raise EngineError(f"decode of {len(tokens)} tokens does not fit the pool's batch")
        step = _Step(slot.seq, tokens, pos0, logits, every, capture, next(self._order))
        with self._cond:
            if self._closed:
                raise Cancelled("the pool is closed")
            if slot.cancel_event.is_set():
                raise Cancelled("cancelled")
            self._pending.append(step)
            self._cond.notify_all()
        while not step.done.wait(0.05):
            if slot.cancel_event.is_set():
                with self._cond:
                    if not step.taken:  # still queued: leave at once
                        self._pending.remove(step)
                        raise Cancelled("cancelled")
        if step.error is not None:
            raise step.error
        return step

    def _expected(self, now: float) -> int:
        """Sequences that will most likely send a step soon: those queued and those
        whose last step ended within the last 50 ms (they are between tokens)."""
        queued = {s.seq for s in self._pending}
        recent = {seq for seq, s in self._slots.items() if s.last_done and now - s.last_done < 0.05}
        return len(queued | recent)

    def _loop(self) -> None:
        try:
            self._schedule()
        except BaseException as exc:  # never leave a caller waiting on a dead thread
            with self._cond:
                self.error = exc
                self._closed = True
                for step in self._pending:
                    step.error = EngineError(f"the pool's scheduler stopped: {exc}")
                    step.done.set()
                self._pending.clear()
                self._cond.notify_all()

    def _schedule(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for step in self._pending:
                        step.error = Cancelled("the pool is closed")
                        step.done.set()
                    self._pending.clear()
                    return
                # the sequences of the last batch come back after their sampling and
                # bookkeeping (serialized by the CPU lock): waiting for them keeps the
                # batch whole instead of splitting it in two smaller, dearer decodes
                wait = min(self.gather_s, max(0.002, self._last_decode_s / 4))
                deadline = time.monotonic() + wait
                while len(self._pending) < self._expected(time.monotonic()):
                    left = deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        break
                    self._cond.wait(left)
                batch = self._choose()
                if not batch or self._stall:  # no room yet: a sequence evicts or leaves
                    self._stall = False
                    self._cond.wait(0.01)
                    if not batch:
                        continue
            self._run(batch)

    def _choose(self) -> list[_Step]:
        """One-token steps (answers being written) first, then reads, oldest first,
        as many as the batch holds."""
        order = sorted(self._pending, key=lambda s: (len(s.tokens) > 1, s.order))
        if self._split_next:  # the last batch found no room together: one at a time
            self._split_next = False
            order = order[:1]
        chosen, n = [], 0
        # a sequence whose share shrank evicts at its own next step; until then the
        # cells it still holds are not free (llama_decode would find no slot)
        held = sum(s.stats.cells_used for s in self._slots.values() if s.stats)
        room = self.ctx.n_ctx if self.layout == "shared" else 1 << 62  # streams: own cells
        for step in order:
            if n + len(step.tokens) <= self.ctx.n_batch and held + n + len(step.tokens) <= room:
                chosen.append(step)
                n += len(step.tokens)
        for step in chosen:
            self._pending.remove(step)
            step.taken = True
        return chosen

    def _groups(self, steps: list[_Step]) -> list[list[_Step]]:
        """The ``llama_decode`` calls of one round. Shared pool: one, whatever the
        mix (llama.cpp's ``split_simple`` keeps it one ubatch). One stream per
        sequence: llama.cpp splits a batch into ubatches of equal slices of
        consecutive sequence ids, so one-token steps go together in runs of
        consecutive ids, and a longer step (a prefill chunk) goes alone."""
        if self.layout == "shared":
            return [steps]
        ones = sorted((s for s in steps if len(s.tokens) == 1), key=lambda s: s.seq)
        groups: list[list[_Step]] = []
        for step in ones:
            if groups and groups[-1][-1].seq == step.seq - 1:
                groups[-1].append(step)
            else:
                groups.append([step])
        return groups + [[s] for s in steps if len(s.tokens) > 1]

    def _run(self, steps: list[_Step]) -> None:
        for step in steps:
            step.requeue = False
        for group in self._groups(steps):
            self._decode(group)

    def _decode(self, steps: list[_Step]) -> None:
        entries: list[tuple[int, int, int, bool]] = []
        segments: list[Segment] = []
        starts: list[int] = []
        streams = 1 if self.layout == "shared" else len(steps)
        for k, step in enumerate(steps):
            a, n = len(entries), len(step.tokens)
            starts.append(a)
            for i, tok in enumerate(step.tokens):
                out = step.every or (step.logits and i == n - 1)
                entries.append((step.seq, tok, step.pos0 + i, out))
            if step.capture is not None:
                rows, vis = step.capture.rows, step.capture.visibility
                if streams == 1:
                    segments.append(Segment(a, a + n, rows, vis))
                else:  # stream k holds this step's n rows
                    segments.append(Segment(0, n, rows, vis, stream=k))
        t0 = time.perf_counter()
        try:
            with self._cpu, self._ctx_lock:
                got = iter(self.ctx.decode_batch(entries, segments, streams))
                for step, a in zip(steps, starts, strict=True):
                    n = len(step.tokens)
                    if step.every:
                        step.out = np.stack([self.ctx.logits_at(a + i) for i in range(n)])
                    elif step.logits:
                        step.out = self.ctx.logits_at(a + n - 1)[None]
                    if step.capture is not None:
                        c = next(got)
                        step.captured = Captured(c.visible, c.attn, c.seconds / len(segments))
        except CacheFullError as exc:
            # llama.cpp leaves the cache as it was: a batch tries its steps alone; a
            # step alone waits for a sequence whose share shrank to evict
            # (the counts the room check uses lag behind), then fails
            if len(steps) > 1:
                for step in steps:
                    step.requeue = True
                with self._cond:
                    self._pending[:0] = steps
                    for step in steps:
                        step.taken = False
                    self._split_next = True
            else:
                step = steps[0]
                step.retries += 1
                if step.retries <= 300:  # 3 s
                    step.requeue = True
                    with self._cond:
                        step.taken = False
                        self._pending.insert(0, step)
                        self._stall = True
                else:
                    step.error = exc
        except BaseException as exc:  # every sequence of the batch hears of it
            for step in steps:
                step.error = exc
        finally:
            self.steps += 1
            self.tokens += len(entries)
            self._last_decode_s = time.perf_counter() - t0
            self.decode_s += self._last_decode_s
            try:
                slots = list(self._slots.values())  # other threads admit and release
                held = sum(s.stats.cells_used for s in slots if s.stats)
                self.peak_cells = max(self.peak_cells, held)
                now, done = time.monotonic(), {step.seq for step in steps}
                for slot in slots:
                    if slot.seq in done:
                        slot.last_done = now  # most likely back for the next batch
            finally:
                for step in steps:
                    if step.requeue:
                        continue
                    step.done.set()

    # -- figures ----------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """The pool and each running sequence, for ``/metrics`` and the benchmark."""
        with self._cond:
            slots = sorted(self._slots.values(), key=lambda s: s.seq)
        seqs = []
        for s in slots:
            st = s.stats
            seqs.append(
                {
                    "seq": s.seq,
                    "label": s.label,
                    "share_cells": s.n_ctx,
                    "share": s.n_ctx / self.cells,
                    "policy": st.policy if st else None,
                    "budget_tokens": st.budget_tokens if st else None,
                    "cells_used": st.cells_used if st else 0,
                    "tokens_seen": st.tokens_seen if st else 0,
                    "evicted_tokens": st.evicted_tokens if st else 0,
                    "evictions": st.evictions if st else 0,
                    "retention": (st.cells_used / st.tokens_seen) if st and st.tokens_seen else 1.0,
                    "seconds": time.time() - s.started,
                }
            )
        return {
            "cells": self.cells,
            "n_ctx": self.ctx.n_ctx,
            "max_seqs": self.max_seqs,
            "share_rule": self.share,
            "layout": self.layout,
            "reserved_cells": sum(s["share_cells"] for s in seqs),  # type: ignore[misc]
            "active": len(seqs),
            "peak_seqs": self.peak_seqs,
            "peak_cells": self.peak_cells,
            "steps": self.steps,
            "tokens": self.tokens,
            "mean_batch_tokens": self.tokens / self.steps if self.steps else 0.0,
            "kv_bytes": self.ctx.n_ctx * self.kv_layout.global_cell_bytes
            + self.ctx.swa_cells * self.kv_layout.swa_cell_bytes,
            "sequences": seqs,
        }

    def cancel_all(self) -> None:
        """Stop every running sequence and refuse new ones (thread-safe): their
        sessions raise ``Cancelled`` at their next step."""
        with self._cond:
            self._closed = True
            for slot in self._slots.values():
                slot.cancel_event.set()
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the scheduler (waiting steps are cancelled) and free the context;
        sessions still open raise ``Cancelled`` at their next step and their
        ``close`` then only returns their id."""
        self.cancel_all()
        self._thread.join()
        with self._ctx_lock:
            self._ctx_closed = True
            self.ctx.close()

    def __enter__(self) -> KVPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
