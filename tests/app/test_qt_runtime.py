"""The Qt binding the app runs on must not corrupt the interpreter.

PySide6 6.12.0 on CPython 3.11 drops one reference to ``True`` on every signal
emission to a Python slot; after a few thousand events (a long answer, a long
prefill) the interpreter aborts with "bool_dealloc: deallocating True or False".
pyproject.toml excludes it; this test catches a binding with the same fault.
"""

from __future__ import annotations

import gc
import sys

from PySide6.QtCore import QObject, Signal


class _Emitter(QObject):
    fired = Signal(object)


def test_signal_emission_keeps_bool_reference_counts(qapp):
    emitter = _Emitter()
    seen: list[object] = []
    emitter.fired.connect(seen.append)
    gc.collect()
    before = sys.getrefcount(True), sys.getrefcount(False)
    for i in range(500):
        emitter.fired.emit(i)
    gc.collect()
    after = sys.getrefcount(True), sys.getrefcount(False)
    assert len(seen) == 500
    # a little drift from unrelated code is fine; one lost reference per emission is not
    assert abs(after[0] - before[0]) < 50 and abs(after[1] - before[1]) < 50, (before, after)
