"""The engine end to end on the real default model."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers.docs_for_tests import (
    PASSKEY_PREFIX,
    PASSKEY_SUFFIX,
    passkey_document,
    passkey_key,
    prose,
)
from helpers.margins import check

from engine import (
    POLICIES,
    Cancelled,
    ConfigError,
    ContextOverflowError,
    Done,
    Evicted,
    Progress,
    Prompt,
    Sampling,
    Session,
    Token,
)
from engine.native.cpu import reference_llama

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.95)
PASSKEY_JUNK = 150  # about 3,600 tokens


def _passkey_hits(engine, policy: str, budget: int, depths=DEPTHS) -> list[bool]:
    hits = []
    for depth in depths:
        key = passkey_key(depth)
        prompt = Prompt(
            PASSKEY_PREFIX, passkey_document(PASSKEY_JUNK, depth, key), PASSKEY_SUFFIX, (), True
        )
        with engine.session(policy, budget) as s:
            result = Session.collect(s.run(prompt, max_tokens=8))
            assert result.stats.prompt_tokens > 3400
            assert result.stats.cells_peak <= s.ctx.n_ctx
        hits.append(str(key) in result.text)
    return hits


def test_passkey_question_aware_snapkv_beats_streaming(engine):
    snap = _passkey_hits(engine, "snapkv", 512)
    # StreamingLLM keeps the sinks and its recent window: a key 1,000-2,500 tokens
    # before the end is gone. Two depths say so; all five cost 3 more reads of 3,600
    # tokens (measured: missed at 0.1-0.7, found at 0.95, inside the window)
    stream = _passkey_hits(engine, "streaming", 512, depths=(0.3, 0.7))
    # measured: snapkv 5/5
    check("snapkv keys found of 5 depths", sum(snap), ">=", 4)
    assert stream == [False, False], stream


def _plain_llama_greedy(engine, prompt: list[int], n: int, flash: bool, batch: int) -> str:
    """Plain llama-cpp-python, batched as the session batches (the prompt in chunks of
    ``batch`` tokens): llama.cpp's CPU kernels round differently for other batch sizes."""
    llm = reference_llama(
        engine.model.info.path,
        n_ctx=1024,
        n_batch=batch,
        n_ubatch=batch,
        verbose=False,
        flash_attn=flash,
    )
    try:
        out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1)
        return out["choices"][0]["text"]
    finally:
        llm.close()


@pytest.mark.parametrize("policy", list(POLICIES))
def test_budget_larger_than_input_matches_plain_llama_cpp(engine, policy):
    prompt = Prompt("", prose(20, seed=1), "\n\nIn short,", (), True)
    with engine.session(policy, 1024) as s:
        result = Session.collect(s.run(prompt, max_tokens=16))
        assert result.stats.evicted_tokens == 0
        batch = s.ctx.n_batch  # a job that fits whole is read in one go: text, question
    head = engine.model.tokenize(prompt.prefix, add_bos=True) + engine.model.tokenize(
        prompt.document
    )
    tail = engine.model.tokenize(prompt.suffix)
    # a job that fits whole reads nothing, so runs with llama.cpp's flash attention (on);
    # a policy that keeps every decode's attention (history) reads it, with it off
    needs = POLICIES[policy].needs()
    flash = not (needs.attention and needs.history)
    expected = _plain_llama_greedy(engine, head + tail, 16, flash, batch)
    assert result.text == expected


@pytest.mark.parametrize("policy", ["h2o", "tova", "snapkv", "streaming"])
def test_cache_stays_within_budget_in_prefill_and_decoding(engine, policy):
    budget, chunk = 200, 56  # 256 cells: llama.cpp pads caches to multiples of 256
    doc = prose(60, seed=2)
    with engine.session(policy, budget, chunk_tokens=chunk, positions="compact") as s:
        evicted_in_decode = 0
        generating = False
        for event in s.summarize(doc, max_tokens=120, stops=()):
            assert event.stats.cells_used <= s.ctx.n_ctx
            assert s.cache.n_used == event.stats.cells_used
            if isinstance(event, Evicted):
                assert event.kept <= budget
                evicted_in_decode += generating
            if isinstance(event, Token):
                generating = True
            if isinstance(event, Done):
                done = event
        assert done.stats.generated_tokens > 0
        assert done.stats.evicted_tokens > 0
        if done.stats.generated_tokens >= 80:
            assert evicted_in_decode > 0, "eviction must keep working while decoding"
        assert s.ctx.pos_max() < s.ctx.n_ctx  # compact positions stay inside the cache


def test_full_policy_fails_clearly_when_input_does_not_fit(engine):
    with engine.session("full", 64) as s, pytest.raises(ContextOverflowError, match="budget"):
        Session.collect(s.summarize(prose(40)))


