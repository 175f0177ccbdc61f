"""Summarize many documents, each in a session of its own (its own cache and
eviction state), one Markdown file per input. An unreadable file is reported
and skipped; the rest complete.

    kvtrim summarize a.pdf b.docx notes/ --out summaries/
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .documents import SUFFIXES, load_document
from .errors import Cancelled, KvtrimError
from .runtime import Engine
from .stats import Done, Event, KVStats

_MB = 2**20


@dataclass(frozen=True)
class FileSummary:
    """The outcome for one input; ``error`` is set when it was skipped."""

    path: Path
    out: Path | None
    text: str
    stats: KVStats | None
    seconds: float
    error: str | None = None

    @property
    def retention(self) -> float:
        """Cells kept / tokens seen when the summary was done."""
        s = self.stats
        return s.cells_used / s.tokens_seen if s and s.tokens_seen else 0.0


def expand(paths: Iterable[Path]) -> list[Path]:
    """Files as given; folders become their documents (recursively, sorted, no
    hidden files). A missing path stays in the list, to be reported."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(
                f
                for f in p.rglob("*")
                if f.is_file()
                and f.suffix.lower() in SUFFIXES
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
        else:
            out.append(p)
    return out


def _markdown(item: FileSummary) -> str:
    s = item.stats
    assert s is not None
    return (
        f"# {item.path.name}\n\n{item.text.strip()}\n\n---\n\n"
        f"*kvtrim {s.policy}, budget {s.budget_tokens} tokens: read {s.prompt_tokens:,} tokens, "
        f"kept {s.cells_used:,} ({item.retention:.1%}), KV {s.kv_bytes / _MB:.1f} MB held vs "
        f"{s.kv_bytes_full / _MB:.1f} MB for a full cache, {item.seconds:.1f} s.*\n"
    )


def summarize_many(
    engine: Engine,
    files: Sequence[Path],
    out_dir: Path,
    *,
    policy: str,
    budget_tokens: int,
    on_event: Callable[[Path, Event], None] | None = None,
    **gen: object,
) -> list[FileSummary]:
    """Summarize each file into ``out_dir/<name>.md``; returns one result per file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[FileSummary] = []
    for path in files:
        start = time.perf_counter()
        try:
            text = load_document(path)
            with engine.session(policy, budget_tokens) as session:
                done: Done | None = None
                for event in session.summarize(text, **gen):
                    if on_event is not None:
                        on_event(path, event)
                    if isinstance(event, Done):
                        done = event
            if done is None:
                raise Cancelled("the summary ended without text")
        except Cancelled:
            raise
        except KvtrimError as exc:  # a bad document, or one that cannot be summarized
            results.append(FileSummary(path, None, "", None, time.perf_counter() - start, str(exc)))
            continue
        item = FileSummary(
            path, out_dir / f"{path.name}.md", done.text, done.stats, time.perf_counter() - start
        )
        assert item.out is not None
        item.out.write_text(_markdown(item), encoding="utf-8")
        results.append(item)
    return results


def table(results: Sequence[FileSummary]) -> str:
    """A Markdown table: tokens, retention, KV memory and time per file."""
    rows = [
        "| file | tokens | kept / seen | KV held / full (MB) | time (s) | result |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if r.stats is None:
            rows.append(f"| {r.path.name} | | | | {r.seconds:.1f} | skipped: {r.error} |")
            continue
        s = r.stats
        rows.append(
            f"| {r.path.name} | {s.prompt_tokens:,} | {r.retention:.1%} | "
            f"{s.kv_bytes / _MB:.1f} / {s.kv_bytes_full / _MB:.1f} | {r.seconds:.1f} | {r.out} |"
        )
    return "\n".join(rows)
