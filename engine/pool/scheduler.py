"""The scheduler thread: every running sequence's tokens in one ``llama_decode`` a
round (two where a shared pool's answers go apart from its prompt chunks).

Decoding a token of a small model on a CPU (or of an 8B model on a GPU) is bound
by reading the weights, so one step for eight sequences costs far less than
eight steps (docs/multiseq.md: 2.1x tokens/s at 8 sequences on 2 cores).

A session's ``decode`` puts a step in the queue and blocks; the thread decodes the
queued steps together and hands each sequence its logits and its own attention
rows or keys (capture.py ``Segment``). What goes into a batch is ``plan.plan``'s
(a function, tested without a model). When a batch runs is no timer's either: an
answer's step brings its sampler, which this thread runs on the step's row where
llama.cpp left it (no copy of the vocabulary's logits); the sequences a batch
answered are owed back (each takes its token, or evicts, under the CPU lock that
no decode runs beside, then asks again), and the next
batch waits until every one of them has asked again or left (closed, parked, or
stopped reading: ``forget``), and for the requests the server already holds whose
sequence has not asked yet (``expect``: however long the server takes to parse each),
so a batch is as large as the running and arriving sequences make it, as
llama-server's is: up to the context's ``n_batch`` tokens (``ROUND_TOKENS``,
llama-server's default), which llama.cpp computes in ubatches of ``n_ubatch`` (a
step's most), so a wave of prompts that arrive together is read in one decode and
their answers stay in step (every logits row in the last ubatch: ``batch_rows``).
Where attention runs on the CPU with flash attention, a shared round's answer
tokens are decoded apart from the prompt chunks beside them (``plan.decodes``), as
llama-server's stream per slot splits them: the sequences the first call answered
then run their Python beside the second.
One bound keeps a sequence that stalls outside kvtrim (a library caller that stops
iterating) from holding the others for ever: ``OWED_LIMIT_S``, a liveness guard,
not a scheduling rule. It knows sequences by id only: what they hold comes from the
pool (``held``), never from their sessions.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import CacheFullError, Cancelled, EngineError
from ..native.capture import Captured, Segment, Ubatch
from ..native.context import NativeContext, Pick
from ..native.kvmemory import CacheSettings
from ..native.ubatch import split_equal
from .plan import Room, Waiting, decodes, plan

OWED_LIMIT_S = 2.0  # a sequence owed back longer than this no longer holds the batch
RETRY_S = 0.01  # seconds between tries of a step that found no free cells
RETRIES = 300  # tries of a step alone that finds no free cells (3 s), then it fails
NO_ROOM_S = 60.0  # seconds no waiting step fits the pool before the oldest is failed


class SharedContext:
    """The pool's llama.cpp context, the cache settings it was made with, and the
    locks every thread takes around it."""

    def __init__(self, ctx: NativeContext, cache: CacheSettings) -> None:
        self.ctx = ctx
        self.cache = cache
        self.lock = threading.Lock()  # llama.cpp's context is not thread-safe
        self.cpu = threading.Lock()  # a decode or one session's CPU work, not both
        self.closed = False

    @contextlib.contextmanager
    def native(self) -> Iterator[NativeContext]:
        """The context, with its lock held, while the pool has one."""
        with self.lock:
            if self.closed:
                raise Cancelled("the pool is closed")
            yield self.ctx

    def forget(self, seq: int) -> None:
        """Free sequence ``seq``'s cells (nothing once the context is closed)."""
        with self.lock:
            if not self.closed:
                self.ctx.seq_rm(0, -1, seq)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.ctx.close()


