"""The ``kvtrim bench`` subcommand."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from ..bench import report
from ..bench.runner import BenchConfig, run, steps_total
from ..errors import ConfigError
from ..policies import POLICIES, evicts, keeps_all
from . import types
from .options import Option, add_options


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _mix(text: str) -> tuple[int, int]:
    """``--peer-mix 64x96``: (prompt tokens, output tokens), each at least 1."""
    prompt, sep, gen = text.lower().partition("x")
    try:
        pair = (int(prompt), int(gen))
    except ValueError:
        pair = (0, 0)
    if not sep or min(pair) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give PROMPTxGEN, e.g. 64x96")
    return pair


_GRID_OPTIONS: tuple[Option, ...] = (  # what the comparison (and the parts) run
    (("--quick",), {"action": "store_true", "help": "a small grid (about 6 minutes on 2 cores)"}),
    (
        ("--policies",),
        {
            "type": _csv,
            "default": None,
            "help": f"comma-separated (default: {','.join(BenchConfig().policies)})",
        },
    ),
    (
        ("--length",),
        {
            "type": int,
            "default": None,
            "help": f"document length of the quality runs (default: {BenchConfig().length})",
        },
    ),
    (
        ("--budgets",),
        {
            "type": _csv,
            "default": None,
            "help": "fractions of --length (1/8) or cells (default: 1/8,1/4)",
        },
    ),
    (
        ("--lengths",),
        {
            "type": lambda s: [int(x) for x in _csv(s)],
            "default": None,
            "help": "document lengths of the scaling runs (default: 2048,4096,8192,16000)",
        },
    ),
    (
        ("--scale-budget",),
        {"type": int, "default": None, "help": "budget of the scaling runs"},
    ),
    (("--depths",), {"type": int, "default": None, "help": "passkey depths per trial"}),
    (("--trials",), {"type": int, "default": None}),
    (("--seed",), {"type": int, "default": None}),
    types.MODEL_OPTION,
    (("--threads",), {"type": int, "default": None}),
    (("--out",), {"type": Path, "default": Path("bench-out"), "help": "output folder"}),
)

_PART_OPTIONS: tuple[Option, ...] = (  # one part of the benchmark instead of the comparison
    (
        ("--maps-only",),
        {
            "action": "store_true",
            "help": "add the needle memory maps to OUT/results.json and rewrite the report",
        },
    ),
    (
        ("--robustness",),
        {
            "action": "store_true",
            "help": "only the README demo under threads 1/2, flash attention on/off, "
            "repacking on/off and batch 256/512, plus the cost of repacking off (about 20 "
            "minutes); writes OUT/robustness.json and OUT/robustness.md",
        },
    ),
    (
        ("--kv-memory",),
        {
            "action": "store_true",
            "help": "only KV memory against llama.cpp's default (2K-64K tokens), the "
            "sliding-window cache against swa_full and q8_0/q4_0 caches (about an hour; "
            "with --quick a minute); writes OUT/kvmem.json, OUT/kvmem.md and a plot",
        },
    ),
    (
        ("--multiturn",),
        {
            "action": "store_true",
            "help": "only the conversation task: a summary, then questions about 4 planted "
            "facts per document, every policy and budget with recall, against the full "
            "cache and a fresh read per question (about 45 minutes; with --quick 2); writes "
            "OUT/multiturn.json and OUT/multiturn.md",
        },
    ),
    (
        ("--ruler",),
        {
            "action": "store_true",
            "help": "only the RULER-style suite (Hsieh et al. 2024): niah_single, "
            "niah_multikey, niah_multivalue and variable_tracking in essay, noise and "
            "numbers haystacks of 4K-64K tokens at depths 0.1/0.4/0.7, the full cache "
            "(where the document fits the trained context) against snapkv, h2o, tova and "
            "streaming at budgets 1024 and 4096 in each positions mode (auto, compact, original, "
            "bounded). The "
            "full grid reads about 100M prompt tokens: days on 2 cores; with --quick (2K "
            "tokens, 12 answers) about 5 minutes on 2 cores. --parts picks tasks, --positions "
            "position modes; writes OUT/ruler.json, OUT/ruler.md and OUT/ruler.png",
        },
    ),
    (
        ("--positions",),
        {
            "type": _csv,
            "default": None,
            "help": "with --ruler: which of auto,compact,original,bounded (default: all); "
            "with --fidelity: which of compact,original,bounded (default: compact,bounded)",
        },
    ),
    (
        ("--reference",),
        {
            "type": Path,
            "default": None,
            "metavar": "RULER.JSON",
            "help": "with --ruler: take the full cache's records from an earlier run of the "
            "same items (same seed) instead of running it again; the full cache evicts "
            "nothing, so changes to eviction cannot move it",
        },
    ),
    (
        ("--fidelity",),
        {
            "action": "store_true",
            "help": "only the fidelity run: 30 documents per cell (--docs) of five haystack "
            "kinds (prose, numbers, code, boilerplate, manual) with three planted facts and "
            "same-shape distractors each, the first question and two follow-ups, the full "
            "cache against snapkv at budget 256 (--budgets) in compact and bounded positions "
            "(auto read off), 2K-8K tokens (--lengths); accuracy with 95%% intervals. "
            "Resumes from OUT/fidelity.jsonl (hours on 2 cores; --quick a few minutes); "
            "writes OUT/fidelity.md",
        },
    ),
    (
        ("--docs",),
        {"type": int, "default": None, "help": "with --fidelity: documents per cell (30)"},
    ),
    (
        ("--concurrency",),
        {
            "action": "store_true",
            "help": "only throughput against concurrency: the server with 1-8 clients, "
            "summarize one by one and --parallel, pass keys alone and together (about 15 "
            "minutes; with --quick 3); writes OUT/concurrency.json and OUT/concurrency.md",
        },
    ),
    (
        ("--peer",),
        {
            "choices": ("llama-server",),
            "default": None,
            "help": "with --ruler: llama-server as a second full-cache reference, fed the "
            "tokens kvtrim reads, on every item that fits its trained context. Alone: "
            "kvtrim serve against llama.cpp's llama-server (built from the "
            "llama.cpp that llama-cpp-python vendors), alternating, same model and threads: "
            "throughput at 1/4/8 clients, reading 8K-64K-token documents, a second question "
            "about the same document (1-1.5 hours on 2 cores; with --quick a few minutes); "
            "writes OUT/peer.json, OUT/peer.md, OUT/peer.png and the servers' logs in "
            "OUT/peer-logs",
        },
    ),
    (
        ("--peer-binary",),
        {
            "type": Path,
            "default": None,
            "metavar": "PATH",
            "help": "with --peer and --ruler --peer: the llama-server to run (default: build with "
            "scripts/peer/build_llama_server.sh, which reuses a build)",
        },
    ),
    (
        ("--peer-kv-layout",),
        {
            "choices": ("shared", "streams"),
            "default": None,
            "help": "with --peer: kvtrim serve's --kv-layout in the serve part with several "
            "clients (default: shared, its own default; streams gives each request "
            "--kv-cells/N cells, as llama-server gives each slot -c/N)",
        },
    ),
    (
        ("--peer-gpu-layers",),
        {
            "type": int,
            "default": 0,
            "metavar": "N",
            "help": "with --peer: layers both servers offload to the GPU (llama-server "
            "-ngl, kvtrim serve --gpu-layers; needs CUDA builds of both; default: 0)",
        },
    ),
    (
        ("--peer-temperature",),
        {
            "type": float,
            "default": 0.0,
            "metavar": "T",
            "help": "with --peer: the serve part's sampling temperature (default: 0, greedy; "
            "a synthetic model's greedy answers loop, and kvtrim cuts loops short)",
        },
    ),
    (
        ("--peer-ignore-eos",),
        {
            "action": "store_true",
            "help": "with --peer: the serve part's requests carry ignore_eos, so every "
            "answer on both servers runs to its length (kvtrim's loop guard ends looping "
            "ones early otherwise)",
        },
    ),
    (
        ("--peer-mix",),
        {
            "type": _mix,
            "default": None,
            "metavar": "PROMPTxGEN",
            "help": "with --peer: the serve part's prompt and output tokens per request, "
            "e.g. 64x96 (default: 160x32); llama-server's slots grow to hold them",
        },
    ),
    (
        ("--clients",),
        {
            "type": lambda s: [int(x) for x in _csv(s)],
            "default": None,
            "help": "with --peer: concurrent clients of the serve part (default: 1,4,8)",
        },
    ),
    (
        ("--rounds",),
        {
            "type": int,
            "default": None,
            "help": "with --peer: rounds of every configuration (default: 3; --quick 1)",
        },
    ),
    (
        ("--parts",),
        {
            "type": _csv,
            "default": None,
            "help": "with --peer: which of serve,prefill,reuse; "
            "with --kv-memory: which of alloc,long,swa,kv_type; with --concurrency: "
            "which of server,summarize,needles; with --ruler: which tasks of niah_single,"
            "niah_multikey,niah_multivalue,variable_tracking and haystacks of essay,noise,"
            "numbers; with --fidelity: haystacks of prose,numbers,code,boilerplate,manual "
            "(default: all)",
        },
    ),
    (
        ("--report-only",),
        {
            "action": "store_true",
            "help": "rewrite report.md and the plots from OUT/results.json",
        },
    ),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Registers ``bench`` on the ``kvtrim`` subcommands."""
    p = sub.add_parser("bench", help="compare policies on quality, memory and speed")
    add_options(p, (*_GRID_OPTIONS, *_PART_OPTIONS))


