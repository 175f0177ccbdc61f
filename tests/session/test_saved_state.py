"""A session's compressed cache saved and restored (issue 22's resume, issue 24's
prefix reuse): what comes back continues exactly as the session it was saved from,
and a file from another model, settings or version, or a damaged one, is refused in
one line (``StateError``) so the caller reads again."""

from __future__ import annotations

import re
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers.docs_for_tests import prose

from engine import Session
from engine.errors import StateError
from engine.session.state import STATE_VERSION, SavedState

pytestmark = pytest.mark.slow

DOC = prose(60, seed=3) + " The vault code is 58316. " + prose(60, seed=4)
QUESTION, PREFIX = "What is the vault code?", "The vault code is"
FOLLOW_UP = "Who repaired the bicycle?"


def _asked(engine, policy: str, budget: int, **options) -> Session:
    s = engine.session(policy, budget, **options)
    Session.collect(s.ask(DOC, QUESTION, answer_prefix=PREFIX, max_tokens=8))
    return s


def _answer(s: Session) -> tuple[str, list[int]]:
    tokens: list[int] = []
    result = None
    for event in s.follow_up(FOLLOW_UP, max_tokens=16):
        token = getattr(event, "token", -1)
        if token >= 0:
            tokens.append(token)
        result = event
    return getattr(result, "text", ""), tokens


@pytest.mark.parametrize(
    ("policy", "budget"), [("snapkv", 256), ("h2o", 256), ("tova", 256), ("streaming", 256),
                           ("full", 4096)]
)  # fmt: skip
def test_a_restored_session_answers_token_for_token_as_the_one_it_came_from(
    engine, tmp_path, policy, budget
):
    """The live session is normalized to the saved layout (restored into itself, as
    the app does after each turn): a session restored from the file in another
    context then writes exactly the same follow-up, token for token."""
    with _asked(engine, policy, budget) as live:
        saved = live.snapshot({"turns": 1})
        size = saved.write(tmp_path / "s.kvstate")
        live.restore(saved)  # the layout a restore gives
        want = _answer(live)
        held = live.memory_map()
    assert size > 1 << 20
    with engine.session(policy, budget) as back:
        back.restore(SavedState.read(tmp_path / "s.kvstate"))
        assert back.can_follow_up and back.stats.evicted_tokens == saved.meta["evicted"]
        got = _answer(back)
        after = back.memory_map()
    assert got == want and got[1]
    assert [s.name for s in after.segments] == [s.name for s in held.segments]
    for r1, r2 in zip(held.roles, after.roles, strict=True):
        assert np.array_equal(r1, r2)


def test_flash_attention_follows_the_cache_and_a_saved_cache_keeps_its_own(engine, tmp_path):
    """A job that fits whole reads no attention, so its context takes llama.cpp's flash
    attention (on); one that evicts reads it with flash attention off. A cache holding
    cells keeps its context's (the V cells' layout differs), and a saved cache comes
    back in a context like the one it was saved from, or is refused in one line."""
    with _asked(engine, "snapkv", 4096) as live:  # fits whole
        assert not live.reader.capturing and live.reader.flash is None
        Session.collect(live.follow_up(FOLLOW_UP, max_tokens=4))  # reads, keeps its cells
        assert live.reader.capturing and live.reader.flash is None
        saved = live.snapshot()
        assert saved.meta["flash_attn"] is None
        live.restore(saved)
        want = _answer(live)
    with engine.session("snapkv", 4096) as back:
        assert back.reader.flash is False  # a new session is ready to read: off
        back.restore(saved)
        assert back.reader.flash is None and _answer(back) == want
        with pytest.raises(StateError, match=r"damaged.*flash attention"):
            back.restore(replace(saved, meta={**saved.meta, "flash_attn": "on"}))
    with _asked(engine, "snapkv", 256) as evicts:
        assert evicts.reader.capturing and evicts.reader.flash is False
        old = evicts.snapshot()
    del old.meta["flash_attn"]  # saved before the key: in flash_alone's context
    with engine.session("snapkv", 256) as s:
        Session.collect(s.ask("A short note: the code is 5.", "What is the code?", max_tokens=2))
        assert s.reader.flash is None  # fitted whole
        s.restore(old)
        assert s.reader.flash is False and s.can_follow_up


