"""The GPU check's tools on the CPU: synthetic models (scripts/gpu/synth_model.py)
and the self-test with ``--model``/``--gpu-layers``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


synth = _script("synth_model")


@pytest.mark.parametrize("kind", [Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("row", [256, 4096, 14336])
def test_random_blocks_keep_unit_variance_products(kind, row):
    pool = synth.block_pool(kind, row, np.random.default_rng(1))
    w = gguf.quants.dequantize(pool.reshape(-1), kind)
    assert abs(w.mean()) < 0.05 / np.sqrt(row)
    assert w.std() == pytest.approx(1 / np.sqrt(row), rel=0.01)


def test_full_shapes_match_the_published_files():
    for name in ("llama-3.1-8b", "gemma-3-12b"):
        shape = synth.SHAPES[name]
        assert synth._planned_bytes(shape) == pytest.approx(shape.published_bytes, rel=0.01)
    names = [n for n, _, _ in synth.tensors(synth.SHAPES["llama-3.1-8b"])]
    assert len(names) == 3 + 32 * 9 and "output.weight" in names
    kinds = {n: k for n, _, k in synth.tensors(synth.SHAPES["llama-3.1-8b"])}
    # Q4_K_M: Q6_K in the first and last eighth of the layers and every third between
    assert [kinds[f"blk.{i}.ffn_down.weight"] == Q.Q6_K for i in range(8)] == [
        True, True, True, True, False, False, True, False
    ]  # fmt: skip


def test_the_vocabulary_reader_agrees_with_gguf(tmp_path):
    from engine.model import default_model_path

    vocab = synth.Vocab.read(Path(default_model_path()))
    out = tmp_path / "vocab.gguf"
    synth.write_vocab(out, vocab.sized(1000))
    reader = gguf.GGUFReader(out)  # the library's reader, on a small file
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert [bytes(tokens.parts[i]) for i in tokens.data] == vocab.tokens[:1000]
    again = synth.Vocab.read(out)
    assert again.tokens == vocab.tokens[:1000] and (again.scores == vocab.scores[:1000]).all()
    assert (again.bos, again.eos) == (vocab.bos, vocab.eos)
    padded = vocab.sized(len(vocab.tokens) + 64)
    assert padded.tokens[-1] == b"<synth_63>" and len(padded.types) == len(vocab.tokens) + 64


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from engine.model import default_model_path

    out = tmp_path_factory.mktemp("synth")
    vocab = synth.Vocab.read(Path(default_model_path()))
    paths = {}
    for name in ("llama-tiny", "gemma-tiny"):
        paths[name] = out / f"{name}.gguf"
        synth.write_model(name, paths[name], vocab)
    return paths


def test_tiny_synthetic_models_load_evict_and_decode(tiny_models):
    from engine import Engine, Session

    for name, path in tiny_models.items():
        with Engine(path) as eng:
            info = eng.model.info
            assert info.n_head_kv == 2 and info.n_vocab == 32000
            if name == "gemma-tiny":  # every sixth layer global, the rest a 128-token window
                assert info.n_swa == 128 and info.global_layers == (5,)
            with eng.session("snapkv", 128) as s:
                result = Session.collect(s.ask("Clara sold the lamp. " * 60, "Who?", max_tokens=8))
            assert result.stats.evicted_tokens > 0 and result.stats.generated_tokens > 0


def test_self_test_takes_a_model_and_gpu_layers(tiny_models, capsys):
    from app.main import main

    path = tiny_models["llama-tiny"]
    code = main(["--self-test", "--model", str(path), "--gpu-layers", "99", "--no-gui"])
    out = capsys.readouterr().out
    assert code == 0 and "self-test passed" in out, out
    assert "synthetic llama-tiny" in out and "llama.cpp: " in out
    assert "99 GPU layers asked for" in out
    with pytest.raises(SystemExit):
        main(["--self-test", "--gpu-layers", "many"])
