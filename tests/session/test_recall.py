"""Follow-ups bring back evicted document text (engine/recall.py, Session.follow_up).

The unit tests rank windows of made-up tokens; the session tests read a real-text
document with planted facts into a small budget, summarize it (so the first
compression is not steered by the questions), then ask about the facts.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers.margins import check

from engine import Cancelled, Engine, Recalled, Sampling, Session, Token
from engine.bench import multiturn
from engine.native.kvmemory import pad
from engine.session.recall import Recall, words
from engine.session.trace import EVICTED, RECALLED

WORDS = [f"w{i}" for i in range(12)]  # filler words


def _doc(n: int, planted: dict[int, str]) -> tuple[list[int], dict[int, bytes]]:
    """``n`` tokens of filler words; ``planted``: token index -> a word put there."""
    vocab: dict[str, int] = {}
    tokens = []
    for i in range(n):
        word = planted.get(i, WORDS[i % len(WORDS)])
        tokens.append(vocab.setdefault(word, len(vocab)))
    return tokens, {t: f" {w}".encode() for w, t in vocab.items()}


def test_words_drop_stop_words_and_case() -> None:
    assert words("What is the Pass key of ROOM 204?") == ["pass", "key", "room", "204"]


def test_pick_finds_the_window_with_the_question_terms() -> None:
    tokens, pieces = _doc(1000, {700: "lighthouse", 701: "keeper", 702: "Mirela"})
    recall = Recall(tokens, pieces.__getitem__, window=64)
    held = np.zeros(1000, dtype=bool)
    got = recall.pick("Who is the lighthouse keeper?", held, 128)
    assert got, "no window picked"
    assert any(e.start <= 700 and e.stop > 702 for e in got)
    assert sum(e.stop - e.start for e in got) <= 128
    assert all(e.score > 0 for e in got)


def test_pick_skips_held_windows_and_unmatched_questions() -> None:
    tokens, pieces = _doc(600, {300: "archive", 301: "code"})
    recall = Recall(tokens, pieces.__getitem__, window=64)
    held = np.ones(600, dtype=bool)
    assert recall.pick("What is the archive code?", held, 256) == []  # nothing was evicted
    held[:] = False
    assert recall.pick("What about the weather?", held, 256) == []  # no shared term
    assert recall.pick("archive code", held, 0) == []
    assert Recall([], pieces.__getitem__).pick("archive", np.zeros(0, dtype=bool), 64) == []


def test_pick_respects_the_limit_and_merges_overlaps() -> None:
    planted = {i: "needle" for i in range(100, 400, 7)}
    tokens, pieces = _doc(1000, planted)
    recall = Recall(tokens, pieces.__getitem__, window=64)
    got = recall.pick("needle", np.zeros(1000, dtype=bool), 200)
    assert sum(e.stop - e.start for e in got) <= 200
    assert all(a.stop < b.start for a, b in itertools.pairwise(got))  # merged, sorted
    assert recall.host_bytes > recall.tokens.nbytes


@pytest.fixture(scope="module")
def conversation_doc(engine: Engine) -> tuple[str, list[multiturn.Fact]]:
    facts = multiturn.facts_for(0)
    return multiturn.document(engine, 1500, facts, offset=0), facts


def _summarize(s: Session, doc: str) -> None:
    for _ in s.summarize(doc, max_tokens=16):
        pass


def _ask(s: Session, fact: multiturn.Fact) -> tuple[str, list[Recalled]]:
    text, recalled = "", []
    for event in s.follow_up(fact.question, answer_prefix=fact.answer_prefix, max_tokens=10):
        if isinstance(event, Recalled):
            recalled.append(event)
        if isinstance(event, Token):
            text += event.text
    return text, recalled


def test_follow_up_after_summary_recovers_evicted_facts(
    engine: Engine, conversation_doc: tuple[str, list[multiturn.Fact]]
) -> None:
    doc, facts = conversation_doc
    with engine.session("snapkv", 256) as s:
        _summarize(s, doc)
        n_ctx = s.ctx.n_ctx
        assert s.stats.evicted_tokens > 1000  # the document did not fit
        hits = 0
        previous: np.ndarray = np.zeros(0, dtype=np.int64)
        for fact in facts:
            answer, recalled = _ask(s, fact)
            hits += fact.hit(answer)
            assert len(recalled) == 1 and recalled[0].tokens > 0
            assert s.stats.recalled_tokens > 0 and s.stats.recall_host_bytes > 0
            # the previous excerpt left the cache; this one is in it
            assert not np.isin(previous, s.cache.ids).any()
            previous = s.turns.copy_ids.copy()
            assert np.isin(previous, s.cache.ids).all()
            # bounded: the cache never grew past budget + chunk
            assert s.ctx.n_ctx == n_ctx <= pad(s.capacity)
            assert s.stats.cells_peak <= s.capacity
        m = s.memory_map()
        roles = m.roles[m.segment("document")]
        assert (roles == RECALLED).sum() > 0 and (roles == EVICTED).sum() > 0
        assert any(seg.name == "recalled" for seg in m.segments)
    check("facts answered of 4 after a summary", hits, ">=", 3)


def test_no_recall_when_nothing_was_evicted_or_disabled(
    engine: Engine, conversation_doc: tuple[str, list[multiturn.Fact]]
) -> None:
    doc, facts = conversation_doc
    with engine.session("snapkv", 2048) as s:  # the whole document fits
        _summarize(s, doc)
        _, recalled = _ask(s, facts[0])
        assert recalled == [] and s.stats.recalled_tokens == 0
    with engine.session("snapkv", 256, recall_tokens=0) as s:
        _summarize(s, doc)
        _, recalled = _ask(s, facts[0])
        assert recalled == []


def test_cancelled_follow_up_is_rolled_back_and_the_chat_goes_on(
    engine: Engine, conversation_doc: tuple[str, list[multiturn.Fact]]
) -> None:
    doc, facts = conversation_doc
    with engine.session("snapkv", 256) as s:
        _summarize(s, doc)
        s.reader.settle()  # the summary's last token, decoded as the turn begins
        before = s.cache.ids.copy()
        events = s.follow_up(facts[0].question, answer_prefix=facts[0].answer_prefix)
        with pytest.raises(Cancelled):
            for event in events:
                if isinstance(event, Recalled):
                    s.cancel()  # stop while the turn is being read
        assert s.can_follow_up
        kept = s.cache.ids
        assert kept.max() < before.max() + 1  # no token of the stopped turn is held
        assert np.isin(kept, before).all()
        assert s.ctx.pos_max() == s.cache.next_lpos - 1  # llama.cpp agrees
        answer, _ = _ask(s, facts[0])
        assert facts[0].hit(answer)


def test_follow_up_after_an_answer_that_filled_the_cache(
    engine: Engine, conversation_doc: tuple[str, list[multiturn.Fact]]
) -> None:
    """The question needs free cells to vote from; an answer that filled the cache to
    its last cell left none (found by the benchmark: "no free KV cell")."""
    doc, facts = conversation_doc
    with engine.session("h2o", 192) as s:  # budget + chunk = 256 cells: no rounding slack
        _summarize(s, doc)
        for _ in range(4):
            s.reader.settle()  # an answer's last token is decoded when the chat goes on
            if s.cache.n_used >= s.capacity:
                break
            room = s.capacity - s.cache.n_used
            for _ in s.generate(max_tokens=room, sampling=Sampling(), stops=()):
                pass
        assert s.cache.n_used == s.capacity == s.ctx.n_ctx
        answer, _ = _ask(s, facts[0])
        assert answer.strip()


def test_recall_first_brings_back_for_the_first_question_too(
    engine: Engine, conversation_doc: tuple[str, list[multiturn.Fact]]
) -> None:
    """Issue 34: with ``recall_first`` the first question's answer follows the evicted
    windows that match it, as a follow-up's does; the request's clock still starts
    with its read, and without the option (or with nothing evicted) none come back."""
    doc, facts = conversation_doc
    fact = facts[1]
    for recall_first in (False, True):
        with engine.session("snapkv", 256, recall_first=recall_first) as s:
            events = list(s.ask(doc, fact.question, answer_prefix=fact.answer_prefix,
                                max_tokens=12))  # fmt: skip
            recalled = [e for e in events if isinstance(e, Recalled)]
            stats = s.stats
            m = s.memory_map()
        assert stats.evicted_tokens > 1000
        assert bool(recalled) == recall_first == (stats.recalled_tokens > 0)
        assert stats.first_token_s >= stats.prefill_s  # timed from the request's start
        assert any(seg.name == "recalled" for seg in m.segments) == recall_first
        assert stats.cells_peak <= s.capacity
    with engine.session("snapkv", 4096, recall_first=True) as s:  # nothing evicted
        events = list(s.ask(doc, fact.question, answer_prefix=fact.answer_prefix, max_tokens=4))
        assert not any(isinstance(e, Recalled) for e in events)
