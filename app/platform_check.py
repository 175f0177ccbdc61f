"""What stops Qt's window from opening on this Linux desktop, said before Qt tries.

Qt aborts the process ("Could not load the Qt platform plugin xcb") when the system
libraries its xcb plugin links against are missing, typically ``libxcb-cursor0`` on a
fresh Debian or Ubuntu desktop. ``window_problem`` finds them first (``ldd`` on the
plugin, else loading it) and names the packages that provide them, so the user reads
one line and the next start does not report a crash with unrelated advice.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

PACKAGES: dict[str, tuple[str, str]] = {  # soname: (Debian/Ubuntu, Fedora)
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-xinerama.so.0": ("libxcb-xinerama0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libEGL.so.1": ("libegl1", "libglvnd-egl"),
    "libGL.so.1": ("libgl1", "libglvnd-glx"),
    "libOpenGL.so.0": ("libopengl0", "libglvnd-opengl"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
}
_NOT_FOUND = re.compile(r"^\s*(\S+) => not found", re.MULTILINE)
_DLOPEN = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file")


def xcb_plugin() -> Path | None:
    """PySide6's xcb platform plugin, if it ships one."""
    try:
        import PySide6
    except ImportError:
        return None
    path = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return path if path.is_file() else None


def missing_libraries(plugin: Path) -> list[str]:
    """The libraries ``plugin`` needs that this system lacks: every one ``ldd`` names,
    else the first one loading it fails on."""
    ldd = shutil.which("ldd")
    if ldd is not None:
        try:
            out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=10)
            return list(dict.fromkeys(_NOT_FOUND.findall(out.stdout)))
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        ctypes.CDLL(str(plugin))
    except OSError as exc:
        found = _DLOPEN.search(str(exc))
        return [found.group(1) if found else str(exc)]
    return []


def install_line(names: list[str]) -> str:
    """``Debian/Ubuntu: sudo apt install ...; Fedora: sudo dnf install ...``."""
    debian = [PACKAGES.get(n, (n, n))[0] for n in names]
    fedora = [PACKAGES.get(n, (n, n))[1] for n in names]
    return (
        f"Debian/Ubuntu: sudo apt install {' '.join(dict.fromkeys(debian))}; "
        f"Fedora: sudo dnf install {' '.join(dict.fromkeys(fedora))}"
    )


def window_problem(
    environ: Mapping[str, str] | None = None, plugin: Path | None = None
) -> str | None:
    """One line saying why the window cannot open here, or None (not Linux, another
    platform plugin chosen, or nothing missing)."""
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux"):
        return None
    platform = env.get("QT_QPA_PLATFORM", "")
    if platform and not platform.startswith("xcb"):
        return None  # offscreen, wayland, vnc...: Qt's own errors apply
    if not env.get("DISPLAY"):
        if env.get("WAYLAND_DISPLAY") and not platform:
            return None  # Qt may take its Wayland plugin
        return (
            "kvtrim's window needs a desktop: DISPLAY is not set. Start it from a desktop "
            "session, or use the command line (kvtrim ask FILE --question TEXT)"
        )
    plugin = plugin or xcb_plugin()
    missing = missing_libraries(plugin) if plugin is not None else []
    if not missing:
        return None
    return (
        f"kvtrim's window cannot open: Qt's xcb platform plugin needs {', '.join(missing)}, "
        f"not installed here. {install_line(missing)}. The command line works without them "
        "(kvtrim ask FILE --question TEXT)"
    )
