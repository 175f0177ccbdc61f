"""The pool's scheduler without a model: a step that never finds room fails with the
reason after ``NO_ROOM_S`` instead of leaving its caller waiting forever."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from engine.errors import CacheFullError
from engine.pool import scheduler as sch


def _scheduler(held: int) -> sch.Scheduler:
    ctx = SimpleNamespace(n_batch=512, n_ctx=2048, close=lambda: None)
    shared = sch.SharedContext(ctx, cache=None)  # type: ignore[arg-type]
    return sch.Scheduler(shared, layout="shared", gather_s=0.01, held=lambda: held)


def test_a_step_that_never_fits_fails_with_the_reason(monkeypatch):
    monkeypatch.setattr(sch, "NO_ROOM_S", 0.3)
    s = _scheduler(held=2048)  # a stale count: every cell held, none ever freed
    start = time.monotonic()
    with pytest.raises(CacheFullError, match="no room in the pool for 0 s: 2048 cells held"):
        s.submit(1, threading.Event(), [1, 2, 3], 0, True, False, None)
    assert 0.3 <= time.monotonic() - start < 5
    s.stop()
    s.join()


def test_a_cancel_still_leaves_a_waiting_step_at_once(monkeypatch):
    monkeypatch.setattr(sch, "NO_ROOM_S", 60.0)
    s = _scheduler(held=2048)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(sch.Cancelled):
        s.submit(1, cancel, [1], 0, True, False, None)
    assert time.monotonic() - start < 2
    s.stop()
    s.join()
