"""The pool's scheduler without a model: a step that never finds room fails with the
reason after ``NO_ROOM_S`` instead of leaving its caller waiting forever."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import CacheFullError
from engine.pool import scheduler as sch
from engine.pool.slot import Slot


def _scheduler(held: int) -> sch.Scheduler:
    ctx = SimpleNamespace(n_batch=512, n_ubatch=512, n_ctx=2048, close=lambda: None)
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    return sch.Scheduler(shared, layout="shared", held=lambda: held)


def test_a_step_that_never_fits_fails_with_the_reason(monkeypatch):
    monkeypatch.setattr(sch, "NO_ROOM_S", 0.3)
    s = _scheduler(held=2048)  # a stale count: every cell held, none ever freed
    start = time.monotonic()
    with pytest.raises(CacheFullError, match="no room in the pool for 0 s: 2048 cells held"):
        s.submit(1, sch.CancelEvent(s), [1, 2, 3], 0, True, False, None)
    assert 0.3 <= time.monotonic() - start < 5
    s.stop()
    s.join()


def test_a_cancel_still_leaves_a_waiting_step_at_once(monkeypatch):
    monkeypatch.setattr(sch, "NO_ROOM_S", 60.0)
    s = _scheduler(held=2048)
    cancel = sch.CancelEvent(s)
    threading.Timer(0.2, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(sch.Cancelled):
        s.submit(1, cancel, [1], 0, True, False, None)
    assert time.monotonic() - start < 2
    s.stop()
    s.join()


class _RecordingContext:
    """A stand-in for the pool's llama.cpp context: records each batch's sequences."""

    def __init__(self) -> None:
        self.n_batch, self.n_ubatch, self.n_ctx, self.batches = 512, 512, 2048, []
        self.n_cells, self.swa_cells, self.n_seq_max, self.capture = 2048, 0, 4, None
        self.removed: list[tuple[int, int, int]] = []

    def seq_rm(self, p0, p1, seq):
        self.removed.append((p0, p1, seq))

    def decode_batch(self, entries, segments, n_streams=1, *, ubatches=()):
        self.batches.append(sorted({seq for seq, *_ in entries}))
        return []

    def logits_at(self, row):
        import numpy as np

        return np.zeros(4, dtype=np.float32)

    def close(self):
        pass


def test_a_batch_waits_for_every_sequence_it_answered_not_for_a_timer():
    """Issue 37: three sequences writing answers, each doing work of its own between
    steps (here a sleep, unequal): every batch after the first holds all three, with
    no gathering delay; one that leaves (forget) holds no batch back."""
    ctx = _RecordingContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 0)

    def sequence(seq: int, steps: int) -> None:
        for _ in range(steps):
            s.submit(seq, sch.CancelEvent(s), [1], 0, True, False, None)
            time.sleep(0.01 * seq)  # sampling, scoring: not the same for each
        s.forget(seq)  # done: closed

    threads = [threading.Thread(target=sequence, args=(seq, 6)) for seq in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.stop()
    s.join()
    full = [b for b in ctx.batches if b == [1, 2, 3]]
    assert len(full) >= 5 and len(ctx.batches) <= 7, ctx.batches
    assert sum(len(b) for b in ctx.batches) == 18  # every step decoded once


def test_the_time_decodes_wait_for_python_is_counted():
    """``owed_s`` (``kvtrim_pool_owed_seconds``): between two decodes, the time the
    sequences the first answered took to ask again; a rest after the last is not."""
    ctx = _RecordingContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 0)
    for step in range(4):
        s.submit(1, sch.CancelEvent(s), [1], step, True, False, None)
        time.sleep(0.05)  # this sequence's work between its steps
    s.forget(1)
    time.sleep(0.2)  # resting: no decode waits for it
    s.stop()
    s.join()
    assert len(ctx.batches) == 4
    assert 0.15 <= s.owed_s < 0.4, s.owed_s


def test_a_new_sequence_empties_itself_without_waiting_for_the_decode_in_flight():
    """A request's session first empties its sequence (``reset``). One the pool has
    just given out holds no cells, so that must not wait for the decode running (a
    wave's first prompt: 0.3 s on 2 cores, and the next round would start without
    it); a sequence that decoded frees its cells under the context's lock."""
    ctx = _RecordingContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 0)
    slot = Slot(shared, s, lambda _: None, 1, 256, label="", want=256, evicts=True)
    with shared.lock:  # a decode in flight holds the context
        t = threading.Thread(target=slot.clear)
        t.start()
        t.join(2)
        assert not t.is_alive()
    assert ctx.removed == []
    slot.decode([7], 0, logits=True)
    slot.clear()
    assert ctx.removed == [(0, -1, 1)]
    s.stop()
    s.join()


