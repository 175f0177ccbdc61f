"""KeyDiff (engine/policies/keydiff.py): keys that differ from the mean key are kept;
on the real model it reads keys with flash attention on and finds the pass key."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.docs_for_tests import passkey_document

from engine.policies import Keys, make_policy


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_the_odd_key_out_scores_highest_and_the_evicted_are_forgotten():
    policy = make_policy("keydiff", n_sink=0, recent=0)
    ids = np.arange(6, dtype=np.int64)
    keys = np.tile(_unit([1.0, 0.0, 0.0]), (6, 1, 1, 1))  # (tokens, layers, heads, dim)
    keys[3] = _unit([0.0, 1.0, 0.0])  # the one unlike the rest
    keys[5] = _unit([0.7, 0.7, 0.0])  # in between
    policy.observe(Keys(ids, keys.astype(np.float16)))
    scores = policy.score(ids, None)
    assert scores.argmax() == 3 and scores[5] > scores[0] == scores[1]
    assert list(policy.keep(ids, 2).ids) == [3, 5]
    policy.score(np.array([3, 5]), None)  # after the eviction
    assert list(policy.state_dict()["ids"]) == [3, 5]


def test_keys_of_several_decodes_line_up_with_their_ids():
    policy = make_policy("keydiff")
    for start in (0, 4):
        ids = np.arange(start, start + 4, dtype=np.int64)
        policy.observe(Keys(ids, _unit(np.ones((4, 2, 1, 8))).astype(np.float16)))
    assert list(policy.state_dict()["ids"]) == list(range(8))
    unknown = policy.score(np.arange(10, dtype=np.int64), None)  # ids 8, 9: no keys seen
    assert unknown.shape == (10,) and unknown[8] == unknown[9] == 0


@pytest.mark.slow
def test_keydiff_reads_keys_with_flash_attention_on_and_keeps_the_key(engine):
    """Measured (post-RoPE keys, as the cache holds them, as the paper and kvpress
    score): 68642 found at depth 0.5 of 9.5K tokens at budget 1,024; pre-RoPE keys
    found none of 3 depths."""
    doc = passkey_document(400, 0.5, 68642)
    with engine.session("keydiff", 1024) as s:
        assert s.ctx.capture is not None and s.ctx.capture.key_shape == (256, 1)
        assert s.ctx.settings["flash_attn"] is not False  # llama.cpp's choice: no attention read
        result = s.collect(s.ask(doc, "What is the pass key?", answer_prefix="The pass key is",
                                 max_tokens=8))  # fmt: skip
        assert s.stats.evicted_tokens > 5000 and s.stats.cells_peak <= s.capacity
        held = s.policy.state_dict()["ids"]
        assert set(held) >= set(s.cache.ids[: len(s.cache.ids) - 1])  # every held token's key
        assert s.cache.cells is None  # keys come in batch order: no cell map to keep
    assert "68642" in result.text, result.text
