"""Attention read with flash attention on (computed from the fused node's inputs)
matches what llama.cpp writes with it off (``kq_soft_max``), and the pure function
behind it matches a plain softmax, grouped heads, softcap and sinks included."""

from __future__ import annotations

import numpy as np
import pytest

from engine.native.capture import Segment, attention
from engine.native.context import NativeContext
from engine.policies import ATTENTION
from engine.session.config import default_threads

THREADS = default_threads()  # what this test run may use (conftest pins xdist workers)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_attention_is_a_grouped_softmax():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(4, 3, 8)).astype(np.float32)
    k = rng.normal(size=(2, 5, 8)).astype(np.float32)
    mask = np.zeros((1, 3, 5), np.float32)
    mask[0, :, 4] = -np.inf  # a hidden cell
    got = attention(q, k, mask, 0.5)
    q16 = q.astype(np.float16).astype(np.float32)
    for h in range(4):
        want = _softmax(0.5 * q16[h] @ k[h // 2].T + mask[0])
        np.testing.assert_allclose(got[h], want, rtol=1e-5, atol=1e-7)
    assert (got[..., 4] == 0).all()
    capped = attention(q, k, mask, 0.5, softcap=2.0)
    want = _softmax(2.0 * np.tanh(0.5 * q16[0] @ k[0].T / 2.0) + mask[0])
    np.testing.assert_allclose(capped[0], want, rtol=1e-5, atol=1e-7)
    sunk = attention(q, k, mask, 0.5, sinks=np.full(4, 50.0, np.float32))
    assert (sunk.sum(axis=-1) < 1e-6).all()  # a huge sink takes the whole row
    hidden = attention(q, k, np.full((1, 3, 5), -np.inf, np.float32), 0.5)
    assert np.isfinite(hidden).all() and (hidden == 0).all()  # a row that sees nothing


@pytest.mark.slow
@pytest.mark.parametrize("streams", [1, 2])
def test_fused_attention_matches_llama_cpp_probabilities(engine, streams):
    """Two sequences decoded in one batch, their last rows captured with flash
    attention off and on: the same cells seen, the same probabilities to f16."""
    model = engine.model
    prompts = [
        model.tokenize("The pass key is 68142. Remember it. " * 6, add_bos=True),
        model.tokenize("Rivers run to the sea, and the sea is never full. " * 4, add_bos=True),
    ]
    got = {}
    for flash in (False, True):
        capture = ATTENTION.capture(model.info)
        ctx = NativeContext(model, n_ctx=512, n_batch=256, n_threads=THREADS, capture=capture,
                            flash_attn=flash, n_seq_max=2, kv_unified=streams == 1)  # fmt: skip
        reads: list[str] = []
        for name in ("_read", "_read_fused"):  # which path ran, per layer
            real = getattr(capture, name)
            setattr(capture, name, _spy(real, name, reads))
        try:
            got[flash] = _decode_two(ctx, prompts, streams)
        finally:
            ctx.close()
        assert reads == ["_read_fused" if flash else "_read"] * len(model.info.global_layers)
    for off, on in zip(got[False], got[True], strict=True):
        assert off.attn is not None and on.attn is not None
        np.testing.assert_array_equal(off.visible, on.visible)
        assert off.attn.shape == on.attn.shape
        # the earlier layers' numerics differ with flash attention on and off, so the
        # rows agree to about 1% (measured: 0.008 at most); _weighs_v checks them exactly
        np.testing.assert_allclose(on.attn, off.attn, atol=0.02)
        np.testing.assert_allclose(on.attn.sum(axis=-1), 1.0, atol=1e-4)


@pytest.mark.slow
def test_fused_attention_is_what_flash_attention_weighs_v_with(engine):
    """In the same decode: softmax(scale * QK^T + mask) @ V per head equals the fused
    node's own output, so the rows are the probabilities it used."""
    model = engine.model
    capture = ATTENTION.capture(model.info)
    checked: list[float] = []
    real = capture._read_fused

    def check(tensor: int) -> None:
        checked.append(_weighs_v(tensor))
        real(tensor)

    capture._read_fused = check  # type: ignore[method-assign]
    ctx = NativeContext(model, n_ctx=512, n_batch=256, n_threads=THREADS, capture=capture,
                        flash_attn=True)  # fmt: skip
    try:
        toks = model.tokenize("The pass key is 68142. Remember it. " * 8, add_bos=True)
        ctx.decode(toks, 0, logits=True, capture=Segment(0, len(toks), 4, True))
    finally:
        ctx.close()
    assert len(checked) == len(model.info.global_layers)
    assert max(checked) < 0.005, checked  # relative error of the output (measured 2-5e-4)


def _weighs_v(tensor: int) -> float:
    from engine.native import _ggml

    fused = _ggml.tensor_src(tensor, 0)
    q, k, v, mask = (_ggml.read_tensor(_ggml.tensor_src(fused, i)) for i in range(4))
    out = _ggml.read_tensor(fused)  # (streams, rows, heads, head_dim)
    scale, _bias, softcap = _ggml.op_params_f32(fused, 3)
    probs = attention(q[0], k[0], mask[0], scale, softcap)  # (heads, rows, n_kv)
    group = q.shape[1] // v.shape[1]
    values = np.repeat(v[0], group, axis=0)  # (heads, n_kv, head_dim)
    want = np.matmul(probs, values).transpose(1, 0, 2)  # (rows, heads, head_dim)
    return float(np.abs(want - out[0]).max() / np.abs(out[0]).max())


def _spy(real, name: str, reads: list[str]):
    def read(tensor: int) -> None:
        reads.append(name)
        real(tensor)

    return read


def _decode_two(ctx: NativeContext, prompts: list[list[int]], streams: int):
    if streams == 1:
        entries, segments, at = [], [], 0
        for seq, toks in enumerate(prompts):
            entries += [(seq, t, i, i == len(toks) - 1) for i, t in enumerate(toks)]
            segments.append(Segment(at, at + len(toks), 4, True))
            at += len(toks)
        return ctx.decode_batch(entries, segments)
    n = min(len(p) for p in prompts)
    entries = [
        (seq, t, i, i == n - 1) for seq, p in enumerate(prompts) for i, t in enumerate(p[:n])
    ]
    segments = [Segment(0, n, 4, True, stream=s) for s in range(2)]
    return ctx.decode_batch(entries, segments, n_streams=2)


@pytest.mark.parametrize("flash", [False, True])
def test_a_step_that_reads_only_what_it_sees_stops_asking_after_one_layer(
    engine, monkeypatch, flash
):
    """The eval callback runs for every node of every decode (728 for this model); a
    pooled step that fits reads only which cells it sees, from the first global layer,
    so after that layer the callback returns before it reads a node's name."""
    from engine.native import _ggml

    model = engine.model
    names: list[bytes] = []
    real = _ggml.tensor_name_bytes

    def named(tensor: int) -> bytes:
        names.append(real(tensor))
        return names[-1]

    monkeypatch.setattr(_ggml, "tensor_name_bytes", named)
    capture = ATTENTION.capture(model.info)
    ctx = NativeContext(model, n_ctx=256, n_batch=64, n_threads=THREADS, capture=capture,
                        flash_attn=flash, n_seq_max=2)  # fmt: skip
    try:
        for seq in (0, 1):
            ctx.decode_batch([(seq, 10 + seq, 0, False), (seq, 20, 1, False)])
        names.clear()
        got = ctx.decode_batch(
            [(0, 30, 2, True), (1, 31, 2, True)], [Segment(0, 1, 0, True), Segment(1, 2, 0, True)]
        )
        asked, names[:] = len(names), []
        both = ctx.decode_batch(  # rows too: every global layer is read
            [(0, 32, 3, True), (1, 33, 3, True)], [Segment(0, 1, 1, True), Segment(1, 2, 1, True)]
        )
    finally:
        ctx.close()
    first = b"-" + str(model.info.global_layers[0]).encode()
    assert asked and names[asked - 1].endswith(first), names[asked - 3 : asked]
    assert len(names) > 2 * asked  # rows are read from every global layer: all asked
    for seq, (one, two) in enumerate(zip(got, both, strict=True)):
        assert one.attn is None and two.attn is not None
        assert one.visible is not None and two.visible is not None
        assert one.visible.sum() == 3 and two.visible.sum() == 4, seq  # its own cells
        assert (two.visible[0, : one.visible.shape[1]] >= one.visible[0]).all()
