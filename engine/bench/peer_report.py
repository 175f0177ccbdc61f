"""Tables, plot and targets of ``kvtrim bench --peer`` (see peer.py): every figure is
the median over the rounds; ratios are kvtrim's over llama-server's."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from .figures import pyplot, save

_MB = 2**20
Target = tuple[str, str, bool]  # (target, what was measured, met?)
PEER = "llama-server"
KVTRIM = "kvtrim"
TARGET_LENGTHS = (32768, 65536)  # issue 24: SnapKV 1,024 on 32K and 64K
SERVE_RATIO = 1.0  # kvtrim's requests/s over llama-server's, at least
PREFILL_RATIO = 0.95  # full-cache prompt tokens/s of the demo over llama-server's, at least
KV_FRACTION = 0.1  # SnapKV 1,024's KV bytes over llama-server's, at most
REUSE_RATIO = 0.2  # second question's TTFT over the first's, at most
DEMO = "demo"  # the configuration of the demo document (config demo_file)


def part(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The records of one part."""
    return [r for r in result["records"] if r["part"] == name]


def median(values: list[Any]) -> float | None:
    """The median of the values that are numbers (None without any)."""
    got = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(got) if got else None


def who(record: dict[str, Any]) -> str:
    """The row name of a record's server: llama-server, or kvtrim's policy and budget."""
    if record["server"] == PEER:
        return PEER
    return f"{KVTRIM} {record.get('policy') or 'snapkv'} {record.get('budget')}"


