"""Every policy through the same checks, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ConfigError, make_policy
from engine.policies import POLICIES, Keys, Observation, Policy
from engine.policies.base import max_pool, realign

EVICTING = [name for name, cls in POLICIES.items() if cls.evicts]


def _observe_random(policy, ids, rows=8, seed=0):
    rng = np.random.default_rng(seed)
    attn = rng.random((rows, len(ids))).astype(np.float32)
    attn /= attn.sum(axis=1, keepdims=True)
    policy.observe(Observation(ids, attn))
    return attn


@pytest.mark.parametrize("name", EVICTING)
def test_keep_respects_budget_sinks_and_recent(name):
    policy = make_policy(name)
    ids = np.arange(1000, dtype=np.int64)
    if policy.needs().attention:
        _observe_random(policy, ids)
    budget = 200
    kept = policy.keep(ids, budget).ids
    assert len(kept) == budget
    assert np.all(np.diff(kept) > 0), "kept ids stay in order"
    assert set(kept) <= set(ids)
    assert set(ids[: policy.n_sink]) <= set(kept)
    recent = policy.recent_for(budget)
    assert set(ids[len(ids) - recent :]) <= set(kept)


@pytest.mark.parametrize("name", EVICTING)
def test_nothing_evicted_under_budget(name):
    policy = make_policy(name)
    ids = np.arange(50, dtype=np.int64)
    assert np.array_equal(policy.keep(ids, 64).ids, ids)


@pytest.mark.parametrize("name", EVICTING)
def test_budget_below_protected_is_a_clear_error(name):
    policy = make_policy(name, n_sink=10, recent=10)
    with pytest.raises(ConfigError, match="cannot hold"):
        policy.keep(np.arange(100, dtype=np.int64), 15)


def test_streaming_keeps_sinks_and_newest():
    kept = make_policy("streaming", n_sink=4).keep(np.arange(100, dtype=np.int64), 20).ids
    assert list(kept) == [0, 1, 2, 3, *range(84, 100)]


def test_h2o_accumulates_over_every_observation():
    policy = make_policy("h2o", recent_ratio=0.5)
    ids = np.arange(10, dtype=np.int64)
    hot = np.zeros((1, 10), np.float32)
    hot[0, 2] = 1.0
    policy.observe(Observation(ids[:5], hot[:, :5]))
    later = np.zeros((3, 11), np.float32)
    later[:, 6] = 0.4
    policy.observe(Observation(np.arange(11, dtype=np.int64), later))
    scores = policy.score(np.arange(11, dtype=np.int64), None)
    assert scores[2] == pytest.approx(1.0)
    assert scores[6] == pytest.approx(1.2)
    kept = policy.keep(np.arange(11, dtype=np.int64), 4).ids
    # half recent (2 newest), half heavy hitters (6 and 2)
    assert list(kept) == [2, 6, 9, 10]


def test_snapkv_votes_of_last_window_rows_are_pooled():
    policy = make_policy("snapkv", n_sink=0, recent=2, window=2, kernel=3)
    ids = np.arange(20, dtype=np.int64)
    old = np.zeros((5, 20), np.float32)
    old[:, 15] = 1.0  # outside the window: must not count
    policy.observe(Observation(ids, old))
    new = np.zeros((2, 20), np.float32)
    new[:, 7] = 1.0
    policy.observe(Observation(ids, new))
    scores = policy.score(ids, None)
    assert scores[6] == scores[7] == scores[8] == pytest.approx(2.0)  # pooled neighbours
    assert scores[15] == 0
    kept = policy.keep(ids, 5).ids
    assert list(kept) == [6, 7, 8, 18, 19]


def test_question_overrides_the_window():
    policy = make_policy("snapkv", n_sink=0, recent=1, kernel=1)
    ids = np.arange(10, dtype=np.int64)
    _observe_random(policy, ids)
    q = np.zeros((3, 10), np.float32)
    q[:, 4] = 1.0
    kept = policy.keep(ids, 2, Observation(ids, q)).ids
    assert list(kept) == [4, 9]


def test_tova_uses_only_the_newest_row():
    policy = make_policy("tova")
    ids = np.arange(6, dtype=np.int64)
    attn = np.zeros((2, 6), np.float32)
    attn[0, 1] = 1.0
    attn[1, 3] = 1.0
    policy.observe(Observation(ids, attn))
    assert list(policy.keep(ids, 2).ids) == [3, 5]


def test_reset_forgets():
    policy = make_policy("h2o")
    ids = np.arange(4, dtype=np.int64)
    _observe_random(policy, ids)
    policy.reset()
    assert not policy.score(ids, None).any()


def test_realign_and_pool():
    values = np.array([[1.0, 2.0, 3.0]])
    out = realign(values, np.array([2, 5, 9]), np.array([5, 6, 9]))
    assert out.tolist() == [[2.0, 0.0, 3.0]]
    assert max_pool(np.array([0, 0, 5, 0, 0, 0.0]), 3).tolist() == [0, 5, 5, 5, 0, 0]


def test_unknown_policy_and_bad_settings():
    with pytest.raises(ConfigError, match="unknown policy"):
        make_policy("lru")
    with pytest.raises(ConfigError):
        make_policy("snapkv", kernel=4)
    with pytest.raises(ConfigError):
        make_policy("streaming", n_sink=-1)


def test_each_class_carries_its_label_help_and_kind():
    from engine.policies import evicts, help_lines, keeps_all, label, policy_class

    labels = [cls.label for cls in POLICIES.values()]
    assert len(set(labels)) == len(labels) and POLICIES["full"].label == "Full cache"
    for name, cls in POLICIES.items():
        assert cls.name == name and policy_class(name) is cls
        assert cls.help and "\n" not in cls.help and len(cls.help) < 120, name
        if cls.evicts:  # the help names the paper (author, year) as the README does
            assert "et al. 20" in cls.help and cls.label in cls.help, name
        assert evicts(name) == cls.evicts and keeps_all(name) == (not cls.evicts)
        assert f"{name}: {cls.help}" in help_lines()
    # names that are no policy (a llama-cpp-python row of a bench report)
    assert not evicts("llama-cpp-python") and not keeps_all("llama-cpp-python")
    assert label("llama-cpp-python") == "llama-cpp-python"
    with pytest.raises(ConfigError, match="unknown policy 'lru'; choose one of full"):
        policy_class("lru")


def test_keep_returns_the_scores_that_chose():
    """The kept ids come with the scores of every held id (no side channel)."""
    ids = np.arange(40, dtype=np.int64)
    policy = make_policy("snapkv", n_sink=2, recent=2, window=4, kernel=1)
    q = np.zeros((4, 40), dtype=np.float32)
    q[:, 10] = 1.0
    kept = policy.keep(ids, 8, Observation(ids, q))
    assert kept.scored is not None and kept.scores is not None
    assert np.array_equal(kept.scored, ids) and len(kept.scores) == 40
    assert 10 in kept.ids and kept.scores[10] == kept.scores.max()
    assert policy.keep(ids, 64).scores is None  # everything fits: nothing scored


def test_the_loop_guard_stops_runaway_answers_and_not_numbers():
    from engine.session.sampling import LoopGuard

    def first_stop(tokens: list[int]) -> int | None:
        guard = LoopGuard()
        return next((i for i, t in enumerate(tokens) if guard(t)), None)

    digit = {str(d): 100 + d for d in range(10)}
    runaway = [digit[c] for c in "4831" + "6" * 40]  # issue 27's answer
    assert first_stop(runaway) == 4 + 16 - 1
    assert first_stop([7, 8] * 30) == 15  # a two-token unit, 8 rounds
    assert first_stop([1, 2, 3, 4] * 8) == 31
    assert first_stop([digit[c] for c in "1000000000000000"]) is None  # 15 zeros
    assert first_stop([digit[c] for c in "3141592653589793238462643383279"]) is None
    assert first_stop(list(range(200))) is None


def _observe(policy, ids, seed=0):
    """What the policy reads, made up: attention rows or unit keys of ``ids``."""
    rng = np.random.default_rng(seed)
    if policy.reads == "attention":
        _observe_random(policy, ids, seed=seed)
    elif policy.reads == "keys":
        keys = rng.normal(size=(len(ids), 2, 1, 8)).astype(np.float32)
        keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
        policy.observe(Keys(ids, keys.astype(np.float16)))


@pytest.mark.parametrize("name", list(POLICIES))
def test_state_dict_carries_what_it_observed_to_a_new_instance(name):
    """The contract saved caches use: a fresh policy given ``state_dict`` scores as
    the one it came from."""
    ids = np.arange(300, dtype=np.int64)
    policy = make_policy(name)
    _observe(policy, ids)
    state = policy.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    again = make_policy(name)
    again.load_state_dict({k: v.copy() for k, v in state.items()})
    assert np.array_equal(again.score(ids, None), policy.score(ids, None))


@pytest.mark.parametrize("name", list(POLICIES))
def test_each_parameter_declares_its_label_help_and_range(name):
    cls = POLICIES[name]
    for t in cls.tunables():
        assert t.param.label and t.param.help and t.param.low <= t.default <= t.param.high
        assert t.check(str(t.default)) == t.default and type(t.check(t.default)) is t.kind
        with pytest.raises(ConfigError, match=t.name):
            t.check(t.param.high + 1)
        with pytest.raises(ConfigError, match=f"{cls.name}: {t.name}"):
            cls(**{t.name: t.param.high + 1})
    needs = cls.needs()
    assert needs.attention == (cls.reads == "attention") and needs.keys == (cls.reads == "keys")
    assert needs.hooked == (cls.reads != "nothing")


class _ReadsKeys(Policy):
    """A policy that scores keys (as KeyDiff does)."""

    name = "reads-keys"
    reads = "keys"

    def score(self, ids, query):
        return np.zeros(len(ids))


def test_needs_decide_capture_and_flash_attention_in_one_place():
    from engine.policies import needs_of

    snap, none, keys = POLICIES["snapkv"].needs(), POLICIES["streaming"].needs(), _ReadsKeys.needs()
    assert snap.cache().flash_attn is None and snap.cell_map and not snap.history  # llama.cpp's
    assert snap.cache().flash_alone() is False  # a session's own context: off (kvmemory.py)
    assert snap.cache(flash_attn="on").flash_alone() is True
    assert none.cache().flash_alone() is None
    assert snap.cache(kv_type="q8_0").flash_attn is False  # a quantized K: probabilities read
    assert keys.cache().flash_attn is None and not keys.cell_map and keys.history  # llama.cpp's
    assert none.cache(kv_type="q8_0").flash_attn is True and not none.hooked
    assert POLICIES["h2o"].needs().history  # every row adds to its sums
    every = needs_of()
    assert every.attention and every.history and every == needs_of(list(POLICIES))
    assert (keys | snap).flags() == (True, True, True)
    with pytest.raises(ConfigError, match="flash attention off"):
        snap.cache(flash_attn="on", kv_type="q4_0")


def test_the_loop_guard_stops_a_sentence_said_again_and_keeps_its_first_round():
    """Issue 36: "The pass key is 68142. Remember it. 68142 is the pass key. The pass key
    is 68142. Remember it. ..." ran to max tokens; units of a sentence or two."""
    from engine.session.sampling import LoopGuard

    sentence = list(range(200, 220))  # 20 tokens, all different
    guard = LoopGuard()
    stops = [i for i, tok in enumerate(sentence * 3) if guard(tok)]
    assert stops[0] == 39 and guard.repeated == 20  # twice: the second round is dropped
    short = [5, 6, 7, 8, 9, 10]  # 6 tokens: three rounds
    guard = LoopGuard()
    stops = [i for i, tok in enumerate(short * 4) if guard(tok)]
    assert stops[0] == 17 and guard.repeated == 12
    once_more = [*range(300, 330), *range(300, 310), *range(400, 440)]  # a phrase again, once
    guard = LoopGuard()
    assert not any(guard(tok) for tok in once_more)


