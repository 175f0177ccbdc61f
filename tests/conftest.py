"""Shared fixtures: one real default model for the whole run."""

from __future__ import annotations

import pytest

from engine import Engine


@pytest.fixture(scope="session")
def engine() -> Engine:
    eng = Engine()
    yield eng
    eng.close()
