"""``kvtrim bench --fidelity``: accuracy with enough items to decide a default.

Every cell (model x haystack x length x setting x path) gets ``docs`` documents
(30 by default) of fidelity_docs.py: five haystack kinds, each document with three
planted facts and two same-shape distractors per fact. The paths a question takes
are scored apart:

- ``first``: the first question about a document, read with that question voting
  at every eviction (``kvtrim ask``, the app's first question);
- ``recall``: the same first question asked again from the saved read (the
  ``PrefixCache`` restore and ``Session.reask``): the read it voted on, plus the
  evicted windows that best match it brought back (follow_up.py), as a first
  question would be answered if it recalled too;
- ``follow``: the other two facts asked after it, from the saved read with recall,
  as ``kvtrim ask`` about the same document again and the server do.

Settings: the full cache (where the document fits the trained context) and every
evicting policy x budget x positions mode; ``auto`` is not run apart but read off:
each record says whether ``auto`` would have chosen its mode for that read. Each
record also keeps why an answer is wrong: whether the value's characters were still
held when the answer began (``kept``), the highest position, and the teacher-forced
log-probability margin (nats) of the right value over the best other token.

Records are one JSON line per item in ``OUT/fidelity.jsonl``, appended as each item
finishes; a run resumes from them (an item already there is skipped, after checking
that its document is the same). Sizes in tokens, times in seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, ContextOverflowError, OutOfMemoryError
from ..native.kvmemory import pad
from ..policies import evicts, keeps_all
from ..runtime.engine import Engine
from ..runtime.prefix import PrefixCache
from ..runtime.spec import RequestSpec
from ..runtime.states import RamStates
from ..session.config import POSITION_MODES, SessionOptions
from ..session.core import Session
from ..session.prompts import ask_prompt, prompt_tokens
from ..session.trace import KEPT_ROLES
from ..stats import Done
from . import fidelity_docs as docs
from .tasks import log_softmax

RECORDS = "fidelity.jsonl"
RUNS = "fidelity-runs.json"
FULL_EXTRA = 160  # cells of the full cache beyond the document: the longest question, answer
Setting = tuple[str, int | None, str]  # (policy, budget or None for the full cache, positions)


@dataclass
class FidelityConfig:
    """The grid: ``docs`` documents per haystack and length, each read by every
    setting; ``follow_ups``: facts asked after the first (0-2)."""

    haystacks: list[str] = field(default_factory=lambda: list(docs.HAYSTACKS))
    lengths: list[int] = field(default_factory=lambda: [2048, 4096, 8192])
    policies: list[str] = field(default_factory=lambda: ["snapkv"])
    budgets: list[int] = field(default_factory=lambda: [256])
    positions: list[str] = field(default_factory=lambda: ["compact", "bounded"])
    full: bool = True
    docs: int = 30
    follow_ups: int = 2
    max_tokens: int = 24
    seed: int = 0

    @classmethod
    def quick(cls) -> FidelityConfig:
        return cls(haystacks=["prose", "code"], lengths=[1024], budgets=[256], docs=2)

    def settings(self) -> list[Setting]:
        out: list[Setting] = [("full", None, "original")] if self.full else []
        for policy in self.policies:
            out += [(policy, b, m) for b in self.budgets for m in self.positions]
        return out

    def check(self) -> None:
        for name in self.haystacks:
            docs.source(name)  # an unknown name fails here
        for policy in self.policies:
            if not evicts(policy):
                raise ConfigError(f"{policy!r} is no evicting policy")
        bad = [m for m in self.positions if m not in POSITION_MODES or m == "auto"]
        if bad:
            raise ConfigError(f"positions: compact, original or bounded, got {bad[0]!r}")
        if not 0 <= self.follow_ups < len(docs.KINDS):
            raise ConfigError(f"follow-ups must be 0..{len(docs.KINDS) - 1}")
        if min(self.budgets, default=64) < 64 or min(self.lengths, default=1) < 256:
            raise ConfigError("budgets start at 64 tokens and lengths at 256")

    def documents(self) -> Iterator[tuple[int, int, str]]:
        """``(length, index, haystack)``, shortest first, haystacks interleaved, so a
        run stopped early has every haystack at about the same count."""
        for length in self.lengths:
            for index in range(self.docs):
                for name in self.haystacks:
                    yield length, index, name


def label(setting: Setting) -> str:
    policy, budget, positions = setting
    return "full" if keeps_all(policy) else f"{policy}-{budget}-{positions}"


def item_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    """What makes an item: model, document, setting, question and path."""
    where = (rec["model_file"], rec["haystack"], rec["length"], rec["doc"])
    return (*where, rec["setting"], rec["q"], rec["path"])


def questions(setting: Setting, follow_ups: int) -> list[tuple[int, str]]:
    """``(fact index, path)`` asked of one document: the first question, then (where
    the setting evicts) the same question again from the saved read, which brings
    back the evicted windows that match it (the ``recall`` path), then the
    follow-ups."""
    again = [(0, "recall")] if evicts(setting[0]) else []
    return [(0, "first"), *again, *((q, "follow") for q in range(1, 1 + follow_ups))]


class Journal:
    """``fidelity.jsonl``: one record per line, appended and flushed as it comes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.records = read_records(path)
        self.done = {item_key(r): r.get("digest") for r in self.records}

    def has(self, key: tuple[Any, ...], digest: str) -> bool:
        found = self.done.get(key)
        if found is not None and found != digest:
            raise ConfigError(
                f"{self.path} holds another document for {key[1:4]} (another seed, model or "
                "kvtrim version): use another --out"
            )
        return found is not None

    def add(self, rec: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records.append(rec)
        self.done[item_key(rec)] = rec.get("digest")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` (none if it is missing); a last line cut by a kill is
    dropped, any other bad line is an error."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break
            raise ConfigError(f"{path}: line {i + 1} is not JSON") from None
    return out


def run(
    cfg: FidelityConfig, engine: Engine, out_dir: Path, step: Callable[[str], None], command: str
) -> dict[str, Any]:
    """Every document of the grid under every setting, resuming from ``out_dir``'s
    records; returns every record there (of every model run into it)."""
    cfg.check()
    journal = Journal(out_dir / RECORDS)
    info = engine.model.info
    model_file = Path(info.path).name
    model = {"model": info.name, "arch": info.arch, "n_ctx_train": info.n_ctx_train}
    meta = {"command": command, "config": asdict(cfg), "model": engine.model_name,
            "haystacks": docs.describe(cfg.haystacks)}  # fmt: skip
    runs = [*load(out_dir)["runs"], meta]
    (out_dir / RUNS).write_text(json.dumps(runs, indent=1))
    for length, index, name in cfg.documents():
        doc = docs.make_document(engine.model, name, length, index, cfg.seed)
        for setting in cfg.settings():
            base = {"model_file": model_file, "haystack": name, "length": length, "doc": index}
            asked = questions(setting, cfg.follow_ups)
            keys = [
                item_key({**base, "setting": label(setting), "q": q, "path": p}) for q, p in asked
            ]
            if all(journal.has(k, doc.digest) for k in keys):
                continue
            step(f"{name} {length} doc {index}: {label(setting)}")
            for rec in ask_document(engine, doc, setting, cfg):
                journal.add({**base, **model, "digest": doc.digest, **rec})
    return {"runs": runs, "records": journal.records}


def load(out_dir: Path) -> dict[str, Any]:
    """The runs (commands, configs, models) and every record written into ``out_dir``."""
    runs_path = out_dir / RUNS
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else []
    return {"runs": runs, "records": read_records(out_dir / RECORDS)}


def _spec(setting: Setting, size: int, cfg: FidelityConfig) -> RequestSpec:
    """The request of every path: the ``first`` path reads without recall (the
    ``recall`` path is that question with it), whatever the default of
    ``recall_first``; the ``recall`` and ``follow`` paths recall from the saved read."""
    policy, _, positions = setting
    return RequestSpec(
        policy=policy,
        budget_tokens=size,
        positions=positions,
        max_tokens=cfg.max_tokens,
        recall_first=False,
    )


def ask_document(
    engine: Engine, doc: docs.Document, setting: Setting, cfg: FidelityConfig
) -> Iterator[dict[str, Any]]:
    """The document's first question (read with it voting) and its follow-ups (from
    the saved read), one record each; one refusal record when the setting cannot
    read the document (the full cache past the trained context is skipped)."""
    policy, budget, positions = setting
    n_doc = len(engine.model.tokenize(doc.text))
    size = budget if budget is not None else n_doc + FULL_EXTRA
    if keeps_all(policy) and pad(size) >= engine.model.info.n_ctx_train:
        return
    spec = _spec(setting, size, cfg)
    states = PrefixCache(RamStates(), min_tokens=0)
    common = {"setting": label(setting), "policy": policy, "budget": budget,
              "positions": positions, "doc_tokens": n_doc}  # fmt: skip
    try:
        with spec.open(engine) as session:
            for q, path in questions(setting, cfg.follow_ups):
                rec = _ask(engine, session, spec, states, doc, doc.asked[q])
                yield {**common, "q": q, "path": path, **rec}
    except (ConfigError, ContextOverflowError, OutOfMemoryError) as exc:
        yield {**common, "q": 0, "path": "first", "error": f"{type(exc).__name__}: {exc}"}


def _ask(
    engine: Engine,
    session: Session,
    spec: RequestSpec,
    states: PrefixCache,
    doc: docs.Document,
    fact: docs.Fact,
) -> dict[str, Any]:
    """One question about ``doc``, scored and explained."""
    model = engine.model
    prompt = ask_prompt(model, doc.text, fact.question, fact.prefix)
    head, tail, sources = prompt_tokens(model, prompt)
    start = time.perf_counter()
    done: Done | None = None
    for event in states.run(session, spec, head, tail, fact.question, sources, prompt.stops):
        if isinstance(event, Done):
            done = event
    assert done is not None
    seconds = time.perf_counter() - start
    stats = done.stats
    auto = SessionOptions(positions="auto", budget_tokens=spec.budget_tokens)
    mode = SessionOptions(positions=spec.positions, budget_tokens=spec.budget_tokens)
    return {
        "kind": fact.kind,
        "depth": round(fact.depth, 4),
        "value": fact.value,
        "distractors": list(fact.distractors),
        "answer": done.text.strip(),
        "reason": done.reason,
        **docs.judge(fact, done.text),
        "kept": _kept(session, fact),
        "max_position": int(session.cache.next_lpos),
        "compactions": int(session.cache.compactions),
        "auto_is": auto.hole(session.reader.planned) == mode.hole(session.reader.planned),
        "read_tokens": int(session.reader.planned),
        "cells_peak": stats.cells_peak,
        "evicted_tokens": stats.evicted_tokens,
        "seconds": round(seconds, 3),
        "margin": _margin(session, tail, fact),
        "error": None,
    }


def _kept(session: Session, fact: docs.Fact) -> float:
    """The share of the value's characters the cache held (or brought back) as the
    answer was written: 1.0 kept whole, 0.0 evicted."""
    m = session.memory_map()
    try:
        i = m.segment("document")
    except StopIteration:
        return float("nan")
    text = m.segments[i].text
    at = text.find(fact.sentence)
    if at < 0:
        return float("nan")
    start = at + fact.sentence.index(fact.value)
    roles = m.char_roles(i)[start : start + len(fact.value)]
    return round(float(np.isin(roles, KEPT_ROLES).mean()), 3)


def _margin(session: Session, tail: list[int], fact: docs.Fact) -> float | None:
    """The smallest log-probability margin (nats) of a right value token over the
    best other, teacher-forced right after the answer prefix: > 0 means greedy
    decoding writes the value. The session's answer is rewound to do it."""
    trace = session.trace
    answer = next((s for s in reversed(trace.segments) if s.name == "answer"), None)
    if answer is None or answer.first_id < 1:
        return None
    value = _value_tokens(session, fact)
    session.rewind(answer.first_id - 1)
    rows = np.concatenate([log_softmax(b) for b in session.teacher_force([tail[-1], *value])])
    margins = []
    for row, token in zip(rows[: len(value)], value, strict=True):
        right = row[token]
        row = row.copy()
        row[token] = -np.inf
        margins.append(float(right - row.max()))
    return round(min(margins), 3)


def _value_tokens(session: Session, fact: docs.Fact) -> list[int]:
    """The value's tokens as they follow the answer prefix in running text (where
    the prefix tokenizes the same alone), else the value's own with a space."""
    model = session.model
    prefix = model.tokenize(fact.prefix)
    whole = model.tokenize(f"{fact.prefix} {fact.value}")
    if whole[: len(prefix)] == prefix and len(whole) > len(prefix):
        return whole[len(prefix) :]
    return model.tokenize(" " + fact.value)
