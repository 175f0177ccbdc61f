"""A RULER-style suite: needles and variable chains in real text, 2K-64K tokens.

RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?") plants synthetic facts in a haystack and asks for
them. Four of its tasks are here: ``niah_single`` (one magic number),
``niah_multikey`` (four keys, the question names one; numbers and codes of the
same shape distract), ``niah_multivalue`` (one key, four numbers, all asked for)
and ``variable_tracking`` (a chain of 4 assignment hops beside a distractor
chain). Haystacks: ``essay`` (the Python docs corpus, texts.py), ``noise``
(RULER's repeated filler sentences) and ``numbers`` (release notes dense with
versions and bug ids). The score is RULER's: the fraction of the expected values
found in the answer (case-insensitive substring). Units: tokens, seconds, bytes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError, ContextOverflowError, OutOfMemoryError
from ..native.kvmemory import pad
from ..policies import evicting, evicts, keeps_all
from ..runtime.engine import Engine
from ..session.core import POSITION_MODES
from . import ruler_peer, texts
from .peer_servers import PEER
from .records import Records
from .tasks import FILLER

TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking")
HAYSTACKS = ("essay", "noise", "numbers")
NOISE_SOURCE = f"RULER's noise: {FILLER.strip()!r} repeated"
FULL_EXTRA = 128  # cells of the full cache beyond the document and question (frame, answer)
DEFAULT_POLICIES = tuple(evicting())
DEFAULT_BUDGETS = (1024, 4096)
_CHARS_PER_TOKEN = 8  # more characters than any token has: a cut of text long enough
_HOPS = 4  # variable tracking: assignments after the first, as in RULER's default

Setting = tuple[str, int | None, str]  # (policy, budget in tokens or None for full, positions)


class Tokenizer(Protocol):
    """What the haystacks need of a tokenizer (``engine.model`` has it)."""

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...


# -- haystacks --------------------------------------------------------------------


def _source(name: str) -> tuple[str, str, str]:
    """``(source, text, separator between two wraps)`` of the haystack ``name``."""
    if name == "essay":
        return texts.SOURCE, texts.corpus(), "\n\n"
    if name == "noise":
        return NOISE_SOURCE, FILLER, ""
    if name == "numbers":
        source, text = texts.release_notes()
        return source, text, "\n\n"
    raise ConfigError(f"unknown haystack {name!r}; choose from {', '.join(HAYSTACKS)}")


def haystack_source(name: str) -> str:
    """Where the haystack ``name`` comes from, in words (recorded with every item)."""
    return _source(name)[0]


def wrap(text: str, start: int, n_chars: int, sep: str) -> str:
    """``n_chars`` characters of ``text`` from ``start`` on, wrapping around (after
    ``sep``) as often as needed."""
    out = [text[start:]]
    size = len(out[0])
    while size < n_chars:
        out.append(sep + text)
        size += len(sep) + len(text)
    return "".join(out)[:n_chars]


def haystack(name: str, tok: Tokenizer, n_tokens: int, offset: int = 0) -> str:
    """``n_tokens`` tokens of the haystack ``name`` (as text, cut by ``tok``) from
    character ``offset`` on."""
    _, text, sep = _source(name)
    if n_tokens <= 0:
        return ""
    chunk = wrap(text, offset % len(text), n_tokens * _CHARS_PER_TOKEN, sep)
    return tok.detokenize(tok.tokenize(chunk)[:n_tokens])


def paragraph_start(name: str, rng: random.Random) -> int:
    """A random paragraph's first character in the haystack ``name`` (0 for the noise,
    whose every sentence group is alike)."""
    _, text, _ = _source(name)
    if name == "noise":
        return 0
    at = text.find("\n\n", rng.randrange(len(text)))
    return 0 if at < 0 else at + 2


# -- needles ------------------------------------------------------------------------

_ADJECTIVES = (
    "abundant amber brave brisk calm clever crimson dusty eager fancy gentle glossy "
    "hollow humble icy jolly keen lively mellow nimble odd placid quiet rapid rustic "
    "silent sturdy tidy vivid witty"
)
_NOUNS = (
    "badger beacon canyon cedar comet falcon ferry garnet harbor heron lantern maple "
    "meadow otter parrot pebble quarry raven saddle spruce thistle tulip violin walrus "
    "willow"
)
NEEDLE = "One of the special magic numbers for {key} is: {value}."
CODE = "One of the special magic codes for {key} is: {value}."


@dataclass(frozen=True)
class Needles:
    """What a task plants: ``(depth, sentence)`` pairs, the question, the answer's
    start, the values a right answer holds and look-alike values that it need not."""

    planted: list[tuple[float, str]]
    question: str
    answer_prefix: str
    expected: list[str]
    distractors: list[str] = field(default_factory=list)


def _keys(rng: random.Random, n: int) -> list[str]:
    pairs = rng.sample([(a, b) for a in _ADJECTIVES.split() for b in _NOUNS.split()], n)
    return [f"{a}-{b}" for a, b in pairs]


def _numbers(rng: random.Random, n: int, digits: int = 7) -> list[str]:
    return [str(v) for v in rng.sample(range(10 ** (digits - 1), 10**digits), n)]


def _names(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in out:
            out.append(name)
    return out


def _ring(depth: float, n: int) -> list[float]:
    """``n`` depths evenly around the document, the first at ``depth``."""
    return [(depth + i / n) % 1.0 for i in range(n)]


def _spread(start: float, n: int, end: float) -> list[float]:
    """``n`` depths in order from ``start`` to ``end`` (``start`` if it is past)."""
    end = max(start, end)
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def _ask_number(key: str) -> tuple[str, str]:
    return (
        f"What is the special magic number for {key} mentioned in the provided text?",
        f"The special magic number for {key} mentioned in the provided text is",
    )


def niah_single(rng: random.Random, depth: float) -> Needles:
    """RULER's single needle: one 7-digit magic number for one key, at ``depth``."""
    key, value = _keys(rng, 1)[0], _numbers(rng, 1)[0]
    question, prefix = _ask_number(key)
    return Needles([(depth, NEEDLE.format(key=key, value=value))], question, prefix, [value])