class _LogitsContext(_RecordingContext):
    """Each decode writes its rows into one buffer the next decode overwrites, as
    llama.cpp's does: row i predicts batch entry i's token plus one."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = np.zeros((8, 16), dtype=np.float32)

    def decode_batch(self, entries, segments, n_streams=1, *, ubatches=()):
        self.rows[:] = 0
        for i, (_seq, tok, _pos, _out) in enumerate(entries):
            self.rows[i, (tok + 1) % 16] = 1
        return super().decode_batch(entries, segments, n_streams, ubatches=ubatches)

    def logits_view(self, row):
        return self.rows[row]  # no copy


def test_a_step_picks_its_token_from_its_own_row_where_it_lies():
    """Issue 37: a sequence's sampler runs in the scheduler's thread on the row
    llama.cpp left (no copy of the vocabulary's logits): each step of a batch picks
    from its own last row, and a sampler that fails fails its own step only, after
    its decode (the caller's cache then holds the token: ``Slot.picked`` raises)."""
    ctx = _LogitsContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 0)

    def broken(row: np.ndarray) -> int:
        raise ValueError("this sampler is broken")

    def argmax(row: np.ndarray) -> int:
        return int(np.argmax(row))

    steps = [
        sch._Step(1, [3, 4], 0, True, False, None, 0, argmax),  # a chunk: its last row
        sch._Step(2, [9], 5, True, False, None, 1, broken),
        sch._Step(3, [6], 7, True, False, None, 2, argmax),
    ]
    s._decode(steps)
    assert [st.picked for st in steps] == [5, None, 7]
    assert steps[0].out is None and steps[2].out is None  # nothing copied
    assert all(st.error is None for st in steps)
    assert isinstance(steps[1].pick_error, ValueError)
    assert steps[0].pick_error is None and steps[2].pick_error is None
    assert len(ctx.batches) == 1
    # through submit: the step waits for its batch and returns what it picked
    got = s.submit(4, sch.CancelEvent(s), [10], 0, False, False, None, argmax)
    assert got.picked == 11 and got.out is None
    s.stop()
    s.join()


@pytest.mark.parametrize("layout", ["shared", "streams"])
def test_a_round_of_several_ubatches_picks_each_token_from_its_moved_row(layout):
    """A shared round llama.cpp splits into ubatches puts every logits row last
    (``batch_rows``), and each step still picks from its own row; a round of one
    ubatch, and the streams layout, keep each step's tokens together."""
    ctx = _LogitsContext()
    ctx.n_ubatch = 2
    log: list[list[tuple[int, int, int, bool]]] = []
    record = ctx.decode_batch

    def decode_batch(entries, segments, n_streams=1, *, ubatches=()):
        log.append(list(entries))
        return record(entries, segments, n_streams, ubatches=ubatches)

    ctx.decode_batch = decode_batch  # type: ignore[method-assign]
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout=layout, held=lambda: 0)

    def argmax(row: np.ndarray) -> int:
        return int(np.argmax(row))

    steps = [
        sch._Step(1, [3, 4, 5], 0, True, False, None, 0, argmax),  # a chunk: its last row
        sch._Step(2, [9], 5, True, False, None, 1, argmax),  # an answer's token
        sch._Step(3, [1, 2], 0, False, False, None, 2),  # a chunk wanting no logits
    ]
    s._decode(steps)
    assert [st.picked for st in steps[:2]] == [6, 10]
    tokens = [tok for _, tok, _, _ in log[0]]
    wants = [i for i, entry in enumerate(log[0]) if entry[3]]
    if layout == "shared":
        assert tokens == [3, 4, 1, 2, 5, 9] and wants == [4, 5]
    else:
        assert tokens == [3, 4, 5, 9, 1, 2] and wants == [2, 3]
    s._decode(steps[1:2])  # one ubatch: as it came
    assert [tok for _, tok, _, _ in log[1]] == [9] and steps[1].picked == 10
    s.stop()
    s.join()


