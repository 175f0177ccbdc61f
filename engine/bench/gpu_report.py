"""Tables and plots of the GPU check (engine/bench/gpu.py): ``gpu.md`` and three
PNGs. Memory is the process's peak on the GPU (NVML: weights, KV cache, compute
buffers, CUDA context); without a GPU (the CPU dry run) the process's peak RAM.

Which documents fit a card: a run fits when its peak is under the card's memory
less ``RESERVE`` (the desktop and other programs hold some). Beside the lengths
measured, a straight line through the default runs' peaks (memory grows linearly
with the document when flash attention is on) gives the longest that fits.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

_GiB, _MiB = 2**30, 2**20
CARDS = {"12 GB": 12 * _GiB, "16 GB": 16 * _GiB}
RESERVE = 512 * _MiB


def _peak(r: dict[str, Any]) -> int | None:
    if "error" in r or "skipped" in r:
        return None
    gpu = r.get("process_gpu_peak_bytes")
    return gpu if gpu is not None else r.get("rss_peak_bytes")


def _on_gpu(records: list[dict[str, Any]]) -> bool:
    return any(r.get("process_gpu_peak_bytes") is not None for r in records)


def _on_device(name: str) -> bool:
    """A llama.cpp buffer in GPU memory: CUDA0, CUDA1... (CUDA_Host is pinned RAM)."""
    return name.startswith("CUDA") and not name.startswith("CUDA_Host")


def _buffers(r: dict[str, Any], kind: str, where: str = "gpu") -> float | None:
    """llama.cpp's own buffers of this kind (model, KV, compute), MiB. ``gpu``: those
    in GPU memory where the run had any, else the CPU's (a dry run); ``host``: the
    rest where the run had GPU buffers. Never the CPU's repacked copies of weights
    (a CPU detail: the mapped file stays mapped)."""
    buffers = {
        k.rsplit(" ", 1)[0]: v
        for k, v in r.get("llama_buffers", {}).items()
        if k.endswith(" " + kind) and not k.startswith("CPU_REPACK")
    }
    gpu = any(_on_device(k) for k in r.get("llama_buffers", {}))
    if where == "gpu":
        sizes = [v for k, v in buffers.items() if _on_device(k) or not gpu]
    else:
        sizes = [v for k, v in buffers.items() if gpu and not _on_device(k)]
    return sum(sizes) / _MiB if sizes else None


def _mib(x: float | None) -> str:
    return "-" if x is None else format(x, ",.0f" if x >= 100 else ".1f")


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def fit_length(records: list[dict[str, Any]], label: str, card: int) -> int | None:
    """The longest document (tokens) whose default run fits ``card``, by a straight
    line through that model's default runs; None with fewer than two."""
    default = [
        (r["length"], _peak(r))
        for r in records
        if r["label"] == label and r["config"] == "default" and _peak(r) is not None
    ]
    if len(default) < 2:
        return None
    xs, ys = zip(*default, strict=True)
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    if slope <= 0:
        return None
    return max(0, int((card - RESERVE - (my - slope * mx)) / slope))


