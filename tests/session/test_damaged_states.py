"""Saved caches that were damaged or planted (issue 36, item 1 and 2): each is refused
with one line before llama.cpp sees it, its file is removed, the document is read
again and the answer still comes; llama.cpp's own complaint never lands in the
answer. Files are rewritten as valid archives with one array changed, as an attacker
(or a bit flip before the archive was written) would leave them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.docs_for_tests import passkey_document

from engine.errors import DamagedStateError, StateError
from engine.runtime.states import StateStore
from engine.session.state import SavedState

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
KEY = "68142"
QUESTION = "What is the pass key? Give the number."


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("doc") / "notes.txt"
    path.write_text(passkey_document(60, 0.4, int(KEY)))  # about 1,500 tokens: saved
    return path


def _ask(document: Path, states: Path, *more: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVTRIM_STATES": str(states)}
    cmd = [sys.executable, "-m", "app.main", "ask", str(document), "--question", QUESTION,
           "--answer-prefix", "The pass key is", "--budget", "256", *more]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)


def _only_file(states: Path) -> Path:
    [path] = list(states.glob("*.kvstate"))
    return path


def _damage(path: Path, **arrays: np.ndarray) -> None:
    state = SavedState.read(path)
    state.arrays.update(arrays)
    state.write(path)


def _damaged(name: str, state: SavedState) -> dict[str, np.ndarray]:
    """The one array changed of each case."""
    doc = state.arrays["document"].copy()
    ids = state.arrays["ids"].copy()
    if name == "document":
        doc[len(doc) // 2] = 10_000_000  # past the vocabulary: llama.cpp aborted on it
        return {"document": doc}
    if name == "ids":
        ids[-1] = 1_000_000_000  # past the stream: the memory map indexed with it
        return {"ids": ids}
    if name == "lengths":
        return {"lpos": state.arrays["lpos"][:-3]}
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["document", "ids", "lengths"])
def test_a_damaged_saved_read_is_one_line_removed_and_the_answer_still_comes(
    document, tmp_path, name
):
    states = tmp_path / "states"
    first = _ask(document, states)
    assert first.returncode == 0 and KEY in first.stdout, first.stderr
    path = _only_file(states)
    _damage(path, **_damaged(name, SavedState.read(path)))
    second = _ask(document, states, "--show-kept", str(tmp_path / "kept.html"))
    assert second.returncode == 0, second.stderr[-2000:]
    assert KEY in second.stdout
    notes = [line for line in second.stderr.splitlines() if "damaged" in line]
    assert len(notes) == 1 and "reading the document again" in notes[0], second.stderr
    assert "Traceback" not in second.stderr and "terminate" not in second.stderr
    assert (tmp_path / "kept.html").stat().st_size > 1000
    third = _ask(document, states)  # the damaged file was replaced by a good one
    assert third.returncode == 0 and "damaged" not in third.stderr
    assert "from the saved read of this document" in third.stderr


def test_llama_cpps_complaint_about_bad_kv_bytes_never_lands_in_the_answer(document, tmp_path):
    states = tmp_path / "states"
    assert _ask(document, states).returncode == 0
    path = _only_file(states)
    state = SavedState.read(path)
    garbage = bytes(np.random.default_rng(0).integers(0, 256, len(state.kv), dtype=np.uint8))
    SavedState(state.meta, state.arrays, garbage).write(path)
    again = _ask(document, states)
    assert again.returncode == 0 and again.stdout.strip() == f"The pass key is {KEY}."
    assert "state_seq_set_data" not in again.stdout
    [note] = [line for line in again.stderr.splitlines() if "damaged" in line]
    assert "KV cells" in note and "llama.cpp says" in note  # its complaint is the reason


def test_restore_checks_every_array_before_llama_cpp(engine, tmp_path):
    """In the library: ``DamagedStateError`` (a ``StateError``), the session empty and
    usable; a store removes the file."""
    doc = passkey_document(60, 0.4, int(KEY))
    with engine.session("snapkv", 256) as s:
        s.collect(s.ask(doc, QUESTION, answer_prefix="The pass key is", max_tokens=8))
        good = s.snapshot()
    # the answer's last step picked its token from llama.cpp's logits: none kept
    assert "logits" not in good.arrays and good.meta["predicted"] is True
    store = StateStore(tmp_path)
    bad = {
        "logits": {"logits": np.zeros(10, dtype=np.float32)},
        "cells": {"cell_positions": good.arrays["cell_positions"] + 1},
        "copies": {"copy_src": np.array([5, 6]), "copy_ids": np.array([1])},
        "policy": {"policy.0.ids": np.array([10**9])},
        "trace": {"trace.0.starts": np.array([0, 10**6])},
    }
    with engine.session("snapkv", 256) as s:
        for case, arrays in bad.items():
            store.put(case, SavedState(good.meta, {**good.arrays, **arrays}, good.kv))
            with pytest.raises(DamagedStateError, match="damaged") as caught:
                store.restore(case, s)
            assert "\n" not in str(caught.value), case
            assert not store.path(case).exists() and s.cache.n_used == 0, case
            with pytest.raises(StateError, match="no saved cache"):
                store.get(case)
        store.put("meta", SavedState({**good.meta, "predicted": "yes"}, good.arrays, good.kv))
        with pytest.raises(DamagedStateError, match="turn ended"):
            store.restore("meta", s)
        store.put("good", good)
        store.restore("good", s)
        assert s.can_follow_up and store.path("good").exists()
        # a state saved before ``predicted`` was: its logits say that a turn ended
        older = {k: v for k, v in good.meta.items() if k != "predicted"}
        logits = np.zeros(s.model.info.n_vocab, dtype=np.float32)
        store.put("older", SavedState(older, {**good.arrays, "logits": logits}, good.kv))
        store.restore("older", s)
        assert s.can_follow_up and s.reader.logits is not None