def test_a_slots_cancel_answers_its_queued_step_without_polling(monkeypatch):
    """Issue 37: a pooled sequence's thread sleeps until its step is answered (no look
    at its cancel every 50 ms, which woke 8 threads during every decode); setting its
    cancel answers a step still waiting for a batch at once."""
    monkeypatch.setattr(sch, "NO_ROOM_S", 600.0)
    ctx = _RecordingContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 2048)  # no room: it waits
    slot = Slot(shared, s, lambda _: None, 1, 256, label="", want=256, evicts=True)
    assert isinstance(slot.cancel_event, sch.CancelEvent)
    raised: list[BaseException] = []

    def decode() -> None:
        try:
            slot.decode([7], 0, logits=True)
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=decode)
    t.start()
    time.sleep(0.3)  # queued, no room
    assert t.is_alive()
    start = time.monotonic()
    slot.cancel_event.set()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - start < 1
    assert len(raised) == 1 and isinstance(raised[0], sch.Cancelled)
    assert ctx.batches == []  # never decoded
    s.stop()
    s.join()


def test_a_cancel_answers_its_own_step_not_another_requests_on_the_same_sequence(
    monkeypatch,
):
    """A sequence id goes to the next request once one ends; the old request's cancel,
    set late (a client that left as its answer ended), must not cancel the new one's
    step. A cancel set while its step ran and found no free cells ends it then."""
    monkeypatch.setattr(sch, "NO_ROOM_S", 600.0)
    ctx = _RecordingContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 2048)  # no room: it waits
    old, new = sch.CancelEvent(s), sch.CancelEvent(s)
    raised: list[BaseException] = []

    def submit() -> None:
        try:
            s.submit(1, new, [7], 0, True, False, None)
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=submit)
    t.start()
    time.sleep(0.3)
    old.set()  # the last request of sequence 1 is cancelled late
    t.join(0.5)
    assert t.is_alive() and raised == []
    new.set()
    t.join(5)
    assert not t.is_alive() and isinstance(raised[0], sch.Cancelled)
    s.stop()
    s.join()
    # no free cells for a batch it was in, its caller cancelled meanwhile: not tried again
    gone, kept = sch.CancelEvent(s), sch.CancelEvent(s)
    steps = [sch._Step(2, [5], 0, True, False, None, 0, cancel=gone),
             sch._Step(3, [6], 0, True, False, None, 1, cancel=kept)]  # fmt: skip
    gone.set()
    s._no_room(steps, sch.CacheFullError("full"))
    assert isinstance(steps[0].error, sch.Cancelled) and not steps[0].requeue
    assert steps[1].error is None and steps[1].requeue and s._pending == [steps[1]]


