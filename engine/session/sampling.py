"""Choosing the next token from logits: greedy, or temperature + top-p with a seed."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy; otherwise softmax(logits / T) cut to ``top_p``."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # also refuses nan
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")


class Sampler:
    """Draws tokens according to a ``Sampling``; one per generation."""

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._rng = np.random.default_rng(sampling.seed)

    def __call__(self, logits: np.ndarray) -> int:
        s = self.sampling
        if s.temperature == 0:
            return int(np.argmax(logits))
        with np.errstate(over="ignore"):
            z = logits.astype(np.float64) / s.temperature
        if not np.isfinite(z).all():  # a temperature so small it overflows: greedy
            return int(np.argmax(logits))
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        if s.top_p < 1:
            order = np.argsort(-p)
            cum = np.cumsum(p[order])
            cut = int(np.searchsorted(cum, s.top_p)) + 1
            keep = order[:cut]
            q = p[keep] / p[keep].sum()
            return int(keep[self._rng.choice(len(keep), p=q)])
        return int(self._rng.choice(len(p), p=p))


SENTENCE_END = "\x00sentence-end"
"""A stop "string" that is a rule: the answer ends after its first complete sentence
(a ``.``, ``!`` or ``?``, closing quotes or brackets, then white space; a list
marker such as "1." or "a." does not end one). Added to a question's stops where an
answer prefix is given (``with_sentence_stop``): the answer's first sentence holds the
fact (issue 36: of 608 right answers in the fidelity run, none was past its first
sentence)."""
_SENTENCE = re.compile(r"(?<=[^\s])[.!?][\"')\]]*(?=\s)")
_MARKER = re.compile(r"(?:^|\s)(?:\d{1,2}|[A-Za-z])$")  # "1." "a." "iv" no: a word


def with_sentence_stop(stops: Sequence[str], answer_prefix: str) -> tuple[str, ...]:
    """``stops`` and, where ``answer_prefix`` starts the answer, ``SENTENCE_END``."""
    extra = (SENTENCE_END,) if answer_prefix.strip() else ()
    return (*stops, *extra)


def _sentence_end(text: str, start: int) -> int:
    """Where the first sentence of ``text`` ends, searching from ``start`` (-1: none)."""
    for match in _SENTENCE.finditer(text, max(start, 0)):
        if not _MARKER.search(text[: match.start()]):
            return match.end()
    return -1


class StopMatcher:
    """Holds back text that could be the start of a stop string; ``SENTENCE_END``
    among the stops ends the text after its first complete sentence."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.sentence = SENTENCE_END in stops
        self.stops = tuple(s for s in stops if s and s != SENTENCE_END)
        self.text = ""
        self._sent = 0

    def ends_sentence(self, piece: str) -> bool:
        """Whether ``piece`` (the next token's text, not yet fed) would only begin
        after the text's first complete sentence: the answer ends before it, and the
        token is never decoded."""
        if not self.sentence or not piece[:1].isspace():
            return False
        return _sentence_end(self.text + piece[:1], self._sent - 4) == len(self.text)

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add ``piece``; return (text safe to emit now, whether a stop was hit)."""
        before = len(self.text)
        self.text += piece
        if self.sentence:
            end = _sentence_end(self.text, self._sent - 4)
            if end >= 0:
                # cut between tokens, as the cache holds them: before this piece where
                # it starts with the space, after it where it holds the full stop too
                self.text = self.text[: end if end <= before else len(self.text)]
                out = self.text[self._sent :]
                self._sent = len(self.text)
                return out, True
        for stop in self.stops:
            at = self.text.find(stop, max(0, self._sent - len(stop)))
            if at >= 0:
                self.text = self.text[:at]
                out = self.text[self._sent :]
                self._sent = len(self.text)
                return out, True
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.text)), 0, -1):
                if self.text.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        upto = len(self.text) - hold
        out = self.text[self._sent : upto] if upto > self._sent else ""
        self._sent = max(self._sent, upto)
        return out, False

    def flush(self) -> str:
        out = self.text[self._sent :]
        self._sent = len(self.text)
        return out


class LoopGuard:
    """Whether an answer has fallen into a loop: its last tokens are one unit of 1-4
    tokens repeated (16 tokens of one token or 8 rounds of a longer unit), or a unit
    of a sentence or two (5-64 tokens, at least 5 of them different) said three times
    over, or twice where it is 12 tokens or more.

    Greedy decoding of a small model over a compressed cache can write one digit to
    max tokens ("4831666666...", issue 27), or one sentence after another ("The pass key
    is 68142. Remember it. 68142 is the pass key. The pass key is 68142. Remember
    it...", issue 36); no answer a user wants ends that way, and 16 repeats stay clear
    of real text (digits of a 16-digit number differ somewhere). ``repeated``: after a
    loop of a long unit, the tokens at the end that only say its first round again
    (the caller drops them: the answer ends where the full cache's does).
    """

    PERIODS = (1, 2, 3, 4)
    ROUNDS = 8
    MIN_SPAN = 16
    LONG = range(5, 65)  # a sentence or two, in tokens
    LONG_ROUNDS = 3
    TWICE = 12  # a unit this long said twice is already a loop

    def __init__(self) -> None:
        self._tokens: list[int] = []
        self.repeated = 0

    def __call__(self, token: int) -> bool:
        """Add ``token``; True when the answer now ends in a loop."""
        t = self._tokens
        t.append(token)
        for k in self.PERIODS:
            span = max(self.MIN_SPAN, self.ROUNDS * k)
            if len(t) >= span and all(t[-i] == t[-i - k] for i in range(1, span - k + 1)):
                return True
        for k in self.LONG:
            rounds = 2 if k >= self.TWICE else self.LONG_ROUNDS
            if len(t) < rounds * k:
                break
            unit = t[-k:]
            if len(set(unit)) <= max(self.PERIODS):
                continue  # a run of few tokens ("66666"): the short rule's, with its span
            if all(t[len(t) - (r + 1) * k : len(t) - r * k] == unit for r in range(1, rounds)):
                self.repeated = (rounds - 1) * k
                return True
        return False
