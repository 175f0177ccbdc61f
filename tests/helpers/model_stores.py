"""Fake model stores of other tools under a folder (LM Studio, Ollama, the Hugging
Face cache), hostile entries included, for the model finder; files that only need to
look like a GGUF (``gguf``); the arguments of ``kvtrim models``."""

from __future__ import annotations

import json
from pathlib import Path

from engine.native import finder

HEADER = b"GGUF" + (3).to_bytes(4, "little") + bytes(24)  # magic, version, counts


def gguf(path: Path, size: int = 64) -> Path:
    """A file the finder takes for a GGUF: the magic and a full header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(HEADER + bytes(max(0, size - len(HEADER))))
    return path


def lmstudio_store(root: Path) -> Path:
    models = root / "lmstudio" / "models"
    gguf(models / "bartowski" / "Qwen2.5-0.5B-GGUF" / "Qwen2.5-0.5B-Q4_K_M.gguf", 100)
    gguf(models / "bartowski" / "Qwen2.5-0.5B-GGUF" / "mmproj-Qwen2.5-f16.gguf")
    split = models / "unsloth" / "Big-GGUF" / "Q8_0"
    gguf(split / "Big-Q8_0-00001-of-00002.gguf", 300)
    gguf(split / "Big-Q8_0-00002-of-00002.gguf", 200)
    (models / "evil" / "fake").mkdir(parents=True)
    (models / "evil" / "fake" / "notes.gguf").write_bytes(b"PK\x03\x04" + bytes(60))
    (models / "evil" / "fake" / "empty.gguf").write_bytes(b"")
    (models / "evil" / "fake" / "short.gguf").write_bytes(b"GGUF")  # truncated header
    (models / "evil" / "fake" / "readme.txt").write_text("hi")
    (models / "evil" / "fake" / "gone.gguf").symlink_to(models / "nowhere.gguf")
    (models / "evil" / "fake" / "loop").symlink_to(models / "evil")  # a cycle, bounded
    (models / "evil" / "fake" / "fifo.gguf").mkdir()  # a folder named .gguf
    gguf(models / "evil" / "fake" / "a" / "b" / "c" / "too-deep.gguf")
    gguf(models / "flat.gguf")  # not publisher/repo/file: LM Studio would not show it
    gguf(models / ".internal" / "x" / "y" / "hidden.gguf")
    return models


def digest(n: int) -> str:
    return f"{n:064x}"


def _manifest(path: Path, *layers: tuple[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json"},
        "layers": [{"mediaType": m, "digest": d, "size": 1} for m, d in layers],
    }
    path.write_text(json.dumps(body))


MODEL = "application/vnd.ollama.image.model"


def ollama_store(root: Path) -> Path:
    store = root / "ollama" / "models"
    blobs = store / "blobs"
    gguf(blobs / f"sha256-{digest(1)}", 1000)
    gguf(blobs / f"sha256-{digest(2)}", 500)
    gguf(blobs / f"sha256-{digest(3)}", 700)
    (blobs / f"sha256-{digest(4)}").write_bytes(b"{}" + bytes(62))  # not a GGUF
    gguf(blobs / f"sha256-{digest(5)}", 50)
    lib = store / "manifests" / "registry.ollama.ai" / "library"
    _manifest(
        lib / "llama3.2" / "1b",
        ("application/vnd.ollama.image.template", f"sha256:{digest(9)}"),
        (MODEL, f"sha256:{digest(1)}"),
        ("application/vnd.ollama.image.projector", f"sha256:{digest(5)}"),
    )
    _manifest(lib / "llama3.2" / "latest", (MODEL, f"sha256:{digest(1)}"))  # the same blob
    _manifest(
        store / "manifests" / "registry.ollama.ai" / "someone" / "tiny" / "q4",
        (MODEL, f"sha256:{digest(2)}"),
    )
    _manifest(
        store / "manifests" / "hf.co" / "bartowski" / "Foo-GGUF" / "Q4_K_M",
        (MODEL, f"sha256-{digest(3)}"),
    )
    _manifest(lib / "notgguf" / "latest", (MODEL, f"sha256:{digest(4)}"))
    _manifest(lib / "missing" / "latest", (MODEL, f"sha256:{digest(6)}"))
    _manifest(lib / "escape" / "latest", (MODEL, "sha256:../../../lmstudio/models/flat.gguf"))
    _manifest(
        lib / "projector-only" / "latest",
        ("application/vnd.ollama.image.projector", f"sha256:{digest(5)}"),
    )
    (lib / "badjson").mkdir()
    (lib / "badjson" / "latest").write_text('{"layers": [')
    (lib / "listjson").mkdir()
    (lib / "listjson" / "latest").write_text("[1, 2]")
    (lib / "badlayers").mkdir()
    (lib / "badlayers" / "latest").write_text('{"layers": [3, {"mediaType": 4, "digest": null}]}')
    (lib / "huge").mkdir()
    (lib / "huge" / "latest").write_bytes(b" " * (finder._MAX_MANIFEST_BYTES + 1))
    _manifest(
        lib / "deeper" / "tag" / "extra", (MODEL, f"sha256:{digest(2)}")
    )  # a folder, not a tag
    return store


def hf_cache(root: Path) -> Path:
    hub = root / "hf" / "hub"
    repo = hub / "models--unsloth--gemma-3-270m-it-GGUF"
    blobs = repo / "blobs"
    gguf(blobs / "aaa", 400)
    gguf(blobs / "bbb", 10)
    gguf(blobs / "old", 390)
    new, old = repo / "snapshots" / "rev2", repo / "snapshots" / "rev1"
    new.mkdir(parents=True)
    old.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev2")
    (new / "gemma-3-270m-it-Q4_K_M.gguf").symlink_to("../../blobs/aaa")
    (new / "mmproj-F16.gguf").symlink_to("../../blobs/bbb")
    (new / "half-downloaded.gguf").symlink_to("../../blobs/incomplete")
    (old / "gemma-3-270m-it-Q4_K_M.gguf").symlink_to("../../blobs/old")  # an older revision
    (new / "sub").mkdir()
    (new / "sub" / "other.gguf").symlink_to("../../../blobs/bbb")  # same blob as mmproj
    gguf(hub / "datasets--someone--data" / "snapshots" / "r" / "data.gguf")
    gguf(hub / "models--org--notes" / "snapshots" / "r" / "README.md")
    return hub


def models_cli_args(json: bool):
    import argparse

    return argparse.Namespace(command="models", json=json)
