"""The sampler draws what softmax(logits / T) cut to top-k, min-p and top-p says,
without a model: frequencies over many draws, across the blocks its draw walks, at the
vocabulary's ends, with a nucleus found above its floors and below them, and each draw
of the chain against its definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.session.sampling import CHAT, WHOLE, LoopGuard, Sampler, Sampling

DRAWS = 8_000


def _whole(temperature: float, **kw) -> Sampling:
    """Sampling over the whole vocabulary unless ``kw`` cuts it."""
    return Sampling(temperature, **{**WHOLE, **kw})


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
    got = _frequencies(_whole(1.0, seed=3), _logits(vocab, weights), draws)
    _close(got, weights, draws)


def test_temperature_sharpens_and_flattens():
    logits = _logits(4096, {7: 0.6, 3000: 0.4})
    for t in (0.5, 2.0):
        a, b = 0.6 ** (1 / t), 0.4 ** (1 / t)
        want = {7: a / (a + b), 3000: b / (a + b)}
        _close(_frequencies(_whole(t, seed=5), logits), want)


def test_top_p_keeps_the_smallest_set_that_reaches_it():
    """0.5 + 0.3 reaches 0.7: the nucleus is those two, renormalized; 0.5 alone
    reaches 0.5 (the token that crosses top_p is kept, as in the paper)."""
    logits = _logits(3000, {2999: 0.5, 1500: 0.3, 1: 0.15, 2: 0.05})
    _close(_frequencies(_whole(1.0, top_p=0.7, seed=1), logits), {2999: 0.625, 1500: 0.375})
    _close(_frequencies(_whole(1.0, top_p=0.5, seed=1), logits), {2999: 1.0})


def test_a_nucleus_below_the_floors_is_found_among_every_token():
    """A flat tail: the nucleus at 0.99 holds tokens far below a thousandth of the
    most likely one, past every floor but the last."""
    vocab = 2048
    weights = {0: 0.5, **{t: 0.5 / (vocab - 1) for t in range(1, vocab)}}
    got = _frequencies(_whole(1.0, top_p=0.99, seed=2), _logits(vocab, weights))
    assert abs(got[0] - 0.5 / 0.99) < 0.02 and len(got) > 1500


def test_a_seed_repeats_its_draws_and_greedy_is_the_argmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(50_000) * 2).astype(np.float32)
    for sampling in (_whole(0.8, seed=11), _whole(0.8, top_p=0.9, seed=11)):
        one, two = Sampler(sampling), Sampler(sampling)
        assert [one(logits) for _ in range(50)] == [two(logits) for _ in range(50)]
    assert Sampler(Sampling(0.0))(logits) == int(np.argmax(logits))


def test_logits_with_nan_or_inf_fall_back_to_the_argmax():
    logits = np.array([0.1, np.inf, 0.3], dtype=np.float32)
    assert Sampler(_whole(1.0, seed=1))(logits) == 1
    logits = np.array([0.1, 0.2, np.nan], dtype=np.float32)
    assert Sampler(_whole(1.0, seed=1))(logits) in (0, 1, 2)  # no exception, a token


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
    sampler = Sampler(_whole(1.0, top_p=0.7, seed=1))
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
    sampler = Sampler(_whole(1.0, seed=1))
    sampler._rng = _Fixed(1.0 - 1e-17)  # rounds to 1.0
    assert sampler(logits) == 2100
    sampler._rng = _Fixed(0.0)
    assert sampler(logits) == 5


def test_extreme_temperatures_and_precise_logits():
    """A huge T is uniform over the finite logits (-inf stays impossible); float64
    logits keep their differences (1e6 +- 0.03 in float32 are one number)."""
    logits = np.array([0.0, -np.inf, 1.0, -np.inf], dtype=np.float32)
    drawn = {Sampler(_whole(1e46, seed=s))(logits) for s in range(200)}
    assert drawn == {0, 2}
    precise = np.array([1e6, 1e6 + 0.03, 1e6 - 0.03], dtype=np.float64)
    weights = np.exp([-3.0, 0.0, -6.0])  # (logit - the largest) / 0.01
    want = {t: float(p) for t, p in enumerate(weights / weights.sum())}
    _close(_frequencies(_whole(0.01, seed=4), precise, 4000), want, 4000)
    with np.errstate(all="raise", under="ignore"):  # no numpy warnings on extreme inputs
        for chain in ({**WHOLE}, {}, {"top_k": 0}, {"min_p": 1e-30}):
            Sampler(Sampling(1e-300, seed=1, **chain))(np.array([1.0, 2.0], dtype=np.float32))
            Sampler(Sampling(1.0, seed=1, **chain))(np.array([-3e38, 3e38], dtype=np.float32))
            Sampler(Sampling(1e46, seed=1, **chain))(np.array([-3e38, 0.0], dtype=np.float32))
            Sampler(Sampling(1e5, seed=1, **chain))(np.array([-6e4, 6e4], dtype=np.float16))


def test_top_k_keeps_the_k_most_likely_and_ties_keep_the_lowest_ids():
    logits = _logits(5000, {10: 0.4, 4000: 0.3, 2000: 0.15, 3000: 0.15})
    _close(_frequencies(_whole(1.0, top_k=2, seed=1), logits), {10: 4 / 7, 4000: 3 / 7})
    want = {10: 0.4 / 0.85, 4000: 0.3 / 0.85, 2000: 0.15 / 0.85}
    _close(_frequencies(_whole(1.0, top_k=3, seed=1), logits), want)


def test_min_p_cuts_on_the_logits_as_they_are_then_the_temperature_draws():
    """min-p 0.4 of the top's 0.5 keeps 0.3 and drops 0.1; then at T 2 the draw is
    by the square roots of the two kept (after the temperature, 0.1's share of the
    top would have been 0.45: kept)."""
    logits = _logits(5000, {7: 0.5, 8: 0.3, 9: 0.1, 4999: 0.1})
    a, b = math.sqrt(0.5), math.sqrt(0.3)
    _close(_frequencies(_whole(2.0, min_p=0.4, seed=2), logits), {7: a / (a + b), 8: b / (a + b)})


def test_the_cuts_apply_top_k_then_top_p_then_min_p():
    """llama.cpp's order. Top-k 3 keeps 1, 2, 3; top-p 0.6 of their 0.9 keeps 1, 2;
    min-p 0.6 of 0.4 keeps both. Without top-k, top-p 0.5 keeps 1 and 2 before min-p
    (after min-p's renormalization it would keep 1 alone)."""
    logits = _logits(3000, {1: 0.4, 2: 0.3, 3: 0.2, 4: 0.1})
    got = _frequencies(_whole(1.0, top_k=3, top_p=0.6, min_p=0.6, seed=3), logits)
    _close(got, {1: 4 / 7, 2: 3 / 7})
    _close(_frequencies(_whole(1.0, top_p=0.5, min_p=0.6, seed=3), logits), {1: 4 / 7, 2: 3 / 7})
    _close(_frequencies(_whole(1.0, top_k=3, top_p=0.4, seed=3), logits), {1: 1.0})


def _chain_draw(x: np.ndarray, s: Sampling, u: float, argsort_max: int) -> int:
    """The definition, one token at a time: on the weights exp(x - max) in float32,
    the top_k heaviest (ties: lowest ids), the heaviest of them until their mass
    reaches top_p of theirs, those whose logit is at least ln(min_p) below the max;
    then the token where the running sum of exp((x - max) / T) over those (heaviest
    first; by id where more than ``argsort_max`` are left) passes u times their mass."""
    top = float(x.max())
    w1 = np.exp((x - top).astype(np.float32))
    kept = sorted(range(x.size), key=lambda t: (-x[t], t))[: s.top_k or x.size]
    if s.top_p < 1:
        kept.sort(key=lambda t: (-w1[t], t))
        cum = np.cumsum([float(w1[t]) for t in kept])
        kept = kept[: min(int(np.searchsorted(cum, s.top_p * cum[-1])) + 1, cum.size)]
    if s.min_p > 0:
        kept = [t for t in kept if float(x[t]) - top >= math.log(s.min_p)]
    w = np.exp((x - top).astype(np.float32) * np.float32(1 / s.temperature))
    by_id = len(kept) > argsort_max  # (a list is empty while it sorts)
    kept.sort(key=lambda t: t if by_id else (-w[t], t))
    cum = np.cumsum([float(w[t]) for t in kept])
    return kept[min(int(np.searchsorted(cum, u * cum[-1], side="right")), cum.size - 1)]


@pytest.mark.parametrize(("seed", "spread"), [(0, 3.0), (1, 3.0), (2, 0.01), (3, 300.0)])
def test_each_draw_of_the_chain_is_the_definitions(seed, spread):
    """Random logits with ties and -inf, peaked, flat (top-k's threshold narrows) and
    spread wide (it widens past what can weigh anything), the chain's settings varied,
    the draw fixed at quantiles: the same token as the definition's, on the
    few-candidates path (heaviest first) and on the whole-vocabulary one (in id
    order, where more than ``ARGSORT_MAX`` are left)."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal(6000) * spread, 3).astype(np.float32)  # ties
    x[rng.choice(6000, 200, replace=False)] = -np.inf
    for top_k, min_p, top_p, t in [(40, 0.05, 0.95, 0.8), (7, 0.0, 1.0, 1.0), (0, 0.01, 0.9, 1.5),
                                   (3000, 1e-9, 0.99, 3.0), (5, 1.0, 0.5, 0.7)]:  # fmt: skip
        s = _whole(t, top_k=top_k, min_p=min_p, top_p=top_p, seed=1)
        for argsort_max in (Sampler.ARGSORT_MAX, 0):
            sampler = Sampler(s)
            sampler.ARGSORT_MAX = argsort_max
            for u in (0.0, 0.13, 0.5, 0.77, 0.999):
                sampler._rng = _Fixed(u)
                want = _chain_draw(x, s, u, argsort_max)
                assert sampler(x) == want, (top_k, min_p, top_p, t, u)


def test_top_k_past_the_finite_logits_never_draws_an_impossible_token():
    """-inf logits, or a -1e4 fill (weight 0 at any temperature the API allows), are
    never drawn; all tied logits keep the lowest ids."""
    for fill in (-np.inf, -1e4):
        logits = np.full(262_144, fill, dtype=np.float32)
        logits[[3, 4000]] = [0.0, 1.0]
        for chain in ({"top_k": 40, "min_p": 0.0}, {}):
            drawn = {Sampler(Sampling(2.0, seed=s, **chain))(logits) for s in range(60)}
            assert drawn == {3, 4000}, (fill, chain)
    flat = np.zeros(262_144, dtype=np.float32)
    assert {Sampler(Sampling(1.0, seed=s))(flat) for s in range(60)} <= set(range(40))


def test_a_chat_draws_from_its_chain_and_refuses_bad_settings():
    """CHAT samples (llama-server's 0.8) within top-k 40; a bad top_k or min_p is
    refused by name."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(262_144) * 2).astype(np.float32)
    top40 = set(np.argsort(-x)[:40].tolist())
    sampler = Sampler(CHAT)
    assert CHAT.temperature > 0 and {sampler(x) for _ in range(200)} <= top40
    for bad in ({"top_k": -1}, {"top_k": 1.5}, {"top_k": True}, {"min_p": 1.5},
                {"min_p": float("nan")}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Sampling(1.0, **bad)


def _ends_in_a_loop(t: list[int], guard: type[LoopGuard]) -> tuple[bool, int]:
    """LoopGuard's rule read straight off its docstring, on one whole prefix: (a loop,
    the tokens that only say its first round again)."""
    for k in guard.PERIODS:
        span = max(guard.MIN_SPAN, guard.ROUNDS * k)
        if len(t) >= span and all(t[-i] == t[-i - k] for i in range(1, span - k + 1)):
            return True, 0
    for k in guard.LONG:
        rounds = 2 if k >= guard.TWICE else guard.LONG_ROUNDS
        if len(t) < rounds * k:
            break
        unit = t[-k:]
        if len(set(unit)) > max(guard.PERIODS) and all(
            t[len(t) - (r + 1) * k : len(t) - r * k] == unit for r in range(1, rounds)
        ):
            return True, (rounds - 1) * k
    return False, 0


@pytest.mark.parametrize("seed", range(20))
def test_the_loop_guard_matches_its_rule_token_by_token(seed):
    """Random answers from a few tokens with loops of every period planted: the
    guard's verdict and its repeated tokens after each token are the rule's."""
    rng = np.random.default_rng(seed)
    t: list[int] = []
    while len(t) < 300:
        if rng.random() < 0.3:
            k = int(rng.integers(1, 40))
            t += t[-k:] * int(rng.integers(1, 4)) if len(t) >= k else []
        else:
            t += rng.integers(0, 12, int(rng.integers(1, 20))).tolist()
    guard, ended = LoopGuard(), 0
    for n, token in enumerate(t, 1):
        want = _ends_in_a_loop(t[:n], LoopGuard)
        assert (guard(token), guard.repeated if want[0] else 0) == want, n
        ended += want[0]
    assert ended  # the planted loops were seen
