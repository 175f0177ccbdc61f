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

ROOT = Path(__file__).resolve().parents[2]


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
    from engine.native.embedded import default_model_path

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
    from engine.native.embedded import default_model_path

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


@pytest.mark.slow
def test_check_dry_run_end_to_end(tmp_path):
    """scripts/gpu/check.sh --dry-run: tiny models, no GPU layers, every file written."""
    import json
    import os
    import subprocess

    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WORK": str(tmp_path / "work")}
    env |= {"LENGTHS": "512", "BUDGETS": "128", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu/check.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = {p.name for p in out.iterdir()}
    assert names >= {"gpu.json", "gpu.md", "gpu_memory.png", "gpu_prefill.png", "gpu_trace.png"}
    assert "self-test passed" in (out / "selftest.txt").read_text()
    runs = json.loads((out / "gpu.json").read_text())["runs"]
    assert len(runs) == 2 * 4 and all("prefill_tokens_per_s" in r for r in runs), runs
    by = {(r["label"], r["config"]): r for r in runs}
    snap, stream = by[("llama-tiny", "snapkv-128")], by[("llama-tiny", "streaming-128")]
    assert snap["capture_share"] > 0 and snap["evicted_tokens"] > 0
    assert stream["capture_share"] is None and stream["flash_attn"] == "auto"
    default = by[("gemma-tiny", "default")]
    assert default["flash_attn"] is True and any(
        k.endswith(" KV") for k in default["llama_buffers"]
    )
    assert default["prompt_tokens"] >= 512 and default["trace"]
    assert "| gemma-tiny | 512 | noflash |" in (out / "gpu.md").read_text()


@pytest.mark.slow
def test_peer_dry_run_end_to_end(tmp_path):
    """scripts/gpu/peer.sh --dry-run: the serve peer bench on a tiny synthetic model with
    the CPU llama-server, what comes back (the logs packed in one file)."""
    import json
    import os
    import subprocess

    binary = ROOT / ".variants" / "llama-server" / "llama-server"
    if not binary.is_file():
        pytest.skip("no llama-server built (scripts/peer/build_llama_server.sh)")
    model = tmp_path / "llama-tiny.gguf"
    synth.main(["llama-tiny", str(model)])
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "WORK": str(tmp_path / "work")}
    env |= {"MODEL": str(model), "PYTHON": sys.executable, "THREADS": "2"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu/peer.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {
        "peer.json", "peer.md", "peer.png", "peer-logs.tar.xz"
    }  # fmt: skip
    records = json.loads((out / "peer.json").read_text())["records"]
    assert {(r["server"], r["clients"]) for r in records} == {
        (s, n) for s in ("llama-server", "kvtrim") for n in (1, 2)
    }


def test_a_failed_or_late_run_is_recorded_and_the_rest_go_on(tmp_path):
    from engine.bench.gpu import Plan, run_all

    plan = Plan({"missing": str(tmp_path / "none.gguf")}, [256], [64], ["streaming"])
    plan.gpu_layers, plan.deadline_s = 0, 120
    records = run_all(plan, tmp_path, log=lambda line: None)
    assert [r["config"] for r in records] == ["default", "streaming-64", "noflash"]
    assert all("error" in r for r in records), records
    plan.deadline_s = 0
    assert all(r.get("skipped") == "deadline" for r in run_all(plan, tmp_path, log=print))


def test_the_most_wanted_runs_come_first():
    from engine.bench.gpu import Plan

    plan = Plan({"a": "a.gguf", "b": "b.gguf"}, [8192, 32768, 131072], [1024, 4096])
    order = [(r.label, r.length, r.config) for r in plan.runs()]
    assert len(order) == 2 * 3 * 6
    assert order[:6] == [(m, n, "default") for n in (8192, 32768, 131072) for m in "ab"]
    assert order[6:10] == [
        ("a", 131072, "snapkv-1024"), ("a", 131072, "streaming-1024"),
        ("b", 131072, "snapkv-1024"), ("b", 131072, "streaming-1024"),
    ]  # fmt: skip
    assert {c for _, _, c in order[10:16]} == {"noflash"}
    assert order[-1][1] == 8192 and order[-1][2].startswith("streaming")


def test_which_documents_fit_a_card():
    from engine.bench.gpu_report import RESERVE, fit_length, fits

    gib = 2**30
    records = [
        {"label": "m", "config": "default", "length": n, "process_gpu_peak_bytes": peak}
        for n, peak in ((8192, 6 * gib), (32768, 9 * gib), (131072, 21 * gib))
    ] + [
        {"label": "m", "config": "snapkv-1024", "length": 131072, "process_gpu_peak_bytes": 5 * gib}
    ]
    # a line through the three default runs, where it meets 12 GiB less the reserve
    est = fit_length(records, "m", 12 * gib)
    assert est is not None and 50_000 < est < 60_000
    assert fit_length(records, "m", 12 * gib + 2 * RESERVE) > est
    text = fits(records)
    assert "| m | 12 GB | default | 32,768 tokens |" in text
    assert "| m | 12 GB | snapkv-1024 | 131,072 tokens (the longest measured) |" in text
    assert "| m | 16 GB | default | 32,768 tokens |" in text


def test_alloc_mode_reads_llama_cpp_buffers_without_reading(tiny_models, tmp_path):
    """``--alloc``: each context is made, nothing is read; llama.cpp's KV buffer
    shrinks from the document's size to the budget's."""
    from engine.bench.gpu import main

    model = f"tiny={tiny_models['llama-tiny']}"
    args = ["--alloc", "--model", model, "--lengths", "4096", "--budgets", "128"]
    assert main([*args, "--policies", "snapkv", "--gpu-layers", "0", "--out", str(tmp_path)]) == 0
    import json

    runs = {r["config"]: r for r in json.loads((tmp_path / "alloc.json").read_text())["runs"]}
    kv = {
        c: sum(v for k, v in r["llama_buffers"].items() if k.endswith(" KV"))
        for c, r in runs.items()
    }
    # 2 layers x (K + V) x 2 heads x 64 x 2 bytes = 1 KiB a cell, for the document,
    # 32 answer tokens and a 128-token frame, in llama.cpp's 256-cell blocks
    from engine.native.kvmemory import pad

    assert kv["default"] == kv["noflash"] == pad(4096 + 32 + 128) * 1024
    assert kv["snapkv-128"] < kv["default"] / 10
    assert "| tiny | 4,096 | snapkv-128 |" in (tmp_path / "alloc.md").read_text()


def test_a_run_on_a_gpu_reports_gpu_memory_not_ram(monkeypatch):
    """NVML's figure survives the recorder closing its monitor (a review found the
    GPU figures lost that way): a fake NVML lists this process at 5 GiB."""
    import os
    import types

    from engine.bench import gpu

    nv = types.ModuleType("pynvml")
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=6 << 30, total=141 << 30)
    listed = [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=5 << 30)]
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: listed
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(gpu, "_plain", lambda run, flash: {"prefill_tokens_per_s": 1.0})
    record = gpu.measure(gpu.Run("m.gguf", "m", "default", 1024))
    assert record["gpu"] == "NVIDIA H200"
    assert record["process_gpu_peak_bytes"] == 5 << 30 and record["device_peak_bytes"] == 6 << 30
    from engine.bench.gpu_report import table

    assert "GPU peak GiB" in table([record]) and "| 5.00 |" in table([record])


def test_synth_model_refuses_bad_inputs_with_one_line(tmp_path, capsys):
    """A vocabulary that is not a GGUF, or cut short, and an output that cannot be
    written: a one-line error, no traceback and no half-written model left."""
    bad, cut = tmp_path / "bad.gguf", tmp_path / "cut.gguf"
    bad.write_bytes(b"not a model at all")
    cut.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 8 + b"\xff" * 8)
    for vocab in (bad, cut, tmp_path):
        with pytest.raises(SystemExit):
            synth.main(["llama-tiny", str(tmp_path / "x.gguf"), "--vocab", str(vocab)])
        assert "cannot read a vocabulary" in capsys.readouterr().err
    out = tmp_path / "missing" / "x.gguf"
    with pytest.raises(SystemExit):
        synth.main(["llama-tiny", str(out)])
    assert "cannot write" in capsys.readouterr().err and not out.exists()
