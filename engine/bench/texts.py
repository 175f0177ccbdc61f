"""Real text that ships offline and that nobody on this project wrote.

The haystacks, summaries and fidelity runs use the Python reference manual's
topic pages (``pydoc_data.topics``, part of every CPython install): prose and
code examples written by the Python documentation team. The RULER suite's
``numbers`` haystack reads release notes (``read_release_notes``).
"""

from __future__ import annotations

import re
from functools import cache

SOURCE = "Python reference manual topics (pydoc_data.topics, shipped with CPython)"


@cache
def corpus() -> str:
    """The topic pages in a fixed order, blank-line separated, whitespace tidied."""
    from pydoc_data.topics import topics

    pages = [topics[key] for key in sorted(topics)]
    text = "\n\n".join(pages)
    return re.sub(r"[ \t]+\n", "\n", text)


def window(offset_chars: int, n_chars: int) -> str:
    """``n_chars`` characters of the corpus from ``offset_chars`` on (wrapping around)."""
    text = corpus()
    start = offset_chars % len(text)
    return (text[start:] + "\n\n" + text)[:n_chars]


NEWS_FILES = (
    ("CPython's NEWS", "/usr/share/doc/python3.11/NEWS.gz"),
    ("glibc's NEWS", "/usr/share/doc/libc6/NEWS.gz"),
)


def read_release_notes(files: tuple[tuple[str, str], ...] = NEWS_FILES) -> tuple[str, str]:
    """``(source, text)`` of the first release notes found: a gzipped NEWS file from
    ``files`` (Debian ships them), else IDLE's ``NEWS.txt`` from the standard library.
    Dense with version numbers, bug ids and option names."""
    import gzip
    from pathlib import Path

    for name, path in files:
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                return f"{name} ({path})", re.sub(r"[ \t]+\n", "\n", f.read())
        except OSError:
            continue
    import idlelib

    path = Path(idlelib.__file__).parent / "NEWS.txt"
    text = path.read_text(encoding="utf-8", errors="replace")
    return f"IDLE's NEWS.txt ({path})", re.sub(r"[ \t]+\n", "\n", text)


@cache
def release_notes() -> tuple[str, str]:
    """``read_release_notes()`` once per process."""
    return read_release_notes()