class CancelEvent(threading.Event):
    """A pooled sequence's cancel: setting it also answers its caller's step still
    waiting for a batch, so the caller's thread sleeps until its step is answered
    (it looked every 50 ms before: 8 threads' looks took about 0.6 ms of CPU a pooled
    step from llama.cpp's threads on 2 cores, history.md, issue 37)."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__()
        self._scheduler = scheduler

    def set(self) -> None:
        super().set()
        self._scheduler.cancelled(self)


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
    pick: Pick | None = None  # chooses the next token from the last row where it lies
    cancel: CancelEvent | None = None  # its caller's (its step is answered at set)
    done: threading.Event = field(default_factory=threading.Event)
    taken: bool = False
    out: np.ndarray | None = None  # logits rows: (1 or len(tokens), n_vocab)
    picked: int | None = None  # what ``pick`` chose
    pick_error: Exception | None = None  # what ``pick`` raised (the decode itself ran)
    captured: Captured | None = None
    error: BaseException | None = None
    requeue: bool = False  # put back in the queue instead of answered (no free cells)
    retries: int = 0
    skipped: int = 0  # batches it was left out of (plan.MAX_SKIPS)

    def waiting(self) -> Waiting:
        return Waiting(self.seq, len(self.tokens), self.order, self.skipped)


def _owners(steps: Sequence[_Step]) -> dict[int, int]:
    """Each capturing step's result index (``Segment.owner``), by sequence."""
    return {s.seq: k for k, s in enumerate(s for s in steps if s.capture is not None)}


def _kept(first: int, count: int, n: int, rows: int) -> int:
    """How many of a step's last ``rows`` (of ``n``) are among its rows ``first`` to
    ``first + count``: those a ubatch holding that part of it keeps."""
    return max(0, min(count, first + count - (n - min(rows, n))))


def shared_ubatches(
    steps: Sequence[_Step], n_ubatch: int, runs: Sequence[tuple[Run, ...]] | None = None
) -> list[Ubatch]:
    """One shared pool: the ubatches llama.cpp splits a round of ``steps`` (in batch
    order, their tokens where ``runs`` says: ``batch_rows``; None: each step's together)
    into, ``n_ubatch`` consecutive rows each (``split_simple``), each with a segment
    of every run of a step that captures in it; a step's rows may lie in several, and
    in two runs of one (its last ``rows`` rows are kept wherever they fall). None where
    no step captures."""
    if all(s.capture is None for s in steps):
        return []
    if runs is None:
        runs = batch_rows(steps)[1]
    placed = sorted((row, k, first, count) for k, rs in enumerate(runs) for row, first, count in rs)
    a = sum(len(s.tokens) for s in steps)
    owner = _owners(steps)
    out = []
    for u0 in range(0, a, n_ubatch):
        u1 = min(a, u0 + n_ubatch)
        segments = []
        for row, k, first, count in placed:
            s, c = steps[k], steps[k].capture
            lo, hi = max(row, u0), min(row + count, u1)
            if c is None or lo >= hi:
                continue
            kept = _kept(first + lo - row, hi - lo, len(s.tokens), c.rows)
            seg = Segment(lo - u0, hi - u0, kept, c.visibility, keys=c.keys, owner=owner[s.seq])
            segments.append(seg)
        out.append(Ubatch(u1 - u0, 1, tuple(segments)))
    return out


def stream_ubatches(steps: Sequence[_Step], n_ubatch: int) -> list[Ubatch]:
    """One KV stream per sequence: the ubatches llama.cpp splits a round of
    ``steps`` (in batch order) into, each with the segments of the steps that
    capture; a step's rows may span two (its last ``rows`` rows are kept wherever
    they fall). None where no step captures."""
    if all(s.capture is None for s in steps):
        return []
    by_seq = {s.seq: s for s in steps}
    owner = _owners(steps)
    out = []
    for slices in split_equal([(s.seq, len(s.tokens)) for s in steps], n_ubatch):
        segments = []
        for sl in slices:
            c, n = by_seq[sl.seq].capture, len(by_seq[sl.seq].tokens)
            if c is None:
                continue
            kept = _kept(sl.first, sl.count, n, c.rows)
            segments.append(
                Segment(0, sl.count, kept, c.visibility, sl.stream, c.keys, owner[sl.seq])
            )
        out.append(Ubatch(slices[0].count, len(slices), tuple(segments)))
    return out


Run = tuple[int, int, int]
"""Where some of a step's tokens lie: (batch row, the step's token index, count)."""


