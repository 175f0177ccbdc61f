"""The sampler draws what softmax(logits / T) cut to top-p says, without a model:
frequencies over many draws, across the blocks its draw walks, at the vocabulary's
ends, with a nucleus found above its floors and below them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.session.sampling import Sampler, Sampling

DRAWS = 8_000


def _logits(vocab: int, weights: dict[int, float]) -> np.ndarray:
    """Logits whose softmax gives each listed token its weight, the rest nothing."""
    x = np.full(vocab, -1e4, dtype=np.float32)
    for token, weight in weights.items():
        x[token] = math.log(weight)
    return x


def _frequencies(sampling: Sampling, logits: np.ndarray, draws: int = DRAWS) -> dict[int, float]:
    draw = Sampler(sampling)
    got = np.bincount([draw(logits) for _ in range(draws)], minlength=logits.size)
    return {int(t): got[t] / draws for t in np.flatnonzero(got)}


def _close(got: dict[int, float], want: dict[int, float], draws: int = DRAWS) -> None:
    assert set(got) == set(want), (got, want)
    for token, p in want.items():
        # five standard errors of a frequency over this many draws
        assert abs(got[token] - p) < 5 * math.sqrt(p * (1 - p) / draws) + 1e-9, (token, got)


@pytest.mark.parametrize("vocab", [3, 1024, 5000, 262_144])
def test_draws_follow_the_softmax_across_blocks_and_at_the_ends(vocab):
    """Tokens at the first and last index and in different blocks of 1,024 (a
    vocabulary that is not a multiple of it pads its last block with nothing)."""
    weights = {0: 0.2, vocab // 2: 0.5, vocab - 1: 0.3}
    draws = DRAWS if vocab < 10_000 else 3_000  # Gemma's vocabulary: a ms a draw
    got = _frequencies(Sampling(1.0, seed=3), _logits(vocab, weights), draws)
    _close(got, weights, draws)


def test_temperature_sharpens_and_flattens():
    logits = _logits(4096, {7: 0.6, 3000: 0.4})
    for t in (0.5, 2.0):
        a, b = 0.6 ** (1 / t), 0.4 ** (1 / t)
        want = {7: a / (a + b), 3000: b / (a + b)}
        _close(_frequencies(Sampling(t, seed=5), logits), want)


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    """0.5 + 0.3 reaches 0.7: the nucleus is those two, renormalized; 0.5 alone
    reaches 0.5 (the token that crosses top_p is kept, as in the paper)."""
    logits = _logits(3000, {2999: 0.5, 1500: 0.3, 1: 0.15, 2: 0.05})
    _close(_frequencies(Sampling(1.0, top_p=0.7, seed=1), logits), {2999: 0.625, 1500: 0.375})
    _close(_frequencies(Sampling(1.0, top_p=0.5, seed=1), logits), {2999: 1.0})


def test_a_nucleus_below_the_floors_is_found_among_every_token():
    """A flat tail: the nucleus at 0.99 holds tokens far below a thousandth of the
    most likely one, past every floor but the last."""
    vocab = 2048
    weights = {0: 0.5, **{t: 0.5 / (vocab - 1) for t in range(1, vocab)}}
    got = _frequencies(Sampling(1.0, top_p=0.99, seed=2), _logits(vocab, weights))
    assert abs(got[0] - 0.5 / 0.99) < 0.02 and len(got) > 1500


def test_a_seed_repeats_its_draws_and_greedy_is_the_argmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(50_000) * 2).astype(np.float32)
    for sampling in (Sampling(0.8, seed=11), Sampling(0.8, top_p=0.9, seed=11)):
        one, two = Sampler(sampling), Sampler(sampling)
        assert [one(logits) for _ in range(50)] == [two(logits) for _ in range(50)]
    assert Sampler(Sampling(0.0))(logits) == int(np.argmax(logits))


def test_logits_with_nan_or_inf_fall_back_to_the_argmax():
    logits = np.array([0.1, np.inf, 0.3], dtype=np.float32)
    assert Sampler(Sampling(1.0, seed=1))(logits) == 1
    logits = np.array([0.1, 0.2, np.nan], dtype=np.float32)
    assert Sampler(Sampling(1.0, seed=1))(logits) in (0, 1, 2)  # no exception, a token