def grouped(records: list[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    """Records by the values of ``keys`` (``who`` for the server and settings)."""
    out: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[tuple(who(r) if k == "who" else r.get(k) for k in keys)].append(r)
    return dict(out)


def _demo(result: dict[str, Any]) -> str:
    """The demo document's file name."""
    return Path(result["config"].get("demo_file", "passkey.txt")).name


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _num(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def _hits(records: list[dict[str, Any]], key: str) -> str:
    return f"{sum(bool(r.get(key)) for r in records)}/{len(records)}"


# ---------------------------------------------------------------- serve


def serve_medians(result: dict[str, Any]) -> dict[tuple[int, bool, str], dict[str, Any]]:
    """Per (clients, streaming, server): the medians over the rounds."""
    out = {}
    for (clients, stream, server), rs in grouped(
        part(result, "serve"), "clients", "stream", "server"
    ).items():
        out[(clients, stream, server)] = {
            "requests_per_s": median([r["requests_per_s"] for r in rs]),
            "latency_p50_s": median([r["latency_p50_s"] for r in rs]),
            "ttft_p50_s": median([r.get("ttft_p50_s") for r in rs]),
            "completion_tokens": median(
                [statistics.mean(r["completion_tokens"] or [0]) for r in rs]
            ),
            "decodes": median([r.get("decodes") for r in rs]),
            "tokens_per_decode": median([r.get("tokens_per_decode") for r in rs]),
            "rounds": len(rs),
            "answers": rs[0]["answers"],
        }
    return out


def serve_round_ratios(result: dict[str, Any]) -> dict[tuple[int, bool], list[float]]:
    """Per (clients, streaming): kvtrim's requests/s over llama-server's in each round
    both ran (a round runs them one after the other: the pairs share the machine's
    state of that minute, which the medians over rounds do not show)."""
    rps: dict[tuple[int, bool, int], dict[str, float]] = defaultdict(dict)
    for r in part(result, "serve"):
        rps[(r["clients"], r["stream"], r.get("round", 0))][r["server"]] = r["requests_per_s"]
    out: dict[tuple[int, bool], list[float]] = defaultdict(list)
    for (clients, stream, _), by in sorted(rps.items()):
        ratio = _ratio(by.get(KVTRIM), by.get(PEER))
        if ratio is not None:
            out[(clients, stream)].append(ratio)
    return dict(out)


def _spread(ratios: list[float]) -> str:
    """The per-round ratios as ``min-max (k/n at SERVE_RATIO or more)``."""
    if not ratios:
        return "n/a"
    won = sum(r >= SERVE_RATIO for r in ratios)
    return f"{min(ratios):.2f}-{max(ratios):.2f} ({won}/{len(ratios)})"


def _same_text(a: list[str], b: list[str]) -> str:
    return f"{sum(x == y for x, y in zip(a, b, strict=False))}/{len(a)}"


def _layout(cfg: dict[str, Any]) -> str:
    """kvtrim's --kv-layout in the serve part, where not its default."""
    layout = cfg.get("kv_layout", "shared")
    return "" if layout == "shared" else f" --kv-layout {layout}"


def _serve_table(result: dict[str, Any]) -> list[str]:
    """A row per client count and mode (nothing without the serve part)."""
    med = serve_medians(result)
    if not med:
        return []
    cfg = result["config"]
    lines = [
        f"## Serve: ~{cfg['passage_tokens']}-token passages, {cfg['gen_tokens']} tokens each, "
        f"{cfg['requests']} requests",
        "",
        "llama-server `-np N -c N x {0}`; kvtrim `--parallel N --kv-cells C{3} --budget {2}`, "
        "C the larger of {1} and N x {0} "
        "(1 client: `--parallel 1 --budget {2}`). Requests/s over the wall time of all "
        "requests; p50 of each request's latency and (streaming) time to first token.".format(
            cfg["slot_cells"],
            cfg["kv_cells"],
            cfg["serve_budget"],
            _layout(cfg),
        ),
        "",
        "| clients | mode | llama-server req/s | kvtrim req/s | kvtrim / llama | "
        f"per round: range (rounds >= {SERVE_RATIO:.1f}x) | p50 latency (s) llama / kvtrim | "
        "TTFT p50 (s) llama / kvtrim | "
        "tokens generated llama / kvtrim | llama_decode calls llama / kvtrim | "
        "tokens per call llama / kvtrim | same text |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    rounds = serve_round_ratios(result)
    for clients, stream in sorted({(c, s) for c, s, _ in med}):
        a, b = med.get((clients, stream, PEER)), med.get((clients, stream, KVTRIM))
        if not (a and b):
            continue
        ratio = _ratio(b["requests_per_s"], a["requests_per_s"])
        lines.append(
            f"| {clients} | {'streaming' if stream else 'plain'} | "
            f"{_num(a['requests_per_s'])} | {_num(b['requests_per_s'])} | {_num(ratio)}x | "
            f"{_spread(rounds.get((clients, stream), []))} | "
            f"{_num(a['latency_p50_s'])} / {_num(b['latency_p50_s'])} | "
            f"{_num(a['ttft_p50_s'], '.3f')} / {_num(b['ttft_p50_s'], '.3f')} | "
            f"{_num(a['completion_tokens'], '.1f')} / {_num(b['completion_tokens'], '.1f')} | "
            f"{_num(a['decodes'], '.0f')} / {_num(b['decodes'], '.0f')} | "
            f"{_num(a['tokens_per_decode'], '.1f')} / {_num(b['tokens_per_decode'], '.1f')} | "
            f"{_same_text(a['answers'], b['answers'])} |"
        )
    return [*lines, ""]


def _serve_targets(result: dict[str, Any]) -> list[Target]:
    """kvtrim's requests/s at the fewest and the most clients, plain and streaming."""
    med = serve_medians(result)
    rounds = serve_round_ratios(result)
    counts = sorted({c for c, _, _ in med})
    out: list[Target] = []
    for clients in sorted({counts[0], counts[-1]}) if counts else []:
        for stream in (False, True):
            a, b = med.get((clients, stream, PEER)), med.get((clients, stream, KVTRIM))
            if not (a and b):
                continue
            ratio = _ratio(b["requests_per_s"], a["requests_per_s"])
            mode = "streaming" if stream else "plain"
            out.append(
                (
                    f"serve, {clients} client{'s' * (clients > 1)}, {mode}: kvtrim req/s >= "
                    f"{SERVE_RATIO:.1f}x llama-server's",
                    f"{_num(b['requests_per_s'])} vs {_num(a['requests_per_s'])} req/s "
                    f"({_num(ratio)}x; per round {_spread(rounds.get((clients, stream), []))})",
                    ratio is not None and ratio >= SERVE_RATIO,
                )
            )
    return out


# ---------------------------------------------------------------- prefill


def prefill_medians(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (configuration, server and settings): medians over the rounds, the fact's
    hits and the length."""
    out = {}
    for (config, name), rs in grouped(part(result, "prefill"), "config", "who").items():
        out[(config, name)] = {
            "length": rs[0].get("length"),
            "prompt_tokens": median([r.get("prompt_tokens") for r in rs]),
            "wall_s": median([r.get("wall_s") for r in rs]),
            "server_prompt_tokens_per_s": median(
                [r.get("server_prompt_tokens_per_s") for r in rs]
            ),
            "prompt_tokens_per_wall_s": median([r.get("prompt_tokens_per_wall_s") for r in rs]),
            "kv_bytes": median([r.get("kv_bytes") for r in rs]),
            "hits": _hits(rs, "hit"),
            "all_hit": all(r["hit"] for r in rs),
            "refused": next((r["refused"] for r in rs if r.get("refused")), None),
            "answer": rs[0]["answer"] if "answer" in rs[0] else f"refused: {rs[0]['refused']}",
        }
    return out


def _config_order(config: str) -> tuple[int, str]:
    return (int(config.split()[0]) if config[0].isdigit() else 10**9, config)


def _prefill_table(result: dict[str, Any]) -> list[str]:
    """A row per document and server (nothing without the prefill part)."""
    med = prefill_medians(result)
    if not med:
        return []
    lines = [
        "## Prefill: one question about a long document",
        "",
        "Real text with a pass key in the middle (the demo: resources/samples/passkey.txt), "
        "the document as the system message, the question as the user's, a short greedy "
        "answer. Wall: the whole request. Prompt tok/s: as each server reports it "
        "(llama-server `timings.prompt_per_second`, kvtrim `kvtrim.prefill_tokens_per_s`). "
        "KV: llama-server's `llama_kv_cache: size` log lines, kvtrim's `kv_bytes_held`.",
        "",
        "| document | server | prompt tokens | wall (s) | x llama wall | prompt tok/s "
        "(server) | prompt tok / wall s | KV MB | x llama KV | fact | answer |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for config in sorted({c for c, _ in med}, key=_config_order):
        base = med.get((config, PEER), {})
        shown = f"{DEMO} ({_demo(result)})" if config == DEMO else config
        for (c, name), m in sorted(med.items(), key=lambda x: (x[0][1] != PEER, x[0][1])):
            if c != config:
                continue
            kv = m["kv_bytes"]
            lines.append(
                f"| {shown} | {name} | {_num(m['prompt_tokens'], '.0f')} | "
                f"{_num(m['wall_s'], '.1f')} | {_num(_ratio(m['wall_s'], base.get('wall_s')))} | "
                f"{_num(m['server_prompt_tokens_per_s'], '.0f')} | "
                f"{_num(m['prompt_tokens_per_wall_s'], '.0f')} | "
                f"{_num(None if kv is None else kv / _MB, '.1f')} | "
                f"{_num(_ratio(kv, base.get('kv_bytes')), '.3f')} | {m['hits']} | "
                f"{m['answer'].strip()[:40]!r} |"
            )
    return [*lines, ""]


def _demo_target(med: dict[tuple[str, str], dict[str, Any]]) -> list[Target]:
    """The full cache reads the demo at >= 0.95x llama-server's prompt tokens/s."""
    a = med.get((DEMO, PEER))
    b = next((m for (c, n), m in med.items() if c == DEMO and n.startswith("kvtrim full")), None)
    if not (a and b):
        return []
    ratio = _ratio(b["server_prompt_tokens_per_s"], a["server_prompt_tokens_per_s"])
    return [
        (
            f"full-cache prefill of the 9K demo >= {PREFILL_RATIO}x llama-server's prompt tokens/s",
            f"{_num(b['server_prompt_tokens_per_s'], '.0f')} vs "
            f"{_num(a['server_prompt_tokens_per_s'], '.0f')} tok/s ({_num(ratio)}x; wall "
            f"{_num(b['wall_s'], '.1f')} vs {_num(a['wall_s'], '.1f')} s)",
            ratio is not None and ratio >= PREFILL_RATIO,
        )
    ]


def _long_targets(med: dict[tuple[str, str], dict[str, Any]]) -> list[Target]:
    """SnapKV 1,024 on 32K and 64K (else the longest document run): no slower end to
    end than llama-server with the document in context, at <= 1/10 of its KV bytes."""
    lengths = sorted({m["length"] for m in med.values() if m["length"]})
    judged = [n for n in lengths if n in TARGET_LENGTHS] or lengths[-1:]
    out: list[Target] = []
    for n in judged:
        config = f"{n} tokens"
        a, b = med.get((config, PEER)), med.get((config, "kvtrim snapkv 1024"))
        if not (a and b):
            continue
        if a["refused"] and a["wall_s"] is None:  # past llama-server's context
            out.append(_refused_target(n, a, b))
            continue
        wall = _ratio(b["wall_s"], a["wall_s"])
        kv = _ratio(b["kv_bytes"], a["kv_bytes"])
        ok = wall is not None and wall <= 1 and kv is not None and kv <= KV_FRACTION
        out.append(
            (
                f"SnapKV 1,024 on {n:,} tokens: end-to-end time <= llama-server's, at <= "
                f"1/{round(1 / KV_FRACTION)} of its KV bytes",
                f"{_num(b['wall_s'], '.1f')} vs {_num(a['wall_s'], '.1f')} s ({_num(wall)}x), "
                f"KV {_num(_mb(b['kv_bytes']), '.1f')} vs {_num(_mb(a['kv_bytes']), '.1f')} MB "
                f"({_num(kv, '.3f')}x); fact {b['hits']} vs {a['hits']}",
                ok,
            )
        )
    return out


def _refused_target(n: int, a: dict[str, Any], b: dict[str, Any]) -> Target:
    """A length llama-server refused: kvtrim passes by reading it and finding the fact."""
    return (
        f"SnapKV 1,024 on {n:,} tokens: end-to-end time <= llama-server's, at <= "
        f"1/{round(1 / KV_FRACTION)} of its KV bytes",
        f"llama-server refused the document ({a['refused']}); kvtrim read it in "
        f"{_num(b['wall_s'], '.1f')} s with {_num(_mb(b['kv_bytes']), '.1f')} MB of KV, "
        f"fact {b['hits']}",
        b["all_hit"],
    )


def _mb(value: float | None) -> float | None:
    return None if value is None else value / _MB


# ---------------------------------------------------------------- reuse


def reuse_medians(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per server and settings: TTFTs, their ratio, cached tokens, answers right."""
    out = {}
    for (name,), rs in grouped(part(result, "reuse"), "who").items():
        first = median([r["ttft_first_s"] for r in rs])
        second = median([r["ttft_second_s"] for r in rs])
        out[name] = {
            "ttft_first_s": first,
            "ttft_second_s": second,
            "ratio": _ratio(second, first),
            "prompt_tokens": median([r["prompt_tokens"] for r in rs]),
            "cached_tokens_second": median([r["cached_tokens_second"] for r in rs]),
            "hits_first": _hits(rs, "hit_first"),
            "hits_second": _hits(rs, "hit_second"),
            "all_hit": all(r["hit_second"] for r in rs),
            "answer_second": rs[0]["answer_second"],
        }
    return out


def _reuse_table(result: dict[str, Any]) -> list[str]:
    """A row per server (nothing without the reuse part)."""
    med = reuse_medians(result)
    if not med:
        return []
    lines = [
        f"## Reuse: a second question about the same document ({_demo(result)})",
        "",
        "A streaming chat, the document as the system message; the second question "
        "follows the first on the same server.",
        "",
        "| server | TTFT first (s) | TTFT second (s) | second / first | prompt tokens | "
        "cached tokens (2nd) | right 1st | right 2nd | 2nd answer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, m in sorted(med.items(), key=lambda x: (x[0] != PEER, x[0])):
        lines.append(
            f"| {name} | {_num(m['ttft_first_s'])} | {_num(m['ttft_second_s'])} | "
            f"{_num(m['ratio'], '.3f')} | {_num(m['prompt_tokens'], '.0f')} | "
            f"{_num(m['cached_tokens_second'], '.0f')} | {m['hits_first']} | "
            f"{m['hits_second']} | {m['answer_second'].strip()[:40]!r} |"
        )
    return [*lines, ""]


def _reuse_targets(result: dict[str, Any]) -> list[Target]:
    """kvtrim's second TTFT <= 0.2x its first, the answer right."""
    med = reuse_medians(result)
    b = next((m for n, m in med.items() if n.startswith(KVTRIM)), None)
    if b is None:
        return []
    a = med.get(PEER)
    peer = f"; llama-server {_num(a['ratio'], '.3f')}x" if a else ""
    return [
        (
            f"second question's TTFT <= {REUSE_RATIO}x the first's, answer right",
            f"{_num(b['ttft_second_s'])} vs {_num(b['ttft_first_s'])} s "
            f"({_num(b['ratio'], '.3f')}x), right {b['hits_second']}{peer}",
            b["ratio"] is not None and b["ratio"] <= REUSE_RATIO and b["all_hit"],
        )
    ]


# ---------------------------------------------------------------- all


def targets(result: dict[str, Any]) -> list[Target]:
    """Issue 24's targets, judged from the records of the parts that ran."""
    med = prefill_medians(result)
    return [
        *_serve_targets(result),
        *_demo_target(med),
        *_long_targets(med),
        *_reuse_targets(result),
    ]


def _range_cover(n: int) -> str:
    """The chance that the range of ``n`` rounds' ratios holds their median, as a
    percentage: all ``n`` fall on one side of it with chance ``2 x 0.5^n`` (a sign
    test)."""
    return f"{max(0.0, 1.0 - 2.0 * 0.5**n):.1%}".replace(".0%", "%")


def _who_first(result: dict[str, Any]) -> str:
    """Which server of a round's configuration ran first, from the records' order
    (runs before the counterbalanced schedule always started llama-server first)."""
    groups = grouped(result.get("records", []), "part", "round", "config")
    firsts = {min(rs, key=lambda r: r.get("order", 0))["server"] == PEER for rs in groups.values()}
    if len(firsts) > 1:
        return "llama-server first in even rounds, kvtrim first in odd ones"
    return "llama-server first" if all(firsts) else "kvtrim first"


def _notes(result: dict[str, Any]) -> list[str]:
    """What a reader needs to judge the comparison fair."""
    cfg = result["config"]
    template = (
        [
            "- The model file has no chat template: llama-server would fall back to ChatML "
            "(`<|im_start|>`, which this model never saw), so it gets `--jinja "
            "--chat-template-file` with kvtrim's plain format (the document, `Question: "
            "...`, `Answer:`) and both servers get kvtrim's stop strings: the same prompt "
            "tokens (compare the prompt tokens columns)."
        ]
        if cfg.get("chat_template_file")
        else []
    )
    return [
        "## How",
        "",
        f"- The same model file (`{Path(cfg['model']).name}`) and {cfg['threads']} threads "
        f"for both (llama-server `-t -tb`, kvtrim `--threads`), {cfg.get('gpu_layers', 0)} "
        "GPU layers (`-ngl`, `--gpu-layers`); each server its own process, "
        "started for each configuration and round and stopped before the other starts "
        f"({_who_first(result)}); never both at once. Every figure is the median of "
        f"{cfg['rounds']} round(s); the serve table's per-round column is kvtrim's "
        "requests/s over llama-server's within each round (the two runs of a round are "
        "minutes apart, the rounds further: the spread is the machine's noise; the range "
        f"of {cfg['rounds']} rounds holds the ratio's true median with "
        f"{_range_cover(cfg['rounds'])} confidence, by a sign test).",
        f"- llama-server: `{cfg['peer_binary']}`"
        + (f", {cfg['peer_build']}" if cfg.get("peer_build") else "")
        + ", its defaults but `-np`, `-c`, `-t`, `-tb` "
        "and `-lv 4` (its log then shows the KV caches it allocates). Its defaults include "
        "a prompt cache in RAM (`--cache-ram`, 8 GiB) and context checkpoints (one where "
        "the last user message starts: how its sliding-window cache answers a second "
        "question without reading the document again); every serve request is a "
        "passage neither server has seen.",
        *template,
        _sampling_line(cfg.get("temperature", 0.0), cfg.get("ignore_eos", False)),
        *_short_answers(result),
        "- KV bytes: llama-server's cache for its whole `-c` context (allocated at start), "
        "kvtrim's cache of the request (`kv_bytes_held`).",
        "- Timings taken on a loaded machine mean nothing.",
        "",
    ]


def _color(name: str) -> str:
    """One color per server and settings in every panel: llama-server gray."""
    if name == PEER:
        return "tab:gray"
    if name.startswith(f"{KVTRIM} full"):
        return "tab:green"
    budgets = ("1024", "4096")
    return ("tab:blue", "tab:orange", "tab:purple")[
        next((i for i, b in enumerate(budgets) if name.endswith(f" {b}")), 2)
    ]


def _plot_serve(ax: Any, result: dict[str, Any]) -> None:
    med = serve_medians(result)
    for server, color in ((PEER, _color(PEER)), (KVTRIM, "tab:blue")):
        for stream, style in ((False, "-o"), (True, "--s")):
            pts = sorted(
                (c, m["requests_per_s"])
                for (c, s, n), m in med.items()
                if n == server and s == stream
            )
            if pts:
                label = f"{server} {'streaming' if stream else 'plain'}"
                ax.plot(*zip(*pts, strict=True), style, color=color, label=label)
    ax.set_xticks(sorted({c for c, _, _ in med}))
    ax.set(xlabel="concurrent clients", ylabel="requests/s", title="serve", ylim=(0, None))
    ax.legend(fontsize=7)


def _plot_prefill(ax_time: Any, ax_kv: Any, result: dict[str, Any]) -> None:
    med = prefill_medians(result)
    lengths = sorted({m["length"] for m in med.values() if m["length"]})
    for name in sorted({n for _, n in med}, key=lambda n: (n != PEER, n)):
        pts = sorted(
            (m["length"], m["wall_s"], _mb(m["kv_bytes"]))
            for (_, n), m in med.items()
            if n == name and m["length"] and m["wall_s"] is not None  # not refused
        )
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax_time.plot(xs, [p[1] for p in pts], "-o", color=_color(name), label=name)
        ax_kv.plot(xs, [p[2] for p in pts], "-o", color=_color(name), label=name)
    ax_time.set(xlabel="document tokens", ylabel="wall s (read + answer)", title="prefill")
    ax_kv.set(xlabel="document tokens", ylabel="KV MB (each server's own figure)", title="KV")
    for ax in (ax_time, ax_kv):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n // 1024}K" for n in lengths])
        ax.minorticks_off()
        ax.set_ylim(0, None)
        ax.legend(fontsize=7)


def _plot_reuse(ax: Any, result: dict[str, Any]) -> None:
    med = reuse_medians(result)
    names = sorted(med, key=lambda n: (n != PEER, n))
    xs = range(len(names))
    for shift, key, label in ((-0.2, "ttft_first_s", "first"), (0.2, "ttft_second_s", "second")):
        bars = ax.bar([x + shift for x in xs], [med[n][key] or 0 for n in names], 0.4)
        bars.set_label(f"{label} question")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(list(xs), names, fontsize=7)
    ax.set(ylabel="time to first token (s)", title=f"reuse ({_demo(result)})")
    ax.legend(fontsize=7)


def plot(result: dict[str, Any], out_dir: Path) -> str | None:
    """``peer.png``: a panel per part that ran; its file name (None: no part ran)."""
    panels = [p for p in ("serve", "prefill", "reuse") if part(result, p)]
    if not panels:
        return None
    plt = pyplot()
    n = len(panels) + ("prefill" in panels)
    fig, axes = plt.subplots(1, n, figsize=(4.4 * n, 3.8), squeeze=False)
    axes = list(axes[0])
    if "serve" in panels:
        _plot_serve(axes.pop(0), result)
    if "prefill" in panels:
        _plot_prefill(axes.pop(0), axes.pop(0), result)
    if "reuse" in panels:
        _plot_reuse(axes.pop(0), result)
    return save(fig, out_dir, "peer.png")


def markdown(result: dict[str, Any], image: str | None = None) -> str:
    """The report: the tables of the parts that ran, the targets, how it was run."""
    lines = [
        "# kvtrim serve against llama-server",
        "",
        f"`{result['command']}` on {result['model']}; {result.get('elapsed_s', 0):.0f} s in all.",
        "",
        *([f"![kvtrim against llama-server]({image})", ""] if image else []),
        *_serve_table(result),
        *_prefill_table(result),
        *_reuse_table(result),
        "## Targets (issue 24)",
        "",
    ]
    found = targets(result)
    lines += [f"- {'met' if ok else 'MISSED'}: {t}: {m}" for t, m, ok in found]
    if not found:
        lines.append("- none judged: the parts that ran measure none of them")
    return "\n".join([*lines, "", *_notes(result)])


def write(result: dict[str, Any], out_dir: Path) -> Path:
    """``peer.md`` and ``peer.png`` in ``out_dir``; the report's path."""
    image = plot(result, out_dir)
    path = out_dir / "peer.md"
    path.write_text(markdown(result, image))
    return path


def _short_answers(result: dict[str, Any]) -> list[str]:
    """Greedy serve loads where kvtrim wrote fewer tokens a request than llama-server:
    why that is not a speed figure (empty where it did not, or where tokens are sampled
    and lengths differ by chance)."""
    if not result.get("records") or result["config"].get("temperature", 0.0):
        return []
    medians = serve_medians(result)
    short, together = [], False
    for (clients, stream, server), m in sorted(medians.items()):
        peer = medians.get((clients, stream, PEER))
        ours = m["completion_tokens"]
        if server != KVTRIM or peer is None or not ours:  # no answers: no figure
            continue
        if ours < peer["completion_tokens"] - 0.05:
            mode = "streaming" if stream else "plain"
            short.append(
                f"{clients} client{'s' * (clients > 1)} {mode}: {ours:.1f} against "
                f"{peer['completion_tokens']:.1f} tokens a request"
            )
            together = together or clients > 1
    if not short:
        return []
    return [
        f"- kvtrim wrote fewer tokens than llama-server ({'; '.join(short)}). Its loop "
        "guard ends an answer that repeats itself, which llama-server writes out to the "
        "length."
        + (
            " A client whose answer ends early sends its next request out of step with the "
            "others, and their prompts are then read in more, smaller rounds: llama-server "
            "given kvtrim's lengths was slower too (docs/benchmarks/history.md, issue 37: "
            "answers the loop guard ends early)."
            if together
            else ""
        )
    ]


def _sampling_line(temperature: float, ignore_eos: bool = False) -> str:
    """How the serve part's requests choose their tokens."""
    length = (
        " With `ignore_eos` (both servers' field) every answer runs to its length: end "
        "tokens and kvtrim's loop guard give way, so both write the same number of tokens."
        if ignore_eos
        else ""
    )
    if not temperature:
        return (
            "- Requests through the OpenAI Python SDK, greedy (`temperature 0`). 'same text': "
            "requests whose continuation is the same on both servers; greedy decoding parts "
            "where two tokens nearly tie, and the servers batch the prompt differently "
            "(kvtrim's shared pool even by the order in which the requests arrive)."
            + length
        )
    return (
        f"- Requests through the OpenAI Python SDK, sampled at `temperature {temperature:g}` "
        "and each server's own defaults for the rest (top-k 40, top-p 0.95 and min-p 0.05 on "
        "both, in llama.cpp's order), each its own seeds: 'same text' is not expected. Greedy "
        "answers of random weights repeat one token, which kvtrim's loop guard cuts short."
        + length
    )
