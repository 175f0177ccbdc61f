"""A cancel stops a running decode through a flag llama.cpp reads in C (issue 37):
no Python runs between graph nodes, so a decode does not wait for the GIL while
another Python thread is busy. The flag alone, llama.cpp obeying it, and a
resized context keeping it."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

import pytest
from helpers.docs_for_tests import prose

from engine import Cancelled
from engine.native import _ggml
from engine.native._ggml import AbortFlag
from engine.native.context import AbortEvent, NativeContext
from engine.session.config import default_threads


def test_the_flag_reads_raised_only_between_put_true_and_put_false():
    flag = AbortFlag()
    assert not flag.raised
    flag.put(True)
    assert flag.raised
    flag.put(False)
    assert not flag.raised


def test_an_abort_event_raises_and_lowers_its_flag():
    event = AbortEvent()
    event.set()
    assert event.is_set() and event.flag.raised
    event.clear()
    assert not event.is_set() and not event.flag.raised


def test_the_callback_is_ggml_code_not_a_python_function():
    """A Python callback would be a ctypes thunk; this one is ggml_is_empty itself."""
    called = ctypes.cast(AbortFlag.callback, ctypes.c_void_p).value
    assert called == ctypes.cast(_ggml._base.ggml_is_empty, ctypes.c_void_p).value


def _context(engine) -> NativeContext:
    return NativeContext(engine.model, n_ctx=512, n_batch=64, n_threads=default_threads(),
                         capture=None)  # fmt: skip


@pytest.mark.slow
def test_llama_cpp_stops_a_decode_on_the_raised_flag_alone(engine):
    """The flag raised behind the event's back (so kvtrim's own check before the
    decode passes): llama.cpp itself aborts the graph, even of one token."""
    ctx = _context(engine)
    tokens = engine.model.tokenize("The kettle was sold on a Tuesday.", add_bos=True)
    entries = [(0, t, i, i == len(tokens) - 1) for i, t in enumerate(tokens)]
    ctx.cancel_event.flag.put(True)
    with pytest.raises(Cancelled):
        ctx.decode_batch(entries[:1])
    ctx.cancel_event.flag.put(False)
    ctx.seq_rm(0, -1)
    ctx.decode_batch(entries)  # lowered: the same decode runs
    assert ctx.pos_max() == len(tokens) - 1


@pytest.mark.slow
def test_a_resized_context_obeys_the_same_cancel(engine):
    ctx = _context(engine)
    bigger = ctx.resized(1024, capture=False, flash_attn=None)
    assert bigger.cancel_event is ctx.cancel_event
    ctx.cancel_event.flag.put(True)  # the flag only: llama.cpp must see it in the new one
    token = engine.model.tokenize("Tuesday", add_bos=True)[0]
    with pytest.raises(Cancelled):
        bigger.decode_batch([(0, token, 0, True)])


@pytest.mark.slow
def test_a_pending_shift_is_applied_whole_even_when_the_flag_is_raised(engine):
    """llama.cpp applies a shift at the next decode by rotating keys in place; stopped
    halfway it would rotate some layers again at the decode after. So a decode that
    carries a shift cannot be stopped, and the one after it can."""
    ctx = _context(engine)
    tokens = engine.model.tokenize("The kettle was sold on a Tuesday in May.", add_bos=True)
    ctx.decode_batch([(0, t, i, False) for i, t in enumerate(tokens)])
    ctx.seq_rm(1, 3)
    ctx.seq_shift(3, -1, -2)
    ctx.cancel_event.flag.put(True)  # behind the event's back, as a Stop landing mid-decode
    n = len(tokens) - 2
    ctx.decode_batch([(0, tokens[-1], n, True)])  # carries the shift: runs whole
    with pytest.raises(Cancelled):
        ctx.decode_batch([(0, tokens[-1], n + 1, True)])


@pytest.mark.slow
def test_ctrl_c_on_the_main_thread_stops_a_long_decode_inside_llama_cpp(engine):
    """Python runs a signal handler only on the main thread, between bytecodes: a long
    decode there asks a Python callback, so a Ctrl+C stops it where it is."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")
    ctx = NativeContext(engine.model, n_ctx=1024, n_batch=512, n_threads=default_threads(),
                        capture=None)  # fmt: skip
    tokens = engine.model.tokenize(prose(600, seed=5), add_bos=True)[:400]
    entries = [(0, t, i, i == len(tokens) - 1) for i, t in enumerate(tokens)]
    previous = signal.signal(signal.SIGINT, lambda *_: ctx.cancel_event.set())
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        start = time.perf_counter()
        with pytest.raises(Cancelled):
            ctx.decode_batch(entries)
        assert ctx.pos_max() < len(tokens) - 1  # stopped inside: not every token is in
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - start < 5
