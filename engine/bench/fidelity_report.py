"""Tables of ``kvtrim bench --fidelity`` (fidelity.py): accuracy per cell with 95%
Wilson intervals, each setting against the full cache on the same items (Newcombe's
paired interval), position modes against each other, and why answers were wrong.

A cell is one model, path (``first`` question or ``follow``-up), haystack and
length; ``auto`` is read off the compact and bounded records (each says whether
``auto`` would have chosen it). Accuracies in percent, lengths in tokens.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .intervals import paired_difference, separated, wilson

Record = dict[str, Any]
Item = tuple[Any, ...]  # (model file, haystack, length, doc, q)
MIN_ITEMS = 30  # per cell, before a cell may decide anything
RATIOS = (8, 32)  # document / budget ratios of the first target
WITHIN = 0.05  # the first target: within 5 points of the full cache
PAST_SHARE = 0.9  # past the trained context: 90% of the full cache's accuracy
PATHS = ("first", "recall", "follow")
FULL_PATH = {"recall": "first"}  # the full cache's records each path is held against
DEFAULT_PATH = "recall"  # a first question's answer with the defaults (recall_first, issue 34)
PATH_TITLES = {
    "first": "first questions without recall (--no-recall-first)",
    "recall": "first questions with recall (the default)",
    "follow": "follow-up questions",
}


def item(r: Record) -> Item:
    return (r["model_file"], r["haystack"], r["length"], r["doc"], r["q"])


def answered(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.get("error") is None and r.get("right") is not None]


def with_auto(records: list[Record]) -> list[Record]:
    """``records`` plus, for each compact or bounded record ``auto`` would have made,
    a copy as the setting ``<policy>-<budget>-auto``."""
    extra = [
        {**r, "setting": f"{r['policy']}-{r['budget']}-auto", "positions": "auto"}
        for r in records
        if r.get("auto_is") and r.get("positions") in ("compact", "bounded")
    ]
    return records + extra


def _by_setting(records: list[Record]) -> dict[str, dict[Item, bool]]:
    out: dict[str, dict[Item, bool]] = defaultdict(dict)
    for r in answered(records):
        out[r["setting"]][item(r)] = bool(r["right"])
    return out


def cell(hits: int, n: int) -> str:
    """``hits/n pct% (low-high)``, the interval Wilson's."""
    if n == 0:
        return "-"
    low, high = wilson(hits, n)
    return f"{hits}/{n} {100 * hits / n:.0f}% ({100 * low:.0f}-{100 * high:.0f})"


def diff_cell(first: dict[Item, bool], second: dict[Item, bool]) -> tuple[str, Any]:
    """``first - second`` on the items both have, in points with Newcombe's interval;
    and ``(difference, low, high, n)`` (None with no common item)."""
    common = sorted(set(first) & set(second))
    if not common:
        return "-", None
    d, low, high = paired_difference([first[i] for i in common], [second[i] for i in common])
    mark = " *" if separated(low, high) else ""
    text = f"{100 * d:+.0f} ({100 * low:+.0f}..{100 * high:+.0f}, n={len(common)}){mark}"
    return text, (d, low, high, len(common))


def _order(setting: str) -> tuple[int, str]:
    return (0 if setting == "full" else 2 if setting.endswith("-auto") else 1, setting)


def _groups(records: list[Record]) -> dict[tuple[str, str, str, int], list[Record]]:
    """Records by (model, policy-budget, path, budget) of the evicting settings, each
    group with the full cache's records of the same model and path."""
    out: dict[tuple[str, str, str, int], list[Record]] = defaultdict(list)
    full = defaultdict(list)
    for r in records:
        if r["setting"] == "full":
            full[(r["model"], r["path"])].append(r)
        else:
            out[(r["model"], f"{r['policy']}-{r['budget']}", r["path"], r["budget"])].append(r)
    # the full cache evicts nothing to recall: its first answers are the reference
    return {k: v + full[(k[0], FULL_PATH.get(k[2], k[2]))] for k, v in out.items()}


