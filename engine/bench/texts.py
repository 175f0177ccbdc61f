"""Real text that ships offline and that nobody on this project wrote.

The haystacks, summaries and fidelity runs use the Python reference manual's
topic pages (``pydoc_data.topics``, part of every CPython install): prose and
code examples written by the Python documentation team.
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
