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


@pytest.fixture(scope="session")
def engine() -> Engine:
    eng = Engine()
    yield eng
    eng.close()