def batch_rows(
    steps: Sequence[_Step], tails_last: bool = False
) -> tuple[list[tuple[int, int, int, bool]], list[tuple[Run, ...]]]:
    """The batch's ``(seq, token, pos, logits)`` entries for ``steps`` (in batch
    order) and each step's runs. ``tails_last``: the last token of each step that wants
    that row's logits only goes after every step's other tokens (each sequence's
    positions still rise in batch order), so a shared round that llama.cpp splits
    into ubatches of consecutive rows computes its logits rows in the last one
    (where they fit in it: the rest in the one before).
    On a CPU Gemma's 262,144-row output layer costs far more for rows spread over
    ubatches (3, 3 and 2 of a wave of 8 prompts) than for 8 in one (history.md,
    issue 37: a decode of 8 answer tokens took 61 ms with 8 logits rows, 81 with 7)."""
    body: list[tuple[int, int, int, bool]] = []
    tail: list[tuple[int, int, int, bool]] = []
    where: list[tuple[int, int]] = []  # each step's first body row and tail index (-1: none)
    for s in steps:
        n = len(s.tokens)
        move = tails_last and s.logits and not s.every
        where.append((len(body), len(tail) if move else -1))
        for i in range(n - 1 if move else n):
            body.append((s.seq, s.tokens[i], s.pos0 + i, s.every or (s.logits and i == n - 1)))
        if move:
            tail.append((s.seq, s.tokens[-1], s.pos0 + n - 1, True))
    runs: list[tuple[Run, ...]] = []
    for s, (b, t) in zip(steps, where, strict=True):
        n = len(s.tokens)
        if t < 0:
            runs.append(((b, 0, n),))
        else:
            last = (len(body) + t, n - 1, 1)
            runs.append(((b, 0, n - 1), last) if n > 1 else (last,))
    return body + tail, runs


def _read_out(
    ctx: NativeContext,
    step: _Step,
    runs: tuple[Run, ...],
    got: Iterator[Captured],
    n_segments: int,
) -> None:
    """A step's logits rows (where ``runs`` put its tokens), or the token its ``pick``
    chose from the last one where it lies, and its attention (call with the
    context's lock held)."""
    n = len(step.tokens)
    last = runs[-1][0] + runs[-1][2] - 1
    if step.every:  # never split: its rows follow one another
        step.out = np.stack([ctx.logits_at(runs[0][0] + i) for i in range(n)])
    elif step.pick is not None:  # its sampler, on the row where it lies: no copy
        try:
            step.picked = step.pick(ctx.logits_view(last))
        except Exception as exc:  # the sequence's own failure, after its cells were written
            step.pick_error = exc
    elif step.logits:
        step.out = ctx.logits_at(last)[None]
    if step.capture is not None:
        c = next(got)
        step.captured = Captured(c.visible, c.attn, c.seconds / n_segments, c.keys)


def _in_batch_order(steps: list[_Step], layout: str) -> list[_Step]:
    """A decode's steps in batch order (a round's, as llama-server's rounds):
    as chosen in a shared pool (``split_simple`` cuts ubatches of consecutive rows); by
    sequence id with a stream each, which llama.cpp splits into equal slices of runs of
    consecutive ids (native/ubatch.py)."""
    return steps if layout == "shared" else sorted(steps, key=lambda s: s.seq)


def _parts(steps: list[_Step], apart: bool, n_ubatch: int) -> list[list[_Step]]:
    """A round's ``llama_decode`` calls (``plan.decodes``), as its steps."""
    by_seq = {s.seq: s for s in steps}
    parts = decodes([s.waiting() for s in steps], apart, n_ubatch)
    return [[by_seq[w.seq] for w in part] for part in parts]


def _put_back(pending: list[_Step], before: list[_Step], steps: list[_Step]) -> None:
    """Queue ``steps`` of a round again in ``pending``, undecoded, after the steps of
    ``before`` that ``_no_room`` put back; one whose caller cancelled is answered
    instead (call with the scheduler's lock held)."""
    ahead = [i for i, s in enumerate(pending) if s.requeue and s in before]
    at = ahead[-1] + 1 if ahead else 0
    back = []
    for step in steps:
        if step.cancel is not None and step.cancel.is_set():
            step.error = Cancelled("cancelled")
            step.done.set()
        else:
            step.requeue, step.taken = True, False
            back.append(step)
    pending[at:at] = back