def test_what_was_read_comes_back_in_the_memory_map(engine, tmp_path):
    with _asked(engine, "snapkv", 256) as live:
        before = live.memory_map()
        live.snapshot().write(tmp_path / "s.kvstate")
    with engine.session("snapkv", 256) as back:
        back.restore(SavedState.read(tmp_path / "s.kvstate"))
        after = back.memory_map()
    assert after.tokens_seen == before.tokens_seen and after.tokens_kept == before.tokens_kept
    doc = before.segment("document")
    assert after.segments[doc].text == DOC
    assert np.array_equal(before.roles[doc], after.roles[doc])


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"policy": "h2o"}, "another policy"),
        ({"budget": 512}, "other cache settings (budget_tokens"),
        ({"positions": "bounded"}, "other cache settings (positions)"),
        ({"kv_type": "q8_0"}, "other cache settings (kv_type)"),
    ],
)
def test_other_settings_are_refused_with_the_reason(engine, tmp_path, options, reason):
    with _asked(engine, "snapkv", 256) as live:
        saved = live.snapshot()
    options = {"policy": "snapkv", "budget": 256, **options}
    with engine.session(options.pop("policy"), options.pop("budget"), **options) as other:
        with pytest.raises(StateError, match=re.escape(reason)):
            other.restore(saved)
        assert other.cache.n_used == 0 and not other.can_follow_up


def test_another_model_version_or_damaged_file_is_one_line(engine, tmp_path):
    with _asked(engine, "snapkv", 256) as live:
        saved = live.snapshot()
    path = tmp_path / "s.kvstate"
    saved.write(path)
    meta = saved.meta["fingerprint"]
    cases = {
        "another model file": replace(saved, meta={**saved.meta, "fingerprint": {
            **meta, "model": {"bytes": 1, "sha256_head": "x"}}}),
        "another version": replace(saved, meta={**saved.meta, "fingerprint": {
            **meta, "kvtrim_state": STATE_VERSION + 1}}),
    }  # fmt: skip
    with engine.session("snapkv", 256) as s:
        for reason, state in cases.items():
            with pytest.raises(StateError, match=reason):
                s.restore(state)
        whole = path.read_bytes()
        damaged = {
            "truncated": whole[: len(whole) // 2],
            "empty": b"",
            "not a state": b"hello, I am a text file\n",
        }
        for name, data in damaged.items():
            bad = tmp_path / f"{name}.kvstate"
            bad.write_bytes(data)
            with pytest.raises(StateError) as caught:
                s.restore(SavedState.read(bad))
            assert "\n" not in str(caught.value), name
        foreign = tmp_path / "foreign.kvstate"
        with zipfile.ZipFile(foreign, "w") as z:
            z.writestr("meta.npy", b"\x93NUMPY garbage")
        with pytest.raises(StateError, match=r"damaged|not a kvtrim"):
            SavedState.read(foreign)
        flipped = bytearray(whole)
        flipped[len(whole) // 2] ^= 0xFF  # one byte of the KV cells: the zip's CRC fails
        (tmp_path / "flipped.kvstate").write_bytes(bytes(flipped))
        with pytest.raises(StateError, match="damaged"):
            SavedState.read(tmp_path / "flipped.kvstate")
        s.restore(SavedState.read(path))  # and the good file still works
        assert s.can_follow_up


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(StateError, match="no saved cache"):
        SavedState.read(Path(tmp_path / "none.kvstate"))


def test_a_pooled_sequence_cannot_be_saved(engine):
    from engine.runtime.batch import make_pool
    from engine.runtime.spec import RequestSpec

    spec = RequestSpec(policy="snapkv", budget_tokens=256)
    with (
        make_pool(engine, spec, 2) as pool,
        spec.open_in(engine, pool, 600) as s,
        pytest.raises(StateError, match="shared KV pool"),
    ):
        s.snapshot()
