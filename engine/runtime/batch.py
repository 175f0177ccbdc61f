"""Summarize many documents, each in a session of its own (its own cache and
eviction state), one Markdown file per input. An unreadable file is reported
and skipped; the rest complete.

    kvtrim summarize a.pdf b.docx notes/ --out summaries/

A file in a folder keeps its path under that folder (``notes/a/x.txt`` becomes
``summaries/a/x.txt.md``); names that would still collide get ``-2``, ``-3``.
Each summary is written atomically as soon as it is done, so a failure later
(a full disk) loses none that finished. Every file's session is opened with the
same ``RequestSpec`` as a single file's (spec.py).

With ``parallel > 1`` that many documents are read at once, each a sequence of
one shared context (pool.py) whose cells are what one document's session would
hold (budget + chunk): the documents share the budget by length, and their
decodes are batched.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePath

from ..documents.load import SUFFIXES, load_document
from ..errors import Cancelled, KvtrimError, OutputError, shown
from ..native.kvmemory import pad
from ..policies import make_policy
from ..pool.kvpool import KVPool
from ..session.core import default_threads
from ..stats import Done, Event, KVStats
from .engine import Engine
from .spec import RequestSpec

_MB = 2**20


@dataclass(frozen=True)
class Source:
    """A document to summarize and its summary's path under the output folder."""

    path: Path
    out_name: PurePath

    @property
    def name(self) -> str:
        """The document as the output names it: its path under its folder."""
        return self.out_name.with_suffix("").as_posix()


@dataclass(frozen=True)
class FileSummary:
    """The outcome for one input; ``error`` is set when it was skipped."""

    source: Source
    out: Path | None
    text: str
    stats: KVStats | None
    seconds: float
    error: str | None = None
    reason: str = ""  # why the summary ended (cli/main.py FINISH_REASONS)

    @property
    def path(self) -> Path:
        return self.source.path

    @property
    def retention(self) -> float:
        """Cells kept / tokens seen when the summary was done."""
        s = self.stats
        return s.cells_used / s.tokens_seen if s and s.tokens_seen else 0.0


def _documents_in(folder: Path) -> list[Path]:
    return sorted(
        f
        for f in folder.rglob("*")
        if f.is_file()
        and f.suffix.lower() in SUFFIXES
        and not any(part.startswith(".") for part in f.relative_to(folder).parts)
    )


def _found(p: Path) -> list[tuple[Path, PurePath]]:
    """``(document, its path under the folder given)``; a file given is its own name."""
    if p.is_dir():
        return [(f, f.relative_to(p)) for f in _documents_in(p)]
    return [(p, PurePath(p.name))]


def _out_name(relative: PurePath, taken: set[str]) -> PurePath:
    """``relative`` + ``.md``, or ``stem-2.suffix.md``, ``-3``... when that is taken
    (compared without case, as on a case-insensitive disk)."""
    name, n = relative.with_name(f"{relative.name}.md"), 1
    while name.as_posix().casefold() in taken:
        n += 1
        name = relative.with_name(f"{relative.stem}-{n}{relative.suffix}.md")
    taken.add(name.as_posix().casefold())
    return name


def expand(paths: Iterable[Path]) -> list[Source]:
    """Files as given; folders become their documents (recursively, sorted, no
    hidden files), named by their path under the folder. A file met twice is
    summarized once; a missing path stays in the list, to be reported."""
    out: list[Source] = []
    seen: set[str] = set()
    taken: set[str] = set()
    for p in paths:
        for path, relative in _found(p):
            if (real := os.path.realpath(path)) not in seen:
                seen.add(real)
                out.append(Source(path, _out_name(relative, taken)))
    return out


