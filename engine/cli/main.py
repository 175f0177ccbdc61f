"""The ``kvtrim`` command: ask about or summarize a document in bounded memory.

kvtrim ask notes.txt --question "What is the pass key?" --policy snapkv --budget 1024
kvtrim summarize notes.txt --json
kvtrim summarize a.pdf b.docx notes/ --out summaries/
kvtrim info
kvtrim serve --policy h2o --budget 2048
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from ..documents.load import SUFFIXES, load_document
from ..errors import Cancelled, ConfigError, DocumentError, KvtrimError, shown
from ..native.cpu import system_info
from ..native.monitor import MemoryMonitor
from ..policies import POLICIES, help_lines, make_policy, parse_settings
from ..runtime.engine import Engine
from ..runtime.prefix import PrefixCache
from ..runtime.spec import RequestSpec
from ..runtime.states import default_store
from ..runtime.summary import SummaryDone
from ..session.config import AUTO_SPAN, usable_cpus
from ..session.core import MIN_CHUNK, POSITION_MODES, Session
from ..session.prompts import ask_prompt, prompt_tokens
from ..session.sampling import with_sentence_stop
from ..stats import Done, Event, Evicted, Progress, Restored, Token
from . import bench as bench_cli
from . import chat as chat_cli
from . import serve as serve_cli
from . import types
from .models import add_parser as add_models_parser
from .models import main as models_main
from .options import Option, add_options, engine_from_args, policy_args_help

_MB = 1024 * 1024
REPACK_MODES = ("auto", "on", "off")


class _Parser(argparse.ArgumentParser):
    """Usage errors raise ``ConfigError``: ``main`` reports them in one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _model_options(p: argparse.ArgumentParser) -> None:
    """--model, --gpu-layers, --repack: shared by ask, summarize and info."""
    p.add_argument(*types.MODEL_OPTION[0], **types.MODEL_OPTION[1])
    p.add_argument(
        "--gpu-layers",
        type=types.at_least(0, "layers"),
        default=0,
        metavar="N",
        help="layers to offload to the GPU (needs a CUDA build of llama-cpp-python)",
    )
    p.add_argument(
        "--repack",
        choices=REPACK_MODES,
        default=os.environ.get("KVTRIM_REPACK", "auto"),
        help="llama.cpp's CPU weight repacking (extra buffer types): auto turns it off on "
        "CPUs with AMX, where it crashes (default: $KVTRIM_REPACK, else auto)",
    )


def _request_options() -> list[Option]:
    """ask, summarize and chat's options that make their ``RequestSpec``: a flag
    whose ``dest`` is a ``SessionOptions`` field sets that field (``from_args``)."""
    tokens = types.at_least(MIN_CHUNK, "tokens")
    default = RequestSpec()  # each option's default is the spec's: declared once
    greedy = default.sampling
    return [
        (("--policy",), {"choices": list(POLICIES), "default": default.policy,
            "help": f"eviction policy (default: {default.policy}). {help_lines()}"}),
        (("--policy-arg",), {"dest": "policy_args", "action": "append", "default": None,
            "metavar": "NAME=VALUE", "help": "a parameter of the policy (repeatable): "
            f"{policy_args_help()}"}),
        (("--budget",), {"dest": "budget_tokens", "type": tokens,
            "default": default.budget_tokens, "metavar": "N",
            "help": f"KV cells kept after each eviction (default: {default.budget_tokens})"}),
        (("--chunk",), {"dest": "chunk_tokens", "type": tokens, "default": default.chunk_tokens,
            "metavar": "N", "help": "tokens read between evictions (default: budget/4)"}),
        (("--no-question-aware",), {"dest": "question_aware", "action": "store_false",
            "help": "score with the document's own attention, not the question's"}),
        (("--positions",), {"choices": list(POSITION_MODES), "default": default.positions,
            "help": "after an eviction, renumber the kept tokens 0..n-1 (compact, llama.cpp's "
            "context shift), shorten each hole to a few positions (bounded), keep the "
            "positions they were read at (original, as in the papers), or auto (default): "
            f"compact for text up to {AUTO_SPAN} budgets long, bounded beyond"}),
        (("--position-gap",), {"type": types.at_least(1, "positions"),
            "default": default.position_gap, "metavar": "N",
            "help": "the longest hole --positions bounded leaves "
            f"(default: {default.position_gap})"}),
        (("--recall-first",), {"action": argparse.BooleanOptionalAction,
            "default": default.recall_first, "help": "the first question brings back the "
            "evicted passages that best match it, as follow-ups do (default: "
            f"{'on' if default.recall_first else 'off'})"}),
        (("--flash-attn",), {"choices": ["auto", "on", "off"], "default": default.flash_attn,
            "help": "flash attention (auto: llama.cpp's choice, but off for a policy that "
            "reads attention in a session's own context)"}),
        *types.KV_OPTIONS,
        (("--answer-prefix",), {"default": default.answer_prefix, "metavar": "TEXT",
            "help": "text the answer starts with (helps base models: 'The pass key is')"}),
        (("--max-tokens",), {"type": types.at_least(1, "tokens"), "default": default.max_tokens,
            "metavar": "N", "help": "the longest answer, in tokens; of a summary, each "
            f"part's (default: {default.max_tokens})"}),
        (("--temperature",), {"type": types.temperature, "default": greedy.temperature,
            "help": "0 is greedy (default)"}),
        (("--top-p",), {"type": types.top_p, "default": greedy.top_p,
            "help": f"in (0, 1] (default: {greedy.top_p:g})"}),
        (("--top-k",), {"type": types.at_least(0), "default": greedy.top_k, "metavar": "K",
            "help": f"the K most likely tokens, 0: all (default: {greedy.top_k})"}),
        (("--min-p",), {"type": types.min_p, "default": greedy.min_p, "metavar": "P",
            "help": "tokens at least P times as likely as the most likely, 0: all "
            f"(default: {greedy.min_p:g})"}),
        (("--seed",), {"type": types.at_least(0), "default": greedy.seed, "metavar": "N"}),
        (("--stop",), {"action": "append", "default": None, "metavar": "TEXT",
            "help": "stop string (repeatable; default: the prompt's own)"}),
    ]  # fmt: skip


