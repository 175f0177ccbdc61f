"""The fidelity run's documents: haystacks of five kinds with planted facts.

Each document is ``n_tokens`` tokens of one haystack (a real text of this machine
or of CPython, wrapped from a random paragraph) with three facts planted at random
depths: a number, a person's name and an access code. Each fact has two
distractors: the same sentence with another label and a value of the same shape
("The combination of the amber safe is 58316." beside "... of the cedar safe is
40729."), so an answer that picks the wrong sentence is caught. The first question
asks one fact (the kinds take turns across documents); the follow-ups ask the other
two. Everything is drawn from ``random.Random`` seeded by the document's place in
the grid, so a run that resumes rebuilds the same documents. Sizes in tokens.
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

from ..errors import ConfigError
from . import texts
from .ruler import plant, wrap

_CHARS_PER_TOKEN = 8  # more characters than any token has


class Tokenizer(Protocol):
    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...


# -- haystacks -----------------------------------------------------------------------

_STDLIB = Path(sysconfig.get_paths()["stdlib"])
_CODE_FILES = (
    "argparse.py", "dataclasses.py", "textwrap.py", "csv.py", "shutil.py", "subprocess.py",
    "tarfile.py", "pathlib.py", "typing.py", "logging/__init__.py", "configparser.py",
    "difflib.py", "heapq.py", "ipaddress.py", "fractions.py",
)  # fmt: skip
_LICENCES = (Path("/usr/share/common-licenses/GPL-3"), _STDLIB / "LICENSE.txt")
_MANUAL = Path("/usr/share/vim/vim90/doc")


def _read(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return re.sub(r"[ \t]+\n", "\n", data.decode("utf-8", errors="replace"))


def _code() -> tuple[str, str]:
    files = [_STDLIB / name for name in _CODE_FILES if (_STDLIB / name).is_file()]
    return f"Python standard library source ({_STDLIB})", "\n\n".join(map(_read, files))


def _boilerplate() -> tuple[str, str]:
    path = next(p for p in _LICENCES if p.is_file())
    return f"one licence repeated ({path})", _read(path)


def _manual() -> tuple[str, str]:
    pages = sorted(_MANUAL.glob("usr_*.txt"))
    if pages:
        return f"the Vim user manual ({_MANUAL}/usr_*.txt)", "\n\n".join(map(_read, pages))
    return f"IDLE's help ({_STDLIB}/idlelib/help.html)", _read(_STDLIB / "idlelib" / "help.html")


SOURCES: dict[str, Callable[[], tuple[str, str]]] = {
    "prose": lambda: (texts.SOURCE, texts.corpus()),
    "numbers": texts.release_notes,
    "code": _code,
    "boilerplate": _boilerplate,
    "manual": _manual,
}
HAYSTACKS = tuple(SOURCES)
"""``prose`` (the Python reference manual), ``numbers`` (release notes dense with
versions and bug ids), ``code`` (Python source), ``boilerplate`` (one licence text
repeated end to end) and ``manual`` (a user manual this machine ships)."""


@cache
def source(name: str) -> tuple[str, str]:
    """``(where it comes from, text)`` of the haystack ``name``."""
    if name not in SOURCES:
        raise ConfigError(f"unknown haystack {name!r}; choose from {', '.join(HAYSTACKS)}")
    return SOURCES[name]()


def haystack(name: str, tok: Tokenizer, n_tokens: int, rng: random.Random) -> str:
    """``n_tokens`` tokens of ``name`` from a random paragraph on (wrapping around)."""
    _, text = source(name)
    at = text.find("\n\n", rng.randrange(len(text)))
    start = 0 if name == "boilerplate" or at < 0 else at + 2
    chunk = wrap(text, start, max(n_tokens, 1) * _CHARS_PER_TOKEN, "\n\n")
    return tok.detokenize(tok.tokenize(chunk)[: max(n_tokens, 0)])


# -- facts ---------------------------------------------------------------------------


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_LABELS = _words(
    "amber azure cedar cobalt coral crimson falcon garnet harbor heron indigo jasper "
    "juniper lantern maple marble meadow onyx orchid otter quartz raven saffron "
    "sparrow thistle topaz tulip walnut willow zephyr"
)
_FIRST = _words(
    "Adaeze Bronwen Casimir Delphine Eamon Farida Gunnar Hiroko Ignatius Jolanta Kwabena "
    "Leocadia Mateus Nkechi Oskar Perpetua Quillon Radomir Saoirse Thaddeus Ulrike "
    "Valentin Wilhelmina Xiomara Yevgenia Zbigniew"
)
_LAST = _words(
    "Abernathy Bettencourt Castellanos Drozdowski Eriksdottir Fairweather Grimaldi "
    "Hollingsworth Iwasaki Jankowski Kallistratos Lindqvist Mbeki Nakamura Okonkwo "
    "Pemberton Quintanilla Rasmussen Szymanski Thorvaldsen Urquhart Vasilenko "
    "Whitcombe Yamaguchi Zeferino"
)
_CODE_LETTERS = "ACDEFHJKLMNPRTVWXY"


def _number(rng: random.Random) -> str:
    return str(rng.randrange(10000, 100000))


def _name(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _code_value(rng: random.Random) -> str:
    head = "".join(rng.choice(_CODE_LETTERS) for _ in range(3))
    return f"{head}-{rng.randrange(1000, 10000)}"


@dataclass(frozen=True)
class Kind:
    """A kind of fact: its sentence, question and answer start (``{label}``,
    ``{value}``), and how a value of its shape is drawn."""

    sentence: str
    question: str
    prefix: str
    draw: Callable[[random.Random], str]


KINDS: dict[str, Kind] = {
    "number": Kind(
        "The combination of the {label} safe is {value}.",
        "What is the combination of the {label} safe?",
        "The combination of the {label} safe is",
        _number,
    ),
    "name": Kind(
        "The {label} project is led by {value}.",
        "Who leads the {label} project?",
        "The {label} project is led by",
        _name,
    ),
    "code": Kind(
        "The access code for the {label} door is {value}.",
        "What is the access code for the {label} door?",
        "The access code for the {label} door is",
        _code_value,
    ),
}
DISTRACTORS = 2  # per fact: the same sentence, other labels, values of the same shape


@dataclass(frozen=True)
class Fact:
    """One planted fact asked about, with the values of its distractors."""

    kind: str
    label: str
    value: str
    depth: float
    distractors: tuple[str, ...]

    @property
    def sentence(self) -> str:
        return KINDS[self.kind].sentence.format(label=self.label, value=self.value)

    @property
    def question(self) -> str:
        return KINDS[self.kind].question.format(label=self.label)

    @property
    def prefix(self) -> str:
        return KINDS[self.kind].prefix.format(label=self.label)


def _whole(value: str, answer: str) -> bool:
    """``value`` in ``answer`` as a whole (not inside a longer run of letters or
    digits: "58316" is not found in "583160"), case-insensitive."""
    pattern = r"(?<![0-9A-Za-z])" + re.escape(value) + r"(?![0-9A-Za-z])"
    return re.search(pattern, answer, flags=re.IGNORECASE) is not None


def judge(fact: Fact, answer: str) -> dict[str, bool]:
    """``found``: the value is in the answer whole; ``distracted``: a distractor's
    value is; ``right``: found and not distracted."""
    found = _whole(fact.value, answer)
    distracted = any(_whole(v, answer) for v in fact.distractors)
    return {"found": found, "distracted": distracted, "right": found and not distracted}


# -- documents -----------------------------------------------------------------------


@dataclass(frozen=True)
class Document:
    """One haystack with its planted facts; ``asked``: the first question's fact,
    then the follow-ups'."""

    haystack: str
    length: int
    index: int
    text: str
    asked: tuple[Fact, ...]

    @property
    def digest(self) -> str:
        """What a resumed run checks its records against (the same text and facts)."""
        facts = "|".join(f"{f.kind}:{f.label}:{f.value}" for f in self.asked)
        return hashlib.sha256(f"{self.text}\x00{facts}".encode()).hexdigest()[:16]