def prepare_out_dir(out_dir: Path) -> None:
    """Create the output folder, so that a bad one fails before any model work."""
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"the output folder {out_dir} exists and is not a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the output folder {out_dir}: {_why(exc)}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write in the output folder {out_dir}: permission denied")


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def write_atomic(path: Path, text: str) -> None:
    """``text`` as UTF-8 at ``path``, whole or not at all: written to a temporary
    file in the same folder, flushed to the disk (fsync), then renamed over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _markdown(item: FileSummary) -> str:
    s = item.stats
    assert s is not None
    return (
        f"# {shown(item.path.name)}\n\n{item.text.strip()}\n\n---\n\n"
        f"*kvtrim {s.policy}, budget {s.budget_tokens} tokens: read {s.prompt_tokens:,} tokens, "
        f"kept {s.cells_used:,} ({item.retention:.1%}), KV {s.kv_bytes / _MB:.1f} MB held vs "
        f"{s.kv_bytes_llama_default / _MB:.1f} MB for llama.cpp's default cache, "
        f"{item.seconds:.1f} s, finished: {item.reason or 'unknown'}.*\n"
    )


def _summarize(
    engine: Engine,
    path: Path,
    settings: RequestSpec,
    on_event: Callable[[Path, Event], None] | None,
    pool: KVPool | None = None,
) -> Done:
    text = load_document(path)
    done: Done | None = None
    if pool is None:
        session = settings.open(engine)
    else:
        n_tokens = len(engine.model.tokenize(text)) + settings.max_tokens + 64  # + the prompt
        session = settings.open_in(engine, pool, n_tokens, label=path.name)
    with session:
        for event in settings.summarize(session, text):
            if on_event is not None:
                on_event(path, event)
            if isinstance(event, Done):
                done = event
    if done is None:
        raise Cancelled("the summary ended without text")
    return done


def _save(item: FileSummary, finished: int) -> None:
    assert item.out is not None
    try:
        write_atomic(item.out, _markdown(item))
    except OSError as exc:
        raise OutputError(
            f"cannot write {item.out}: {_why(exc)}; stopped, {finished} finished "
            f"{'summary is' if finished == 1 else 'summaries are'} written"
        ) from None


def summarize_many(
    engine: Engine,
    sources: Sequence[Source],
    out_dir: Path,
    settings: RequestSpec,
    on_event: Callable[[Path, Event], None] | None = None,
    parallel: int = 1,
    *,
    share: str = "length",
    pools: list[KVPool] | None = None,
    layout: str = "shared",
) -> list[FileSummary]:
    """Summarize each source into ``out_dir/<out_name>`` with ``settings``, writing
    each as it is done, ``parallel`` at once; returns one result per source, in
    order. Raises ``OutputError`` when a summary cannot be written (those before
    it stay written; with ``parallel > 1`` the ones running finish first).
    ``share``: how the pool splits its cells (pool.SHARES); ``pools``: gets the pool
    used, for its figures (the benchmark)."""
    prepare_out_dir(out_dir)
    results: list[FileSummary | None] = [None] * len(sources)
    lock = threading.Lock()
    pool = None
    if parallel > 1 and len(sources) > 1:
        pool = make_pool(engine, settings, min(parallel, len(sources)), share, layout)
        if pools is not None:
            pools.append(pool)

    def one(i: int) -> None:
        source, start = sources[i], time.perf_counter()
        try:
            done = _summarize(engine, source.path, settings, on_event, pool)
        except Cancelled:
            raise
        except KvtrimError as exc:  # a bad document, or one that cannot be summarized
            seconds = time.perf_counter() - start
            results[i] = FileSummary(source, None, "", None, seconds, str(exc))
            return
        out = out_dir / source.out_name
        text = settings.answer(done.text)
        seconds = time.perf_counter() - start
        item = FileSummary(source, out, text, done.stats, seconds, reason=done.reason)
        with lock:
            _save(item, sum(r is not None and r.out is not None for r in results))
            results[i] = item

    try:
        if pool is None:
            for i in range(len(sources)):
                one(i)
        else:
            _in_parallel(one, len(sources), parallel, pool)
    finally:
        if pool is not None:
            pool.close()
    return [r for r in results if r is not None]


def _in_parallel(one: Callable[[int], None], n: int, parallel: int, pool: KVPool) -> None:
    """``one(i)`` for ``i`` in ``range(n)``, ``parallel`` at once; the first to fail
    cancels the rest, those waiting and, through ``pool``, those running."""
    with ThreadPoolExecutor(parallel, thread_name_prefix="kvtrim-summarize") as workers:
        futures = [workers.submit(one, i) for i in range(n)]
        try:
            for future in futures:
                future.result()
        except BaseException:  # Ctrl+C, a full disk: stop the others at once
            for future in futures:
                future.cancel()
            pool.cancel_all()
            raise


def make_pool(
    engine: Engine,
    settings: RequestSpec,
    parallel: int,
    share: str = "length",
    layout: str = "shared",
) -> KVPool:
    """A pool for ``parallel`` documents with the KV cells of one document's session
    (``budget + chunk``, as llama.cpp rounds them)."""
    config = settings.config(engine)
    policy = make_policy(settings.policy)
    return KVPool(
        engine.model,
        cells=pad(config.budget_tokens + config.chunk()),
        max_seqs=parallel,
        n_threads=config.n_threads or default_threads(),
        needs=policy.needs(),
        flash_attn=settings.flash_attn,
        kv_type=config.kv_type,
        swa_cache=config.swa_cache,
        n_batch=min(config.batch_tokens, config.chunk()),
        share=share,
        layout=layout,
    )


def default_parallel(engine: Engine, settings: RequestSpec, n_files: int) -> int:
    """Documents to read at once when ``--parallel`` is not given.

    On a CPU: one. Reading is bound by arithmetic there, so batching documents
    gains nothing, and the shared budget gives each a smaller share, so more
    evictions (measured: 8 documents of 2K-8K tokens with ``--parallel 4`` ran at
    0.73x the speed of one by one, docs/benchmarks/history.md). With layers on a GPU, where a decode
    is bound by reading the weights: up to 4, never more than the files, and only
    as many as a quarter of the free RAM holds (each adds a sliding window of KV)."""
    import psutil

    model = engine.model
    if not model.on_gpu:
        return 1
    layout = model.info.kv_layout()
    window = model.info.n_swa + 512
    per_seq = window * layout.swa_cell_bytes + settings.budget_tokens * layout.global_cell_bytes
    fits = int(psutil.virtual_memory().available // 4 // max(per_seq, 1))
    return max(1, min(4, n_files, fits))


def table(results: Sequence[FileSummary]) -> str:
    """A Markdown table: tokens, retention, KV memory and time per file."""
    rows = [
        "| file | tokens | kept / seen | KV held / llama.cpp default (MB) | time (s) | finished "
        "| result |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        if r.stats is None:
            rows.append(
                f"| {shown(r.source.name)} | | | | {r.seconds:.1f} | | skipped: {shown(r.error)} |"
            )
            continue
        s = r.stats
        rows.append(
            f"| {shown(r.source.name)} | {s.prompt_tokens:,} | {r.retention:.1%} | "
            f"{s.kv_bytes / _MB:.1f} / {s.kv_bytes_llama_default / _MB:.1f} | {r.seconds:.1f} | "
            f"{r.reason} | {shown(r.out)} |"
        )
    return "\n".join(rows)