def niah_multikey(rng: random.Random, depth: float) -> Needles:
    """Four keys' numbers (the asked one at ``depth``) and two magic codes of the same
    shape (one for the asked key), all planted around the document."""
    keys, values = _keys(rng, 4), _numbers(rng, 6)
    others = [NEEDLE.format(key=k, value=v) for k, v in zip(keys[1:], values[1:4], strict=True)]
    others += [CODE.format(key=keys[0], value=values[4]), CODE.format(key=keys[1], value=values[5])]
    rng.shuffle(others)
    depths = _ring(depth, len(others) + 1)
    planted = [(depths[0], NEEDLE.format(key=keys[0], value=values[0]))]
    planted += list(zip(depths[1:], others, strict=True))
    question, prefix = _ask_number(keys[0])
    return Needles(planted, question, prefix, [values[0]], values[1:])


def niah_multivalue(rng: random.Random, depth: float) -> Needles:
    """One key with four different numbers, evenly around the document from ``depth``;
    the answer should hold all four."""
    key, values = _keys(rng, 1)[0], _numbers(rng, 4)
    planted = [
        (d, NEEDLE.format(key=key, value=v)) for d, v in zip(_ring(depth, 4), values, strict=True)
    ]
    return Needles(
        planted,
        f"What are all the special magic numbers for {key} mentioned in the provided text?",
        f"The special magic numbers for {key} mentioned in the provided text are",
        values,
    )


def _chain(names: list[str], value: str) -> list[str]:
    first = f"VAR {names[0]} = {value}."
    return [first] + [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]


