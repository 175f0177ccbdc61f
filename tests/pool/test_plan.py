"""The pool's scheduling step as a function (issue 37, engine/pool/plan.py), without a
model, a thread or a clock: fairness, starvation, the batch's tokens and the free
cells, prompt chunks beside answers, a full cache, and the loop around it."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from engine.native.kvmemory import CacheSettings
from engine.native.model import Model
from engine.pool.plan import MAX_SKIPS, TILE_ROWS, Room, Waiting, decodes, plan


def _seqs(p) -> list[int]:
    return [w.seq for w in p.batch]


def test_answers_go_first_then_prompt_chunks_oldest_first():
    waiting = [Waiting(0, 256, 0), Waiting(1, 1, 5), Waiting(2, 64, 1), Waiting(3, 1, 2)]
    p = plan(waiting, Room(n_batch=512, free=4096))
    assert _seqs(p) == [3, 1, 0, 2]  # answers by age, then chunks by age
    assert p.left == () and p.too_big == ()


def test_the_batch_holds_at_most_n_batch_tokens_and_the_free_cells():
    waiting = [Waiting(i, 200, i) for i in range(4)]
    p = plan(waiting, Room(n_batch=512, free=4096))
    assert _seqs(p) == [0, 1] and [w.seq for w in p.left] == [2, 3]
    p = plan(waiting, Room(n_batch=512, free=250))  # a full pool: one chunk's room
    assert _seqs(p) == [0] and all(w.skipped == 1 for w in p.left)
    streams = plan(waiting, Room(n_batch=512, free=None))  # own cells: only n_batch counts
    assert _seqs(streams) == [0, 1]


def test_a_full_cache_runs_nothing_and_ages_nothing():
    waiting = [Waiting(0, 64, 0, skipped=1), Waiting(1, 1, 1)]
    p = plan(waiting, Room(n_batch=512, free=0))
    assert p.batch == () and {w.seq: w.skipped for w in p.left} == {0: 1, 1: 0}


def test_a_step_no_batch_can_hold_is_refused_not_left_waiting():
    p = plan([Waiting(0, 600, 0), Waiting(1, 1, 1)], Room(n_batch=512, free=4096))
    assert _seqs(p) == [1] and [w.seq for w in p.too_big] == [0]


def test_no_step_starves_behind_newer_answers():
    """Eight sequences writing answers and one long prompt chunk: the chunk is left
    out while the batch is full of answers, then goes first after MAX_SKIPS."""
    order = itertools.count()
    chunk = Waiting(99, 500, next(order))
    answers = [Waiting(i, 1, next(order)) for i in range(8)]
    ran_at = None
    for batch_no in range(10):
        p = plan([chunk, *answers], Room(n_batch=504, free=10_000))
        if 99 in _seqs(p):
            ran_at = batch_no
            break
        [chunk] = [w for w in p.left if w.seq == 99]
        answers = [Waiting(w.seq, 1, next(order)) for w in p.batch]  # they ask again
    assert ran_at == MAX_SKIPS  # left out exactly MAX_SKIPS times, then first


def test_every_waiting_sequence_runs_within_a_few_batches():
    """Fairness under load: 16 sequences of mixed steps, a batch of 256 tokens: each
    runs at most 1 + MAX_SKIPS batches after it asked."""
    order = itertools.count()
    sizes = [1, 1, 1, 1, 32, 64, 128, 200, 1, 1, 16, 250, 1, 1, 8, 100]
    waiting = [Waiting(i, n, next(order)) for i, n in enumerate(sizes)]
    asked = dict.fromkeys(range(16), 0)
    worst = 0
    for batch_no in range(60):
        p = plan(waiting, Room(n_batch=256, free=None))
        assert sum(w.tokens for w in p.batch) <= 256 and p.batch
        for w in p.batch:
            worst = max(worst, batch_no - asked[w.seq])
            asked[w.seq] = batch_no + 1
        waiting = [*p.left, *(Waiting(w.seq, w.tokens, next(order)) for w in p.batch)]
    assert worst <= 1 + MAX_SKIPS


def test_cancellation_is_the_caller_leaving_the_queue():
    """A cancelled step is one the loop takes out of ``waiting``: the plan of the
    rest is what it would have been without it."""
    waiting = [Waiting(0, 1, 0), Waiting(1, 300, 1), Waiting(2, 300, 2)]
    without = [w for w in waiting if w.seq != 1]
    assert _seqs(plan(without, Room(512, 4096))) == [0, 2]


def _decode_seqs(batch: list[Waiting], apart: bool, n_ubatch: int = 512) -> list[list[int]]:
    """Each decode's sequences, in batch order."""
    return [[w.seq for w in part] for part in decodes(batch, apart, n_ubatch)]