def _files(p: argparse.ArgumentParser, many: bool) -> None:
    """The document (ask, chat) or documents (summarize, with --out and --parallel)."""
    if not many:
        p.add_argument("file", help="a document of any length: .txt .md .html .pdf .docx")
        return
    p.add_argument(
        "file",
        nargs="+",
        type=Path,
        help="documents or folders (.txt .md .html .pdf .docx); several, a folder or "
        "--out summarize each into its own Markdown file",
    )
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="where to write")
    p.add_argument(
        "--parallel",
        type=types.at_least(1, "documents"),
        default=None,
        metavar="N",
        help="documents read at once, as sequences of one context sharing the KV "
        "memory of one (default: 1 on a CPU, where it does not pay; up to 4 with "
        "--gpu-layers, as free memory allows)",
    )


def _common(p: argparse.ArgumentParser, many: bool = False) -> None:
    _files(p, many)
    add_options(p, _request_options())
    _model_options(p)
    p.add_argument(
        "--threads",
        type=types.threads,
        default=None,
        metavar="N",
        help=f"CPU threads, 1 to {usable_cpus()} (default: the physical cores it may use)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--show-kept",
        type=Path,
        default=None,
        metavar="FILE.html",
        help="write what the cache held at the end, over the text, as an HTML page",
    )
    p.add_argument("--verbose", action="store_true", help="show llama.cpp's log")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvtrim", description="Long documents in a bounded KV cache (H2O, SnapKV, TOVA, ...)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="answer a question about a document")
    _common(ask)
    ask.add_argument("--question", "-q", required=True)
    ask.add_argument(
        "--reread",
        action="store_true",
        help="read the document again even when it was read before with these settings "
        "(by default a second question about it starts from that saved read)",
    )
    summ = sub.add_parser("summarize", help="summarize a document, or many into --out")
    _common(summ, many=True)
    chat = sub.add_parser("chat", help="chat about a document in the terminal (or JSON lines)")
    _common(chat)
    chat_cli.add_options(chat)
    bench_cli.add_parser(sub)
    serve_cli.add_parser(sub)
    info = sub.add_parser("info", help="show the model and the memory monitor")
    _model_options(info)
    add_models_parser(sub)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Options, each checked: a bad one raises ``ConfigError``."""
    args = build_parser().parse_args(argv)
    check_settings(args)
    return args


def check_settings(args: argparse.Namespace) -> None:
    """What one option alone cannot tell: the budget against the policy's
    protected tokens, and ``$KVTRIM_REPACK``. Runs before any file is read."""
    if getattr(args, "repack", None) not in (None, *REPACK_MODES):  # None: serve's default
        raise ConfigError(
            f"KVTRIM_REPACK must be one of {', '.join(REPACK_MODES)}, got {args.repack!r}"
        )
    if args.command not in ("ask", "summarize", "chat"):
        return
    settings = parse_settings(args.policy, args.policy_args or ())
    policy = make_policy(args.policy, **dict(settings))
    protected = policy.protected(args.budget_tokens)
    if policy.evicts and args.budget_tokens < protected + 1:
        raise ConfigError(
            f"budget {args.budget_tokens} is too small for {policy.name}: it keeps "
            f"{protected} sink and recent tokens"
        )


def _summary_line(result: dict[str, Any]) -> str:
    cached = result.get("cached_tokens", 0)
    reused = f" ({cached} of them from the saved read of this document)" if cached else ""
    if result.get("reads", 1) > 1:  # a summary part by part: the KV figures are the document's
        reused += f" in {result['reads']} reads of its {result['tokens_seen']:,} tokens"
    return (
        f"[{result['policy']} budget={result['budget_tokens']}] "
        f"{result['prompt_tokens']} prompt tokens{reused}, peak {result['kv_cells_peak']} cells, "
        f"KV {result['kv_bytes_peak'] / _MB:.1f} MB vs "
        f"{result['kv_bytes_llama_default'] / _MB:.1f} MB llama.cpp default "
        f"({result['kv_ratio']:.3f}; {result['kv_bytes_full'] / _MB:.1f} MB swa_full), "
        f"evicted {result['evicted_tokens']}, "
        f"prefill {result['prefill_tokens_per_s']:.0f} tok/s, "
        f"decode {result['decode_tokens_per_s']:.1f} tok/s, {_finished(result)}"
    )


FINISH_REASONS = {
    "stop": "at a stop string",
    "eog": "the model ended it",
    "length": "--max-tokens reached",
    "repetition": "it began to repeat itself",
    "empty": "nothing to summarize",
}


def _finished(result: dict[str, Any]) -> str:
    """Why the answer ended ("finished: length, --max-tokens reached"); for a summary
    of several parts, how many parts ended each way."""
    reason = result["finish_reason"]
    line = f"finished: {reason}, {FINISH_REASONS.get(reason, reason)}"
    parts = [p["finish_reason"] for p in result.get("summary_parts") or ()]
    if len(parts) > 1:
        counts = ", ".join(f"{parts.count(r)} {r}" for r in dict.fromkeys(parts))
        line += f" ({len(parts)} parts: {counts})"
    return line


def _batch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from tqdm import tqdm

    from ..runtime.batch import default_parallel, expand, prepare_out_dir, summarize_many, table

    sources = expand(args.file)
    if not sources:
        names = ", ".join(str(p) for p in args.file)
        raise DocumentError(f"{names}: a directory with no documents ({', '.join(SUFFIXES)})")
    out_dir = args.out or Path("summaries")
    prepare_out_dir(out_dir)  # a bad --out fails before the model loads
    settings = RequestSpec.from_args(args)
    bar = tqdm(total=len(sources), file=err, disable=args.json or not err.isatty(), unit="file")

    def progress(path: Path, event: object) -> None:
        if isinstance(event, Progress):
            bar.set_postfix_str(f"{path.name}: {event.done:,}/{event.total:,} tokens")
        elif isinstance(event, Done):
            bar.update(1)

    with engine_from_args(args) as engine:
        try:
            parallel = args.parallel or default_parallel(engine, settings, len(sources))
            results = summarize_many(engine, sources, out_dir, settings, progress, parallel)
        finally:
            bar.close()
    failed = [r for r in results if r.error]
    if args.json:
        rows = [
            {
                "file": str(r.path),
                "out": str(r.out) if r.out else None,
                "error": r.error,
                "finish_reason": r.reason or None,
                "prompt_tokens": r.stats.prompt_tokens if r.stats else None,
                "retention": r.retention if r.stats else None,
                "kv_bytes": r.stats.kv_bytes if r.stats else None,
                "kv_bytes_full": r.stats.kv_bytes_full if r.stats else None,
                "seconds": r.seconds,
            }
            for r in results
        ]
        out.write(json.dumps(rows) + "\n")
    else:
        out.write(table(results) + "\n")
    for r in failed:
        err.write(f"kvtrim: skipped {r.path}: {r.error}\n")
    return 1 if failed else 0


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command == "summarize":
        if len(args.file) > 1 or args.out is not None or args.file[0].is_dir():
            return _batch(args, out, err)
        args.file = args.file[0]
    text = load_document(args.file)
    settings = RequestSpec.from_args(args)
    monitor = MemoryMonitor()
    with engine_from_args(args) as engine:
        for note in engine.notes:
            err.write(f"note: {note}\n")
        with settings.open(engine) as session:
            _install_sigint(session)
            done = _answer(args, settings, session, text, monitor, out, err)
            monitor.sample()
            if args.show_kept is not None:
                _write_kept(args, session, engine.model_name, settings.answer(done.text))
        cached = getattr(args, "cached_tokens", 0)
        result = _result(done, settings.answer(done.text), monitor, engine, cached)
    monitor.close()
    if args.json:
        out.write(json.dumps(result) + "\n")
    else:
        out.write("\n")
        out.flush()
        err.write(_summary_line(result) + "\n")
    return 0


def _answer(
    args: argparse.Namespace,
    settings: RequestSpec,
    session: Session,
    text: str,
    monitor: MemoryMonitor,
    out: TextIO,
    err: TextIO,
) -> Done:
    """Read ``text`` and write the answer as it comes (progress on a terminal)."""
    if args.command == "ask":
        events = _ask_events(args, settings, session, text)
    else:
        events = settings.summarize(session, text)
    if not args.json and settings.answer_prefix:
        out.write(settings.answer_prefix)
    show_progress = not args.json and err.isatty()
    done: Done | None = None
    progress_shown = False  # a summary reads again after each part's paragraph
    for event in events:
        if isinstance(event, Restored):
            args.cached_tokens = event.seen
            if event.reason:  # one line, before the answer: the document is read again
                err.write(f"note: {shown(str(args.file))}: {event.reason}\n")
                err.flush()
        if isinstance(event, (Progress, Evicted)):
            monitor.sample()
        if isinstance(event, Progress) and show_progress:
            err.write(
                f"\rreading {event.done}/{event.total} tokens, {event.stats.evicted_tokens} evicted"
            )
            err.flush()
            progress_shown = True
        elif isinstance(event, Token) and not args.json:
            if progress_shown:
                err.write("\r\033[K")
                progress_shown = False
            out.write(event.text)
            out.flush()
        elif isinstance(event, Done):
            done = event
    assert done is not None
    return done


def _ask_events(
    args: argparse.Namespace, settings: RequestSpec, session: Session, text: str
) -> Iterator[Event]:
    """The answer's events: from the saved read of this document when a question about
    it was asked before with these settings (runtime/prefix.py), else reading it."""
    store = None if args.reread else default_store()
    if store is None:
        return settings.ask(session, text, args.question)
    prompt = ask_prompt(session.model, text, args.question, settings.answer_prefix)
    head, tail, sources = prompt_tokens(session.model, prompt)
    stops = settings.stops if settings.stops is not None else prompt.stops
    stops = with_sentence_stop(stops, settings.answer_prefix)  # as Session.ask's
    return PrefixCache(store).run(session, settings, head, tail, args.question, sources, stops)


def _result(
    done: Done, answer: str, monitor: MemoryMonitor, engine: Engine, cached: int = 0
) -> dict[str, Any]:
    """``--json``'s object: the answer and its figures (bytes, tokens, seconds);
    ``cached``: the document's tokens not read again (a saved read was restored)."""
    s = done.stats
    gpu_seen = monitor.gpu_note is None
    return {
        "answer": answer,
        "policy": s.policy,
        "budget_tokens": s.budget_tokens,
        # OpenAI's (and the server's) convention: every prompt token, the cached among them
        "prompt_tokens": s.prompt_tokens + cached,
        "cached_tokens": cached,
        "tokens_seen": s.tokens_seen,  # the document's (a summary's largest read)
        "reads": s.reads,
        "generated_tokens": s.generated_tokens,
        "kv_cells_peak": s.cells_peak,
        "kv_cells_allocated": s.n_ctx,
        "kv_swa_cells_allocated": s.swa_cells,
        "kv_type": s.kv_type,
        "kv_bytes_peak": s.kv_bytes,
        "kv_bytes_llama_default": s.kv_bytes_llama_default,
        "kv_bytes_full": s.kv_bytes_full,
        "kv_ratio": s.kv_ratio,
        "kv_ratio_full": s.kv_ratio_full,
        "evicted_tokens": s.evicted_tokens,
        "evictions": s.evictions,
        "prefill_tokens_per_s": s.prefill_tokens_per_s,
        "decode_tokens_per_s": s.decode_tokens_per_s,
        "first_token_s": s.first_token_s,
        "prefill_s": s.prefill_s,
        "decode_s": s.decode_s,
        "capture_s": s.capture_s,
        "score_s": s.score_s,
        "finish_reason": done.reason,
        "summary_parts": _parts(done),
        "rss_peak_bytes": monitor.rss_peak_bytes,
        "gpu_peak_bytes": monitor.gpu_peak_bytes if gpu_seen else None,
        # this process's own (weights, KV, buffers): what the app plots and the GPU check
        "gpu_process_peak_bytes": monitor.process_gpu_peak_bytes if gpu_seen else None,
        "gpu": monitor.gpu_note or "NVIDIA GPU",
        "model": engine.model_name,
        "cpu_path": engine.model.cpu_path.describe(),
        "repack": engine.model.cpu_path.repack,
    }