def variable_tracking(rng: random.Random, depth: float) -> Needles:
    """RULER's variable tracking: ``VAR A = 12345``, then ``VAR B = VAR A`` ... (4 hops,
    in order from ``depth`` to the end), and a distractor chain with another value;
    the answer should name every variable of the first chain."""
    names = _names(rng, 2 * (_HOPS + 1))
    value, other = _numbers(rng, 2, digits=5)
    chain, decoy = names[: _HOPS + 1], names[_HOPS + 1 :]
    planted = list(zip(_spread(depth, len(chain), 0.95), _chain(chain, value), strict=True))
    start = rng.uniform(0.02, 0.5)
    planted += list(zip(_spread(start, len(decoy), 0.9), _chain(decoy, other), strict=True))
    return Needles(
        planted,
        f"Find all variables that are assigned the value {value} in the text above.",
        f"According to the chain of variable assignments in the text above, {len(chain)} "
        f"variables are assigned the value {value}, they are:",
        chain,
        [*decoy, other],
    )


NEEDLES: dict[str, Callable[[random.Random, float], Needles]] = {
    "niah_single": niah_single,
    "niah_multikey": niah_multikey,
    "niah_multivalue": niah_multivalue,
    "variable_tracking": variable_tracking,
}


# -- documents and scores -------------------------------------------------------


def _boundary(text: str, depth: float) -> tuple[int, str]:
    """Where a sentence goes near ``depth`` of ``text`` (after the last line or
    sentence end before it), and what follows the sentence there."""
    cut = int(len(text) * depth)
    line, sentence = text.rfind("\n", 0, cut), text.rfind(". ", 0, cut)
    if line < 0 and sentence < 0:
        return 0, "\n"
    if line >= sentence:
        return line + 1, "\n"
    return sentence + 2, " "


def plant(text: str, planted: Sequence[tuple[float, str]]) -> str:
    """``text`` with each ``(depth, sentence)`` at a line or sentence boundary near its
    depth (depths as fractions of ``text``'s characters; ties keep their order)."""
    cuts = sorted(
        ((*_boundary(text, depth), i, sentence) for i, (depth, sentence) in enumerate(planted)),
        key=lambda c: (c[0], c[2]),
    )
    out, at = [], 0
    for index, sep, _, sentence in cuts:
        out += [text[at:index], sentence, sep]
        at = index
    return "".join([*out, text[at:]])


def document(tok: Tokenizer, name: str, n_tokens: int, needles: Needles, offset: int) -> str:
    """About ``n_tokens`` tokens: the haystack ``name`` less the needles' room, with the
    needles planted."""
    room = sum(len(tok.tokenize(" " + sentence)) + 1 for _, sentence in needles.planted)
    return plant(haystack(name, tok, n_tokens - room, offset), needles.planted)


@dataclass(frozen=True)
class Item:
    """One document and its question (what ``run`` asks every setting)."""

    task: str
    haystack: str
    length: int  # tokens asked for
    depth: float
    trial: int
    document: str
    needles: Needles


def make_item(
    tok: Tokenizer, task: str, name: str, length: int, depth: float, trial: int, seed: int = 0
) -> Item:
    """The item of one grid point; keys and values come from a ``random.Random`` seeded
    by task, length, depth and trial, the haystack's start by haystack and trial."""
    if task not in NEEDLES:
        raise ConfigError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    rng = random.Random(f"ruler-{seed}-{task}-{length}-{depth:.3f}-{trial}")
    needles = NEEDLES[task](rng, depth)
    offset = paragraph_start(name, random.Random(f"ruler-{seed}-{name}-{trial}"))
    return Item(
        task, name, length, depth, trial, document(tok, name, length, needles, offset), needles
    )


def score(task: str, answer: str, expected: Sequence[str]) -> float:
    """RULER's string match: the fraction of ``expected`` found in ``answer``
    (case-insensitive substrings; extra values cost nothing), 0..1."""
    if task not in NEEDLES:
        raise ConfigError(f"unknown task {task!r}")
    if not expected:
        return 0.0
    low = answer.lower()
    return sum(value.lower() in low for value in expected) / len(expected)


