"""Tables and targets of ``kvtrim bench --multiturn`` (see multiturn.py)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..native.kvmemory import pad
from ..policies import keeps_all

_MB = 2**20
TARGET_BUDGET = 1024


def _groups(result: dict[str, Any]) -> dict[tuple[str, int, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in result["records"]:
        groups[(r["policy"], r["budget_tokens"], r["mode"])].append(r)
    return groups


def _row(rs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [t for r in rs for t in r["followup_s"]]
    return {
        "hits": sum(r["hits"] for r in rs),
        "questions": sum(r["questions"] for r in rs),
        "followup_s": statistics.median(times) if times else math.nan,
        "summary_s": statistics.median(r["summary_s"] for r in rs),
        "kv_mb": max(r["kv_bytes"] for r in rs) / _MB,
        "cells": max(r["kv_cells_allocated"] for r in rs),
        "peak": max(r["kv_cells_peak"] for r in rs),
        "host_kb": max(r["recall_host_bytes"] for r in rs) / 1024,
        "rss_mb": max(r["rss_peak_bytes"] for r in rs) / _MB,
        "recalled": statistics.median(a["recalled_tokens"] for r in rs for a in r["answers"]),
    }


def rows(result: dict[str, Any]) -> list[tuple[tuple[str, int, str], dict[str, Any]]]:
    order = {"full": 0, "followup": 1, "memory": 2, "reread": 3}
    items = [(k, _row(v)) for k, v in _groups(result).items()]
    return sorted(items, key=lambda kv: (kv[0][1], kv[0][0], order.get(kv[0][2], 9)))


def targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The issue's targets, measured at budget 1,024 (or the grid's largest)."""
    table = dict(rows(result))
    full = next((v for (p, _, _), v in table.items() if keeps_all(p)), None)
    budgets = sorted({b for (p, b, _) in table if not keeps_all(p)})
    if full is None or not budgets:
        return []
    budget = TARGET_BUDGET if TARGET_BUDGET in budgets else budgets[-1]
    out: list[tuple[str, str, bool]] = []
    n = full["questions"]
    slack = max(1, math.ceil(n / 16))
    for (policy, b, mode), v in table.items():
        if b != budget or mode != "followup":
            continue
        out.append(
            (
                f"{policy} budget {b}: follow-ups after a summary within {slack} hit(s) "
                "of the full cache",
                f"{v['hits']}/{v['questions']} vs full {full['hits']}/{n}",
                v["hits"] >= full["hits"] - slack,
            )
        )
        reread = table.get((policy, b, "reread"))
        if reread is not None:
            ratio = v["followup_s"] / reread["followup_s"]
            out.append(
                (
                    f"{policy} budget {b}: median follow-up <= 0.5x a fresh question-aware read",
                    f"{v['followup_s']:.2f} s vs {reread['followup_s']:.2f} s ({ratio:.2f}x)",
                    ratio <= 0.5,
                )
            )
        memory = table.get((policy, b, "memory"))
        if memory is not None:
            ratio = v["summary_s"] / memory["summary_s"]
            out.append(
                (
                    f"{policy} budget {b}: first turn (summary) no slower than before",
                    f"{v['summary_s']:.1f} s vs {memory['summary_s']:.1f} s ({ratio:.2f}x)",
                    ratio <= 1.1,
                )
            )
        cells = pad(b + max(64, b // 4))
        out.append(
            (
                f"{policy} budget {b}: device KV within the budget's cells",
                f"{v['cells']} cells allocated, peak {v['peak']} (budget + chunk = {cells})",
                v["cells"] <= cells and v["peak"] <= cells,
            )
        )
    return out


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    n_docs = len({r["doc"] for r in result["records"]})  # a run stopped early has fewer
    lines = [
        "# Multi-turn: a summary, then questions about planted facts",
        "",
        f"`{result['command']}` on {result['model']}: {n_docs} documents of about "
        f"{cfg['doc_tokens']} tokens of real text, 4 facts each (a number, a code, a name, "
        "a room number at depths 0.2-0.8); a summary first, then one question per fact, "
        "greedy. `followup`: the cache after the summary plus what recall brings back; "
        "`memory`: the same cache without recall (kvtrim before); `reread`: a fresh "
        "question-aware read of the whole document per question; `full`: every token.",
        "",
        "| policy | budget | mode | hits | median follow-up s | summary s | KV MB | cells "
        "(peak) | recalled tokens (median) | recall index KB | RSS peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (policy, budget, mode), v in rows(result):
        lines.append(
            f"| {policy} | {budget or '-'} | {mode} | {v['hits']}/{v['questions']} | "
            f"{v['followup_s']:.2f} | {v['summary_s']:.1f} | {v['kv_mb']:.1f} | "
            f"{v['cells']} ({v['peak']}) | {v['recalled']:.0f} | {v['host_kb']:.0f} | "
            f"{v['rss_mb']:.0f} |"
        )
    lines += ["", "## Targets", ""]
    for name, measured, ok in targets(result):
        lines.append(f"- {'met' if ok else 'MISSED'}: {name}: {measured}")
    misses = [
        (r["doc"], r["policy"], r["budget_tokens"], r["mode"], a)
        for r in result["records"]
        for a in r["answers"]
        if not a["hit"]
    ]
    if misses:
        lines += ["", "## Misses", "", "| doc | policy | budget | mode | fact | answer |"]
        lines.append("|---|---|---|---|---|---|")
        for doc, policy, budget, mode, a in misses:
            answer = " ".join(a["answer"].split()).replace("|", "\\|")
            lines.append(f"| {doc} | {policy} | {budget} | {mode} | {a['value']} | {answer} |")
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "multiturn.md"
    path.write_text(markdown(result))
    return path