def cell_table(records: list[Record], budget: int) -> list[str]:
    """A row per haystack and length (and one per length over every haystack): each
    setting's accuracy, and ``auto`` against the full cache."""
    settings = sorted({r["setting"] for r in records}, key=_order)
    auto = next((s for s in settings if s.endswith("-auto")), None)
    lines = [
        "| haystack | tokens (x budget) | " + " | ".join(settings) + " | auto - full |",
        "|---|---|" + "---|" * (len(settings) + 1),
    ]
    lengths = sorted({r["length"] for r in records})
    haystacks = sorted({r["haystack"] for r in records})
    for length in lengths:
        for name in [*haystacks, "all"]:
            at = [r for r in records if r["length"] == length and name in ("all", r["haystack"])]
            got = _by_setting(at)
            row = [cell(sum(got[s].values()), len(got[s])) for s in settings]
            diff = diff_cell(got[auto], got["full"])[0] if auto and "full" in got else "-"
            who = f"**{name}**" if name == "all" else name
            lines.append(
                f"| {who} | {length:,} ({length / budget:g}) | " + " | ".join(row) + f" | {diff} |"
            )
    return lines


def modes_table(records: list[Record], budget: int) -> list[str]:
    """Compact against bounded on the same items, per length (every haystack)."""
    lines = ["| tokens (x budget) | compact - bounded | items |", "|---|---|---|"]
    for length in sorted({r["length"] for r in records}):
        got = _by_setting([r for r in records if r["length"] == length])
        pair = (
            [s for s in got if s.endswith("-compact")],
            [s for s in got if s.endswith("-bounded")],
        )
        if not (pair[0] and pair[1]):
            continue
        text, found = diff_cell(got[pair[0][0]], got[pair[1][0]])
        lines.append(f"| {length:,} ({length / budget:g}) | {text} | {found[3] if found else 0} |")
    return lines


def recall_table(recall: list[Record], first: list[Record], budget: int) -> list[str]:
    """Each evicting setting's first question answered with recall against without,
    on the same items, per length (every haystack)."""
    lines = ["| setting | tokens (x budget) | with recall - without |", "|---|---|---|"]
    for length in sorted({r["length"] for r in recall}):
        with_, without = (
            _by_setting([r for r in rs if r["length"] == length]) for rs in (recall, first)
        )
        for setting in sorted(with_, key=_order):
            if setting != "full" and setting in without:
                text = diff_cell(with_[setting], without[setting])[0]
                lines.append(f"| {setting} | {length:,} ({length / budget:g}) | {text} |")
    return lines


def why_table(records: list[Record]) -> list[str]:
    """Per setting: wrong answers split by whether the value was still held (the
    model's miss) or evicted (the policy's), distractor answers, and margins."""
    lines = [
        "| setting | items | wrong | value held | value evicted | a distractor's value "
        "| median margin of the wrong (nats) |",
        "|---|---|---|---|---|---|---|",
    ]
    by: dict[str, list[Record]] = defaultdict(list)
    for r in answered(records):
        by[r["setting"]].append(r)
    for setting in sorted(by, key=_order):
        rs = by[setting]
        wrong = [r for r in rs if not r["right"]]
        held = sum(1 for r in wrong if (r.get("kept") or 0) >= 0.99)
        distracted = sum(1 for r in wrong if r.get("distracted"))
        margins = [r["margin"] for r in wrong if r.get("margin") is not None]
        median = f"{statistics.median(margins):.2f}" if margins else "-"
        lines.append(
            f"| {setting} | {len(rs)} | {len(wrong)} | {held} | {len(wrong) - held} "
            f"| {distracted} | {median} |"
        )
    return lines


def _auto_vs_full(records: list[Record], keep: Callable[[Record], bool]) -> list[tuple[Any, ...]]:
    """``(model, haystack, length, difference, low, high, n)`` of ``auto`` against the
    full cache in each first-question cell that ``keep`` accepts, on the default path."""
    out = []
    for (model, _, path, budget), rs in _groups(with_auto(records)).items():
        if path != DEFAULT_PATH:
            continue
        for length in sorted({r["length"] for r in rs}):
            for name in sorted({r["haystack"] for r in rs}):
                at = [r for r in rs if r["length"] == length and r["haystack"] == name]
                if not at or not keep(at[0] | {"budget": budget}):
                    continue
                got = _by_setting(at)
                auto = next((s for s in got if s.endswith("-auto")), None)
                if auto and "full" in got:
                    _, found = diff_cell(got[auto], got["full"])
                    if found:
                        out.append((model, name, length, *found))
    return out


def targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 34's targets on the default settings (``auto``), each model apart."""
    records = result["records"]
    out = []
    in_range = lambda r: RATIOS[0] <= r["length"] / r["budget"] <= RATIOS[1]  # noqa: E731
    cells = _auto_vs_full(records, in_range)
    for model in sorted({c[0] for c in cells}):
        mine = [c for c in cells if c[0] == model]
        enough = [c for c in mine if c[6] >= MIN_ITEMS]
        worst = min(mine, key=lambda c: c[3])
        ok = len(enough) == len(mine) and all(c[3] >= -WITHIN for c in mine)
        out.append((
            f"{model}: auto within {100 * WITHIN:.0f} points of the full cache at "
            f"{RATIOS[0]}-{RATIOS[1]}x the budget, every haystack, >= {MIN_ITEMS} items",
            f"{len(mine)} cells ({len(enough)} with >= {MIN_ITEMS} items); worst {worst[1]} "
            f"{worst[2]:,}: {_points(*worst[3:6])}",
            ok,
        ))  # fmt: skip
    out += _past_training(records)
    return out


def _points(d: float, low: float, high: float) -> str:
    return f"{100 * d:+.0f} points ({100 * low:+.0f}..{100 * high:+.0f})"


def _past_training(records: list[Record]) -> list[tuple[str, str, bool]]:
    """Auto past the trained context against the full cache at half of it."""
    out = []
    for model in sorted({r["model"] for r in records}):
        mine = [r for r in answered(with_auto(records)) if r["model"] == model]
        if not mine:
            continue
        train = mine[0]["n_ctx_train"]
        full = [r for r in mine if r["setting"] == "full" and r["path"] == "first"]
        past = [r for r in mine if r["setting"].endswith("-auto") and r["length"] > train]
        past = [r for r in past if r["path"] == DEFAULT_PATH]
        if not full or not past:
            continue
        half = min({r["length"] for r in full}, key=lambda n: abs(n - train / 2))
        ref = [r["right"] for r in full if r["length"] == half]
        got = [r["right"] for r in past]
        ref_acc, acc = sum(ref) / len(ref), sum(got) / len(got)
        out.append((
            f"{model}: past the trained context ({train:,}) >= {100 * PAST_SHARE:.0f}% of the "
            f"full cache's accuracy at {half:,}",
            f"auto {cell(sum(got), len(got))} against full {cell(sum(ref), len(ref))}",
            acc >= PAST_SHARE * ref_acc,
        ))  # fmt: skip
    return out


def markdown(result: dict[str, Any]) -> str:
    records = with_auto(result["records"])
    lines = ["# Fidelity: accuracy with intervals (kvtrim bench --fidelity)", ""]
    for run in result.get("runs", []):
        lines.append(f"- `{run['command']}` ({run['model']})")
    lines += [
        "",
        "Each cell: right answers / items, percent, 95% Wilson interval. `auto - full`: the "
        "difference on the same items in points, with Newcombe's paired 95% interval "
        "(`*`: the interval excludes 0). A right answer holds the planted value whole and "
        "no distractor's value. First questions are read with the question voting at every "
        "eviction; with recall (the default since issue 34) the evicted passages that best "
        "match the question come back before it is read, as they do for follow-ups, which "
        "are asked from the saved read.",
    ]
    groups = _groups(records)
    for key in sorted(groups, key=lambda k: (k[0], k[1], PATHS.index(k[2]))):
        (model, policy, path, budget), rs = key, groups[key]
        lines += ["", f"## {model}: {policy}, {PATH_TITLES[path]}", "", *cell_table(rs, budget)]
        base = [r for r in rs if not r["setting"].endswith("-auto")]
        lines += ["", "Position modes on the same items:", "", *modes_table(base, budget)]
        if path == "recall":
            first = groups.get((model, policy, "first", budget), [])
            lines += ["", "Recall against none, the same first questions:", ""]
            lines += recall_table(rs, first, budget)
        lines += ["", "Why answers were wrong:", "", *why_table(rs)]
    lines += ["", "## Targets", ""]
    lines += [f"- {'met' if ok else 'MISSED'}: {t}: {m}" for t, m, ok in targets(result)]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out_dir: Path) -> Path:
    path = out_dir / "fidelity.md"
    path.write_text(markdown(result))
    return path
