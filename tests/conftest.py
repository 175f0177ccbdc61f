"""Shared fixtures: one real default model for the whole run."""

from __future__ import annotations

import os
import tempfile

import pytest

# Qt tests run headless; set before pytest-qt creates the QApplication
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# crash logs of app.main runs go to a scratch folder, not the user's
os.environ.setdefault("KVTRIM_CRASH_DIR", tempfile.mkdtemp(prefix="kvtrim-crashes-"))

from engine import Engine

# a numeric variant for the real model's tests (scripts/numeric_margins.py sets these;
# $KVTRIM_REPACK and $LLAMA_CPP_LIB_PATH are read by the engine itself)
THREADS_ENV, BATCH_ENV = "KVTRIM_TEST_THREADS", "KVTRIM_TEST_BATCH"


def engine_variant() -> dict[str, int]:
    """``Engine`` arguments of the numeric variant asked for in the environment."""
    out = {}
    if os.environ.get(THREADS_ENV):
        out["n_threads"] = int(os.environ[THREADS_ENV])
    if os.environ.get(BATCH_ENV):
        out["batch_tokens"] = int(os.environ[BATCH_ENV])
    return out


@pytest.fixture(scope="session")
def engine() -> Engine:
    eng = Engine(**engine_variant())
    yield eng
    eng.close()
