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


def _exact_nucleus(w: np.ndarray, top_p: float) -> set[int]:
    """The definition: tokens by weight, heaviest first (ties: lowest id first), until
    their mass reaches top_p of the whole."""
    order = sorted(range(w.size), key=lambda t: (-w[t], t))
    kept, mass, target = set(), 0.0, top_p * float(w.sum(dtype=np.float64))
    for t in order:
        kept.add(t)
        mass += float(w[t])
        if mass >= target:
            break
    return kept


@pytest.mark.parametrize("seed", range(6))
def test_the_nucleus_below_the_floors_is_the_definitions(seed):
    """The sorted-weights path (a nucleus past every floor), ties included."""
    rng = np.random.default_rng(seed)
    w = rng.choice([1.0, 0.5, 0.25, 1e-9], size=3000).astype(np.float32)
    for top_p in (0.3, 0.9, 0.999999):
        target = top_p * float(w.sum(dtype=np.float64))
        kept = np.flatnonzero(Sampler._nucleus(w, np.sort(w), target))
        assert set(kept.tolist()) == _exact_nucleus(w, top_p)


def test_a_sampler_without_floors_draws_the_same_distribution():
    logits = _logits(3000, {2999: 0.5, 1500: 0.3, 1: 0.15, 2: 0.05})
    sampler = Sampler(Sampling(1.0, top_p=0.7, seed=1))
    sampler.NUCLEUS_FLOORS, sampler.ARGSORT_MAX = (), 0  # the sorted-weights path
    got = np.bincount([sampler(logits) for _ in range(DRAWS)], minlength=3000) / DRAWS
    _close({int(t): got[t] for t in np.flatnonzero(got)}, {2999: 0.625, 1500: 0.375})


class _Fixed:
    """An RNG whose every draw is ``u``."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def test_a_draw_at_the_very_top_of_the_sums_is_a_token_with_weight():
    """u * total rounds to the total (or past a block's own sum): the last token with
    weight, never a padded or -inf one."""
    logits = _logits(4000, {5: 0.4, 2100: 0.6})  # the last block (3072-4095) is empty
    sampler = Sampler(Sampling(1.0, seed=1))
    sampler._rng = _Fixed(1.0 - 1e-17)  # rounds to 1.0
    assert sampler(logits) == 2100
    sampler._rng = _Fixed(0.0)
    assert sampler(logits) == 5


def test_extreme_temperatures_and_precise_logits():
    """A huge T is uniform over the finite logits (-inf stays impossible); float64
    logits keep their differences (1e6 +- 0.03 in float32 are one number)."""
    logits = np.array([0.0, -np.inf, 1.0, -np.inf], dtype=np.float32)
    drawn = {Sampler(Sampling(1e46, seed=s))(logits) for s in range(200)}
    assert drawn == {0, 2}
    precise = np.array([1e6, 1e6 + 0.03, 1e6 - 0.03], dtype=np.float64)
    weights = np.exp([-3.0, 0.0, -6.0])  # (logit - the largest) / 0.01
    want = {t: float(p) for t, p in enumerate(weights / weights.sum())}
    _close(_frequencies(Sampling(0.01, seed=4), precise, 4000), want, 4000)
    with np.errstate(all="raise"):  # no numpy warnings on extreme inputs
        Sampler(Sampling(1e-300, seed=1))(np.array([1.0, 2.0], dtype=np.float32))
        Sampler(Sampling(1.0, seed=1))(np.array([-3e38, 3e38], dtype=np.float32))