class Scheduler:
    """The step queue and the thread that decodes it in batches.

    ``held``: cells every sequence holds now (a sequence whose share shrank holds
    more than its share until its next step evicts). ``answers_apart``: ``plan.decodes``."""

    def __init__(
        self,
        shared: SharedContext,
        *,
        layout: str,
        held: Callable[[], int],
        answers_apart: bool = False,
    ) -> None:
        self.shared = shared
        self.layout = layout
        self.held = held
        self.answers_apart = answers_apart
        self._cond = threading.Condition()
        self._pending: list[_Step] = []
        self._order = itertools.count()
        # sequences a batch answered, not back yet, and expected requests: since when
        self._owed: dict[Hashable, float] = {}
        self._stall = False
        self._split_next = False
        self._no_room_since: float | None = None  # when the first batch found no room
        self._running: list[_Step] = []  # the batch being decoded
        self.closed = False  # no new steps: stopped, or the thread died
        self.error: BaseException | None = None  # what stopped the thread, if anything
        self.steps = 0  # llama_decode calls
        self.tokens = 0  # tokens decoded
        self.peak_cells = 0  # most cells held by all sequences at once
        self.decode_s = 0.0
        self.owed_s = 0.0  # seconds between decodes while a sequence was owed back
        self._owed_since: float | None = None  # the last decode's end, if it left some owed
        self._thread = threading.Thread(target=self._loop, name="kvtrim-pool", daemon=True)
        self._thread.start()

    # -- callers' side ----------------------------------------------------

    def submit(
        self,
        seq: int,
        cancel: CancelEvent,
        tokens: Sequence[int],
        pos0: int,
        logits: bool,
        every: bool,
        capture: Segment | None,
        pick: Pick | None = None,
    ) -> _Step:
        """Queue sequence ``seq``'s step and wait until it was decoded (or raise:
        ``Cancelled`` at ``cancel`` while still queued, or the step's error).
        ``pick`` runs here, in the scheduler's thread, on the last row's logits where
        llama.cpp left them, before the next decode overwrites them."""
        if not 0 < len(tokens) <= self.shared.ctx.n_batch:
            raise EngineError(f"decode of {len(tokens)} tokens does not fit the pool's batch")
        logits = logits or pick is not None
        step = _Step(seq, tokens, pos0, logits, every, capture, next(self._order), pick, cancel)
        with self._cond:
            if self.closed:
                raise Cancelled("the pool is closed")
            if cancel.is_set():
                raise Cancelled("cancelled")
            self._pending.append(step)
            self._owed.pop(seq, None)
            self._cond.notify_all()
        step.done.wait()  # a cancel answers it while it is queued (``cancelled``)
        if step.error is not None:
            raise step.error
        return step

    def cancelled(self, cancel: CancelEvent) -> None:
        """Answer the step of ``cancel``'s caller still waiting for a batch with
        ``Cancelled`` (its own: a sequence id may have gone to another request)."""
        with self._cond:
            for step in [s for s in self._pending if s.cancel is cancel and not s.taken]:
                self._pending.remove(step)
                step.error = Cancelled("cancelled")
                step.done.set()

    def forget(self, key: Hashable) -> None:
        """Sequence ``key`` ended or rests (closed, parked), or the expected request
        ``key`` will not come: no step of it is owed."""
        with self._cond:
            self._owed.pop(key, None)
            self._cond.notify_all()

    def expect(self, key: Hashable) -> None:
        """A request on its way to a new sequence (``KVPool.expect``): the next round
        waits for it as for a sequence owed back, until ``arrived`` or ``forget``."""
        with self._cond:
            self._owed[key] = time.monotonic()

    def arrived(self, key: Hashable, seq: int) -> None:
        """The expected request ``key`` has sequence ``seq``: rounds wait for its first
        step now (since the request came, for ``OWED_LIMIT_S``)."""
        with self._cond:
            since = self._owed.pop(key, None)
            if since is not None:
                self._owed[seq] = since
            self._cond.notify_all()

    def stop(self) -> None:
        """Refuse new steps; the waiting ones are cancelled and the thread ends."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def join(self) -> None:
        self._thread.join()

    # -- the thread -------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._schedule()
        except BaseException as exc:  # never leave a caller waiting on a dead thread
            with self._cond:
                self.error = exc
                self.closed = True
                error = EngineError(f"the pool's scheduler stopped: {exc}")
                self._fail_waiting(error)
                for step in self._running:  # taken into a batch that never answered
                    if not step.done.is_set():
                        step.error = error
                        step.done.set()
                self._cond.notify_all()

    def _fail_waiting(self, error: BaseException) -> None:
        """Answer every queued step with ``error`` (call with ``_cond`` held)."""
        for step in self._pending:
            step.error = error
            step.done.set()
        self._pending.clear()

    def _schedule(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self.closed:
                    self._cond.wait()
                if self.closed:
                    self._fail_waiting(Cancelled("the pool is closed"))
                    return
                self._await_owed()
                batch = self._choose()
                if not batch or self._stall:  # no room yet: a sequence evicts or leaves
                    self._stall = False
                    self._cond.wait(RETRY_S)
                    if not batch:
                        self._starved()
                        continue
                self._no_room_since = None
                self._running = batch
            self._run(batch)

    def _starved(self) -> None:
        """No waiting step has fitted for ``NO_ROOM_S``: the oldest fails with the
        reason instead of every caller waiting forever (a count of held cells that
        never comes down would otherwise hang them all; call with ``_cond`` held)."""
        now = time.monotonic()
        if self._no_room_since is None:
            self._no_room_since = now
        elif now - self._no_room_since > NO_ROOM_S and self._pending:
            step = min(self._pending, key=lambda s: s.order)
            self._pending.remove(step)
            step.error = CacheFullError(
                f"no room in the pool for {NO_ROOM_S:.0f} s: {self.held()} cells held of "
                f"{self.shared.ctx.n_ctx}, {len(step.tokens)} to decode"
            )
            step.done.set()
            self._no_room_since = None

    def _await_owed(self) -> None:
        """Wait until every sequence the last batch answered has asked again or left
        (call with ``_cond`` held): the batch is then every running sequence's."""
        while self._owed and not self.closed:
            oldest = min(self._owed.values())
            left = oldest + OWED_LIMIT_S - time.monotonic()
            if left <= 0:  # stalled outside kvtrim: it no longer holds the others
                self._owed = {s: t for s, t in self._owed.items() if t > oldest}
                continue
            self._cond.wait(left)

    def _choose(self) -> list[_Step]:
        """The next batch, as ``plan.plan`` says, and the waiting steps' ages; a step
        no batch can hold fails (call with ``_cond`` held)."""
        ctx = self.shared.ctx
        pending = self._pending[:1] if self._split_next else self._pending
        self._split_next = False  # the last batch found no room together: one at a time
        # a sequence whose share shrank evicts at its own next step; until then the
        # cells it still holds are not free (llama_decode would find no slot)
        free = ctx.n_ctx - self.held() if self.layout == "shared" else None
        # a round is a decode (two: plan.decodes) of up to n_batch tokens, in ubatches; one
        # ubatch while a step wants every row's logits or attention rows (an evicting
        # read: larger rounds slowed 4 parallel 9K-token reads by 20%+, history.md, issue 37)
        one = any(s.every or (s.capture is not None and s.capture.rows) for s in pending)
        room = Room(ctx.n_ubatch if one else ctx.n_batch, free)
        chosen = plan([s.waiting() for s in pending], room)
        by_seq = {s.seq: s for s in pending}
        for w in chosen.left:
            by_seq[w.seq].skipped = w.skipped
        for w in chosen.too_big:
            step = by_seq[w.seq]
            self._pending.remove(step)
            step.error = EngineError(f"a step of {w.tokens} tokens does not fit the batch")
            step.done.set()
        batch = [by_seq[w.seq] for w in chosen.batch]
        for step in batch:
            self._pending.remove(step)
            step.taken = True
        return batch

    # -- one decode -------------------------------------------------------

    def _run(self, steps: list[_Step]) -> None:
        if self._owed_since is not None:  # the sequences' Python since the last decode
            self.owed_s += time.perf_counter() - self._owed_since
        for step in steps:
            step.requeue = False
        parts = _parts(steps, self.answers_apart, self.shared.ctx.n_ubatch)
        for k, part in enumerate(parts):
            self._decode(_in_batch_order(part, self.layout))
            if any(s.requeue for s in part):  # no room: the rest waits behind it, undecoded
                with self._cond:
                    _put_back(self._pending, part, [s for rest in parts[k + 1 :] for s in rest])
                break
        with self._cond:
            self._owed_since = time.perf_counter() if self._owed else None

    def _decode(self, steps: list[_Step]) -> None:
        """Decode ``steps`` in one ``llama_decode`` and answer each (or requeue)."""
        n_ubatch = self.shared.ctx.n_ubatch
        several = sum(len(s.tokens) for s in steps) > n_ubatch  # llama.cpp splits it
        entries, runs = batch_rows(steps, tails_last=several and self.layout == "shared")
        segments: list[Segment] = []
        if self.layout != "shared":
            ubatches = stream_ubatches(steps, n_ubatch)
        elif several:
            ubatches = shared_ubatches(steps, n_ubatch, runs)
        else:  # one ubatch: each step's rows together
            ubatches = []
            for step, ((a, _, n),) in zip(steps, runs, strict=True):
                if (c := step.capture) is not None:
                    segments.append(Segment(a, a + n, c.rows, c.visibility, keys=c.keys))
        n_captured = sum(s.capture is not None for s in steps)
        t0: float | None = None  # from the locks on: a session's locked work is not decoding
        try:
            with self.shared.cpu, self.shared.lock:
                t0 = time.perf_counter()
                ctx = self.shared.ctx
                got = iter(ctx.decode_batch(entries, segments, ubatches=ubatches))
                for step, where in zip(steps, runs, strict=True):
                    _read_out(ctx, step, where, got, n_captured)
        except CacheFullError as exc:
            self._no_room(steps, exc)
        except BaseException as exc:  # every sequence of the batch hears of it
            for step in steps:
                step.error = exc
        finally:
            self._account(steps, len(entries), 0.0 if t0 is None else time.perf_counter() - t0)

    def _no_room(self, steps: list[_Step], exc: CacheFullError) -> None:
        """llama.cpp found no free cells and left the cache as it was: a batch tries
        its steps alone; a step alone waits for a sequence whose share shrank to
        evict (the counts the room check uses lag behind), then fails. A step whose
        caller cancelled meanwhile is answered ``Cancelled`` instead."""
        with self._cond:
            for step in steps:
                if step.cancel is not None and step.cancel.is_set():
                    step.error = Cancelled("cancelled")
            back = [s for s in steps if s.error is None]
            if len(steps) > 1:  # each alone next
                self._split_next = True
            elif back and back[0].retries < RETRIES:  # after a while: others evict
                back[0].retries += 1
                self._stall = True
            elif back:
                back[0].error, back = exc, []
            for step in back:
                step.requeue, step.taken = True, False
            self._pending[:0] = back

    def _account(self, steps: list[_Step], n_tokens: int, seconds: float) -> None:
        """Count the decode, then answer every step not put back in the queue."""
        self.steps += 1
        self.tokens += n_tokens
        self.decode_s += seconds
        try:
            self.peak_cells = max(self.peak_cells, self.held())
            now = time.monotonic()
            with self._cond:
                for step in steps:
                    if not step.requeue and step.error is None:
                        self._owed[step.seq] = now  # it samples or evicts, then asks again
        finally:
            for step in steps:
                if not step.requeue:
                    step.done.set()
