"""A conversation about one long document: a summary first, then questions.

The app's main path (drop a document, read its summary, ask about details) as a
benchmark task, in the setting SCBench calls shared context, multi-turn: the
document is read once and every turn reuses its cache, and each turn's answer
is scored on its own. Four facts (a number, a code, a name, a room number) are
planted at depths 0.2, 0.4, 0.6 and 0.8 of real text; the summary steers the
first compression, the questions then ask for each fact.

Modes: ``followup`` (the cache after the summary, with what recall.py brings
back), ``memory`` (the same without recall: what kvtrim did before), ``reread``
(a fresh question-aware read of the whole document per question), and the
full cache (policy ``full``). Units: seconds, bytes, cells.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..native.monitor import MemoryMonitor
from ..policies import evicting, evicts
from ..runtime.engine import Engine
from ..session.core import Session
from ..stats import Done, Recalled
from .records import Records
from .tasks import _drain, real_text

DEPTHS = (0.2, 0.4, 0.6, 0.8)
MODES = ("followup", "memory", "reread")
NAMES = ("Mirela Vasquez", "Tomasz Okafor", "Ingrid Halvorsen", "Dmitri Castellano")


@dataclass(frozen=True)
class Fact:
    """A sentence planted in the document and the question that asks for it."""

    sentence: str
    question: str
    answer_prefix: str
    value: str

    def hit(self, answer: str) -> bool:
        return self.value.lower() in answer.lower()


def facts_for(seed: int) -> list[Fact]:
    """Four facts with values drawn from ``seed`` (one per depth, in this order)."""
    rng = random.Random(f"multiturn-{seed}")
    number = str(rng.randint(10000, 99999))
    code = f"{rng.choice('BCDFGHKLMNPRSTVXZ')}{rng.choice('AEIOU')}{rng.randint(100, 999)}"
    name = rng.choice(NAMES)
    room = str(rng.randint(100, 899))
    return [
        Fact(
            f"The pass key is {number}. Remember it. {number} is the pass key. ",
            "What is the pass key?",
            "The pass key is",
            number,
        ),
        Fact(
            f"The access code for the archive is {code}. ",
            "What is the access code for the archive?",
            "The access code for the archive is",
            code,
        ),
        Fact(
            f"The lighthouse keeper is called {name}. ",
            "What is the lighthouse keeper called?",
            "The lighthouse keeper is called",
            name,
        ),
        Fact(
            f"The budget meeting takes place in room {room}. ",
            "In which room does the budget meeting take place?",
            "The budget meeting takes place in room",
            room,
        ),
    ]


def document(engine: Engine, n_tokens: int, facts: list[Fact], offset: int) -> str:
    """About ``n_tokens`` tokens of real text with each fact at its depth (at a
    paragraph or sentence boundary)."""
    text = real_text(engine, n_tokens - 30 * len(facts), offset)
    cuts = []
    for depth in DEPTHS[: len(facts)]:
        cut = int(len(text) * depth)
        boundary = max(text.rfind("\n\n", 0, cut), text.rfind(". ", 0, cut))
        cuts.append(boundary + 2 if boundary > 0 else cut)
    out, at = [], 0
    for cut, fact in zip(cuts, facts, strict=True):
        out += [text[at:cut], fact.sentence]
        at = cut
    return "".join([*out, text[at:]])


def _turn(events: Any, monitor: MemoryMonitor) -> tuple[Done, float, int]:
    start = time.perf_counter()
    recalled = 0
    done = None
    for event in events:
        monitor.sample()
        if isinstance(event, Recalled):
            recalled = event.tokens
        if isinstance(event, Done):
            done = event
    assert done is not None
    return done, time.perf_counter() - start, recalled


def _questions(
    s: Session, mode: str, doc: str, facts: list[Fact], monitor: MemoryMonitor, max_tokens: int
) -> tuple[list[dict[str, Any]], int]:
    """One question per fact in ``s`` after its summary (``reread``: a fresh read of
    ``doc`` with each); each answer's record, and the most cells ``s`` held."""
    peak = s.stats.cells_peak
    answers: list[dict[str, Any]] = []
    for fact in facts:
        if mode == "reread":
            events = s.ask(
                doc, fact.question, answer_prefix=fact.answer_prefix, max_tokens=max_tokens
            )
        else:
            events = s.follow_up(
                fact.question, answer_prefix=fact.answer_prefix, max_tokens=max_tokens
            )
        done, seconds, recalled = _turn(events, monitor)
        peak = max(peak, s.stats.cells_peak)
        answers.append(
            {
                "question": fact.question,
                "value": fact.value,
                "answer": done.text.strip()[:60],
                "hit": fact.hit(done.text),
                "seconds": seconds,
                "recalled_tokens": recalled,
            }
        )
    return answers, peak


