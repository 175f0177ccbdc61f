"""Memory maps of one needle run per policy: which parts of the haystack each
policy still holds when it answers, and where the key was, drawn as one strip
per policy (the picture in the benchmark report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..policies import evicts
from ..runtime.engine import Engine
from ..session.core import Session
from ..session.prompts import Prompt
from ..session.trace import EVICTED, strip
from .tasks import PASSKEY_PREFIX, PASSKEY_SUFFIX, filler_haystack

CELLS = 600  # strip resolution
DEPTH = 0.35  # far from both ends: only a policy that scores finds it
KEY = 53817


def needle_maps(engine: Engine, policies: list[str], length: int, budget: int) -> list[dict]:
    """One passkey run per policy; each record holds its map binned to ``CELLS``."""
    doc = filler_haystack(length, DEPTH, KEY)
    at = doc.index(str(KEY))
    out = []
    for policy in policies:
        b = budget if evicts(policy) else max(budget, length + 64)
        prompt = Prompt(PASSKEY_PREFIX, doc, PASSKEY_SUFFIX, (), engine.model.add_bos)
        with engine.session(policy, b) as s:
            result = Session.collect(s.run(prompt, max_tokens=8))
            m = s.memory_map()
        roles = m.char_roles(m.segment("document"), strongest=True)
        shares, classes = strip(roles, CELLS)
        out.append(
            {
                "policy": policy,
                "budget_tokens": b,
                "tokens": m.tokens_seen,
                "retention": m.retention,
                "answer": result.text.strip(),
                "found": str(KEY) in result.text,
                "needle": [at / len(doc), (at + len(str(KEY))) / len(doc)],
                "needle_kept": bool((roles[at : at + len(str(KEY))] != EVICTED).all()),
                "kept": [round(float(x), 3) for x in shares],
                "top": [c == "top" for c in classes],
            }
        )
    return out


def plot(maps: list[dict], path: Path) -> None:
    """One horizontal strip per policy: kept (teal), strongest (amber), evicted (grey)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    fig, axes = plt.subplots(len(maps), 1, figsize=(10, 0.55 * len(maps) + 0.9), squeeze=False)
    teal, grey, amber = (np.array(to_rgb(c)) for c in ("#2a9d8f", "#c9ccd1", "#e9a23b"))
    for ax, m in zip(axes[:, 0], maps, strict=True):
        kept = np.array(m["kept"])[:, None]
        rgb = kept * teal + (1 - kept) * grey
        rgb[np.array(m["top"])] = amber
        ax.imshow(rgb[None, :, :], aspect="auto", extent=(0, 1, 0, 1))
        lo, hi = m["needle"]
        mid = (lo + hi) / 2  # a marker above the strip, so the strip shows what was kept
        ax.plot([mid], [1.12], marker="v", color="#d62728", markersize=7, clip_on=False)
        ax.set_ylim(0, 1)
        verdict = "found" if m["found"] else "missed"
        ax.set_yticks([0.5], [f"{m['policy']} ({verdict})"])
        ax.set_xticks([])
        ax.set_xlim(0, 1)
    axes[-1, 0].set_xticks([0, 0.25, 0.5, 0.75, 1], ["start", "", "middle", "", "end"])
    first = maps[0]
    fig.suptitle(
        f"What each policy holds when it answers: {first['tokens']:,}-token passkey haystack, "
        f"key (red marker) at {DEPTH:.0%}; teal kept, amber strongest scores, grey evicted",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def summary(maps: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for the report."""
    lines = [
        "| policy | budget | kept / read | key kept | answer |",
        "|---|---:|---:|---|---|",
    ]
    for m in maps:
        lines.append(
            f"| {m['policy']} | {m['budget_tokens']:,} | {m['retention']:.1%} | "
            f"{'yes' if m['needle_kept'] else 'no'} | {m['answer']!r} |"
        )
    return lines
