"""A stop is not an error (issue 22, finding 4): the lines llama.cpp logs at ERROR
when a cancel aborts a decode are dropped, while the same lines outside a cancel,
and every other error, still reach the log."""

from __future__ import annotations

import logging
import threading

import pytest
from helpers.docs_for_tests import prose

from engine import Cancelled, Progress
from engine.native import model

ABORT_LINES = (
    "graph_compute: ggml_backend_sched_graph_compute_async failed with error 1",
    "process_ubatch: failed to compute graph, compute status: 1",
    "llama_decode: failed to decode, ret = 2",
)
ERROR = 4  # ggml's log level


def _logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kvtrim.llama"]


def test_abort_lines_are_dropped_only_while_their_decode_is_cancelled(caplog):
    caplog.set_level(logging.ERROR, logger="kvtrim.llama")
    sink = model._llama_log._sink
    cancel = threading.Event()
    with model.decoding(cancel):
        sink(ERROR, ABORT_LINES[0] + "\n")  # not cancelled: a real failure
        cancel.set()
        for line in ABORT_LINES:
            sink(ERROR, line + "\n")
        sink(ERROR, "graph_compute: ggml_backend_sched_graph_compute_async failed with error -1\n")
    sink(ERROR, ABORT_LINES[2] + "\n")  # outside any decode
    assert _logged(caplog) == [
        ABORT_LINES[0],
        "graph_compute: ggml_backend_sched_graph_compute_async failed with error -1",
        ABORT_LINES[2],
    ]


@pytest.mark.slow
def test_cancelling_a_real_decode_logs_no_error(engine, caplog, capfd):
    """Stop lands inside ``llama_decode`` (a timer on another thread, as the app's Stop
    button): llama.cpp aborts the graph and says so at WARNING ("removing memory module
    entries"), and nothing at ERROR reaches the log or the terminal."""
    caplog.set_level(logging.WARNING, logger="kvtrim.llama")
    text = prose(400, seed=3)
    aborted = False
    for _ in range(5):  # a cancel between two decodes aborts nothing: try again
        caplog.clear()
        session = engine.session("snapkv", 256)
        timer = threading.Timer(0.02, session.cancel)
        try:
            with pytest.raises(Cancelled):
                for event in session.ask(text, "Who sold the kettle?", max_tokens=8):
                    if isinstance(event, Progress) and timer.ident is None:
                        timer.start()  # after the first chunk, while the next decodes
        finally:
            session.close()
        aborted = any("removing memory module entries" in m for m in _logged(caplog))
        if aborted:
            break
    assert aborted, "no cancel landed inside llama_decode"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    err = capfd.readouterr().err
    assert not [line for line in ABORT_LINES if line in err]
