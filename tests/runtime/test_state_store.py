"""The folder of saved caches under hostile conditions (issue 36, item 8): the folder
is a file, a write is killed midway (SIGKILL), what such writes leave is cleared; no
model needed: the store moves bytes, restore checks them (test_damaged_states.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from engine.errors import DamagedStateError, StateError
from engine.runtime.states import STALE_PARTIAL_S, StateStore
from engine.session.state import STATE_VERSION, SavedState

ROOT = Path(__file__).resolve().parents[2]


def _state(n: int = 1000) -> SavedState:
    meta = {"fingerprint": {"kvtrim_state": STATE_VERSION}, "extra": {"turns": []}}
    return SavedState(meta, {"ids": np.arange(n, dtype=np.int64)}, b"\x01" * n)


def test_a_states_folder_that_is_a_file_saves_nothing_and_reads_nothing(tmp_path):
    folder = tmp_path / "states"
    folder.write_text("not a folder")
    store = StateStore(folder)
    with pytest.raises(StateError, match="cannot save"):
        store.put("doc", _state())
    with pytest.raises(StateError, match="no saved cache") as caught:
        store.get("doc")
    assert not isinstance(caught.value, DamagedStateError)  # nothing to remove, no note
    assert folder.read_text() == "not a folder"


def test_a_planted_folder_where_a_state_file_goes_is_damage_not_a_crash(tmp_path):
    store = StateStore(tmp_path)
    store.path("doc").mkdir(parents=True)
    with pytest.raises(DamagedStateError, match="folder"):
        store.get("doc")


def test_a_write_killed_midway_leaves_nothing_that_is_read_and_is_cleared_later(tmp_path):
    child = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / "tests" / "runtime")!r})
        from test_state_store import _state
        from engine.runtime.states import StateStore
        os.fsync = lambda fd: time.sleep(60)  # the bytes are written, not yet renamed
        StateStore(__import__("pathlib").Path(sys.argv[1])).put("doc", _state(200_000))
    """)
    proc = subprocess.Popen([sys.executable, "-c", child, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".*.partial")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    store = StateStore(tmp_path)
    [partial] = list(tmp_path.glob(".*.partial"))
    with pytest.raises(StateError, match="no saved cache"):
        store.get("doc")  # the half-written file is never taken as the saved cache
    store.put("other", _state())  # a fresh .partial may be another process writing now
    assert partial.exists()
    old = time.time() - STALE_PARTIAL_S - 1
    os.utime(partial, (old, old))
    store.put("other", _state())
    assert not partial.exists() and store.get("other").arrays["ids"][-1] == 999


def test_a_key_written_again_leaves_one_whole_file(tmp_path):
    store = StateStore(tmp_path)
    for n in (10, 20, 30):
        store.put("doc", _state(n))
    assert len(store.get("doc").arrays["ids"]) == 30
    assert [p.name for p in tmp_path.iterdir()] == [store.path("doc").name]


def test_a_full_disk_mid_write_keeps_the_last_good_file_and_leaves_no_partial(
    tmp_path, monkeypatch
):
    import errno

    store = StateStore(tmp_path)
    store.put("doc", _state(10))
    real = np.savez

    def full(f, **arrays):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(StateError, match="No space left"):
        store.put("doc", _state(20))
    monkeypatch.setattr(np, "savez", real)
    assert len(store.get("doc").arrays["ids"]) == 10  # the good file, untouched
    assert not list(tmp_path.glob(".*.partial"))