def conversation(
    engine: Engine,
    policy: str,
    budget: int,
    mode: str,
    doc: str,
    facts: list[Fact],
    *,
    summary_tokens: int = 64,
    answer_tokens: int = 12,
) -> dict[str, Any]:
    """One conversation (summary, then one question per fact) as a record with a
    hit and a time per question. ``mode``: see the module docstring."""
    monitor = MemoryMonitor()
    recall = None if mode in ("followup", "full") else 0
    size = budget if evicts(policy) else len(engine.model.tokenize(doc)) + 256
    with engine.session(policy, size, recall_tokens=recall) as s:
        start = time.perf_counter()
        summary = _drain(s.summarize(doc, max_tokens=summary_tokens), monitor)
        summary_s = time.perf_counter() - start
        answers, peak = _questions(s, mode, doc, facts, monitor, answer_tokens)
        stats = s.stats
    monitor.close()
    times = [a["seconds"] for a in answers]
    return {
        "task": "multiturn",
        "policy": policy,
        "budget_tokens": budget,
        "mode": mode if evicts(policy) else "full",
        "summary": summary.text.strip()[:200],
        "summary_s": summary_s,
        "hits": sum(a["hit"] for a in answers),
        "questions": len(answers),
        "followup_s_median": statistics.median(times),
        "followup_s": times,
        "answers": answers,
        "kv_cells_allocated": stats.n_ctx,
        "kv_cells_peak": peak,
        "kv_bytes": stats.kv_bytes,
        "recall_host_bytes": stats.recall_host_bytes,
        "rss_peak_bytes": monitor.rss_peak_bytes,
    }


@dataclass
class MultiTurnConfig:
    """The grid of ``kvtrim bench --multiturn``: every policy and budget follows up
    with recall; ``memory`` (no recall, as before) and ``reread`` run where listed."""

    docs: int = 4
    doc_tokens: int = 7600
    policies: list[str] = field(default_factory=evicting)
    budgets: list[int] = field(default_factory=lambda: [512, 1024])
    main_budget: int = 1024  # every policy runs here; other budgets run focus_policies
    focus_policies: list[str] = field(default_factory=lambda: ["snapkv"])
    memory_budgets: list[int] = field(default_factory=lambda: [1024])
    reread_policies: list[str] = field(default_factory=lambda: ["snapkv"])
    reread_budgets: list[int] = field(default_factory=lambda: [1024])
    summary_tokens: int = 64
    answer_tokens: int = 12
    seed: int = 0

    @classmethod
    def quick(cls) -> MultiTurnConfig:
        return cls(
            docs=1,
            doc_tokens=1500,
            policies=["snapkv"],
            budgets=[256],
            main_budget=256,
            memory_budgets=[256],
            reread_budgets=[256],
            summary_tokens=16,
            answer_tokens=8,
        )

    def jobs(self) -> list[tuple[str, int, str]]:
        """``(policy, budget, mode)`` of each conversation, per document."""
        out = [("full", 0, "full")]
        for budget in self.budgets:
            for policy in self.policies:
                if budget != self.main_budget and policy not in self.focus_policies:
                    continue
                out.append((policy, budget, "followup"))
                if budget in self.memory_budgets:
                    out.append((policy, budget, "memory"))
                if budget in self.reread_budgets and policy in self.reread_policies:
                    out.append((policy, budget, "reread"))
        return out


def run(
    cfg: MultiTurnConfig,
    engine: Engine,
    out_dir: Path,
    step: Callable[[str], None],
    command: str,
) -> dict[str, Any]:
    """Every job on every document; ``multiturn.json`` is rewritten after each one."""
    records = Records(out_dir / "multiturn.json", command, cfg, engine.model.info.name)
    corpus_step = 40_000  # characters between two documents' starts in the corpus
    for d in range(cfg.docs):
        facts = facts_for(cfg.seed + d)
        doc = document(engine, cfg.doc_tokens, facts, offset=d * corpus_step)
        n_doc = len(engine.model.tokenize(doc))
        for policy, budget, mode in cfg.jobs():
            step(f"doc {d + 1}/{cfg.docs} {policy} budget={budget} {mode}")
            rec = conversation(
                engine,
                policy,
                budget,
                mode,
                doc,
                facts,
                summary_tokens=cfg.summary_tokens,
                answer_tokens=cfg.answer_tokens,
            )
            rec.update(doc=d, doc_tokens=n_doc)
            records.emit(rec)
    return records.result