def whole_score(task: str, answer: str, expected: Sequence[str]) -> float:
    """Stricter than RULER's match: a value counts only as a whole token of the
    answer, not inside a longer run of digits or letters ("7490734" is not found in
    "74907340734": a user reads the longer number). 0..1."""
    if task not in NEEDLES:
        raise ConfigError(f"unknown task {task!r}")
    if not expected:
        return 0.0
    pieces = {m.lower() for m in re.findall(r"[0-9]+|[A-Za-z]+", answer)}
    return sum(value.lower() in pieces for value in expected) / len(expected)


def repeats_to_the_end(text: str, *, min_chars: int = 8, max_period: int = 16) -> bool:
    """Whether ``text`` ends in one piece of 1..``max_period`` characters repeated at
    least 4 times and over ``min_chars`` characters (trailing whitespace aside): how a
    greedy answer that ran away ends ("00000000", "the the the the ")."""
    tail = text.rstrip() or text
    for period in range(1, max_period + 1):
        copies = max(4, -(-min_chars // period))
        if len(tail) < copies * period:
            break
        if tail.endswith(tail[-period:] * copies):
            return True
    return False


# -- the grid -----------------------------------------------------------------------


def grid(
    policies: Sequence[str], budgets: Sequence[int], positions: Sequence[str]
) -> list[Setting]:
    """The full cache (the reference), then every evicting policy x budget x positions."""
    out: list[Setting] = [("full", None, "original")]
    out += [(p, b, m) for p in policies if not keeps_all(p) for b in budgets for m in positions]
    return out


@dataclass
class RulerConfig:
    """The grid of ``kvtrim bench --ruler``; ``settings``: ``(policy, budget tokens or
    None for the full cache, positions)``. The full cache runs only where the
    document fits the model's trained context."""

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    haystacks: list[str] = field(default_factory=lambda: list(HAYSTACKS))
    lengths: list[int] = field(default_factory=lambda: [4096, 8192, 16384, 32768, 49152, 65536])
    depths: list[float] = field(default_factory=lambda: [0.1, 0.4, 0.7])
    trials: int = 1
    settings: list[Setting] = field(
        default_factory=lambda: grid(DEFAULT_POLICIES, DEFAULT_BUDGETS, POSITION_MODES)
    )
    max_tokens: int = 32
    seed: int = 0
    reference: str | None = None  # an earlier ruler.json whose full-cache records are reused
    peer_binary: str = ""  # llama-server, asked every item that fits as a second reference
    model: str = ""  # the model file llama-server loads (kvtrim's own)
    threads: int = 0  # llama-server's -t and -tb

    @classmethod
    def quick(cls) -> RulerConfig:
        return cls(
            tasks=["niah_single", "niah_multikey"],
            haystacks=["essay", "numbers"],
            lengths=[2048],
            depths=[0.5],
            settings=[
                ("full", None, "original"),
                ("snapkv", 1024, "compact"),
                ("snapkv", 1024, "original"),
            ],
        )

    def part(self, index: int) -> list[Any]:
        """The distinct ``index``-th members of the evicting settings, in order."""
        seen = [s[index] for s in self.settings if evicts(s[0])]
        return list(dict.fromkeys(seen))

    def check(self) -> None:
        """A bad task, haystack, policy, budget or position mode fails here."""
        for name, value, allowed in (
            ("task", self.tasks, TASKS),
            ("haystack", self.haystacks, HAYSTACKS),
        ):
            bad = [v for v in value if v not in allowed]
            if bad:
                raise ConfigError(f"unknown {name} {bad[0]!r}; choose from {', '.join(allowed)}")
        for policy, budget, positions in self.settings:
            if policy == PEER and not self.peer_binary:
                raise ConfigError(f"the {PEER} setting needs its binary (--peer-binary)")
            if not (evicts(policy) or keeps_all(policy) or policy == PEER):
                raise ConfigError(f"unknown policy {policy!r}")
            if evicts(policy) and (budget is None or budget < 16):
                raise ConfigError(f"{policy} needs a budget of at least 16 tokens, got {budget}")
            if positions not in POSITION_MODES:
                raise ConfigError(f"positions must be one of {', '.join(POSITION_MODES)}")

    def documents(self) -> list[tuple[int, str, str, float, int]]:
        """``(length, task, haystack, depth, trial)`` of every document, shortest first
        (a run stopped early has whole columns)."""
        return [
            (n, t, h, d, k)
            for n in self.lengths
            for t in self.tasks
            for h in self.haystacks
            for d in self.depths
            for k in range(self.trials)
        ]


# -- running ------------------------------------------------------------------------


def _full_budget(engine: Engine, item: Item, n_doc: int) -> int:
    n_ask = len(engine.model.tokenize(f"{item.needles.question} {item.needles.answer_prefix}"))
    return n_doc + n_ask + FULL_EXTRA


def ask(
    engine: Engine, item: Item, setting: Setting, n_doc: int, max_tokens: int
) -> dict[str, Any]:
    """One item under one setting, as a record (``error`` set where kvtrim refused)."""
    policy, budget, positions = setting
    size = budget if evicts(policy) and budget else _full_budget(engine, item, n_doc)
    needles = item.needles
    start = time.perf_counter()
    rec: dict[str, Any] = {"budget_tokens": size, "expected": needles.expected}
    try:
        with engine.session(policy, size, positions=positions) as s:
            result = s.collect(
                s.ask(
                    item.document,
                    needles.question,
                    answer_prefix=needles.answer_prefix,
                    max_tokens=max_tokens,
                )
            )
    except (ConfigError, ContextOverflowError, OutOfMemoryError) as exc:
        rec.update(_refused(f"{type(exc).__name__}: {exc}"))
        rec.update(length_tokens=n_doc, total_s=time.perf_counter() - start)
        return rec
    stats = result.stats
    rec.update(
        _answered(item, result.text, result.reason),
        length_tokens=stats.prompt_tokens,
        prefill_s=stats.prefill_s,
        total_s=time.perf_counter() - start,
        kv_bytes=stats.kv_bytes,
        kv_cells_peak=stats.cells_peak,
        evicted_tokens=stats.evicted_tokens,
    )
    return rec


def _answered(item: Item, text: str, reason: str | None) -> dict[str, Any]:
    """A record's answer fields: ``text`` scored both ways, and whether it ran away."""
    expected = item.needles.expected
    return {
        "error": None,
        "score": score(item.task, text, expected),
        "whole_score": whole_score(item.task, text, expected),
        "answer": text.strip(),
        "reason": reason,
        "runaway": reason == "length" and repeats_to_the_end(text),
    }


def _refused(error: str) -> dict[str, Any]:
    """A record's answer fields where the item got no answer (``error`` says why)."""
    return {"error": error, "score": None, "answer": "", "reason": None, "runaway": False}


def fits_full(engine: Engine, item: Item, n_doc: int) -> bool:
    """Whether the full cache for this document is below the trained context (the
    session refuses it otherwise)."""
    return pad(_full_budget(engine, item, n_doc)) < engine.model.info.n_ctx_train


def ask_peer(url: str, engine: Engine, item: Item, max_tokens: int) -> dict[str, Any]:
    """One item asked of llama-server (ruler_peer.py), scored as kvtrim's answers are."""
    needles = item.needles
    ids, stops = ruler_peer.prompt_ids(
        engine, item.document, needles.question, needles.answer_prefix
    )
    rec: dict[str, Any] = {"budget_tokens": None, "expected": needles.expected}
    got = ruler_peer.complete(url, ids, stops, max_tokens)
    text, error = got.pop("text"), got.pop("error")
    rec.update(got, length_tokens=got.get("length_tokens", len(ids)))
    if error is not None:
        return {**rec, **_refused(error)}
    return {**rec, **_answered(item, text, got["reason"]), "evicted_tokens": 0}


def _peer_url(cfg: RulerConfig, engine: Engine, out_dir: Path, stack: contextlib.ExitStack) -> str:
    """Starts llama-server for the run where the grid asks it ('' where not)."""
    if not any(s[0] == PEER for s in cfg.settings):
        return ""
    n_ctx = engine.model.info.n_ctx_train
    proc = ruler_peer.server(
        cfg.peer_binary, cfg.model, cfg.threads, n_ctx, out_dir / "ruler-llama-server.log"
    )
    return stack.enter_context(proc)


def _reference(cfg: RulerConfig) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The full cache's records of ``cfg.reference`` by item (length, task, haystack,
    depth, trial); the run must have used the same seed, so the items are the same."""
    if cfg.reference is None:
        return {}
    try:
        earlier = json.loads(Path(cfg.reference).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the reference run {cfg.reference}: {exc}") from None
    if earlier.get("config", {}).get("seed") != cfg.seed:
        raise ConfigError(f"the reference run {cfg.reference} used another seed")
    return {
        (r["length"], r["task"], r["haystack"], r["depth"], r["trial"]): r
        for r in earlier.get("records", [])
        if keeps_all(r["policy"])
    }


def run(
    cfg: RulerConfig,
    engine: Engine,
    out_dir: Path,
    step: Callable[[str], None],
    command: str,
) -> dict[str, Any]:
    """Every document (built once) under every setting; ``ruler.json`` is rewritten
    after each item."""
    cfg.check()
    records = Records(out_dir / "ruler.json", command, cfg, engine.model.info.name)
    records.result["haystack_sources"] = {h: haystack_source(h) for h in cfg.haystacks}
    records.result["n_ctx_train"] = engine.model.info.n_ctx_train
    docs = cfg.documents()
    reused = _reference(cfg)
    with contextlib.ExitStack() as stack:
        url = _peer_url(cfg, engine, out_dir, stack)
        for i, doc in enumerate(docs, start=1):
            _one_document(cfg, engine, records, (i, len(docs), *doc), reused, url, step)
    return records.result


def _one_document(
    cfg: RulerConfig,
    engine: Engine,
    records: Records,
    where: tuple[int, int, int, str, str, float, int],
    reused: dict[tuple[Any, ...], dict[str, Any]],
    url: str,
    step: Callable[[str], None],
) -> None:
    """One document (built once) under every setting of the grid."""
    i, n_docs, length, task, name, depth, trial = where
    item = make_item(engine.model, task, name, length, depth, trial, cfg.seed)
    n_doc = len(engine.model.tokenize(item.document))
    earlier = reused.get((length, task, name, depth, trial))
    if earlier is not None and earlier["expected"] == item.needles.expected:
        records.emit({**earlier, "reused_from": cfg.reference})
    for setting in cfg.settings:
        policy, budget, positions = setting
        full = keeps_all(policy) or policy == PEER
        if full and not fits_full(engine, item, n_doc):
            continue
        at = f"doc {i}/{n_docs} {task} {name} {length} depth {depth}"
        step(f"{at}: {policy} {budget or ''} {positions}")
        rec = {
            "task": task,
            "haystack": name,
            "haystack_source": haystack_source(name),
            "length": length,
            "doc_tokens": n_doc,
            "depth": depth,
            "trial": trial,
            "policy": policy,
            "budget": budget if evicts(policy) else None,
            "positions": positions,
        }
        if policy == PEER:
            rec.update(ask_peer(url, engine, item, cfg.max_tokens))
        else:
            rec.update(ask(engine, item, setting, n_doc, cfg.max_tokens))
        records.emit(rec)
