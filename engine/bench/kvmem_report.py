"""Tables, targets and the plot of ``kvtrim bench --kv-memory`` (see kvmem.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from . import figures

_MB = 2**20
Target = tuple[str, str, bool]  # (target, what was measured, met?)


def _part(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in result["records"] if r.get("part") == name]


def _mb(v: float) -> str:
    return f"{v / _MB:.1f}"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|").replace("`", "'")


def _hits(rs: list[dict[str, Any]], task: str) -> str:
    sel = [r for r in rs if r.get("task") == task]
    return f"{sum(r['hit'] for r in sel)}/{len(sel)}" if sel else "-"


def _alloc_targets(alloc: list[dict[str, Any]]) -> list[Target]:
    """The allocation against llama.cpp's default, and at 64K tokens one tenth of it."""
    if not alloc:
        return []
    over = [r for r in alloc if r["kv_bytes"] > r["kv_bytes_llama_default"] + r["chunk_bytes"]]
    out = [
        (
            "KV held <= llama.cpp default + one chunk, every length and budget",
            f"{len(alloc) - len(over)}/{len(alloc)} cases",
            not over,
        )
    ]
    for r in (r for r in alloc if r["length"] >= 65536 and r["budget"] == 1024):
        ratio = r["kv_bytes"] / r["kv_bytes_llama_default"]
        out.append(
            (
                "64K tokens, budget 1,024: KV <= 1/10 of llama.cpp default",
                f"{_mb(r['kv_bytes'])} MB vs {_mb(r['kv_bytes_llama_default'])} MB "
                f"(1/{1 / ratio:.1f})",
                ratio <= 0.1,
            )
        )
    return out


def _long_targets(long: list[dict[str, Any]]) -> list[Target]:
    """The key found in the longest real-text documents."""
    return [
        (
            f"{r['length']:,}-token real text, budget {r['budget']}: key found whole",
            f"'{_cell(r['answer'])}' for {r['key']}",
            bool(r["hit"]),
        )
        for r in long
        if r["length"] >= 60000 and r["task"] == "passkey_real"
    ]


def _swa_targets(swa: list[dict[str, Any]]) -> list[Target]:
    """Per policy, the window cache's passkey and KL against swa_full."""
    out: list[Target] = []
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in swa:
        by[(r["policy"], r["swa_cache"])].append(r)
    for policy in dict.fromkeys(r["policy"] for r in swa):
        win, full = by[(policy, "window")], by[(policy, "full")]
        pk = [r for r in win if r["task"].startswith("passkey")]
        if pk:
            hw = sum(r["hit"] for r in pk)
            hf = sum(r["hit"] for r in full if r["task"].startswith("passkey"))
            out.append(
                (
                    f"{policy}: passkey with the window cache >= swa_full - 1",
                    f"{hw}/{len(pk)} vs {hf}/{len(pk)}",
                    hw >= hf - 1,
                )
            )
        fw = [r for r in win if r["task"] == "fidelity"]
        ff = [r for r in full if r["task"] == "fidelity"]
        if fw and ff:
            d = fw[0]["kl_mean"] - ff[0]["kl_mean"]
            out.append(
                (
                    f"{policy}: KL with the window cache <= swa_full + 0.02",
                    f"{fw[0]['kl_mean']:.3f} vs {ff[0]['kl_mean']:.3f}",
                    d <= 0.02,
                )
            )
    return out


def targets(result: dict[str, Any]) -> list[Target]:
    """The issue's targets, judged from the records."""
    return [
        *_alloc_targets(_part(result, "alloc")),
        *_long_targets(_part(result, "long")),
        *_swa_targets(_part(result, "swa")),
    ]


def _intro(result: dict[str, Any]) -> list[str]:
    return [
        "# KV memory against llama.cpp's default",
        "",
        f"Command: `{result['command']}`  ",
        f"Model: {result['model']}; {result.get('elapsed_s', 0) / 60:.0f} min.",
        "",
        "*llama.cpp default*: what llama.cpp's default context (sliding-window layers at "
        "window + batch cells, `n_ubatch` 512) allocates for the same tokens; "
        "*swa_full*: a cell per token in every layer (llama-cpp-python's default); "
        "*kvtrim*: the caches the session allocated (global layers: budget + chunk "
        "cells or fewer for a short text; sliding-window layers: window + chunk).",
        "",
    ]


def _alloc_table(alloc: list[dict[str, Any]]) -> list[str]:
    """KV allocated by document length: llama.cpp's default, swa_full and kvtrim at
    each budget (nothing without the ``alloc`` part)."""
    if not alloc:
        return []
    budgets = sorted({r["budget"] for r in alloc})
    lines = [
        "## KV cache allocated (MB) by document length",
        "",
        "| tokens | llama.cpp default | swa_full | "
        + " | ".join(f"kvtrim {b:,}" for b in budgets)
        + " |",
        "|---:|---:|---:|" + "---:|" * len(budgets),
    ]
    for length in sorted({r["length"] for r in alloc}):
        rs = {r["budget"]: r for r in alloc if r["length"] == length}
        first = next(iter(rs.values()))
        cells = []
        for b in budgets:
            r = rs[b]
            ratio = r["kv_bytes"] / r["kv_bytes_llama_default"]
            cells.append(f"{_mb(r['kv_bytes'])} ({ratio:.2f}x)")
        lines.append(
            f"| {length:,} | {_mb(first['kv_bytes_llama_default'])} | "
            f"{_mb(first['kv_bytes_full'])} | " + " | ".join(cells) + " |"
        )
    return [*lines, ""]


