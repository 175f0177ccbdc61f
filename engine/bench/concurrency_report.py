"""Tables and targets of ``kvtrim bench --concurrency`` (see concurrency.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_MB = 2**20
Target = tuple[str, str, bool]  # (target, what was measured, met?)


def _part(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in result["records"] if r["part"] == name]


def _server(result: dict[str, Any]) -> dict[tuple[int, str, int], dict[str, Any]]:
    return {
        (r["server_parallel"], r.get("layout", "shared"), r["clients"]): r
        for r in _part(result, "server")
    }


def _per_level_batch(result: dict[str, Any]) -> dict[int, float]:
    """Tokens per ``llama_decode`` at each server level (by record index): the
    pool's counters run across the levels of one server, so take differences."""
    out: dict[int, float] = {}
    last: dict[tuple[int, str], tuple[float, float]] = {}
    for i, r in enumerate(result["records"]):
        pool = r.get("pool") or {}
        if r["part"] != "server" or "kvtrim_pool_decode_steps" not in pool:
            continue
        steps = pool["kvtrim_pool_decode_steps"]
        tokens = steps * pool["kvtrim_pool_batch_tokens_mean"]
        key = (r["server_parallel"], r.get("layout", "shared"))
        s0, t0 = last.get(key, (0.0, 0.0))
        if steps > s0:
            out[i] = (tokens - t0) / (steps - s0)
        last[key] = (steps, tokens)
    return out


def _summaries(result: dict[str, Any]) -> dict[tuple[int, str, str], dict[str, Any]]:
    return {
        (r["parallel"], r["share"], r.get("layout", "shared")): r
        for r in _part(result, "summarize")
    }


def _server_targets(server: dict[tuple[int, str, int], dict[str, Any]]) -> list[Target]:
    """Per layout, the most clients against one: requests/s, p50 latency; and every
    pass key as found alone."""
    out: list[Target] = []
    alone = server.get((1, "shared", 1))
    most = max((c for p, _, c in server if p > 1), default=None)
    if not (alone and most):
        return out
    for layout in sorted({lay for p, lay, _ in server if p > 1}):
        par = max(p for p, lay, _ in server if lay == layout)
        many = server[(par, layout, most)]
        speed = many["requests_per_s"] / alone["requests_per_s"]
        out.append(
            (
                f"server ({layout}), {most} clients >= 3x the requests/s of 1 client",
                f"{many['requests_per_s']:.2f} vs {alone['requests_per_s']:.2f} req/s "
                f"({speed:.2f}x; same {many['kv_cells']} KV cells for all)",
                speed >= 3,
            )
        )
        lat = many["latency_p50_s"] / alone["latency_p50_s"]
        out.append(
            (
                f"server ({layout}), p50 latency at {most} clients <= 3x that at 1",
                f"{many['latency_p50_s']:.2f} s vs {alone['latency_p50_s']:.2f} s ({lat:.2f}x)",
                lat <= 3,
            )
        )
    same = all(r["same_key_as_alone"] == r["requests"] for r in server.values())
    out.append(
        (
            "server: every request's pass key as found one at a time",
            ", ".join(
                f"{lay} {c} clients: {r['same_key_as_alone']}/{r['requests']}"
                for (p, lay, c), r in sorted(server.items())
                if p > 1
            ),
            same,
        )
    )
    return out


def _summarize_targets(summ: dict[tuple[int, str, str], dict[str, Any]]) -> list[Target]:
    """``--parallel`` against one by one: the time, and the same peak KV."""
    seq = summ.get((1, "length", "shared"))
    par = next(
        (r for (p, s, lay), r in summ.items() if p > 1 and s == "length" and lay == "shared"),
        None,
    )
    if not (seq and par):
        return []
    speed = seq["wall_s"] / par["wall_s"]
    return [
        (
            f"summarize {par['documents']} documents >= 2x faster with --parallel "
            f"{par['parallel']}",
            f"{par['wall_s']:.0f} s vs {seq['wall_s']:.0f} s ({speed:.2f}x)",
            speed >= 2,
        ),
        (
            "summarize --parallel: the same peak KV (global-layer cells allocated)",
            f"{par['global_cells_allocated']} vs {seq['global_cells_allocated']} cells; "
            f"sliding-window cells {par['swa_cells_allocated']} vs "
            f"{seq['swa_cells_allocated']} (one window per sequence); all layers "
            f"{par['kv_bytes_allocated'] / _MB:.1f} vs "
            f"{seq['kv_bytes_allocated'] / _MB:.1f} MB",
            par["global_cells_allocated"] <= seq["global_cells_allocated"],
        ),
    ]


