"""Find the GGUF models already on this computer: LM Studio's models folder,
Ollama's model store and the Hugging Face cache.

Only cheap file-system work: bounded depth, a cap on the folders listed and on
the time spent, and nothing a hostile or half-downloaded store holds (unreadable
folders, broken symlinks, bad JSON, files that are not GGUF) raises.

Where each store lives, from the tools' own sources:

- LM Studio (lmstudio-js, ``findLMStudioHome``): ``$LMSTUDIO_HOME``, else the
  folder named in ``~/.lmstudio-home-pointer``, else ``~/.cache/lm-studio`` (older
  installs), else ``~/.lmstudio``; models are ``<home>/models/<publisher>/<repo>/*.gguf``.
- Ollama (``envconfig.Models``, ``manifest/paths.go``, ``manifest.Manifests``):
  ``$OLLAMA_MODELS``, else ``~/.ollama/models`` (the Linux service: under
  ``/usr/share/ollama``); manifests are ``manifests/<host>/<namespace>/<model>/<tag>``
  (JSON), the weights the layer of media type ``application/vnd.ollama.image.model``,
  stored as ``blobs/sha256-<hex>``.
- Hugging Face (``huggingface_hub.constants``): ``$HF_HUB_CACHE``, else
  ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``; files are
  ``models--<org>--<name>/snapshots/<rev>/...`` (symlinks into ``blobs/``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ModelError
from .model import check_gguf

log = logging.getLogger("kvtrim.finder")

Source = Literal["LM Studio", "Ollama", "Hugging Face"]

MAX_DIRS = 4000  # folders listed per scan, all stores together
MAX_ENTRIES = 5000  # entries read from one folder
TIME_LIMIT_S = 3.0  # a slow disk or network home stops the scan, not the app
_MAX_MANIFEST_BYTES = 1 << 20
_MAX_POINTER_BYTES = 4096

_OLLAMA_MODEL = "application/vnd.ollama.image.model"
_OLLAMA_DEFAULT_HOST = "registry.ollama.ai"
_OLLAMA_DEFAULT_NAMESPACE = "library"
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_OLLAMA_SYSTEM = Path("/usr/share/ollama/.ollama/models")


@dataclass(frozen=True)
class FoundModel:
    """A GGUF model some other tool downloaded: ``path`` is what llama.cpp opens."""

    name: str
    path: Path
    source: Source
    size_bytes: int


@dataclass(frozen=True)
class Roots:
    """The folders to search: LM Studio models folders, Ollama model stores
    (holding ``manifests/`` and ``blobs/``) and Hugging Face hub caches."""

    lmstudio: tuple[Path, ...] = ()
    ollama: tuple[Path, ...] = ()
    huggingface: tuple[Path, ...] = ()

    def all(self) -> list[tuple[Source, Path]]:
        """Every root with its source, for messages."""
        return [
            *(("LM Studio", p) for p in self.lmstudio),
            *(("Ollama", p) for p in self.ollama),
            *(("Hugging Face", p) for p in self.huggingface),
        ]


def default_roots(environ: Mapping[str, str] | None = None, home: Path | None = None) -> Roots:
    """Where the three tools keep models here: the one place that reads the
    environment and the home folder."""
    env = os.environ if environ is None else environ

    def var(key: str) -> str:  # as Ollama reads its variables: trimmed, unquoted
        return env.get(key, "").strip().strip("\"'")

    def expand(value: str) -> Path:
        return Path(os.path.expanduser(os.path.expandvars(value)))

    if home is None:
        try:
            home = Path.home()
        except (RuntimeError, KeyError, OSError):  # no home folder: only the variables
            home = None
    lm_homes: list[Path] = []
    if var("LMSTUDIO_HOME"):
        lm_homes.append(expand(var("LMSTUDIO_HOME")))
    if home is not None:
        pointer = _read_small(home / ".lmstudio-home-pointer", _MAX_POINTER_BYTES)
        if pointer and pointer.strip():
            lm_homes.append(Path(pointer.strip()))
        lm_homes += [home / ".lmstudio", home / ".cache" / "lm-studio"]
    ollama: list[Path] = []
    if var("OLLAMA_MODELS"):
        ollama.append(expand(var("OLLAMA_MODELS")))
    if home is not None:
        ollama.append(home / ".ollama" / "models")
    if sys.platform.startswith("linux"):
        ollama.append(_OLLAMA_SYSTEM)
    hf: Path | None = None
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            hf = expand(env[key])
            break
    else:
        if env.get("HF_HOME"):
            hf = expand(env["HF_HOME"]) / "hub"
        elif env.get("XDG_CACHE_HOME"):
            hf = expand(env["XDG_CACHE_HOME"]) / "huggingface" / "hub"
        elif home is not None:
            hf = home / ".cache" / "huggingface" / "hub"
    return Roots(
        lmstudio=_unique(p / "models" for p in lm_homes),
        ollama=_unique(ollama),
        huggingface=_unique([hf] if hf is not None else []),
    )


def find_models(
    roots: Roots | None = None,
    *,
    max_dirs: int = MAX_DIRS,
    time_limit_s: float = TIME_LIMIT_S,
) -> list[FoundModel]:
    """The GGUF models in ``roots`` (default: ``default_roots()``), sorted by source
    then name, one per file: first shards of split models only, no vision
    projectors. Never raises for what it finds on disk."""
    roots = default_roots() if roots is None else roots
    budget = _Budget(max_dirs, time.monotonic() + time_limit_s)
    scans: list[tuple[Callable[[Path, _Budget], Iterator[FoundModel]], tuple[Path, ...]]] = [
        (_scan_lmstudio, roots.lmstudio),
        (_scan_ollama, roots.ollama),
        (_scan_huggingface, roots.huggingface),
    ]
    found: list[FoundModel] = []
    for scan, folders in scans:
        for folder in folders:
            try:
                found.extend(scan(folder, budget))
            except Exception as exc:  # a store we did not foresee must not stop the app
                log.warning("skipped %s: %s", folder, exc)
    found.sort(key=lambda m: (m.source, m.name.casefold(), m.name, str(m.path)))
    seen: set[Path] = set()
    unique: list[FoundModel] = []
    for model in found:
        key = _resolved(model.path) or model.path
        if key not in seen:
            seen.add(key)
            unique.append(model)
    return unique


def format_size(n: int) -> str:
    """``4.1 GB``, ``512 MB``: decimal units, as the tools that download models show them."""
    if n >= 1_000_000_000:
        return f"{n / 1e9:.1f} GB"
    return f"{max(n, 0) / 1e6:.0f} MB"


# -- the stores ------------------------------------------------------------


def _scan_lmstudio(models: Path, budget: _Budget) -> Iterator[FoundModel]:
    """``<models>/<publisher>/<repo>/*.gguf``, and one folder deeper."""
    for publisher in _subdirs(models, budget):
        for repo in _subdirs(publisher, budget):
            for rel, path in _gguf_files(repo, budget, depth=2):
                model = _model("LM Studio", f"{publisher.name}/{repo.name}: {rel}", path)
                if model is not None:
                    yield model


def _scan_ollama(store: Path, budget: _Budget) -> Iterator[FoundModel]:
    """Every ``manifests/<host>/<namespace>/<model>/<tag>`` whose model layer is a GGUF blob."""
    for host in _subdirs(store / "manifests", budget):
        for namespace in _subdirs(host, budget):
            for name in _subdirs(namespace, budget):
                for tag in _entries(name, budget):
                    if not _is_file(tag):
                        continue
                    blob = _ollama_blob(store, tag)
                    if blob is None:
                        continue
                    model = _model(
                        "Ollama", _ollama_name(host.name, namespace.name, name.name, tag.name), blob
                    )
                    if model is not None:
                        yield model


def _ollama_blob(store: Path, manifest: Path) -> Path | None:
    """The weights a manifest names (its last model layer, as Ollama takes it)."""
    text = _read_small(manifest, _MAX_MANIFEST_BYTES)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # "[" * 500,000 is not a manifest
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return None
    blob: Path | None = None
    for layer in layers:
        if not isinstance(layer, dict) or layer.get("mediaType") != _OLLAMA_MODEL:
            continue
        digest = layer.get("digest")
        match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        blob = store / "blobs" / f"sha256-{match.group(1)}" if match else None
    return blob


def _ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """As ``ollama list`` shows it (``Name.DisplayShortest``)."""
    if host.casefold() != _OLLAMA_DEFAULT_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    if namespace.casefold() != _OLLAMA_DEFAULT_NAMESPACE:
        return f"{namespace}/{model}:{tag}"
    return f"{model}:{tag}"


def _scan_huggingface(hub: Path, budget: _Budget) -> Iterator[FoundModel]:
    """``models--<org>--<name>/snapshots/<rev>/**.gguf``: one entry per file name
    and repository, from the revision ``refs/main`` names, else the newest."""
    for repo in _subdirs(hub, budget):
        if not repo.name.startswith("models--"):
            continue
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        main = (_read_small(repo / "refs" / "main", 256) or "").strip()
        snapshots = _subdirs(repo / "snapshots", budget)
        snapshots.sort(key=lambda s: (s.name != main, -_mtime(s)))
        seen: set[str] = set()
        for snapshot in snapshots:
            for rel, path in _gguf_files(snapshot, budget, depth=3):
                if rel in seen:
                    continue
                seen.add(rel)
                model = _model("Hugging Face", f"{repo_id}: {rel}", path)
                if model is not None:
                    yield model


# -- one candidate ---------------------------------------------------------


def _model(source: Source, name: str, path: Path) -> FoundModel | None:
    """A ``FoundModel`` if ``path`` is a GGUF llama.cpp can be given: not a vision
    projector, not a later shard; a split model's size is that of its shards."""
    filename = path.name.casefold()
    if "mmproj" in filename:
        return None
    split = _SPLIT.match(path.name)
    if split and int(split["index"]) != 1:
        return None
    try:
        check_gguf(path)
        size = path.stat().st_size
    except (ModelError, OSError, ValueError):
        return None
    if split:
        for i in range(2, int(split["count"]) + 1):
            shard = path.with_name(f"{split['prefix']}-{i:05d}-of-{split['count']}.gguf")
            with contextlib.suppress(OSError, ValueError):
                size += shard.stat().st_size
    return FoundModel(name=name, path=path, source=source, size_bytes=size)


# -- bounded file-system reads ---------------------------------------------


@dataclass
class _Budget:
    """How many folders a scan may still list, and until when."""

    dirs: int
    deadline: float
    spent: bool = False

    def take(self) -> bool:
        if self.dirs <= 0 or time.monotonic() > self.deadline:
            if not self.spent:
                log.warning("stopped looking for models: too many folders or too slow")
            self.spent = True
            return False
        self.dirs -= 1
        return True


def _entries(folder: Path, budget: _Budget) -> list[Path]:
    """Up to ``MAX_ENTRIES`` visible entries of ``folder``, sorted; none on any error."""
    if not budget.take():
        return []
    out: list[Path] = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if not entry.name.startswith("."):
                    out.append(Path(entry.path))
                if len(out) >= MAX_ENTRIES:
                    break
    except (OSError, ValueError):
        return []
    return sorted(out)


def _subdirs(folder: Path, budget: _Budget) -> list[Path]:
    """The folders in ``folder`` (symlinks to folders too: depth is bounded by the callers)."""
    return [p for p in _entries(folder, budget) if _is_dir(p)]


def _gguf_files(folder: Path, budget: _Budget, depth: int) -> Iterator[tuple[str, Path]]:
    """``(relative name, path)`` of the ``*.gguf`` files up to ``depth`` levels down."""
    for entry in _entries(folder, budget):
        if entry.name.casefold().endswith(".gguf") and _is_file(entry):
            yield entry.name, entry
        elif depth > 1 and _is_dir(entry):
            for rel, path in _gguf_files(entry, budget, depth - 1):
                yield f"{entry.name}/{rel}", path


def _stat_mode(path: Path) -> int:
    try:
        return path.stat().st_mode
    except (OSError, ValueError):
        return 0


def _is_dir(path: Path) -> bool:
    return stat.S_ISDIR(_stat_mode(path))


def _is_file(path: Path) -> bool:
    return stat.S_ISREG(_stat_mode(path))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except (OSError, ValueError):
        return 0.0


def _read_small(path: Path, limit: int) -> str | None:
    """The text of a regular file of at most ``limit`` bytes, else None."""
    if not _is_file(path):
        return None
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except (OSError, ValueError):
        return None
    if len(data) > limit:
        return None
    return data.decode("utf-8", errors="replace")


def _resolved(path: Path) -> Path | None:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None


def _unique(paths: Iterable[Path]) -> tuple[Path, ...]:
    """``paths`` without repeats, in order."""
    out: list[Path] = []
    for p in paths:
        if p not in out:
            out.append(p)
    return tuple(out)
