"""Finding downloaded models: fake LM Studio, Ollama and Hugging Face stores under
tmp_path, hostile ones included (bad JSON, missing blobs, broken symlinks, files
that only look like GGUF, projectors, later shards, unreadable folders)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from helpers.model_stores import digest as _digest
from helpers.model_stores import gguf, hf_cache, lmstudio_store, models_cli_args, ollama_store

from engine.native import finder
from engine.native.finder import FoundModel, Roots, default_roots, find_models


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    return Roots(
        lmstudio=(lmstudio_store(tmp_path), tmp_path / "missing" / "models"),
        ollama=(ollama_store(tmp_path),),
        huggingface=(hf_cache(tmp_path), tmp_path / "hf.txt"),
    )


def test_finds_each_store_and_skips_what_llama_cpp_cannot_use(roots, tmp_path):
    (tmp_path / "hf.txt").write_text("a file where a folder should be")
    found = find_models(roots)
    assert [(m.source, m.name) for m in found] == [
        ("Hugging Face", "unsloth/gemma-3-270m-it-GGUF: gemma-3-270m-it-Q4_K_M.gguf"),
        ("Hugging Face", "unsloth/gemma-3-270m-it-GGUF: sub/other.gguf"),
        ("LM Studio", "bartowski/Qwen2.5-0.5B-GGUF: Qwen2.5-0.5B-Q4_K_M.gguf"),
        ("LM Studio", "unsloth/Big-GGUF: Q8_0/Big-Q8_0-00001-of-00002.gguf"),
        ("Ollama", "hf.co/bartowski/Foo-GGUF:Q4_K_M"),
        ("Ollama", "llama3.2:1b"),  # llama3.2:latest is the same blob
        ("Ollama", "someone/tiny:q4"),
    ]
    by_name = {m.name: m for m in found}
    hf = by_name["unsloth/gemma-3-270m-it-GGUF: gemma-3-270m-it-Q4_K_M.gguf"]
    # the snapshot's path (a name llama.cpp can derive split shards from), the
    # revision refs/main names, resolving to its blob
    assert hf.path.name == "gemma-3-270m-it-Q4_K_M.gguf" and hf.path.parent.name == "rev2"
    assert hf.path.resolve().name == "aaa" and hf.size_bytes == 400
    split = by_name["unsloth/Big-GGUF: Q8_0/Big-Q8_0-00001-of-00002.gguf"]
    assert split.size_bytes == 500  # both shards
    llama = by_name["llama3.2:1b"]
    assert llama.path == roots.ollama[0] / "blobs" / f"sha256-{_digest(1)}"
    assert llama.size_bytes == 1000
    assert all(isinstance(m, FoundModel) and m.path.is_absolute() for m in found)


def test_paths_open_as_gguf_and_results_are_frozen(roots):
    found = find_models(roots)
    for m in found:
        assert m.path.read_bytes()[:4] == b"GGUF"
    with pytest.raises(AttributeError):
        found[0].name = "x"  # type: ignore[misc]


def test_the_same_file_through_two_stores_is_listed_once(tmp_path):
    blob = gguf(tmp_path / "shared" / "model.gguf")
    lm = tmp_path / "lm" / "pub" / "repo"
    lm.mkdir(parents=True)
    (lm / "model.gguf").symlink_to(blob)
    hub = tmp_path / "hub" / "models--pub--repo" / "snapshots" / "r"
    hub.mkdir(parents=True)
    (hub / "model.gguf").symlink_to(blob)
    found = find_models(Roots(lmstudio=(tmp_path / "lm",), huggingface=(tmp_path / "hub",)))
    assert [(m.source, m.name) for m in found] == [("Hugging Face", "pub/repo: model.gguf")]


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _lock(monkeypatch, paths: list[Path]) -> None:
    """Make ``paths`` unreadable: by their mode, or for root (who reads anything)
    by failing ``os.scandir`` and ``Path.open`` on them as the kernel would."""
    if not _is_root():
        for p in paths:
            p.chmod(0)
        return
    locked = {str(p) for p in paths}
    real_scandir, real_open = os.scandir, Path.open

    def scandir(path):
        if str(path) in locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    def open_(self, *args, **kwargs):
        if str(self) in locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(finder.os, "scandir", scandir)
    monkeypatch.setattr(Path, "open", open_)


def _unlock(paths: list[Path]) -> None:
    if not _is_root():
        for p in paths:
            p.chmod(0o755)


def test_unreadable_folders_and_files_are_skipped(roots, monkeypatch):
    locked = [
        roots.lmstudio[0] / "unsloth",
        roots.lmstudio[0] / "bartowski" / "Qwen2.5-0.5B-GGUF" / "Qwen2.5-0.5B-Q4_K_M.gguf",
        roots.ollama[0] / "manifests" / "hf.co",
        roots.ollama[0] / "manifests" / "registry.ollama.ai" / "someone" / "tiny" / "q4",
        roots.huggingface[0] / "models--unsloth--gemma-3-270m-it-GGUF" / "snapshots" / "rev2",
    ]
    _lock(monkeypatch, locked)
    try:
        found = find_models(roots)
    finally:
        _unlock(locked)
    assert [(m.source, m.name) for m in found] == [
        # rev2 unreadable: the older revision's file stands in
        ("Hugging Face", "unsloth/gemma-3-270m-it-GGUF: gemma-3-270m-it-Q4_K_M.gguf"),
        ("Ollama", "llama3.2:1b"),
    ]
    assert found[0].path.parent.name == "rev1" and found[0].size_bytes == 390


def test_the_scan_is_bounded(roots, caplog):
    assert find_models(roots, max_dirs=0) == []
    assert find_models(roots, time_limit_s=-1) == []
    few = find_models(roots, max_dirs=4)  # stops part-way, without an error
    assert len(few) < len(find_models(roots))
    assert "stopped looking for models" in caplog.text


def test_missing_or_empty_roots_find_nothing(tmp_path):
    assert find_models(Roots()) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_models(Roots((empty,), (empty,), (empty,))) == []


def test_default_roots_follow_each_tools_rules(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = default_roots({}, home)
    assert r.lmstudio[:2] == (
        home / ".lmstudio" / "models",
        home / ".cache" / "lm-studio" / "models",
    )
    assert r.ollama[0] == home / ".ollama" / "models"
    assert r.huggingface == (home / ".cache" / "huggingface" / "hub",)

    (home / ".lmstudio-home-pointer").write_text(f"{tmp_path / 'elsewhere'}\n")
    env = {
        "LMSTUDIO_HOME": str(tmp_path / "lms"),
        "OLLAMA_MODELS": f' "{tmp_path / "om"}" ',  # Ollama trims spaces and quotes
        "HF_HOME": str(tmp_path / "hfhome"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
    }
    r = default_roots(env, home)
    assert r.lmstudio[:3] == (
        tmp_path / "lms" / "models",
        tmp_path / "elsewhere" / "models",
        home / ".lmstudio" / "models",
    )
    assert r.ollama[:2] == (tmp_path / "om", home / ".ollama" / "models")
    assert r.huggingface == (tmp_path / "hfhome" / "hub",)
    assert default_roots({"XDG_CACHE_HOME": "/x"}, home).huggingface == (
        Path("/x/huggingface/hub"),
    )
    env["HUGGINGFACE_HUB_CACHE"] = "/legacy"
    assert default_roots(env, home).huggingface == (Path("/legacy"),)
    env["HF_HUB_CACHE"] = "/new"
    assert default_roots(env, home).huggingface == (Path("/new"),)


def test_a_bad_home_pointer_is_ignored(tmp_path):
    home = tmp_path / "home"
    (home / ".lmstudio-home-pointer").mkdir(parents=True)  # a folder, not a file
    assert default_roots({}, home).lmstudio[0] == home / ".lmstudio" / "models"
    big = tmp_path / "home2"
    big.mkdir()
    (big / ".lmstudio-home-pointer").write_text("x" * 10_000)
    assert default_roots({}, big).lmstudio[0] == big / ".lmstudio" / "models"


def test_cli_models_json_reads_the_environment(tmp_path, monkeypatch):
    from engine.cli.main import main

    home = tmp_path / "home"
    gguf(home / ".lmstudio" / "models" / "pub" / "repo" / "m-Q4_K_M.gguf")
    store = ollama_store(tmp_path)
    hub = hf_cache(tmp_path)
    for key in ("LMSTUDIO_HOME", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    out, err = io.StringIO(), io.StringIO()
    assert main(["models", "--json"], out=out, err=err) == 0, err.getvalue()
    rows = json.loads(out.getvalue())
    ours = [r for r in rows if r["path"] and Path(r["path"]).is_relative_to(tmp_path)]
    assert [(r["source"], r["name"]) for r in ours] == [
        ("Hugging Face", "unsloth/gemma-3-270m-it-GGUF: gemma-3-270m-it-Q4_K_M.gguf"),
        ("Hugging Face", "unsloth/gemma-3-270m-it-GGUF: sub/other.gguf"),
        ("LM Studio", "pub/repo: m-Q4_K_M.gguf"),
        ("Ollama", "hf.co/bartowski/Foo-GGUF:Q4_K_M"),
        ("Ollama", "llama3.2:1b"),
        ("Ollama", "someone/tiny:q4"),
    ]
    assert set(ours[0]) == {"source", "name", "size_bytes", "path"}
    assert ours[0]["size_bytes"] == 400

    out = io.StringIO()
    assert main(["models"], out=out, err=err) == 0
    assert "llama3.2:1b" in out.getvalue() and str(store / "blobs") in out.getvalue()


def test_cli_models_says_where_it_looked_when_nothing_is_there(tmp_path, monkeypatch):
    from engine.cli import models as models_cli

    monkeypatch.setattr(models_cli, "find_models", lambda roots: [])
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "om"))
    out, err = io.StringIO(), io.StringIO()
    assert models_cli.main(models_cli_args(json=False), out, err) == 0
    assert [line.split()[:2] for line in out.getvalue().splitlines()] == [
        ["kvtrim", "gemma3-270m"],
        ["kvtrim", "smollm2-135m"],
    ]  # the models kvtrim ships come first, found or not
    assert "no downloaded GGUF models found" in err.getvalue()
    assert str(tmp_path / "om") in err.getvalue()


def test_a_deeply_nested_ollama_manifest_is_skipped_not_fatal(tmp_path):
    """Issue 23 WEAK: '[' * 500,000 raised RecursionError and ended the whole scan."""
    manifest = tmp_path / "manifest"
    manifest.write_text("[" * 500_000)
    assert finder._ollama_blob(tmp_path, manifest) is None