def _reading_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By model, document length, then llama.cpp's runs before kvtrim's (the runs
    themselves went most wanted first)."""
    models = list(dict.fromkeys(r["label"] for r in records))
    plain = {"default": 0, "noflash": 1}

    def key(r: dict[str, Any]) -> tuple[int, int, int, str]:
        return (models.index(r["label"]), r["length"], plain.get(r["config"], 2), r["config"])

    return sorted(records, key=key)


def table(records: list[dict[str, Any]]) -> str:
    records = _reading_order(records)
    gpu = _on_gpu(records)
    mem = "GPU peak GiB" if gpu else "RAM peak GiB (no GPU)"
    where = "on the GPU" if gpu else "(CPU)"
    head = (
        f"| model | tokens | run | {mem} | llama.cpp model / KV / compute MiB {where} | "
        "host buffers MiB | prefill tok/s | decode tok/s | capture share |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        what = f"| {r['label']} | {r['length']:,} | {r['config']} |"
        if "error" in r or "skipped" in r:
            lines.append(f"{what} {r.get('error') or 'not run: ' + r['skipped']} | | | | | |")
            continue
        parts = [_buffers(r, k) for k in ("model", "KV", "compute")]
        bufs = " / ".join(_mib(p) for p in parts)
        host = sum(_buffers(r, k, "host") or 0 for k in ("model", "KV", "compute", "output"))
        peak = _peak(r)
        share = r.get("capture_share")
        lines.append(
            f"{what} {_fmt(peak / _GiB if peak else None, '.2f')} | {bufs} | {_mib(host)} | "
            f"{_fmt(r.get('prefill_tokens_per_s'), ',.0f') or 'memory only'} | "
            f"{_fmt(r.get('decode_tokens_per_s'), ',.1f')} | "
            f"{'reads none' if share is None else format(share, '.1%')} |"
        )
    return "\n".join(lines)


def fits(records: list[dict[str, Any]]) -> str:
    """Per model and card: the longest measured document each run fits."""
    lines = ["| model | card | run | longest measured document that fits |", "|---|---|---|---|"]
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r["label"], r["config"])].append(r)
    for card, size in CARDS.items():
        for (label, config), runs in by.items():
            ok = [r["length"] for r in runs if (p := _peak(r)) is not None and p <= size - RESERVE]
            measured = [r["length"] for r in runs if _peak(r) is not None]
            if not measured:
                continue
            best = f"{max(ok):,} tokens" if ok else f"none (the shortest, {min(measured):,})"
            if ok and max(ok) == max(measured):
                best += " (the longest measured)"
            lines.append(f"| {label} | {card} | {config} | {best} |")
        for label in dict.fromkeys(r["label"] for r in records):
            est = fit_length(records, label, size)
            if est is not None:
                lines.append(f"| {label} | {card} | default, by a line | about {est:,} tokens |")
    return "\n".join(lines)


def plots(records: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu = _on_gpu(records)
    labels = list(dict.fromkeys(r["label"] for r in records))
    ok = [r for r in records if _peak(r) is not None]
    paths = []
    for name, ylabel, value in (
        ("gpu_memory.png", "GPU peak (GiB)" if gpu else "RAM peak (GiB)", _peak),
        ("gpu_prefill.png", "prefill (tokens/s)", lambda r: r.get("prefill_tokens_per_s")),
    ):
        fig, axes = plt.subplots(1, len(labels), figsize=(6 * len(labels), 4), squeeze=False)
        for ax, label in zip(axes[0], labels, strict=True):
            for config in dict.fromkeys(r["config"] for r in ok if r["label"] == label):
                pts = [
                    (r["length"], value(r))
                    for r in ok
                    if r["label"] == label and r["config"] == config and value(r) is not None
                ]
                if pts:
                    xs, ys = zip(*sorted(pts), strict=True)
                    scale = _GiB if name == "gpu_memory.png" else 1
                    ax.plot(xs, [y / scale for y in ys], marker="o", label=config)
            if name == "gpu_memory.png" and gpu:
                for card, size in CARDS.items():
                    ax.axhline(size / _GiB, color="grey", linestyle="--", linewidth=0.8)
                    ax.text(ax.get_xlim()[0], size / _GiB, f" {card} card", va="bottom")
            ax.set_xscale("log", base=2)
            lengths = sorted({r["length"] for r in ok if r["label"] == label})
            ax.set_xticks(lengths, [f"{x / 1024:g}K" for x in lengths])
            ax.minorticks_off()
            ax.set_title(label)
            ax.set_xlabel("document (tokens)")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    longest = max((r["length"] for r in ok), default=0)
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in ok:
        if r["length"] == longest and r["label"] == labels[0] and r.get("trace"):
            ts, mb = zip(*r["trace"], strict=True)
            ax.plot(ts, [m / 1024 for m in mb], label=r["config"])
    ax.set_title(f"{labels[0] if labels else ''}, {longest:,} tokens: memory over the run")
    ax.set_xlabel("s")
    ax.set_ylabel("GPU (GiB)" if gpu else "RAM (GiB)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu_trace.png", dpi=110)
    plt.close(fig)
    return [*paths, out / "gpu_trace.png"]


def alloc_table(records: list[dict[str, Any]]) -> str:
    """llama.cpp's KV and compute buffers (MiB) when each context is made."""
    lines = [
        "| model | tokens | run | KV MiB | compute MiB (CPU backend) | model MiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        what = f"| {r['label']} | {r['length']:,} | {r['config']} |"
        if not r.get("alloc_only"):
            lines.append(f"{what} {r.get('error') or 'not run'} | | |")
            continue
        kv, compute, model = (_buffers(r, k) for k in ("KV", "compute", "model"))
        lines.append(f"{what} {_mib(kv)} | {_mib(compute)} | {_mib(model)} |")
    return "\n".join(lines)


def write_report(records: list[dict[str, Any]], out: Path) -> Path:
    gpus = {r["gpu"] for r in records if r.get("gpu")}
    where = ", ".join(sorted(gpus)) or "no GPU (a dry run on the CPU: RAM, not VRAM)"
    text = "\n\n".join(
        [
            f"# GPU check: {where}",
            "Synthetic weights (scripts/gpu/synth_model.py): speed and memory only. "
            "Memory is the process's peak (weights, KV cache, compute buffers, CUDA "
            f"context); a card fits a run when the peak is under its size less "
            f"{RESERVE // _MiB} MiB. The CUDA build is scripts/gpu/build_wheel.sh's: "
            "without CUDA's virtual memory management (GGML_CUDA_NO_VMM, no driver stub "
            "to link against where it was built), so llama.cpp's legacy memory pool "
            "serves its temporary buffers and peaks may differ a little from a stock "
            "build's. Flash attention as llama.cpp resolved it is in gpu.json "
            "(flash_resolved).",
            table(records),
            "## Which documents fit",
            fits(records),
        ]
    )
    path = out / "gpu.md"
    path.write_text(text + "\n")
    plots(records, out)
    return path
