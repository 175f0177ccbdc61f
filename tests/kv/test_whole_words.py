"""Words are kept or evicted whole: a number's digits share one score."""

from __future__ import annotations

import numpy as np

from engine import make_policy
from engine.policies import Observation
from engine.policies.base import word_max


def test_word_max_gives_each_token_its_words_best_score():
    scores = np.array([0.1, 0.9, 0.2, 0.3, 0.05])
    words = np.array([0, 1, 1, 3, 3])
    assert word_max(scores, words).tolist() == [0.1, 0.9, 0.9, 0.3, 0.3]
    assert len(word_max(np.zeros(0), np.zeros(0, dtype=np.int64))) == 0


def test_keep_takes_a_number_whole():
    """SnapKV's pooling (kernel 7) around a vote on a number's first digit reaches
    only three tokens to the right: the fifth digit is lost unless words are whole."""
    ids = np.arange(200, dtype=np.int64)
    votes = np.full((1, 200), 1e-4, dtype=np.float32)
    votes[0, 100] = 1.0  # the first of five digits at 100..104
    query = Observation(ids, votes)
    words = ids.copy()
    words[100:105] = 100
    policy = make_policy("snapkv", n_sink=4, recent=32, kernel=7)
    budget = 4 + 32 + 7  # room for the pooled window and nothing more
    without = set(policy.keep(ids, budget, query).ids.tolist())
    assert 104 not in without and {100, 101, 102, 103} <= without
    with_words = set(policy.keep(ids, budget, query, words).ids.tolist())
    assert set(range(100, 105)) <= with_words
    assert len(with_words) == budget


def test_the_session_groups_digits_and_word_pieces(engine):
    text = "The pass key is 20057. Remember it, unbelievably."
    tokens = engine.model.tokenize(text, add_bos=True)
    with engine.session("streaming", 256) as s:
        list(s.feed(tokens, logits=False))
        words = s.cache.words
    pieces = [engine.model.piece(t).decode("utf-8", "replace") for t in tokens]
    groups: dict[int, str] = {}
    for piece, word in zip(pieces, words.tolist(), strict=True):
        groups[word] = groups.get(word, "") + piece
    texts = list(groups.values())
    assert "20057." in [t.strip() for t in texts], texts
    assert " unbelievably." in texts and " it," in texts and " is" in texts


class _NoKV:
    def seq_rm(self, p0: int, p1: int) -> None: ...

    def seq_shift(self, p0: int, p1: int, delta: int) -> None: ...


def _words(edges, close: bool, monkeypatch) -> list[int]:
    from engine.kv import cache as kv_cache

    monkeypatch.setattr(kv_cache, "CLOSE_WORDS", close)
    cache = kv_cache.KVCache(_NoKV(), track_cells=False)  # type: ignore[arg-type]
    cache.appended(len(edges), edges)
    return cache.words.tolist()


def test_the_punctuation_that_closes_a_word_is_kept_with_it(monkeypatch):
    """ "is", " 583", "16", ".", " Next": the period joins the number. Measured on
    RULER items at 16K and 32K tokens (SnapKV 1,024): with the period evicted the model
    read on past the number ("74907340734." for 7490734) in 4 of 4 answers; kept
    with it, all 4 stopped at a number ("7490734."; 3 right, 1 a distractor's)."""
    edges = [(True, True, False), (False, True, False), (True, True, False)]
    edges += [(False, False, True), (False, True, False)]
    assert _words(edges, True, monkeypatch) == [0, 1, 1, 1, 4]
    assert _words(edges, False, monkeypatch) == [0, 1, 1, 3, 4]


def test_punctuation_after_a_space_or_another_closer_starts_its_own_word(monkeypatch):
    edges = [(True, True, False), (False, False, True), (False, False, True)]  # "a", ".", ")"
    assert _words(edges, True, monkeypatch) == [0, 0, 2]
    edges = [(False, False, False), (False, False, True)]  # " ", "." : nothing to close
    assert _words(edges, True, monkeypatch) == [0, 1]