def test_budget_too_small_for_question_is_a_config_error(engine):
    with engine.session("snapkv", 64, chunk_tokens=16) as s:
        # a long question is read in pieces of one chunk
        r = Session.collect(s.ask(prose(40), "Who painted the fence? " * 10, max_tokens=4))
        assert r.stats.evictions > 0
        with pytest.raises(ConfigError, match="no room"):
            Session.collect(s.ask(prose(80), "Who painted the fence? " * 40))
    with pytest.raises(ConfigError, match="too small"):
        engine.session("snapkv", 30)
    with pytest.raises(ConfigError):
        engine.session("snapkv", 8)


def test_auto_positions_compact_a_short_read_and_bound_a_long_one(engine):
    """``auto`` (the default): a text of at most AUTO_SPAN budgets is compacted to
    0..n-1 after each eviction; a longer one keeps holes of at most the gap, the
    same in the follow-up turns after it."""
    from engine.session.config import AUTO_SPAN, BOUNDED_GAP

    budget = 64
    short, long = prose(60, seed=5), prose(250, seed=6)
    assert len(engine.model.tokenize(short)) < AUTO_SPAN * budget < len(engine.model.tokenize(long))
    for doc, bounded in ((short, False), (long, True)):
        with engine.session("snapkv", budget, chunk_tokens=16) as s:
            assert s.config.positions == "auto"
            result = Session.collect(s.ask(doc, "Who repaired the bicycle?", max_tokens=4))
            assert result.stats.evictions > 0
            lpos = s.reader.cache.lpos
            steps = np.diff(lpos)
            assert steps.min() >= 1 and steps.max() <= BOUNDED_GAP + 1
            assert (steps.max() > 1) == bounded, steps.max()
            Session.collect(s.follow_up("And who watched?", max_tokens=4))
            assert (np.diff(s.reader.cache.lpos).max() > 1) == bounded


@pytest.mark.parametrize("positions", ["original", "bounded"])
def test_positions_never_pass_the_trained_context(engine, positions):
    """A document longer than the trained context (here set to 512) is read with
    positions below it: kept positions are compacted before they would pass it."""
    with engine.session("snapkv", 128, chunk_tokens=64, positions=positions, max_position=512) as s:
        result = Session.collect(
            s.ask(prose(200, seed=4), "Who repaired the bicycle?", max_tokens=8)
        )
        assert result.stats.compactions >= 2
        assert s.ctx.pos_max() < 512
        assert result.stats.prompt_tokens > 1000


def test_cancel_mid_prefill_then_session_still_works(engine):
    doc = prose(400, seed=5)
    with engine.session("snapkv", 256) as s:
        raised: list[BaseException] = []
        seen = threading.Event()

        def work() -> None:
            try:
                for event in s.ask(doc, "Who sold the kettle?"):
                    if isinstance(event, Progress):
                        seen.set()
            except BaseException as exc:
                raised.append(exc)

        t = threading.Thread(target=work)
        t.start()
        assert seen.wait(30)
        start = time.perf_counter()
        s.cancel()
        t.join(10)
        assert not t.is_alive()
        assert time.perf_counter() - start < 2.0
        assert raised and isinstance(raised[0], Cancelled)
        assert s.stats.prompt_tokens < len(engine.model.tokenize(doc))
        result = Session.collect(s.ask(prose(20), "Who sold the kettle?", max_tokens=8))
        assert result.stats.generated_tokens > 0


def test_cancel_during_generation(engine):
    with engine.session("h2o", 256) as s:
        events = s.summarize(prose(30), max_tokens=200, stops=())
        n = 0
        with pytest.raises(Cancelled):
            for event in events:
                if isinstance(event, Token):
                    n += 1
                    if n == 5:
                        s.cancel()
        assert n == 5
        assert Session.collect(s.summarize(prose(10), max_tokens=4)).stats.generated_tokens


def test_a_stop_after_the_read_and_before_the_first_token_shows_no_token(engine):
    """A token is yielded before it is decoded, so the first one must look at a stop
    set while the generator waited (a chat's Ctrl+C) itself: nothing of it shows."""
    with engine.session("snapkv", 256) as s:
        Session.collect(s.ask(prose(20, seed=8), "Who sold the kettle?", max_tokens=6))
        events = s.follow_up("Who repaired the bicycle?", answer_prefix="It was", max_tokens=8)
        read, tokens = False, []
        with pytest.raises(Cancelled):
            for event in events:
                if isinstance(event, Progress) and event.done == event.total:
                    read = True
                    s.cancel()  # the question is read; generation has not begun
                elif isinstance(event, Token):
                    tokens.append(event)
        assert read and not tokens
        again = s.follow_up("Who repaired the bicycle?", answer_prefix="It was", max_tokens=8)
        assert Session.collect(again).text.strip(), "the next turn is answered"