def test_with_an_answer_prefix_the_answer_ends_after_its_first_sentence():
    """Issue 36: a question with an answer prefix stops after its first complete
    sentence; a list marker, a decimal or an unfinished sentence do not end it."""
    from engine.session.sampling import SENTENCE_END, StopMatcher, with_sentence_stop

    def run(pieces, stops=(SENTENCE_END,)):
        m = StopMatcher(stops)
        out = ""
        for piece in pieces:
            text, hit = m.feed(piece)
            out += text
            if hit:
                return out, True
        return out + m.flush(), False

    assert run([" 6", "8", "1", "4", "2", ".", " Remember", " it."]) == (" 68142.", True)
    assert run([" Hiroko", " Iwasaki", ",", " the", " lead", ".\n", "The"]) == (
        " Hiroko Iwasaki, the lead.\n",
        True,
    )  # the token is kept whole, as the cache keeps it
    assert run([" 3", ".", "14", " is", " pi"]) == (" 3.14 is pi", False)
    assert run([" 1", ".", " Open", " it", ".", " 2", "."]) == (" 1. Open it.", True)
    assert run([' "KQ7-4MX."', " Then"]) == (' "KQ7-4MX."', True)
    assert run([" 58316.", " Next"], stops=("\n\n",)) == (" 58316. Next", False)  # no prefix
    assert with_sentence_stop(("\n\n",), "The key is") == ("\n\n", SENTENCE_END)
    assert with_sentence_stop(("\n\n",), "  ") == ("\n\n",)