def _parts(done: Done) -> list[dict[str, Any]] | None:
    """A summary's parts (None for an answer): each one's heading, finish reason,
    tokens generated and the sentences kept of them."""
    if not isinstance(done, SummaryDone):
        return None
    return [
        {
            "part": p.number,
            "title": p.title,
            "finish_reason": p.reason,
            "generated_tokens": p.generated_tokens,
            "text": p.text,
        }
        for p in done.parts
    ]


def _write_kept(args: argparse.Namespace, session: Session, model: str, answer: str) -> None:
    """The ``--show-kept`` page; ``answer`` is the whole answer, its prefix included."""
    from ..session.kept_html import render_html, write_page

    question = getattr(args, "question", "")
    page = render_html(session.memory_map(), model=model, question=question, answer=answer)
    write_page(args.show_kept, page)


def _info(args: argparse.Namespace, out: TextIO) -> int:
    monitor = MemoryMonitor()
    with engine_from_args(args) as engine:
        info = engine.model.info
        sample = monitor.sample()
        for note in engine.notes:
            out.write(f"note: {note}\n")
        out.write(f"model: {shown(info.name)} ({shown(info.arch)}) {shown(info.path)}\n")
        out.write(f"llama.cpp: {system_info()}\n")
        out.write(f"CPU: {engine.model.cpu_path.describe()}\n")
        out.write(
            f"layers: {info.n_layer}, heads: {info.n_head} (KV {info.n_head_kv}), "
            f"trained context: {info.n_ctx_train}, sliding window: {info.n_swa or 'none'}\n"
        )
        out.write(f"global layers scored: {list(info.global_layers)}\n")
        lay = info.kv_layout()
        out.write(f"KV per token: {lay.cell_bytes / 1024:.1f} KiB (f16, every layer)")
        if lay.swa_cell_bytes:
            out.write(
                f"; {lay.global_cell_bytes / 1024:.1f} KiB in {len(info.global_layers)} global "
                f"layers, {lay.swa_cell_bytes / 1024:.1f} KiB in {info.n_swa_layers} "
                f"sliding-window layers, which hold only window + batch cells"
            )
        out.write("\n")
        for n in (8192, 32768):
            out.write(
                f"KV for {n:,} tokens: {lay.llama_default(n) / _MB:.1f} MB with llama.cpp's "
                f"default cache, {lay.full(n) / _MB:.1f} MB with swa_full\n"
            )
        out.write(f"process RSS: {sample.rss_bytes / _MB:.0f} MB\n")
        if sample.gpus:
            for g in sample.gpus:
                mine = "" if g.process_bytes is None else f", kvtrim {g.process_bytes / _MB:.0f} MB"
                out.write(
                    f"GPU {g.index} {g.name}: {g.used_bytes / _MB:.0f} / "
                    f"{g.total_bytes / _MB:.0f} MB{mine}\n"
                )
        else:
            out.write(f"GPU: {sample.gpu_note}\n")
    monitor.close()
    return 0