def test_sampling_is_reproducible_with_a_seed_and_stops_apply(engine):
    prompt = Prompt("", prose(10), "\n\nOnce upon a time", (), True)
    texts = []
    for _ in range(2):
        with engine.session("tova", 512) as s:
            r = Session.collect(
                s.run(prompt, max_tokens=24, sampling=Sampling(temperature=0.9, top_p=0.9, seed=7))
            )
            texts.append(r.text)
    assert texts[0] == texts[1] and texts[0]
    with engine.session("tova", 512) as s:
        r = Session.collect(s.run(prompt, max_tokens=40, stops=(" ",)))
        assert " " not in r.text.strip() and r.reason == "stop"


def test_stats_report_memory_and_speed(engine):
    with engine.session("snapkv", 128, chunk_tokens=64) as s:
        r = Session.collect(s.ask(prose(160, seed=6), "Who found the lamp?", max_tokens=8))
    st = r.stats
    per_cell = engine.model.info.kv_bytes_per_cell()
    assert per_cell == 18 * 2 * 256 * 2  # 18 layers, K and V, 256 dims, f16
    layer = 2 * 256 * 2
    # 3 global layers at n_ctx cells, 15 sliding-window layers at window + batch cells,
    # at most n_ctx (so here, a cache of 256 cells, all layers alike)
    assert st.n_ctx == 256 and st.swa_cells == 256
    assert st.kv_bytes == 3 * layer * st.n_ctx + 15 * layer * st.swa_cells
    assert st.kv_bytes_full == (st.prompt_tokens + st.generated_tokens) * per_cell
    assert st.kv_bytes < st.kv_bytes_full / 4
    assert st.prefill_tokens_per_s > 0 and st.decode_tokens_per_s > 0
    assert 0 < st.capture_s < st.prefill_s and st.score_s < st.prefill_s


def test_chat_follow_ups_continue_the_cache_within_its_bound(engine):
    """Turns append to the same cache; earlier text stays answerable; cells stay bounded."""
    doc = prose(30, seed=3) + " The secret colour is teal. " + prose(90, seed=4)
    question = "What is the secret colour?"
    for policy, budget in (("full", 2048), ("snapkv", 256)):
        with engine.session(policy, budget) as s:
            Session.collect(s.ask(doc, "Who repaired the bicycle?", max_tokens=16))
            seen = s.stats.tokens_seen
            r = Session.collect(
                s.follow_up(question, answer_prefix="The secret colour is", max_tokens=8)
            )
            # measured: both answer "teal"; streaming at 256 answers "red"
            assert "teal" in r.text, (policy, r.text)
            assert r.stats.tokens_seen > seen and r.stats.first_token_s is not None
            for _ in range(4):
                before = s.stats.tokens_seen
                for event in s.follow_up("Tell me more about the market.", max_tokens=24):
                    assert event.stats.cells_used <= s.ctx.n_ctx
                assert s.stats.tokens_seen > before
            if policy == "snapkv":
                assert s.stats.evictions > 0 and s.stats.cells_used <= s.capacity


def test_follow_up_needs_a_first_turn(engine):
    with engine.session("snapkv", 256) as s, pytest.raises(ConfigError, match="follow up"):
        Session.collect(s.follow_up("Anything?"))


def test_a_question_longer_than_the_trained_context_says_so(engine):
    """Issue 23 WEAK: a 122,786-token question was told to "use a smaller budget",
    which cannot help; here the trained context is set to 512 tokens."""
    s = engine.session("snapkv", 128, chunk_tokens=64, max_position=512)
    with s, pytest.raises(ConfigError, match="more than the model's trained context"):
        Session.collect(s.ask(prose(40), "Who? " * 600, max_tokens=4))


@pytest.mark.parametrize("gap", [1, 8])
def test_bounded_positions_leave_holes_of_at_most_position_gap(engine, gap):
    """``positions="bounded"`` with ``position_gap``: after every eviction the held
    tokens' positions step by at most ``gap + 1`` (a hole of ``gap`` positions)."""
    with engine.session("snapkv", 128, chunk_tokens=64, positions="bounded", position_gap=gap) as s:
        list(s.feed(engine.model.tokenize(prose(30, seed=2)), logits=False))
        assert s.stats.evictions > 0
        steps = np.diff(s.cache.lpos)
        assert steps.max() <= gap + 1 and steps.min() >= 1
        assert (steps > 1).any(), "evictions left holes"
