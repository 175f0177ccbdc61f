"""A cancel stops a running decode through a flag llama.cpp reads in C (issue 37):
no Python runs between graph nodes, so a decode does not wait for the GIL while
another Python thread is busy. The flag alone, llama.cpp obeying it, and a
resized context keeping it."""

from __future__ import annotations

import ctypes

import pytest

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
