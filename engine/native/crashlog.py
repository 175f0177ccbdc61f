"""A native crash (a segfault in llama.cpp, say) leaves a log the next start reports.

Each process writes ``faulthandler``'s report into its own ``crash-<pid>.log`` in
the user's data folder; a clean exit removes it. At the next start a non-empty
log of a process that is gone is a crash: it is renamed ``crashed-<time>.log`` and
reported once, with what to try.

>>> log = arm()                       # at start-up  # doctest: +SKIP
>>> report = take_last_crash()        # None, or what the last run left  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil
from platformdirs import user_data_dir

CRASH_ENV = "KVTRIM_CRASH_DIR"  # overrides the folder (tests, bundles)
_KEEP = 5  # reported logs kept
_NATIVE_MARKS = ("llama_cpp", "native/context.py", "native\\context.py", "llama_decode", "ggml")
_PHASE = "phase: "  # a line naming what the process was doing, not a crash report
LOADING = "loading model "
QT_START = "starting Qt"
RUNNING = "running"
_state: dict[str, IO[str] | Path] = {}


def crash_dir() -> Path:
    """Where crash logs live: ``$KVTRIM_CRASH_DIR`` or ``<user data>/kvtrim/crashes``."""
    override = os.environ.get(CRASH_ENV)
    return Path(override) if override else Path(user_data_dir("kvtrim")) / "crashes"


def arm() -> Path | None:
    """Send fatal-signal tracebacks of this process to its own log; None when the
    folder cannot be written (the run goes on without a crash log)."""
    if "file" in _state:
        return _state["path"]  # type: ignore[return-value]
    folder = crash_dir()
    path = folder / f"crash-{os.getpid()}.log"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = path.open("w", encoding="utf-8")
    except OSError:
        return None
    handle.write(f"kvtrim pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    handle.flush()
    faulthandler.enable(file=handle, all_threads=True)
    _state.update(file=handle, path=path)
    atexit.register(disarm)
    return path


def phase(text: str) -> None:
    """Note in the log what the process does now (``LOADING`` + the model's path, or
    "running"): a crash report then says it. Nothing when the log is not armed."""
    handle = _state.get("file")
    if handle is None:
        return
    with contextlib.suppress(OSError, ValueError):
        handle.write(f"{_PHASE}{text}\n")  # type: ignore[union-attr]
        handle.flush()  # type: ignore[union-attr]


def disarm() -> None:
    """A clean exit: stop writing and remove this process's (empty) log."""
    handle, path = _state.pop("file", None), _state.pop("path", None)
    if handle is None or path is None:
        return
    with contextlib.suppress(Exception):
        faulthandler.disable()
        handle.close()  # type: ignore[union-attr]
        Path(path).unlink()


@dataclass(frozen=True)
class CrashReport:
    """What a crashed run left: its log and whether the crash was in llama.cpp."""

    log: Path
    in_llama: bool
    first_line: str
    phase: str = ""  # what it was doing (see ``phase``)

    def message(self) -> str:
        """What crashed, in which phase (Qt's start, a model's load, decoding), and
        the advice for that phase only."""
        if self.phase.startswith(LOADING):
            model = self.phase.removeprefix(LOADING)
            return (
                f"the last kvtrim run crashed while llama.cpp loaded {model}: the model file "
                f"looks corrupt or is not supported by this llama.cpp; log: {self.log}"
            )
        if self.phase == QT_START:
            return (
                "the last kvtrim run crashed while Qt opened its window (a missing system "
                "library or no display; kvtrim now names what is missing before it starts "
                f"Qt); log: {self.log}"
            )
        if self.in_llama:
            return (
                f"the last kvtrim run crashed in llama.cpp while decoding; log: {self.log}. "
                "Try --repack off (or KVTRIM_REPACK=off), fewer --gpu-layers or a smaller "
                "--budget, and include the log in a bug report"
            )
        return (
            f"the last kvtrim run crashed with a fatal error; log: {self.log}. Include the "
            "log in a bug report"
        )


def _is_crash(path: Path) -> tuple[bool, str]:
    """(crashed, text): a log with more than its start line holds a fatal report."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False, ""
    lines = [ln for ln in text.splitlines() if not ln.startswith(_PHASE)]
    return len(lines) > 1, text


def take_last_crash() -> CrashReport | None:
    """Report (once) the newest crash of a process that is gone; clears empty logs."""
    folder = crash_dir()
    try:
        logs = sorted(folder.glob("crash-*.log"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    report: CrashReport | None = None
    for path in logs:
        pid = path.stem.removeprefix("crash-")
        if not pid.isdigit() or int(pid) == os.getpid() or psutil.pid_exists(int(pid)):
            continue
        crashed, text = _is_crash(path)
        if not crashed:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
        kept = folder / f"crashed-{stamp}-{pid}.log"
        try:
            path.rename(kept)
        except OSError:
            continue
        lines = text.splitlines()[1:]
        fatal = next((ln for ln in lines if ln.strip() and not ln.startswith(_PHASE)), "")
        phases = [ln.removeprefix(_PHASE) for ln in lines if ln.startswith(_PHASE)]
        in_llama = any(m in text for m in _NATIVE_MARKS)
        report = CrashReport(kept, in_llama, fatal.strip(), phases[-1] if phases else "")
    _prune(folder)
    return report


def _prune(folder: Path) -> None:
    with contextlib.suppress(OSError):
        old = sorted(folder.glob("crashed-*.log"), key=lambda p: p.stat().st_mtime)
        for path in old[:-_KEEP]:
            path.unlink()
