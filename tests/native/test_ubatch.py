"""llama.cpp's split of a stream batch into ubatches (engine/native/ubatch.py), as a
function: the cases the pool's rounds make, checked against the rule read in
``llama_batch_allocr::split_equal`` (sequential); the capture checks the same
prediction against llama.cpp's own graphs (tests/pool/test_pool.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.native.capture import Capture, Captured, Segment
from engine.native.context import NativeContext
from engine.native.ubatch import Slice, split_equal
from engine.pool.scheduler import Run, _Step, batch_rows, shared_ubatches, stream_ubatches
from engine.session.config import default_threads

THREADS = default_threads()  # what this test run may use (conftest pins xdist workers)


def _shape(ubatches: list[list[Slice]]) -> list[list[tuple[int, int, int]]]:
    return [[(s.seq, s.first, s.count) for s in u] for u in ubatches]


def test_answer_tokens_of_consecutive_sequences_are_one_ubatch():
    got = split_equal([(s, 1) for s in range(8)], 512)
    assert _shape(got) == [[(s, 0, 1) for s in range(8)]]
    assert [s.stream for s in got[0]] == list(range(8))


def test_a_prompt_rides_with_the_answers_then_goes_on_alone():
    got = split_equal([(0, 1), (1, 1), (2, 170), (3, 1)], 512)
    assert _shape(got) == [[(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)], [(2, 1, 169)]]
    assert got[1][0].stream == 0


def test_a_gap_in_the_ids_starts_another_ubatch():
    got = split_equal([(0, 1), (1, 1), (3, 1), (4, 40)], 512)
    assert _shape(got) == [[(0, 0, 1), (1, 0, 1)], [(3, 0, 1), (4, 0, 1)], [(4, 1, 39)]]


def test_prompts_go_in_equal_slices_as_far_as_the_shortest():
    got = split_equal([(2, 30), (3, 50)], 512)
    assert _shape(got) == [[(2, 0, 30), (3, 0, 30)], [(3, 30, 20)]]


def test_n_ubatch_caps_each_sequence_s_slice():
    got = split_equal([(0, 300), (1, 300)], 512)
    assert _shape(got) == [
        [(0, 0, 256), (1, 0, 256)],
        [(0, 256, 44), (1, 256, 44)],
    ]
    assert _shape(split_equal([(5, 700)], 512)) == [[(5, 0, 512)], [(5, 512, 188)]]


def test_every_token_is_in_exactly_one_ubatch():
    runs = [(0, 3), (1, 1), (2, 9), (4, 1), (5, 2), (6, 1), (9, 7)]
    seen = {seq: [] for seq, _ in runs}
    for ubatch in split_equal(runs, 8):
        counts = {s.count for s in ubatch}
        assert len(counts) == 1 and len(ubatch) * counts.pop() <= max(8, len(ubatch))
        ids = [s.seq for s in ubatch]
        assert ids == list(range(ids[0], ids[0] + len(ids)))  # a run of consecutive ids
        for s in ubatch:
            seen[s.seq].extend(range(s.first, s.first + s.count))
    assert seen == {seq: list(range(n)) for seq, n in runs}


@pytest.mark.parametrize("runs", [[(0, 1), (0, 2)], [(1, 0)]])
def test_a_batch_the_pool_never_makes_is_refused(runs):
    with pytest.raises(ValueError):
        split_equal(runs, 512)


def test_a_shared_round_s_ubatches_are_consecutive_rows_with_the_kept_rows_last():
    """The shared pool's split (``split_simple``): ubatches of ``n_ubatch`` rows in
    batch order; a step across a boundary has a segment in each, its ``rows`` kept
    rows where they fall, all its parts one owner."""
    seg = Segment(0, 0, 4, True)
    steps = [
        _Step(0, [1], 9, True, False, seg, 0),
        _Step(1, list(range(30)), 0, True, False, seg, 1),
        _Step(2, [1], 5, True, False, None, 2),
        _Step(3, list(range(10)), 0, True, False, Segment(0, 0, 8, False), 3),
    ]
    got = shared_ubatches(steps, 16)
    assert [(u.n_rows, u.n_streams) for u in got] == [(16, 1), (16, 1), (10, 1)]
    shape = [[(s.start, s.stop, s.rows, s.owner) for s in u.segments] for u in got]
    assert shape == [
        [(0, 1, 1, 0), (1, 16, 0, 1)],  # the chunk's first 15 rows: none of its last 4
        [(0, 15, 4, 1)],  # its other 15, the last 4 kept; sequence 2 captures nothing
        [(0, 10, 8, 2)],
    ]
    assert shared_ubatches(steps[2:3], 16) == []  # nothing captured: llama.cpp's own split


def test_tails_last_puts_every_logits_row_after_the_other_rows():
    """``batch_rows(tails_last=True)``: each step's last token, where it wants logits,
    goes to the batch's end, in step order; a step's positions still rise in batch
    order and make one run with no gap; a step wanting no logits stays together."""
    steps = [
        _Step(0, [7], 9, True, False, None, 0),  # an answer's token
        _Step(1, list(range(30)), 0, True, False, None, 1),  # a prompt's last chunk
        _Step(2, [5, 6, 7], 40, False, False, None, 2),  # a chunk wanting no logits
        _Step(3, list(range(10)), 0, True, False, None, 3),
    ]
    together, runs = batch_rows(steps)
    assert runs == [((0, 0, 1),), ((1, 0, 30),), ((31, 0, 3),), ((34, 0, 10),)]
    assert [i for i, e in enumerate(together) if e[3]] == [0, 30, 43]
    entries, runs = batch_rows(steps, tails_last=True)
    assert sorted(entries) == sorted(together)
    assert runs == [
        ((41, 0, 1),),
        ((0, 0, 29), (42, 29, 1)),
        ((29, 0, 3),),
        ((32, 0, 9), (43, 9, 1)),
    ]
    assert [i for i, e in enumerate(entries) if e[3]] == [41, 42, 43]
    for seq in range(4):
        pos = [p for s, _, p, _ in entries if s == seq]
        assert pos == list(range(pos[0], pos[0] + len(pos)))
    for step, rs in zip(steps, runs, strict=True):  # each run holds the step's tokens
        got = [entries[row + i][1] for row, _, count in rs for i in range(count)]
        assert got == list(step.tokens)


def test_a_split_step_s_parts_are_one_owner_in_row_order():
    """With tails last, a capturing step has a part for its body and one for its
    last row; its kept rows are its last wherever they fall."""
    keep = Segment(0, 0, 4, True)
    steps = [
        _Step(0, [1], 9, True, False, keep, 0),
        _Step(1, list(range(30)), 0, True, False, keep, 1),
        _Step(2, [1], 5, True, False, None, 2),
    ]
    got = shared_ubatches(steps, 16, batch_rows(steps, tails_last=True)[1])
    shape = [[(s.start, s.stop, s.rows, s.owner) for s in u.segments] for u in got]
    assert shape == [
        [(0, 16, 0, 1)],  # sequence 1's rows 0-15
        [(0, 13, 3, 1), (13, 14, 1, 0), (14, 15, 1, 1)],  # its rows 16-28, 0's token, its last
    ]


def _cells_as_alone(cap: Captured, runs: list[tuple[Run, ...]], base: int) -> Captured:
    """``cap``'s columns moved to the cells the round's tokens get when each step is
    decoded alone, in step order: llama.cpp gives a fresh round's tokens the free cells
    after the history's ``base``, in batch order."""
    starts = np.cumsum([0] + [sum(r[2] for r in rs) for rs in runs])
    width = max(cap.visible.shape[1], base + int(starts[-1]))  # type: ignore[union-attr]
    perm = np.arange(width)  # perm[alone cell] = the batch's cell
    for k, rs in enumerate(runs):
        for row, first, count in rs:
            at = base + starts[k] + first
            perm[at : at + count] = base + row + np.arange(count)

    def moved(block: np.ndarray | None) -> np.ndarray | None:
        if block is None:
            return None
        padded = np.pad(block, ((0, 0), (0, width - block.shape[1])))
        return padded[:, perm]

    return Captured(moved(cap.visible), moved(cap.attn), cap.seconds, cap.keys)


