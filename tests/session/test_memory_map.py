"""The memory map: kept positions mapped back to exact character spans of the
source text, across chunk boundaries and multi-byte characters."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.docs_for_tests import prose

from engine import Session
from engine.session.trace import (
    EVICTED,
    RECENT,
    SCORED,
    SINK,
    UNREAD,
    TokenTrace,
    byte_spans,
)

MULTIBYTE = "Café crème, naïve — 日本語 🚀 Ελληνικά; byte-split: 𓀀 ꙮ ⸻ 🧌. "


def _doc() -> str:
    parts = []
    for i, sentence in enumerate(prose(40, seed=21).split(". ")):
        parts.append(sentence + (". " if i % 3 else ". " + MULTIBYTE))
    return "".join(parts)


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "streaming"])
def test_kept_positions_map_to_exact_spans(engine, policy):
    doc = _doc()
    tokens = engine.model.tokenize(doc)
    with engine.session(policy, 96, chunk_tokens=17) as s:  # chunk boundaries mid-word
        Session.collect(s.ask(doc, "Who sold the kettle?", max_tokens=6))
        m = s.memory_map()
        held = s.cache.ids.copy()
    i = m.segment("document")
    seg, roles = m.segments[i], m.roles[i]
    assert seg.text == doc and seg.n_tokens == len(tokens)
    # the spans tile the text in order
    assert seg.char_starts[0] == 0 and seg.char_ends[-1] == len(doc)
    assert np.array_equal(seg.char_starts[1:], seg.char_ends[:-1])
    assert "".join(doc[a:b] for a, b in zip(seg.char_starts, seg.char_ends, strict=True)) == doc
    # each token's span is its own text (a character split over byte tokens belongs
    # to the last of them; the others have empty spans)
    split = 0
    for tok, a, b in zip(tokens, seg.char_starts, seg.char_ends, strict=True):
        piece = engine.model.piece(tok, special=True)
        try:
            assert doc[a:b] == piece.decode("utf-8"), (tok, piece, doc[a:b])
        except UnicodeDecodeError:
            split += 1
    assert split > 0, "the document has characters the tokenizer splits into bytes"
    # held ids are exactly the tokens not evicted, and they re-tokenize to themselves
    doc_ids = np.arange(seg.first_id, seg.first_id + seg.n_tokens)
    kept = np.isin(doc_ids, held)
    assert np.array_equal(kept, roles != EVICTED)
    assert 0 < kept.sum() < len(tokens)
    for idx in np.flatnonzero(kept)[:200]:
        a, b = seg.char_starts[idx], seg.char_ends[idx]
        if b > a and engine.model.piece(tokens[idx]).decode("utf-8", "ignore") == doc[a:b]:
            again = engine.model.tokenize(doc[:b])
            assert again[idx] == tokens[idx]
    # roles: sinks first, then what the policy keeps
    assert UNREAD not in roles
    if policy == "h2o":  # no sinks (n_sink 0, as in the paper): the first token stays
        assert roles[0] in (SCORED, EVICTED)  # only if its attention made it heavy
    else:
        assert roles[0] in (SINK, SCORED)
    if policy == "streaming":
        assert not (roles == SCORED).any() and (roles == RECENT).any()
    else:
        kept_scores = m.scores[i][roles == SCORED]
        assert len(kept_scores) and np.isfinite(kept_scores).all()


def test_map_during_prefill_answer_and_follow_up(engine):
    doc = prose(80, seed=22)
    with engine.session("snapkv", 128) as s:
        maps = []
        for event in s.ask(doc, "Who repaired the bicycle?", max_tokens=8):
            if type(event).__name__ == "Progress" and not maps:
                maps.append(s.memory_map())
            if type(event).__name__ == "Done":
                done = event
        first = maps[0]
        d = first.segment("document")
        assert (first.roles[d] == UNREAD).any(), "the rest of the document is not read yet"
        assert first.tokens_seen < s.memory_map().tokens_seen
        end = s.memory_map()
        answer = end.segments[end.segment("answer")]
        assert answer.text.startswith(done.text) and answer.n_tokens == done.stats.generated_tokens
        Session.collect(s.follow_up("And who sold the kettle?", max_tokens=4))
        names = [seg.name for seg in s.memory_map().segments]
        assert names == ["prompt", "document", "question", "answer", "turn", "answer"]


def test_byte_spans_degrade_instead_of_failing():
    starts, ends = byte_spans([b" Hello", b" world"], b"Hello world")  # a space prefix
    assert starts.tolist() == [0, 5] and ends.tolist() == [5, 11]
    starts, ends = byte_spans([b"ab", b"cd"], b"abcdef")  # pieces that do not match
    assert ends[-1] == 6 and (np.diff(starts) >= 0).all()


def test_answer_spans_are_made_when_read_and_match_a_whole_text():
    """Answer tokens cost O(1) as they come; whatever reads the segments sees the same
    text and spans as a segment added whole, multi-byte characters split across
    tokens included, and the next segment starts after the answer's last token."""
    pieces = [b"Caf", b"\xc3", b"\xa9 ", "日本".encode(), b"\xf0\x9f", b"\x9a\x80 ok"]
    trace = TokenTrace(lambda t: pieces[t])
    trace.add("question", "Q?", [0])
    trace.start_answer()
    for t in range(len(pieces)):
        trace.add_answer_token(t)
        assert trace.n_ids == 2 + t  # the question's one token, then the answer's
    whole = TokenTrace(lambda t: pieces[t])
    whole.add("answer", None, list(range(len(pieces))))
    answer, expected = trace.segments[-1], whole.segments[0]
    assert answer.text == expected.text == "Café 日本🚀 ok"
    assert answer.char_starts.tolist() == expected.char_starts.tolist()
    assert answer.char_ends.tolist() == expected.char_ends.tolist()
    trace.add_answer_token(0)  # read mid-answer, then one more token: spans follow
    assert trace.segments[-1].n_tokens == len(pieces) + 1
    trace.add("turn", "next", [1])
    assert [s.first_id for s in trace.segments] == [0, 1, 1 + len(pieces) + 1]
    assert trace.n_ids == 1 + len(pieces) + 2
    trace.truncate(3)  # into the answer: its first two tokens stay
    assert trace.segments[-1].text == "Caf" and trace.n_ids == 3