def _token_counts(budgets: list[str], mode: str, example: str) -> list[int]:
    """``--budgets`` as cell counts, for the modes that take no fractions of a length."""
    try:
        return [int(b) for b in budgets]
    except ValueError:
        raise ConfigError(f"--budgets with {mode} takes token counts ({example})") from None


def _override(cfg: Any, args: argparse.Namespace, *names: str, **renamed: str) -> None:
    """Set each config field to its option's value where the option is given:
    ``names`` name both, ``renamed`` maps a field to an option of another name."""
    for field, option in (*((name, name) for name in names), *renamed.items()):
        value = getattr(args, option)
        if value is not None:
            setattr(cfg, field, value)


def _known_parts(parts: list[str], known: Sequence[str]) -> list[str]:
    """``parts`` when each is one of ``known``; else a ``ConfigError`` naming the first not."""
    bad = [p for p in parts if p not in known]
    if bad:
        raise ConfigError(f"unknown part {bad[0]!r}; choose from {', '.join(known)}")
    return parts


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The comparison's grid: the defaults (or ``--quick``'s) with the options given."""
    cfg = BenchConfig.quick() if args.quick else BenchConfig()
    _override(
        cfg,
        args,
        "policies",
        "length",
        "budgets",
        "lengths",
        "depths",
        "trials",
        "seed",
        "model",
        "threads",
        "scale_budget",
    )
    unknown = [p for p in cfg.policies if p not in POLICIES]
    if unknown:
        raise SystemExit(f"kvtrim: error: unknown policy {unknown[0]!r}")
    return cfg


def _check_tools() -> None:
    """Fail before hours of work, not after, when the plotting or ROUGE library is missing
    (the PyInstaller bundle leaves them out)."""
    import importlib.util

    missing = [m for m in ("matplotlib", "rouge_score") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"kvtrim bench needs {' and '.join(missing)}; run it from a pip install "
            "(bash scripts/setup.sh), not the app bundle"
        )


def _command() -> str:
    """The command line as it was run, quoted, for the results and reports."""
    return "kvtrim " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _log_to(err: TextIO) -> Callable[[str], None]:
    """A progress callback that writes each step's label as a line of ``err``."""

    def step(label: str) -> None:
        err.write(label + "\n")
        err.flush()

    return step