def _facts(rng: random.Random) -> tuple[list[Fact], list[tuple[float, str]]]:
    """One fact of each kind, its distractors, and every sentence with its depth."""
    facts: list[Fact] = []
    planted: list[tuple[float, str]] = []
    labels = rng.sample(_LABELS, len(KINDS) * (1 + DISTRACTORS))
    for i, (kind, spec) in enumerate(KINDS.items()):
        mine = labels[i * (1 + DISTRACTORS) : (i + 1) * (1 + DISTRACTORS)]
        values: list[str] = []
        while len(values) < len(mine):
            value = spec.draw(rng)
            if value not in values:
                values.append(value)
        depths = [rng.uniform(0.05, 0.95) for _ in mine]
        facts.append(Fact(kind, mine[0], values[0], depths[0], tuple(values[1:])))
        planted += [
            (d, spec.sentence.format(label=label, value=v))
            for d, label, v in zip(depths, mine, values, strict=True)
        ]
    return facts, planted


def make_document(
    tok: Tokenizer, haystack_name: str, n_tokens: int, index: int, seed: int = 0
) -> Document:
    """The ``index``-th document of ``n_tokens`` tokens of ``haystack_name``: about
    ``n_tokens`` with the planted sentences; the kind asked first takes turns."""
    rng = random.Random(f"fidelity-{seed}-{haystack_name}-{n_tokens}-{index}")
    facts, planted = _facts(rng)
    room = sum(len(tok.tokenize(" " + s)) + 1 for _, s in planted)
    text = plant(haystack(haystack_name, tok, n_tokens - room, rng), planted)
    first = index % len(facts)
    asked = (facts[first], *facts[:first], *facts[first + 1 :])
    return Document(haystack_name, n_tokens, index, text, asked)


def value_span(doc: Document, fact: Fact) -> tuple[int, int]:
    """``[start, end)`` characters of ``fact``'s value in the document's text."""
    at = doc.text.find(fact.sentence)
    if at < 0:
        raise ValueError(f"fact {fact.label!r} is not in the document")
    start = at + fact.sentence.index(fact.value)
    return start, start + len(fact.value)


def describe(names: Sequence[str]) -> dict[str, str]:
    """Where each haystack of ``names`` comes from (recorded with the run)."""
    return {name: source(name)[0] for name in names}