def test_answers_and_prompt_chunks_are_decoded_apart_where_attention_is_tiled():
    """A shared pool on the CPU: a batch of answers and a prompt chunk whose ubatch
    reaches ggml-cpu's tiled flash attention (``TILE_ROWS`` rows) is two decodes, the
    answers first, each part in batch order; otherwise one decode as planned."""
    answers = [Waiting(0, 1, 3), Waiting(1, 1, 4)]
    chunk = Waiting(2, TILE_ROWS - 2, 0)  # with the answers: exactly a tile of rows
    batch = [*answers, chunk, Waiting(3, 5, 1)]
    assert _decode_seqs(batch, apart=True) == [[0, 1], [2, 3]]
    assert _decode_seqs(batch, apart=False) == [[0, 1, 2, 3]]
    small = [*answers, Waiting(2, TILE_ROWS - 3, 0)]  # under a tile: one kernel reads each row
    assert _decode_seqs(small, apart=True) == [[0, 1, 2]]
    assert _decode_seqs(batch, apart=True, n_ubatch=TILE_ROWS - 1) == [[0, 1, 2, 3]]
    # the answers lie in the last ubatch (logits rows go last): 2 rows there, not a tile
    assert _decode_seqs([*answers, Waiting(2, 512, 0)], apart=True) == [[0, 1, 2]]
    assert _decode_seqs([*answers, Waiting(2, 600, 0)], apart=True) == [[0, 1], [2]]
    assert _decode_seqs(answers, apart=True) == [[0, 1]]  # nothing to part
    assert _decode_seqs([chunk, Waiting(3, 5, 1)], apart=True) == [[2, 3]]
    assert decodes([], apart=True, n_ubatch=512) == []


def test_a_chunk_that_goes_first_after_its_skips_is_still_decoded_in_its_round():
    """A prompt chunk left out ``MAX_SKIPS`` times goes first in the batch (``plan``);
    decoded apart, it follows the answers in that round's second call."""
    waiting = [Waiting(0, 1, 5), Waiting(1, 100, 0, skipped=MAX_SKIPS), Waiting(2, 1, 6)]
    p = plan(waiting, Room(n_batch=512, free=4096))
    assert _seqs(p) == [1, 0, 2]
    assert _decode_seqs(list(p.batch), apart=True) == [[0, 2], [1]]


def test_tiled_attention_is_where_ggml_cpu_runs_flash_attention_over_f16():
    """``CacheSettings.tiles_queries``: the CPU, flash attention on or llama.cpp's
    choice, K and V f16; not on a GPU, with flash attention off, or over a quantized
    cache (ggml-cpu's tiled kernel reads f16 or f32 only)."""
    decide = CacheSettings.decide
    assert decide(reads_attention=True).tiles_queries(on_gpu=False)
    assert not decide(reads_attention=True).tiles_queries(on_gpu=True)
    assert not decide(reads_attention=False, flash_attn="off").tiles_queries(on_gpu=False)
    assert not decide(reads_attention=False, kv_type="q8_0").tiles_queries(on_gpu=False)
    # where the pool asks it: every layer (-1) is on a GPU; a build without GPU support is not
    for layers, offload, on in (
        (-1, True, True),
        (3, True, True),
        (0, True, False),
        (5, False, False),
    ):
        assert Model.on_gpu.fget(SimpleNamespace(n_gpu_layers=layers, gpu_offload=offload)) is on
