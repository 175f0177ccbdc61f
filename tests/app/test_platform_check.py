"""A desktop without Qt's system libraries, or without a display (issue 36, item 4):
the missing packages are named, for Debian/Ubuntu and Fedora, before Qt starts (Qt
aborts the process instead), and the start records its phase for the crash note."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app import main as app_main
from app import platform_check as pc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="xcb: Linux")


def test_the_missing_libraries_are_named_with_their_packages(monkeypatch, tmp_path):
    monkeypatch.setattr(pc, "missing_libraries", lambda plugin: ["libxcb-cursor.so.0"])
    plugin = tmp_path / "libqxcb.so"
    problem = pc.window_problem({"DISPLAY": ":0"}, plugin)
    assert problem is not None and "libxcb-cursor.so.0" in problem
    assert "sudo apt install libxcb-cursor0" in problem
    assert "sudo dnf install xcb-util-cursor" in problem
    assert "\n" not in problem and "kvtrim ask" in problem


def test_no_display_and_other_platforms(monkeypatch, tmp_path):
    monkeypatch.setattr(pc, "missing_libraries", lambda plugin: ["libxcb-icccm.so.4"])
    assert "DISPLAY is not set" in pc.window_problem({}, tmp_path)
    assert pc.window_problem({"WAYLAND_DISPLAY": "wayland-0"}, tmp_path) is None
    assert pc.window_problem({"QT_QPA_PLATFORM": "offscreen"}, tmp_path) is None
    monkeypatch.setattr(pc, "missing_libraries", lambda plugin: [])
    assert pc.window_problem({"DISPLAY": ":0"}, tmp_path) is None


def test_ldd_finds_every_missing_library_of_a_real_file(tmp_path):
    """Against this machine's own PySide6 plugin: whatever ldd says is missing is a
    real soname (the list may be empty on a full desktop)."""
    plugin = pc.xcb_plugin()
    if plugin is None:
        pytest.skip("PySide6 ships no xcb plugin here")
    for name in pc.missing_libraries(plugin):
        assert ".so" in name and " " not in name
    assert pc.missing_libraries(Path("/bin/true")) == []


def test_the_app_says_it_in_one_line_before_qt_starts(monkeypatch, capsys):
    monkeypatch.setattr(pc, "window_problem", lambda: "kvtrim's window cannot open: X")
    started = []
    monkeypatch.setattr(app_main.crashlog, "phase", started.append)
    assert app_main.run_app() == 2
    assert capsys.readouterr().err == "kvtrim: error: kvtrim's window cannot open: X\n"
    assert started == []  # Qt never started
