"""Many sequences in one llama.cpp context: a shared pool of KV cells, and a
scheduler that batches every running sequence's tokens into one ``llama_decode``.

``KVPool`` puts the parts together: each sequence is a ``Slot`` (slot.py), a
per-sequence view of the context a ``Session`` decodes in; its share of the pool's
``cells`` (the global KV budget) comes from ``ShareRule`` (shares.py), which also
decides whether one more sequence fits; the ``Scheduler`` (scheduler.py) batches
the sequences' steps; ``snapshot`` (metrics.py) gives the figures of ``/metrics``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from ..errors import Cancelled, ContextOverflowError
from ..native.capture import Capture
from ..native.context import NativeContext
from ..native.kvmemory import CacheSettings, pad
from ..native.model import Model
from ..policies import ATTENTION, Needs, Policy
from ..session.core import Session, SessionConfig
from . import metrics
from .scheduler import Scheduler, SharedContext
from .shares import (
    LAYOUTS,
    MIN_SHARE,
    QUESTION_ROOM,
    SHARES,
    SLACK,
    ShareRule,
    Want,
    check_settings,
    chunk_in_share,
    job_wants,
)
from .slot import Slot

__all__ = ["LAYOUTS", "MIN_SHARE", "QUESTION_ROOM", "SHARES", "SLACK", "KVPool", "Slot"]

ADMIT_POLL_S = 0.05  # seconds between looks at a waiting request's cancel
ROUND_TOKENS = 2048  # the most tokens of one pooled llama_decode: llama-server's n_batch


def _context(
    model: Model,
    cache: CacheSettings,
    capture: Capture | None,
    *,
    cells: int,
    max_seqs: int,
    layout: str,
    n_batch: int,
    n_threads: int,
) -> NativeContext:
    """The pool's context: ``cells`` cells in one pool (``shared``), or one stream
    per sequence of ``cells / max_seqs`` (a multiple of 256, as llama.cpp rounds a
    stream), whatever the others use (``streams``). A round of up to
    ``ROUND_TOKENS`` is one ``llama_decode``, computed in ubatches of ``n_batch`` (a
    sequence's step is at most one)."""
    per_stream = max(256, cells // max_seqs // 256 * 256)
    return NativeContext(
        model,
        n_ctx=pad(cells) if layout == "shared" else per_stream * max_seqs,
        n_batch=max(ROUND_TOKENS, n_batch),
        n_ubatch=n_batch,
        n_threads=n_threads,
        capture=capture,
        flash_attn=cache.flash_attn,
        swa_full=cache.swa_full,
        type_k=cache.type_k,
        type_v=cache.type_v,
        n_seq_max=max_seqs,
        kv_unified=layout == "shared",
    )


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
        needs: Needs = ATTENTION,
        flash_attn: str = "auto",
        kv_type: str = "f16",
        swa_cache: str = "window",
        n_batch: int = 512,
        share: str = "length",
        layout: str = "shared",
    ) -> None:
        """``cells``: the global KV budget (rounded up to 256 by llama.cpp);
        ``needs``: what its sequences' policies read (``policies.needs_of``);
        ``n_batch``: the most tokens of one sequence's step (llama.cpp's ubatch)."""
        check_settings(cells, max_seqs, share, layout)
        capture = needs.capture(model.info)
        info = model.info
        # decided as for a lone session, so a request gets the same cache either way
        self.cache = cache = needs.cache(
            kv_type=kv_type,
            flash_attn=flash_attn,
            swa_cache=swa_cache,
            window_layers_unknown=info.n_swa > 0 and not info.n_swa_layers,
            who="a pool that reads attention",
        )
        self.model = model
        self.max_seqs = max_seqs
        self.ctx = _context(
            model,
            cache,
            capture,
            cells=cells,
            max_seqs=max_seqs,
            layout=layout,
            n_batch=n_batch,
            n_threads=n_threads,
        )
        self.rule = ShareRule(cells, share, layout, stream_cells=self.ctx.n_ctx_seq)
        self.kv_layout = info.kv_layout(cache.type_k, cache.type_v)
        self._shared = SharedContext(self.ctx, cache)
        self._cond = threading.Condition()  # admission: free ids and shares
        self._free = list(range(max_seqs))
        self._expected: set[object] = set()  # requests on their way (``expect``)
        self._slots: dict[int, Slot] = {}
        self.peak_seqs = 0
        self.reclaim: Callable[[], bool] | None = None
        """Frees a sequence that is kept idle (True) when one more does not fit: the
        server keeps finished requests' sequences for their text (serve/runner.py)."""
        apart = layout == "shared" and cache.tiles_queries(on_gpu=model.on_gpu)
        self.scheduler = Scheduler(
            self._shared, layout=layout, held=self._held, answers_apart=apart
        )

    @property
    def cells(self) -> int:
        """The global KV budget."""
        return self.rule.cells

    @property
    def error(self) -> BaseException | None:
        """What stopped the scheduler, if anything."""
        return self.scheduler.error

    def _held(self) -> int:
        """Cells every sequence holds now, as their sessions last reported."""
        return sum(s.cells_used for s in list(self._slots.values()))

    # -- admission --------------------------------------------------------

    def expect(self) -> object | None:
        """A request on its way here (a server holds it, its prompt is not queued
        yet): rounds wait for it, as for a sequence owed back, while a sequence is free
        for it, so prompts that arrive together are read together. The key to hand to
        ``acquire`` (None: no sequence is free for it, nothing waits); ``unexpect``
        it where the request ends before that."""
        with self._cond:
            if len(self._expected) >= len(self._free):
                return None
            key = object()
            self._expected.add(key)
        self.scheduler.expect(key)
        return key

    def unexpect(self, key: object | None) -> None:
        """The expected request ``key`` will not ask for a sequence now (it failed,
        its client left, or it waits for room that only rounds make); idempotent."""
        with self._cond:
            if key not in self._expected:
                return
            self._expected.discard(key)
        self.scheduler.forget(key)

    def acquire(
        self,
        want: int,
        least: int,
        *,
        evicts: bool = True,
        cancel: threading.Event | None = None,
        label: str = "",
        arrival: object | None = None,
    ) -> Slot:
        """A sequence wanting ``want`` cells, admitted once every share stays at
        ``least`` or more (``MIN_SHARE`` for the running ones); the running ones'
        shares shrink to make room (each evicts down to its new share at its next
        step). Waits for a free id and room, or raises ``Cancelled``. ``arrival``:
        the request's ``expect`` key, whose wait passes to the new sequence."""
        if self.rule.never_fits(least, evicts):
            self.unexpect(arrival)
            raise ContextOverflowError(
                f"the request needs {least} KV cells; the pool gives at most {self.rule.most}"
            )
        while True:
            with self._cond:
                if self.scheduler.closed:
                    raise Cancelled("the pool is closed")
                if cancel is not None and cancel.is_set():
                    raise Cancelled("cancelled while waiting for KV memory")
                slot = self._admit(want, least, evicts, label)
                handed = slot is not None and arrival in self._expected
                self._expected.discard(arrival)
            if handed:
                self.scheduler.arrived(arrival, slot.seq)  # type: ignore[union-attr]
            elif arrival is not None:
                self.scheduler.forget(arrival)  # no room: rounds make it, none waits
            arrival = None
            if slot is not None:
                return slot
            # no room: sequences kept idle for their text (the server's) go first
            if self.reclaim is None or not self.reclaim():
                with self._cond:
                    self._cond.wait(ADMIT_POLL_S)

    def _admit(self, want: int, least: int, evicts: bool, label: str) -> Slot | None:
        """A new sequence if it fits now (call with ``_cond`` held), else None."""
        running = {seq: s.claim for seq, s in self._slots.items()}
        admitted = self.rule.admit(running, Want(want, evicts, least)) if self._free else None
        if admitted is None:
            return None
        share, others = admitted
        seq = self._free.pop(0)
        slot = Slot(
            self._shared,
            self.scheduler,
            self._release,
            seq,
            share,
            label=label,
            want=want,
            evicts=evicts,
        )
        for other, cells in others.items():
            self._slots[other].n_ctx = cells
        self._slots[seq] = slot
        self.peak_seqs = max(self.peak_seqs, len(self._slots))
        return slot

    def open(
        self,
        policy: Policy,
        config: SessionConfig,
        n_tokens: int,
        *,
        cancel: threading.Event | None = None,
        label: str = "",
        arrival: object | None = None,
    ) -> Session:
        """A ``Session`` in a new sequence, for a job of ``n_tokens`` (prompt and
        answer). It wants the job whole when that fits a session's capacity, else
        ``budget + chunk`` and the question's room (``shares.job_wants``); the
        budget follows the share (``Session.budget``), the chunk is at most a fifth
        of the share; ``arrival``: the request's ``expect`` key."""
        whole = config.budget_tokens + config.chunk()
        want, least = job_wants(n_tokens, whole, policy.evicts)
        slot = self.acquire(
            want, least, evicts=policy.evicts, cancel=cancel, label=label, arrival=arrival
        )
        try:
            if policy.evicts and slot.n_ctx < want:
                config = replace(config, chunk_tokens=chunk_in_share(slot.n_ctx, config.chunk()))
            return Session(self.model, policy, config, slot=slot)
        except BaseException:
            slot.close()
            raise

    def _release(self, slot: Slot) -> None:
        """Free ``slot``'s cells and id; the others' shares may grow again."""
        self._shared.forget(slot.seq)
        self.scheduler.forget(slot.seq)
        with self._cond:
            self._slots.pop(slot.seq, None)
            self._free.append(slot.seq)
            self._free.sort()
            running = {seq: s.claim for seq, s in self._slots.items()}
            for seq, cells in self.rule.shares(running).items():
                self._slots[seq].n_ctx = cells
            self._cond.notify_all()

    # -- figures and the end ----------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """The pool and each running sequence, for ``/metrics`` and the benchmark."""
        with self._cond:
            slots = list(self._slots.values())
        return metrics.snapshot(
            rule=self.rule,
            max_seqs=self.max_seqs,
            ctx=self.ctx,
            kv_layout=self.kv_layout,
            slots=slots,
            peak_seqs=self.peak_seqs,
            scheduler=self.scheduler,
        )

    def cancel_all(self) -> None:
        """Stop every running sequence and refuse new ones (thread-safe): their
        sessions raise ``Cancelled`` at their next step."""
        self.scheduler.stop()
        with self._cond:
            for slot in self._slots.values():
                slot.cancel_event.set()
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the scheduler (waiting steps are cancelled) and free the context;
        sessions still open raise ``Cancelled`` at their next step and their
        ``close`` then only returns their id."""
        self.cancel_all()
        self.scheduler.join()
        self._shared.close()

    def __enter__(self) -> KVPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
