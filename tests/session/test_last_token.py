"""An answer's last token is not decoded until the cache is used again: nothing reads
what it predicts (llama-server does not decode it either), so a request of N
answer tokens costs N - 1 decodes, and a follow-up finds the cache as it was
(generate.py, ``Reader.settle``)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.decoded import record_decodes
from helpers.docs_for_tests import prose

from engine import Prompt, Token
from engine.errors import ConfigError, EngineError
from engine.session.sampling import Sampling

N = 6  # answer tokens


def _prompt() -> Prompt:
    return Prompt("", prose(12), "\n\nIn short,", (), True)


def test_the_last_token_is_decoded_when_the_chat_goes_on(engine) -> None:
    with engine.session("snapkv", 1024) as s:
        fed = record_decodes(s)
        result = s.collect(s.run(_prompt(), max_tokens=N, stops=()))
        assert result.reason == "length" and result.stats.generated_tokens == N
        n_prompt = result.stats.prompt_tokens
        last = s.reader.pending
        assert last is not None
        assert len(fed) == n_prompt + N - 1 == s.cache.n_used  # one decode less
        assert s.trace.n_ids == s.cache.next_id + 1  # its id is waiting for it
        s.collect(s.follow_up("And then?", max_tokens=2))
        assert fed[n_prompt + N - 1] == last  # decoded first, at its own place
        assert list(s.cache.ids) == list(range(len(fed)))  # nothing evicted: in order
        assert s.ctx.pos_max() == s.cache.next_lpos - 1  # llama.cpp agrees


def test_a_saved_cache_holds_the_whole_answer(engine) -> None:
    with engine.session("snapkv", 1024) as s:
        result = s.collect(s.run(_prompt(), max_tokens=N, stops=()))
        saved = s.snapshot()
        assert s.reader.pending is None
        assert s.cache.n_used == result.stats.prompt_tokens + N
    with engine.session("snapkv", 1024) as t:
        t.restore(saved)
        assert t.cache.n_used == result.stats.prompt_tokens + N


def test_a_stop_in_the_last_token_leaves_the_ids_in_step(engine) -> None:
    """A stop string that the last token completes: the token is never decoded, and
    its id is spent, so the cache's ids still name the trace's tokens."""
    with engine.session("snapkv", 1024) as s:
        events = list(s.run(_prompt(), max_tokens=N, stops=()))
        tail = [e.text for e in events if isinstance(e, Token)][-1]  # the last token's
        free = events[-1].text
        assert tail.strip() and tail not in free[:-1], free  # stops at token N only
        result = s.collect(s.run(_prompt(), max_tokens=N, stops=(tail,)))
        assert result.reason == "stop" and result.text == free[: -len(tail)]
        assert s.reader.pending is None
        assert s.cache.next_id == s.trace.n_ids
        s.collect(s.follow_up("And then?", max_tokens=2))
        waiting = s.reader.pending is not None  # this answer's last, unless it ended
        assert s.cache.next_id + waiting == s.trace.n_ids
        assert s.ctx.pos_max() == s.cache.next_lpos - 1


def test_a_stop_after_the_answer_ended_does_not_lose_its_last_token(engine) -> None:
    """The GUI's Stop pressed as the answer ends: the map and the saved chat that
    follow still decode the last token, and the Stop stays for what comes next."""
    with engine.session("snapkv", 1024) as s:
        result = s.collect(s.run(_prompt(), max_tokens=N, stops=()))
        s.cancel()
        s.memory_map()
        assert s.reader.pending is None
        assert s.cache.n_used == result.stats.prompt_tokens + N
        assert s.ctx.cancel_event.is_set()


def test_an_answer_step_picks_from_the_last_row_and_reads_no_logits_out(engine) -> None:
    """Issue 37: an answer's step chooses its next token where llama.cpp left the
    logits (no copy of the vocabulary): from the decode's last row, the token the
    copied logits would give; the turn still counts as ended (``can_follow_up``),
    and an answer that ended on such a step leaves no logits to continue from."""
    with engine.session("snapkv", 1024) as s:
        s.collect(s.run(_prompt(), max_tokens=N, stops=()))
        s.reader.settle()
        tokens = s.model.tokenize(" and then it rained")[:3]
        picked = s.reader.decode(tokens, logits=True, pick=lambda row: int(np.argmax(row)))
        assert picked == int(np.argmax(s.ctx.last_logits()))  # the lone context's buffer
        assert s.reader.logits is None and s.can_follow_up
        with pytest.raises(ConfigError, match="nothing to continue from"):
            list(s.generate(max_tokens=2, sampling=Sampling()))
        s.collect(s.follow_up("And then?", max_tokens=2))  # a turn reads its question
        s.reader.settle()
        held = s.cache.n_used

        def broken(row: np.ndarray) -> int:
            raise ValueError("a broken sampler")

        with pytest.raises(ValueError, match="broken"):  # after its decode: the token is held
            s.reader.decode(tokens[:1], logits=True, pick=broken)
        assert s.cache.n_used == held + 1 and s.ctx.pos_max() == s.cache.next_lpos - 1
        with pytest.raises(EngineError, match="not both"):
            s.reader.decode(tokens[:1], logits=True, every=True, pick=broken)