def _steps(
    prompts: dict[int, list[int]], held: dict[int, int], captures: dict[int, Segment]
) -> list[_Step]:
    return [
        _Step(seq, toks, held[seq], True, False, captures.get(seq), k)
        for k, (seq, toks) in enumerate(sorted(prompts.items()))
    ]


@pytest.mark.slow
@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize(
    ("layout", "tails_last"), [("streams", False), ("shared", False), ("shared", True)]
)
def test_a_round_llama_cpp_splits_is_captured_as_its_steps_alone(engine, flash, layout, tails_last):
    """An answer token of sequences 0 and 2 and a 30-token prompt chunk of sequence 1
    in one ``llama_decode``, which llama.cpp runs as two ubatches, each with its own
    ``n_kv``. One stream per sequence: the three first tokens, then the chunk's rest.
    One shared pool in ubatches of 16 (``split_simple``): rows 0-15 and 16-31, the
    chunk in both and its kept rows in the second; with ``tails_last`` every step's
    logits row at the batch's end (the chunk's last row apart from the rest). Each
    step's cells seen, attention rows, keys and logits are those of the same step
    decoded alone in a context of the same history."""
    model = engine.model
    text = "The pass key is 68142. Remember it. Rivers run to the sea. " * 40
    toks = model.tokenize(text, add_bos=True)
    held = {0: 300, 1: 12, 2: 40}  # sequence 0 holds more than 256 cells: a wider n_kv
    round_ = {0: toks[300:301], 1: toks[100:130], 2: toks[200:201]}
    captures = {
        0: Segment(0, 1, 1, True, keys=True),
        1: Segment(0, 30, 4, True, keys=True),
        2: Segment(0, 1, 0, True),
    }
    key_shape = (model.info.head_dim_k, model.info.n_head_kv)
    unified = layout == "shared"
    got = {}
    for together in (True, False):
        capture = Capture(model.info.global_layers, key_shape)
        ctx = NativeContext(model, n_ctx=3 * 512, n_batch=256, n_threads=THREADS,
                            capture=capture, flash_attn=flash, n_seq_max=3,
                            kv_unified=unified,
                            n_ubatch=16 if unified and together else None)  # fmt: skip
        try:
            for seq, n in held.items():
                for at in range(0, n, 200):
                    ctx.decode(toks[at : min(at + 200, n)], at, logits=False, seq=seq)
            if together:
                steps = _steps(round_, held, captures)
                entries, runs = batch_rows(steps, tails_last)
                if unified:
                    ubatches = shared_ubatches(steps, ctx.n_ubatch, runs)
                    assert [(u.n_rows, u.n_streams) for u in ubatches] == [(16, 1), (16, 1)]
                else:
                    ubatches = stream_ubatches(steps, ctx.n_ubatch)
                    assert [(u.n_rows, u.n_streams) for u in ubatches] == [(1, 3), (29, 1)]
                caps = ctx.decode_batch(entries, ubatches=ubatches)
                logits = [ctx.logits_at(r[-1][0] + r[-1][2] - 1) for r in runs]
                if tails_last:  # compare cell for cell with the steps decoded one by one
                    caps = [_cells_as_alone(c, runs, sum(held.values())) for c in caps]
            else:
                caps, logits = [], []
                for seq, piece in sorted(round_.items()):
                    caps.append(
                        ctx.decode(piece, held[seq], logits=True, capture=captures[seq], seq=seq)
                    )
                    logits.append(ctx.last_logits().copy())
        finally:
            ctx.close()
        got[together] = (caps, logits)
    (one, l_one), (alone, l_alone) = got[True], got[False]
    for seq, a, b, la, lb in zip(sorted(round_), one, alone, l_one, l_alone, strict=True):
        n = len(round_[seq])
        assert a.visible is not None and b.visible is not None
        assert a.visible.shape[0] == n and a.visible.sum() == b.visible.sum(), seq
        width = min(a.visible.shape[1], b.visible.shape[1])
        np.testing.assert_array_equal(a.visible[:, :width], b.visible[:, :width])
        assert int(np.argmax(la)) == int(np.argmax(lb)), seq
        np.testing.assert_allclose(la, lb, atol=0.05 * float(np.abs(lb).max()))
        if captures[seq].rows:
            assert a.attn is not None and b.attn is not None
            assert a.attn.shape[0] == min(captures[seq].rows, n)
            # another batch shape changes llama.cpp's sums a little (a token alone or
            # in a ubatch of 16: 0.0042 of a probability at most measured); the same
            # rows one column over differ by 0.46, another step's by far more
            np.testing.assert_allclose(a.attn[:, :width], b.attn[:, :width], rtol=0.02, atol=5e-3)
            np.testing.assert_allclose(a.attn.sum(axis=-1), 1.0, atol=1e-3)
        else:
            assert a.attn is None and b.attn is None
        if captures[seq].keys:
            assert a.keys is not None and b.keys is not None and a.keys.shape == b.keys.shape
            cosine = (a.keys.astype(np.float32) * b.keys.astype(np.float32)).sum(axis=-1)
            assert cosine.min() > 0.99, cosine.min()  # unit keys: the same rows