def _needle_targets(needles: list[dict[str, Any]]) -> list[Target]:
    """Each pool with room for every document: the answers together as alone."""
    return [
        (
            f"needles: answers together identical to alone ({whole['pool']})",
            f"{whole['same_key_as_alone']}/{whole['documents']} "
            f"(found {whole['together_hits']} together, {whole['alone_hits']} alone)",
            whole["same_key_as_alone"] == whole["documents"],
        )
        for whole in needles
        if whole["pool"].startswith("room")
    ]


def targets(result: dict[str, Any]) -> list[Target]:
    """The issue's targets, judged from the records."""
    return [
        *_server_targets(_server(result)),
        *_summarize_targets(_summaries(result)),
        *_needle_targets(_part(result, "needles")),
    ]


def _server_table(result: dict[str, Any]) -> list[str]:
    """A row per server and number of clients (nothing without the server part)."""
    server = _server(result)
    if not server:
        return []
    base = server.get((1, "shared", 1))
    lines = [
        "## Server: N clients, ~150-token prompts, 32 tokens each",
        "",
        "| server | clients | req/s | x 1 client | p50 (s) | p95 (s) | gen tok/s | "
        "pass keys | as alone | tokens per decode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    per_level = _per_level_batch(result)
    index = {id(r): i for i, r in enumerate(result["records"])}
    for (p, lay, c), r in sorted(server.items()):
        who = "one at a time" if p == 1 else f"parallel {p}, {r['kv_cells']} cells, {lay}"
        ratio = r["requests_per_s"] / base["requests_per_s"] if base else float("nan")
        mean = per_level.get(index[id(r)])
        lines.append(
            f"| {who} | {c} | {r['requests_per_s']:.2f} | {ratio:.2f} | "
            f"{r['latency_p50_s']:.2f} | {r['latency_p95_s']:.2f} | "
            f"{r['generated_tokens_per_s']:.1f} | {r['key_hits']}/{r['requests']} | "
            f"{r['same_key_as_alone']}/{r['requests']} | "
            f"{'' if mean is None else f'{mean:.1f}'} |"
        )
    return [*lines, ""]


def _summarize_table(summ: dict[tuple[int, str, str], dict[str, Any]]) -> list[str]:
    """A row per summarize run (nothing without the summarize part)."""
    if not summ:
        return []
    seq = summ.get((1, "length", "shared"))
    lines = [
        "## summarize: documents one by one and in parallel",
        "",
        "| run | wall (s) | x one by one | global cells | SWA cells | KV MB (all layers) | "
        "peak cells held | evictions | decodes | tokens per decode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (p, s, lay), r in sorted(summ.items()):
        who = "one by one" if p == 1 else f"--parallel {p}, {lay}, shares {s}"
        ratio = seq["wall_s"] / r["wall_s"] if seq else float("nan")
        mean = r["mean_batch_tokens"]
        lines.append(
            f"| {who} | {r['wall_s']:.0f} | {ratio:.2f} | {r['global_cells_allocated']} | "
            f"{r['swa_cells_allocated']} | {r['kv_bytes_allocated'] / _MB:.1f} | "
            f"{r['peak_cells_held']} | {r['evictions']} | {r['decode_steps'] or ''} | "
            f"{f'{mean:.0f}' if mean else ''} |"
        )
    return [*lines, ""]


def _needles_table(needles: list[dict[str, Any]]) -> list[str]:
    """A row per pool the pass keys were read in (nothing without the needles part)."""
    if not needles:
        return []
    lines = [
        "## Pass keys: alone and together",
        "",
        "| pool | cells | found together | found alone | same as alone | shares at entry "
        "| time together / alone (s) |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in needles:
        lines.append(
            f"| {r['pool']} | {r['cells']} | {r['together_hits']}/{r['documents']} | "
            f"{r['alone_hits']}/{r['documents']} | {r['same_key_as_alone']}/{r['documents']} "
            f"| {', '.join(map(str, r['shares']))} | {r['together_s']:.1f} / "
            f"{r['alone_s']:.1f} |"
        )
    return [*lines, ""]


def write(result: dict[str, Any], out_dir: Path) -> Path:
    """``concurrency.md``: a table per part the run has, then the targets."""
    lines = [
        "# Throughput against concurrency",
        "",
        f"`{result['command']}` on {result['model']}; {result.get('elapsed_s', 0):.0f} s in all.",
        "",
        *_server_table(result),
        *_summarize_table(_summaries(result)),
        *_needles_table(_part(result, "needles")),
        "## Targets",
        "",
    ]
    for target, measured, ok in targets(result):
        lines.append(f"- {'met' if ok else 'MISSED'}: {target}: {measured}")
    path = out_dir / "concurrency.md"
    path.write_text("\n".join(lines) + "\n")
    return path
