"""Summaries of five real documents, before and after part-by-part summarizing.

For each document: today's summary before issue 22 (``Session.summarize``: one read
of the whole document, "In summary," and a stop at a blank line) and kvtrim's
summary now (``RequestSpec.summarize``: runtime/summary.py), both with the same
settings (SnapKV, budget 1,024, ``--max-tokens`` 128, greedy). Measured: words,
distinct sentences (one said again and again counts once), the document's section
headings the summary mentions, the finish reason, and the parts. Quality, not
speed: the times are not reported.

A heading counts as mentioned when the summary holds one of its distinctive words:
a word of 4 or more letters (or a version such as "3.11"), not a common English
word, found in at most two of the document's headings; words match on their
first 5 letters ("mapping" / "mappings"); the words kvtrim's cues put in the summary
("This section describes") are not the model's and do not count. The JSON lists the
headings matched.

    .venv/bin/python scripts/summary_eval.py --out summary-eval.json

Documents (a missing one is skipped, with a line saying so): this project's
README.md (12,990 tokens when the committed figures were measured; it has since become
a shorter hub, so a new run reads another document); the GPL-3 text
(/usr/share/common-licenses/GPL-3); IDLE's NEWS.txt from the running Python's
standard library; Vim's user manual chapter 5 (/usr/share/vim/vim90/doc/usr_05.txt);
tar's man page, as ``man`` prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine  # noqa: E402
from engine.runtime.spec import RequestSpec  # noqa: E402
from engine.runtime.summary import SummaryDone  # noqa: E402
from engine.session.prompts import OVERVIEW_CUE, PART_CUE  # noqa: E402
from engine.stats import Done, Event  # noqa: E402


def _file(path: str | Path) -> Callable[[], str | None]:
    def load() -> str | None:
        p = Path(path)
        return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None

    return load


def _man(page: str) -> Callable[[], str | None]:
    def load() -> str | None:
        env = {**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": ""}
        try:
            got = subprocess.run(
                ["man", "--nj", "--nh", "-P", "cat", page],
                capture_output=True, text=True, env=env, timeout=60, check=True,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        return got.stdout or None

    return load


@dataclass(frozen=True)
class Doc:
    """A document, where it comes from, and the pattern of its section headings
    (group 1 is the title)."""

    name: str
    source: str
    load: Callable[[], str | None]
    heading: str


DOCS = (
    Doc("README.md", "this project", _file(ROOT / "README.md"), r"^#{2,3} (.+)$"),
    Doc("GPL-3", "/usr/share/common-licenses", _file("/usr/share/common-licenses/GPL-3"),
        r"^ +\d+\. (.+)\.$"),
    Doc("IDLE NEWS.txt", "Python's idlelib", _file(Path(sysconfig.get_paths()["stdlib"])
        / "idlelib" / "NEWS.txt"), r"^What's New in (IDLE [0-9][^\s?]*)"),
    Doc("Vim usr_05.txt", "/usr/share/vim/vim90/doc",
        _file("/usr/share/vim/vim90/doc/usr_05.txt"), r"^\*05\.\d\*\t([^\t\n]+)"),
    Doc("tar(1)", "man tar", _man("tar"), r"^(?:   )?([A-Z][A-Za-z ,-]+)$"),
)  # fmt: skip

COMMON = frozenset(
    (
        "about",
        "above",
        "after",
        "again",
        "also",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "can",
        "could",
        "does",
        "doing",
        "down",
        "each",
        "from",
        "further",
        "have",
        "having",
        "here",
        "into",
        "just",
        "more",
        "most",
        "much",
        "must",
        "only",
        "other",
        "over",
        "same",
        "should",
        "some",
        "such",
        "than",
        "that",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "under",
        "until",
        "used",
        "uses",
        "using",
        "very",
        "want",
        "what",
        "when",
        "where",
        "which",
        "while",
        "will",
        "with",
        "would",
        "your",
        "yours",
        "since",
        "explain",
        "explains",
        "explained",
    )
)  # common English words: no heading is told by them
CUES = (PART_CUE, OVERVIEW_CUE)
SHARED = 2  # a word in more headings than this tells none of them apart
_WORD = re.compile(r"[a-z][a-z'-]{3,}|\d+\.\d+")
_SENTENCE = re.compile(r"[^.!?]*[A-Za-z][^.!?]*[.!?]+(?=[\"')\]]*(?:\s|$))")


def _key(word: str) -> str:
    return word if word[0].isdigit() else word[:5]


def keywords(headings: list[str]) -> list[set[str]]:
    """Each heading's distinctive words (see the module's docstring), as keys."""
    words = [{_key(w) for w in _WORD.findall(h.lower()) if w not in COMMON} for h in headings]
    return [{w for w in ws if sum(w in other for other in words) <= SHARED} for ws in words]


def mentioned(summary: str, headings: list[str]) -> list[str]:
    """The headings ``summary`` mentions, in the words the model wrote: the cues
    kvtrim writes ("This section describes") do not count ("Interpretation of
    Sections 15 and 16", "DESCRIPTION")."""
    for cue in CUES:
        summary = summary.replace(cue, "")
    said = {_key(w) for w in _WORD.findall(summary.lower())}
    return [h for h, keys in zip(headings, keywords(headings), strict=True) if keys & said]


_FACT = re.compile(r"\d{2,}(?:[.,:/-]\d+)*|(?<=[a-z,;] )[A-Z][a-z]+(?: [A-Z][a-z]+)*")


def facts(summary: str, document: str) -> list[str]:
    """The numbers and names of ``summary`` that ``document`` states (issue 36: facts
    over generic sentences), once each."""
    return sorted({f for f in _FACT.findall(summary) if f in document})


def measure(text: str, done: Done, headings: list[str], document: str = "") -> dict[str, Any]:
    """One summary's figures."""
    hits = mentioned(text, headings)
    parts = done.parts if isinstance(done, SummaryDone) else ()
    return {
        "facts": len(facts(text, document)),
        "facts_found": facts(text, document),
        "scaffold": sum(text.count(cue) for cue in CUES),  # kvtrim's cue shown as if written
        "words": len(text.split()),
        "sentences": len({" ".join(x.lower().split()) for x in _SENTENCE.findall(text)}),
        "headings_mentioned": len(hits),
        "headings_matched": hits,
        "finish_reason": done.reason,
        "parts": len(parts) or 1,
        "part_reasons": [p.reason for p in parts],
        "part_titles": [p.title for p in parts],
        "parts_generated": [p.generated for p in parts],
        "generated_tokens": done.stats.generated_tokens,
        "summary": text,
    }


def _summary(engine: Engine, spec: RequestSpec, text: str, kind: str) -> Done:
    """The summary before the change (one read, ``Session.summarize``) or now."""
    with spec.open(engine) as session:
        if kind == "before":
            return _done(session.summarize(text, **spec.generation()))
        return _done(spec.summarize(session, text))


def _done(events: Iterator[Event]) -> Done:
    """The run's last event, its end."""
    done = None
    for event in events:
        if isinstance(event, Done):
            done = event
    if done is None:
        raise RuntimeError("the run ended without an answer")
    return done


def run(docs: list[Doc], spec: RequestSpec, kinds: list[str]) -> list[dict[str, Any]]:
    """Both summaries of each document there is, with their figures."""
    rows: list[dict[str, Any]] = []
    with Engine() as engine:
        for doc in docs:
            text = doc.load()
            if not text:
                print(f"skipped {doc.name}: not found ({doc.source})", file=sys.stderr)
                continue
            headings = [m.group(1).strip() for m in re.finditer(doc.heading, text, re.M)]
            n_tokens = len(engine.model.tokenize(text))
            for kind in kinds:
                done = _summary(engine, spec, text, kind)
                text_out = spec.answer(done.text)
                row = {"document": doc.name, "source": doc.source, "tokens": n_tokens,
                       "headings": len(headings), "kind": kind}  # fmt: skip
                rows.append(row | measure(text_out, done, headings, text))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks/history.md ("Summaries part by part"): before
    and after, a row per document."""
    out = [
        "| document | tokens | headings | before: words / distinct sentences / headings "
        "mentioned / finish | after: words / distinct sentences / headings mentioned / finish "
        "| after: parts (finish reasons) |",
        "|---|---:|---:|---|---|---|",
    ]
    by_doc: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_doc.setdefault(r["document"], {})[r["kind"]] = r
    for name, pair in by_doc.items():
        b, a = pair.get("before", _NONE), pair.get("after", _NONE)
        reasons = ", ".join(f"{a['part_reasons'].count(x)} {x}"
                            for x in dict.fromkeys(a["part_reasons"]))  # fmt: skip
        out.append(
            f"| {name} | {max(b['tokens'], a['tokens']):,} | {max(b['headings'], a['headings'])} "
            f"| {_cell(b)} | {_cell(a)} | "
            f"{a['parts']} ({reasons}) |"
        )
    return "\n".join(out)


KINDS = ("before", "after")
_NONE: dict[str, Any] = {"tokens": 0, "headings": 0, "words": "", "sentences": "",
                         "headings_mentioned": "", "finish_reason": "", "parts": "",
                         "part_reasons": []}  # fmt: skip


def _cell(r: dict[str, Any]) -> str:
    return f"{r['words']} / {r['sentences']} / {r['headings_mentioned']} / {r['finish_reason']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write every row as JSON")
    parser.add_argument("--only", action="append", default=None, metavar="NAME",
                        help="documents whose name starts with NAME (repeatable)")  # fmt: skip
    parser.add_argument("--kind", action="append", choices=KINDS, default=None,
                        help="only this summary (repeatable; default: both)")  # fmt: skip
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    docs = [d for d in DOCS if not args.only or any(d.name.startswith(o) for o in args.only)]
    spec = RequestSpec(budget_tokens=args.budget, max_tokens=args.max_tokens)
    rows = run(docs, spec, args.kind or list(KINDS))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