def _long_table(long: list[dict[str, Any]], cfg: dict[str, Any]) -> list[str]:
    """The passkey runs over long documents, read for real (nothing without them)."""
    if not long:
        return []
    lines = [
        f"## Passkey over long documents ({cfg['long_policy']}, budget "
        f"{cfg['long_budget']:,}, read for real)",
        "",
        "| tokens | haystack | answer | found | KV held MB | llama.cpp default MB | "
        "ratio | prefill tok/s |",
        "|---:|---|---|:-:|---:|---:|---:|---:|",
    ]
    for r in long:
        lines.append(
            f"| {r['prompt_tokens']:,} | {r['task'][8:]} | `{_cell(r['answer'])}` | "
            f"{'yes' if r['hit'] else 'no'} | {_mb(r['kv_bytes_peak'])} | "
            f"{_mb(r['kv_bytes_llama_default'])} | "
            f"1/{r['kv_bytes_llama_default'] / r['kv_bytes_peak']:.1f} | "
            f"{r['prefill_tokens_per_s']:.0f} |"
        )
    return [*lines, ""]


def _quality_table(records: list[dict[str, Any]], key: str, title: str, column: str) -> list[str]:
    """Passkey, KL and KV by policy and ``key`` (the SWA cache or the KV type), headed
    ``title`` (nothing without records)."""
    if not records:
        return []
    return [
        f"## {title}",
        "",
        f"| policy | {column} | passkey filler | passkey real | KL (nats) | top-1 | KV MB |",
        "|---|---|:-:|:-:|---:|---:|---:|",
        *_quality_rows(records, key),
        "",
    ]


def markdown(result: dict[str, Any], plots: list[str]) -> str:
    """``kvmem.md``: a table per part the run has, the targets and the plots."""
    cfg = result["config"]
    at = f"{cfg['quality_length']:,} tokens, budget {cfg['quality_budget']:,}"
    lines = [
        *_intro(result),
        *_alloc_table(_part(result, "alloc")),
        *_long_table(_part(result, "long"), cfg),
        *_quality_table(
            _part(result, "swa"),
            "swa_cache",
            f"Sliding-window cache against swa_full ({at})",
            "SWA cache",
        ),
        *_quality_table(
            _part(result, "kv_type"),
            "kv_type",
            f"Quantized KV caches ({at}; f16 is the window row above)",
            "KV type (K/V)",
        ),
    ]
    lines += ["## Targets", ""]
    for name, measured, ok in targets(result):
        lines.append(f"- {'met' if ok else 'MISSED'}: {name}: {measured}")
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _quality_rows(records: list[dict[str, Any]], key: str) -> list[str]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["policy"], r[key])].append(r)
    rows = []
    for (policy, mode), rs in groups.items():
        fid = next((r for r in rs if r["task"] == "fidelity"), None)
        pk = [r for r in rs if r["task"].startswith("passkey")]
        kind = pk[0]["kv_type"] if pk else (fid["kv_type"] if fid else mode)
        label = kind if key == "kv_type" else mode
        mb = max((r["kv_bytes_peak"] for r in rs), default=0)
        rows.append(
            f"| {policy} | {label} | {_hits(rs, 'passkey_filler')} | {_hits(rs, 'passkey_real')} | "
            f"{fid['kl_mean']:.3f} | {fid['top1_agreement']:.3f} | "
            if fid
            else f"| {policy} | {label} | {_hits(rs, 'passkey_filler')} | "
            f"{_hits(rs, 'passkey_real')} | - | - | "
        )
        rows[-1] += f"{_mb(mb)} |"
    return rows


def plot(result: dict[str, Any], out_dir: Path) -> list[str]:
    alloc = _part(result, "alloc")
    if not alloc:
        return []
    plt = figures.pyplot()
    from matplotlib.ticker import ScalarFormatter

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    lengths = sorted({r["length"] for r in alloc})
    first = {r["length"]: r for r in alloc}
    ax.plot(lengths, [first[n]["kv_bytes_full"] / _MB for n in lengths], "k:", label="swa_full")
    ax.plot(
        lengths,
        [first[n]["kv_bytes_llama_default"] / _MB for n in lengths],
        "k--",
        lw=2,
        label="llama.cpp default",
    )
    for b in sorted({r["budget"] for r in alloc}):
        rs = sorted((r for r in alloc if r["budget"] == b), key=lambda r: r["length"])
        ax.plot(
            [r["length"] for r in rs],
            [r["kv_bytes"] / _MB for r in rs],
            "o-",
            ms=3,
            label=f"kvtrim, budget {b:,}",
        )
    long = [r for r in _part(result, "long") if r["task"] == "passkey_real"]
    if long:
        ax.plot(
            [r["length"] for r in long],
            [r["kv_bytes_peak"] / _MB for r in long],
            "kx",
            ms=8,
            label="measured runs (budget 1,024)",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("KV cache allocated (MB, log scale)")
    ax.set_title(f"KV memory, {result['model']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return [figures.save(fig, out_dir, "kv_bytes_vs_length.png")]


def write(result: dict[str, Any], out_dir: Path) -> Path:
    plots = plot(result, out_dir)
    path = out_dir / "kvmem.md"
    path.write_text(markdown(result, plots))
    return path
