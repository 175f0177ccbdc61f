"""``--show-kept FILE.html``: the memory map as one self-contained HTML page.

The text the model read, styled as in the app's Memory view (evicted dimmed,
strongest scores highlighted, sinks underlined, recent window tinted), with a
clickable minimap along the right edge and the run's figures at the top.
"""

from __future__ import annotations

import html
import itertools
import stat
from pathlib import Path

import numpy as np

from ..errors import OutputError
from .trace import (
    EVICTED,
    HEADING,
    RECALLED,
    RECENT,
    SCORED,
    SINK,
    TOP,
    UNREAD,
    MemoryMap,
    display_roles,
    strip,
)

BINS = 200  # minimap cells
CLASSES = {
    UNREAD: "u",
    EVICTED: "e",
    SCORED: "k",
    SINK: "s",
    RECENT: "r",
    TOP: "t",
    HEADING: "h",
    RECALLED: "b",
}
MINIMAP = {
    "kept": "#2a9d8f",
    "top": "#e9a23b",
    "recalled": "#8e6bd8",
    "evicted": "#b0b4ba",
    "unread": "#e3e5e8",
}

CSS = """
body{margin:0;font:15px/1.55 system-ui,-apple-system,"Segoe UI",sans-serif;color:#202124}
main{max-width:60rem;padding:1.2rem 3.5rem 4rem 2rem}
header{border-bottom:1px solid #dadce0;margin-bottom:1rem;padding-bottom:.6rem}
header h1{font-size:1.2rem;margin:0 0 .3rem}
.legend span{padding:0 .3rem;margin-right:.4rem}
pre{white-space:pre-wrap;word-wrap:break-word;font:inherit}
.e{color:#9aa0a6}.u{color:#c4c7cc;font-style:italic}.s{text-decoration:underline}
.r{background:#dff3ee}.t{background:#ffe29a}.b{background:#e8dcff}
.h{font-weight:600;color:#5f6368}
nav{position:fixed;top:0;right:0;bottom:0;width:16px;display:flex;flex-direction:column}
nav a{flex:1 1 0;display:block}
@media (prefers-color-scheme:dark){body{background:#1f2226;color:#e6e6e6}
.e{color:#6b7078}.u{color:#50555c}.r{background:#173832}.t{background:#5a4710}
.b{background:#3b2d5c}
header{border-color:#3c4043}.h{color:#9aa0a6}}
"""


def _minimap(roles: np.ndarray) -> list[str]:
    _, classes = strip(roles, BINS)
    return [f'<a href="#m{k}" style="background:{MINIMAP[c]}"></a>' for k, c in enumerate(classes)]


def _body(text: str, roles: np.ndarray) -> str:
    """Spans per run of equal roles, with an anchor at each minimap cell's start."""
    edges = set(np.linspace(0, len(roles), BINS + 1).astype(np.int64)[:-1].tolist())
    cuts = set((np.flatnonzero(np.diff(roles)) + 1).tolist()) | edges | {0, len(roles)}
    bounds = sorted(c for c in cuts if c <= len(roles))
    anchors = {int(e): k for k, e in enumerate(sorted(edges))}
    out = []
    for a, b in itertools.pairwise(bounds):
        if a in anchors:
            out.append(f'<span id="m{anchors[a]}"></span>')
        cls = CLASSES.get(int(roles[a]), "k")
        out.append(f'<span class="{cls}">{html.escape(text[a:b])}</span>')
    return "".join(out)


def render_html(m: MemoryMap, *, model: str = "", question: str = "", answer: str = "") -> str:
    """A self-contained page (inline CSS, no scripts, no external files)."""
    text, roles = display_roles(m)
    title = f"kvtrim: what {m.policy} kept at a {m.budget_tokens:,}-token budget"
    figures = (
        f"{html.escape(model)} · policy <b>{html.escape(m.policy)}</b>, budget "
        f"<b>{m.budget_tokens:,}</b> tokens · the cache holds <b>{m.tokens_kept:,}</b> of "
        f"<b>{m.tokens_seen:,}</b> tokens read ({m.retention:.1%})"
    )
    qa = ""
    if question:
        qa += f"<p><b>Question:</b> {html.escape(question)}</p>"
    if answer:
        qa += f"<p><b>Answer:</b> {html.escape(answer)}</p>"
    legend = (
        '<p class="legend"><span class="t">strongest scores</span><span class="r">recent '
        'window</span><span class="b">brought back for the question</span>'
        '<span class="s">sink</span><span>kept</span><span class="e">evicted'
        '</span><span class="u">not read</span></p>'
    )
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<header><h1>{html.escape(title)}</h1><p>{figures}</p>{qa}{legend}</header>"
        f"<pre>{_body(text, roles)}</pre></main><nav>{''.join(_minimap(roles))}</nav>"
        f"</body></html>\n"
    )


def write_page(path: Path, page: str) -> None:
    """Write ``page`` at ``path``, which may be new or an HTML file; anything else
    there (a text file, a FIFO, a folder) is left alone with one line."""
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if info is not None and not (
        stat.S_ISREG(info.st_mode) and path.suffix.lower() in (".html", ".htm")
    ):
        raise OutputError(f"{path} exists and is not an HTML page; choose another name")
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None