def _print_targets(out: TextIO, found: list[tuple[str, str, bool]]) -> None:
    """A line per target: ``met`` or ``MISS``, the target, what was measured."""
    for target, measured, ok in found:
        out.write(f"{'met ' if ok else 'MISS'}  {target}: {measured}\n")


def _maps_only(cfg: BenchConfig, out_dir: Path, out: TextIO) -> int:
    """Needle memory maps added to an earlier run's results (or alone)."""
    import json

    from ..bench.runner import run_maps
    from ..runtime.engine import Engine

    path = out_dir / "results.json"
    if not path.exists():
        raise ConfigError(f"{path} not found: run kvtrim bench --out {out_dir} first")
    result = json.loads(path.read_text())
    with Engine(cfg.model, n_threads=cfg.threads) as engine:
        result["maps"] = run_maps(engine, cfg, lambda label: None)
    path.write_text(json.dumps(result, indent=1))
    report_path = report.write(result, out_dir, result.get("command", "kvtrim bench"))
    out.write(f"wrote {path} and {report_path}\n")
    return 0


def _robustness(cfg: BenchConfig, out_dir: Path, out: TextIO, err: TextIO) -> int:
    """The demo under numeric variants, and what repacking off costs."""
    import json

    from ..bench import robustness as rb
    from ..documents.load import load_document

    command = _command()
    records = rb.run_robustness(cfg.model, _log_to(err))
    text = load_document(rb.DEMO_FILE)
    cost = rb.repack_cost(cfg.model, text[: len(text) // 4])
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"command": command, "records": records, "repack_cost": cost}
    (out_dir / "robustness.json").write_text(json.dumps(data, indent=1))
    (out_dir / "robustness.md").write_text(rb.markdown(records, cost, command))
    for policy, (hits, n) in rb.summary(records).items():
        out.write(f"{policy}: {hits}/{n} right\n")
    out.write(f"wrote {out_dir / 'robustness.md'}\n")
    return 0


def _part(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    name: str,
    configure: Callable[[], Any],
    module: Any,
    report: Any,
) -> int:
    """One part of the benchmark that writes ``OUT/<name>.json``: ``configure()`` builds
    its config (before the model loads, so a bad option fails at once), ``module.run``
    measures, ``report`` writes ``<name>.md`` and judges the targets. With
    ``--report-only`` the JSON is read back instead."""
    import json

    from ..runtime.engine import Engine

    path = args.out / f"{name}.json"
    if args.report_only:
        result = json.loads(path.read_text())
    else:
        cfg = configure()
        with Engine(args.model, n_threads=args.threads) as engine:
            result = module.run(cfg, engine, args.out, _log_to(err), _command())
    report_path = report.write(result, args.out)
    _print_targets(out, report.targets(result))
    out.write(f"wrote {path} and {report_path}\n")
    return 0


def _kvmem_config(args: argparse.Namespace) -> Any:
    from ..bench import kvmem

    cfg = kvmem.KVMemConfig.quick() if args.quick else kvmem.KVMemConfig()
    _override(cfg, args, "lengths", "depths")
    if args.budgets is not None:
        cfg.budgets = _token_counts(args.budgets, "--kv-memory", "256,1024")
    if args.parts is not None:
        cfg.parts = _known_parts(args.parts, kvmem.PARTS)
    return cfg


def _multiturn_config(args: argparse.Namespace) -> Any:
    from ..bench import multiturn

    cfg = multiturn.MultiTurnConfig.quick() if args.quick else multiturn.MultiTurnConfig()
    if args.policies is not None:
        unknown = [p for p in args.policies if not evicts(p)]
        if unknown:
            raise ConfigError(f"unknown or non-evicting policy {unknown[0]!r}")
        cfg.policies = args.policies
    if args.budgets is not None:
        cfg.budgets = [int(b) for b in args.budgets]
        cfg.main_budget = cfg.budgets[-1]
    _override(cfg, args, "seed", doc_tokens="length", docs="trials")
    return cfg


def _ruler_config(args: argparse.Namespace, err: TextIO = sys.stderr) -> Any:
    from ..bench import ruler

    cfg = ruler.RulerConfig.quick() if args.quick else ruler.RulerConfig()
    _override(cfg, args, "lengths", "trials", "seed")
    if args.parts is not None:  # task and haystack names
        tasks = [p for p in args.parts if p not in ruler.HAYSTACKS]
        cfg.tasks = tasks or cfg.tasks
        cfg.haystacks = [p for p in args.parts if p in ruler.HAYSTACKS] or cfg.haystacks
    if args.depths is not None:  # how many, evenly spread
        cfg.depths = [round((i + 0.5) / args.depths, 3) for i in range(args.depths)]
    if (args.policies, args.budgets, args.positions) != (None, None, None):
        budgets = (
            _token_counts(args.budgets, "--ruler", "1024,4096") if args.budgets else cfg.part(1)
        )
        cfg.settings = ruler.grid(
            args.policies or cfg.part(0), budgets, args.positions or cfg.part(2)
        )
    if args.reference is not None:
        cfg.settings = [x for x in cfg.settings if not keeps_all(x[0])]
        cfg.reference = str(args.reference)
    if args.peer:  # llama-server beside kvtrim's full cache, on the items that fit
        cfg.peer_binary, cfg.model, cfg.threads = _peer_run(args, err)
        at = next((i for i, x in enumerate(cfg.settings) if keeps_all(x[0])), -1)
        cfg.settings.insert(at + 1, ruler.ruler_peer.SETTING)
    cfg.check()
    return cfg


def _fidelity_config(args: argparse.Namespace) -> Any:
    from ..bench import fidelity

    cfg = fidelity.FidelityConfig.quick() if args.quick else fidelity.FidelityConfig()
    _override(cfg, args, "lengths", "policies", "positions", "seed", "docs", haystacks="parts")
    if args.budgets is not None:
        cfg.budgets = _token_counts(args.budgets, "--fidelity", "256,1024")
    cfg.check()
    return cfg


def _fidelity(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The fidelity run (resumed from OUT's records), or with --report-only its tables."""
    from ..bench import fidelity, fidelity_report
    from ..runtime.engine import Engine

    if args.report_only:
        result = fidelity.load(args.out)
    else:
        cfg = _fidelity_config(args)
        with Engine(args.model, n_threads=args.threads) as engine:
            result = fidelity.run(cfg, engine, args.out, _log_to(err), _command())
    path = fidelity_report.write(result, args.out)
    _print_targets(out, fidelity_report.targets(result))
    out.write(f"wrote {args.out / fidelity.RECORDS} and {path}\n")
    return 0


def _concurrency_config(args: argparse.Namespace) -> Any:
    from ..bench import concurrency

    cfg = concurrency.ConcurrencyConfig.quick() if args.quick else concurrency.ConcurrencyConfig()
    if args.parts is not None:
        cfg.parts = _known_parts(args.parts, concurrency.PARTS)
    _override(cfg, args, "seed")
    return cfg


def _concurrency(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench import concurrency, concurrency_report

    return _part(
        args,
        out,
        err,
        "concurrency",
        lambda: _concurrency_config(args),
        concurrency,
        concurrency_report,
    )


def _peer_binary(path: Path | None, err: TextIO) -> str:
    """The llama-server to run: ``path``, or what the build script prints (it builds
    one, about 15 minutes on 2 cores, or reuses the last build)."""
    import os
    import subprocess

    from ..bench.peer_servers import BUILD_SCRIPT

    if path is None:
        err.write(f"running {BUILD_SCRIPT} (reuses a build)\n")
        done = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise ConfigError(f"{BUILD_SCRIPT} failed:\n{done.stderr[-2000:]}")
        lines = done.stdout.strip().splitlines()
        path = Path(lines[-1]) if lines else None
        if path is not None and not path.is_absolute():
            path = BUILD_SCRIPT.parents[2] / path
    if path is None or not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"--peer-binary: {path} is not an executable file")
    return str(path.resolve())


def _peer_run(args: argparse.Namespace, err: TextIO) -> tuple[str, str, int]:
    """llama-server's binary, the model file both servers load and their threads."""
    from ..native.embedded import resolve
    from ..session.config import default_threads

    threads = args.threads or default_threads()
    model = str(resolve(args.model).resolve())
    return _peer_binary(args.peer_binary, err), model, threads  # a build comes last


def _peer_config(args: argparse.Namespace, err: TextIO) -> Any:
    from ..bench import peer, peer_servers

    cfg = peer.PeerConfig.quick() if args.quick else peer.PeerConfig()
    if args.parts is not None:
        cfg.parts = _known_parts(args.parts, peer.PARTS)
    _override(cfg, args, "clients", "lengths", "rounds", "seed")
    if args.peer_kv_layout:
        cfg.kv_layout = args.peer_kv_layout
    if args.peer_gpu_layers < -1:
        raise ConfigError(f"--peer-gpu-layers must be -1 (all) or more, got {args.peer_gpu_layers}")
    cfg.gpu_layers = args.peer_gpu_layers
    cfg.temperature = args.peer_temperature
    cfg.ignore_eos = args.peer_ignore_eos
    if not (math.isfinite(cfg.temperature) and 0 <= cfg.temperature <= 2):
        # kvtrim serve's requests take 0-2, as OpenAI's
        raise ConfigError(f"--peer-temperature must be in 0-2, got {cfg.temperature}")
    if args.peer_mix is not None:
        cfg.passage_tokens, cfg.gen_tokens = args.peer_mix
        # a slot holds the chat frame (~64 tokens) too; llama.cpp rounds -c to 256
        cfg.slot_cells = max(cfg.slot_cells, -(-(sum(args.peer_mix) + 64) // 256) * 256)
    bad = [n for n in (*cfg.clients, *cfg.lengths, cfg.rounds) if n < 1]
    if bad:
        raise ConfigError(f"--clients, --lengths and --rounds must be at least 1, got {bad[0]}")
    cfg.peer_binary, cfg.model, cfg.threads = _peer_run(args, err)
    cfg.peer_build = peer_servers.linkage(cfg.peer_binary)
    return cfg


def _peer(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import importlib.util

    from ..bench import peer, peer_report

    if not args.report_only and importlib.util.find_spec("openai") is None:
        raise ConfigError(
            "kvtrim bench --peer sends its requests with the openai package: "
            "pip install openai (or .[dev])"
        )
    return _part(args, out, err, "peer", lambda: _peer_config(args, err), peer, peer_report)


def _kv_memory(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench import kvmem, kvmem_report

    return _part(args, out, err, "kvmem", lambda: _kvmem_config(args), kvmem, kvmem_report)


def _multiturn(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench import multiturn, multiturn_report

    return _part(
        args, out, err, "multiturn", lambda: _multiturn_config(args), multiturn, multiturn_report
    )


def _ruler(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench import ruler, ruler_report

    return _part(args, out, err, "ruler", lambda: _ruler_config(args, err), ruler, ruler_report)


def main(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from tqdm import tqdm

    _check_tools()
    if args.ruler:  # before --peer: --ruler --peer adds llama-server to the suite
        return _ruler(args, out, err)
    if args.peer:
        return _peer(args, out, err)
    if args.kv_memory:
        return _kv_memory(args, out, err)
    if args.multiturn:
        return _multiturn(args, out, err)
    if args.concurrency:
        return _concurrency(args, out, err)
    if args.fidelity:
        return _fidelity(args, out, err)
    if args.report_only:
        import json

        result = json.loads((args.out / "results.json").read_text())
        path = report.write(result, args.out, result.get("command", "kvtrim bench"))
        out.write(f"wrote {path}\n")
        return 0
    cfg = config_from(args)
    if args.maps_only:
        return _maps_only(cfg, args.out, out)
    if args.robustness:
        return _robustness(cfg, args.out, out, err)
    total = steps_total(cfg)
    bar = tqdm(total=total, file=err, disable=not err.isatty(), unit="run")
    done = 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        bar.set_description(label[:60])
        bar.update(1)
        if not err.isatty():
            err.write(f"[{done}/{total}] {label}\n")
            err.flush()

    command = _command()
    result = run(cfg, args.out, step, command)
    bar.close()
    path = report.write(result, args.out, command)
    out.write(f"wrote {args.out / 'results.json'} and {path}\n")
    _print_targets(out, report.targets(result))
    return 0
