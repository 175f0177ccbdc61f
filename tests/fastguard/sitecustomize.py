"""The fast tier's guard in child processes (tests/conftest.py puts this folder on
their ``PYTHONPATH``): llama.cpp refuses to load a real model file, so a test that
runs one in a child fails with a line saying it must be marked slow."""

from __future__ import annotations

import os

MODEL_BYTES = 2**20  # a file this large is a model; broken test files are smaller
MESSAGE = "this test loads a model: mark it slow (tests/conftest.py)"


def install() -> None:
    """Wrap ``llama_cpp._internals.LlamaModel`` (what ``engine.native.model`` calls)."""
    from llama_cpp import _internals

    real = getattr(_internals.LlamaModel, "_kvtrim_real", _internals.LlamaModel)

    def guarded(*, path_model: str, **kwargs: object) -> object:
        if os.path.getsize(path_model) > MODEL_BYTES:
            raise RuntimeError(MESSAGE)
        return real(path_model=path_model, **kwargs)  # a broken test file: fast

    guarded._kvtrim_real = real  # type: ignore[attr-defined]
    _internals.LlamaModel = guarded  # type: ignore[misc]


if os.environ.get("KVTRIM_FAST_TIER"):
    install()