def _install_sigint(session: Session) -> None:
    """First Ctrl+C cancels the run cleanly; the default handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(_sig: int, _frame: object) -> None:
        session.cancel()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = parse_args(argv)
    except ConfigError as exc:  # a bad option: one line, before any file is read
        err.write(f"kvtrim: error: {shown(exc)}\n")
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings become our one line
    if getattr(args, "verbose", False):
        logging.getLogger("kvtrim.llama").setLevel(logging.INFO)
        err.write(f"llama.cpp: {system_info()}\n")
    try:
        if args.command == "info":
            return _info(args, out)
        if args.command == "models":
            return models_main(args, out, err)
        if args.command == "bench":
            return bench_cli.main(args, out, err)
        if args.command == "serve":
            return serve_cli.main(args, out, err)
        if args.command == "chat":
            return chat_cli.main(args, out, err)
        return _run(args, out, err)
    except Cancelled:
        err.write("\nkvtrim: cancelled\n")
        return 130
    except KvtrimError as exc:
        err.write(f"kvtrim: error: {shown(exc)}\n")
        return 2
    except KeyboardInterrupt:
        err.write("\nkvtrim: interrupted\n")
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
        _silence(out)
        return 141  # 128 + SIGPIPE


def _silence(out: TextIO) -> None:
    """Point ``out`` (when it is the process's stdout) at /dev/null, so Python's own
    flush at exit does not report the broken pipe again."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        fd = out.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