def test_a_round_waits_for_a_request_on_its_way_until_its_sequence_asks():
    """Issue 37: a request the server holds whose sequence has not asked yet
    (``expect``) holds the next round like a sequence owed back, so two prompts that
    arrive together are read in one decode however long the second takes to parse;
    handed to its sequence (``arrived``) it holds the round until that sequence's first
    step; one that will not come (``forget``) holds nothing."""
    ctx = _RecordingContext()
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 0)

    def step(seq: int, tokens: list[int]) -> threading.Thread:
        args = (seq, threading.Event(), tokens, 0, True, False, None)
        t = threading.Thread(target=s.submit, args=args)
        t.start()
        return t

    s.expect("request")
    first = step(1, [1, 2, 3])
    time.sleep(0.2)
    assert ctx.batches == []  # the first prompt waits for the request on its way
    s.arrived("request", 2)
    time.sleep(0.2)
    assert ctx.batches == []  # now for its sequence's first step
    second = step(2, [4, 5])
    first.join(5)
    second.join(5)
    assert ctx.batches == [[1, 2]]
    s.forget(1)
    s.forget(2)
    s.expect("gone")
    third = step(3, [6])
    time.sleep(0.2)
    assert ctx.batches == [[1, 2]]
    s.forget("gone")  # its client left before its prompt was parsed
    third.join(5)
    assert ctx.batches == [[1, 2], [3]]
    s.stop()
    s.join()


@pytest.mark.parametrize("apart", [True, False])
def test_answers_beside_a_tiled_prompt_chunk_are_decoded_apart(apart):
    """Issue 37: where a shared round's attention is tiled (``answers_apart``), its
    answer tokens go to llama.cpp in one decode and the prompt chunk in the next, and
    each step still picks its token from its own row of its own decode."""
    ctx = _LogitsContext()
    ctx.rows = np.zeros((128, 16), dtype=np.float32)
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    s = sch.Scheduler(shared, layout="shared", held=lambda: 0, answers_apart=apart)

    def argmax(row: np.ndarray) -> int:
        return int(np.argmax(row))

    chunk = [5] * 63 + [8]  # 64 rows with the answers: a tile of query rows
    steps = [
        sch._Step(1, [2], 9, True, False, None, 0, argmax),
        sch._Step(2, chunk, 0, True, False, None, 1, argmax),
        sch._Step(3, [12], 4, True, False, None, 2, argmax),
    ]
    s._run(steps)
    assert ctx.batches == ([[1, 3], [2]] if apart else [[1, 2, 3]])
    assert [st.picked for st in steps] == [3, 9, 13]
    assert all(st.error is None and st.done.is_set() for st in steps)
    assert (s.steps, s.tokens) == (2 if apart else 1, 66)  # llama_decode calls, tokens
    s.stop()
    s.join()


def test_a_round_whose_answers_find_no_room_puts_its_prompt_chunk_back_undecoded():
    """Decoded apart, a round whose answers find no free cells does not decode its
    prompt chunk into the cells they wait for: the chunk goes back in the queue
    behind them, and a chunk whose caller cancelled meanwhile is answered."""

    class _Full(_LogitsContext):
        def decode_batch(self, entries, segments, n_streams=1, *, ubatches=()):
            if len(entries) < 64:  # the answers' decode: no room
                raise CacheFullError("no free cells")
            return super().decode_batch(entries, segments, n_streams, ubatches=ubatches)

    for cancelled in (False, True):
        ctx = _Full()
        shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
        s = sch.Scheduler(shared, layout="shared", held=lambda: 0, answers_apart=True)
        s.stop()  # no thread takes the queue: what _run leaves there stays
        s.join()
        cancel = sch.CancelEvent(s)
        steps = [
            sch._Step(1, [2], 9, True, False, None, 0),
            sch._Step(3, [12], 4, True, False, None, 1),
            sch._Step(2, [5] * 64, 0, True, False, None, 2, cancel=cancel),
        ]
        if cancelled:
            cancel.set()
        s._run(steps)
        assert ctx.batches == []  # the chunk was not decoded
        queued = [st.seq for st in s._pending]
        assert queued == ([1, 3] if cancelled else [1, 3, 2])
        assert isinstance(steps[2].error, sch.Cancelled) == cancelled
        assert steps[2].done.is_set() == cancelled and not steps[0].done.is_set()
