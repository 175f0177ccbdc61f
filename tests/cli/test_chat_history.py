"""FAIL 6 of issue 23: kvtrim chat's readline history must be a regular file. A FIFO
blocked the prompt forever; a symlink's target was cut to its last 1,000 lines."""

from __future__ import annotations

import io
import os
import threading

from engine.cli.chat import readline_history, usable_history


def test_a_fifo_history_is_not_opened_and_the_prompt_comes(tmp_path):
    fifo = tmp_path / "history"
    os.mkfifo(fifo)
    err = io.StringIO()
    done = threading.Event()

    def chat() -> None:
        with readline_history(fifo, err):
            pass
        done.set()

    threading.Thread(target=chat, daemon=True).start()
    assert done.wait(5), "blocked on the FIFO"
    assert "chat history not kept" in err.getvalue() and "not a regular file" in err.getvalue()


def test_a_symlinked_history_is_not_rewritten_through(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("".join(f"line {i}\n" for i in range(5000)))
    link = tmp_path / "history"
    link.symlink_to(target)
    err = io.StringIO()
    with readline_history(link, err):
        pass
    assert len(target.read_text().splitlines()) == 5000
    assert "is a symlink" in err.getvalue()


def test_a_regular_or_absent_history_is_used(tmp_path):
    assert usable_history(tmp_path / "absent") == tmp_path / "absent"
    (tmp_path / "h").write_text("ask\n")
    assert usable_history(tmp_path / "h") == tmp_path / "h"
    assert usable_history(None) is None
