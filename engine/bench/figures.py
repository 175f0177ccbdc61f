"""What every report's plots do alike: matplotlib without a display, and the
figure laid out, written and closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out_dir: Path, name: str) -> str:
    """Write ``fig`` as ``out_dir/name`` at 110 dpi and close it; returns ``name``
    (the reports link the plots by file name)."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
