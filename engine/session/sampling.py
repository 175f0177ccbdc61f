"""Choosing the next token from logits: greedy, or temperature, top-k, min-p and top-p
with a seed."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy; otherwise a token of softmax(logits / T) over what
    the cuts keep: the ``top_k`` most likely tokens (0: all), the nucleus of mass
    ``top_p`` among them, and of those, the ones at least ``min_p`` times as likely as
    the most likely (0: all), each cut on the softmax of the logits as they are
    (llama.cpp's order; see ``Sampler``). The cuts' defaults are llama.cpp's
    llama-server's, as LM Studio and llama-cpp-python's server have them: they cut the
    tail a small model's softmax spreads over a large vocabulary, and let the sampler
    skip it (0.6 ms a token for Gemma's 262,144 entries against 2.5 ms for top-p
    alone, measured together). ``CHAT`` adds an API request's temperature.
    ``ignore_eos`` (llama-server's and vLLM's field, for benchmarks): the answer runs
    to its length; the model's end tokens are never chosen and the loop guard is off
    (stop strings still end it)."""

    temperature: float = 0.0
    top_p: float = 0.95
    seed: int | None = None
    top_k: int = 40
    min_p: float = 0.05
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # also refuses nan
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ConfigError(f"top_k must be a whole number >= 0 (0: off), got {k!r}")
        if isinstance(self.min_p, bool) or not 0 <= self.min_p <= 1:  # also refuses nan
            raise ConfigError(f"min_p must be in [0, 1] (0: off), got {self.min_p!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")


CHAT = Sampling(temperature=0.8)
"""What an API request samples with unless it says otherwise (llama-server's 0.8)."""

WHOLE = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}
"""Sampling's cuts off: softmax(logits / T) over the whole vocabulary."""


FLOAT32_MAX = float(np.finfo(np.float32).max)


BLOCK = 1024  # tokens summed together by the running-sum searches


def _block_sums(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``v`` as rows of ``BLOCK`` (the last padded with zeros) and the running float64
    sum of the rows' sums (a float64 running sum of every entry costs 5 ms at 262K)."""
    pad = -v.size % BLOCK
    blocks = (np.pad(v, (0, pad)) if pad else v).reshape(-1, BLOCK)
    return blocks, np.cumsum(blocks.sum(axis=1, dtype=np.float64))


def _search(blocks: np.ndarray, cum: np.ndarray, target: float, side: str) -> int:
    """The first index where the running sum reaches ``target`` (``side`` "left":
    >= it; "right": > it), never a zero entry: past the end, or in the rounding between
    the blocks' sums and one block's own, the last nonzero entry before."""
    b = min(int(np.searchsorted(cum, target, side=side)), cum.size - 1)
    while b and not cum[b] > cum[b - 1]:  # an empty block: the one before
        b -= 1
    inner = np.cumsum(blocks[b], dtype=np.float64) + (cum[b - 1] if b else 0.0)
    at = int(np.searchsorted(inner, target, side=side))
    if at >= BLOCK:
        at = int(np.flatnonzero(blocks[b])[-1])
    return b * BLOCK + at


class Sampler:
    """Draws tokens according to a ``Sampling``; one per generation.

    In llama.cpp's order (llama-server's chain): the ``top_k`` most likely tokens, then
    the nucleus of mass ``top_p`` among them (Holtzman et al. 2020), then those at least
    ``min_p`` times as likely as the most likely one (Nguyen et al. 2024), each on the
    softmax of the logits as they are; the token is drawn from softmax(logits / T) over
    what is left, so a high temperature spreads the draw over the kept tokens and never
    reaches the tail. Top-k and min-p are thresholds on the logits: the default chain
    never exponentiates the vocabulary. A nucleus over the whole vocabulary (top-k off)
    takes O(vocab) float32 passes: it is sorted alone, found among the tokens within a
    factor of the most likely one (``NUCLEUS_FLOORS``), which hold it whenever their mass
    reaches ``top_p``; below the floors, by its weight threshold in the sorted weights.
    Ties at a cut keep the lowest token ids. One uniform draw a token."""

    NUCLEUS_FLOORS = (1e-3, 1e-6)  # weight / the largest weight
    ARGSORT_MAX = 4096  # more candidates than this: the weights are sorted, not indices
    ZERO_BEYOND = 104.0  # logits this far below the largest, over T, weigh 0 in float32

    def __init__(self, sampling: Sampling) -> None:
        self.sampling = sampling
        self._rng = np.random.default_rng(sampling.seed)

    def __call__(self, logits: np.ndarray) -> int:
        s = self.sampling
        if s.temperature == 0:
            return int(np.argmax(logits))
        x = np.asarray(logits)
        if x.dtype != np.float64:
            x = x.astype(np.float32, copy=False)  # float16 would overflow in x - top
        top, inverse = float(x.max()), 1.0 / s.temperature
        if not (math.isfinite(top) and inverse < FLOAT32_MAX):  # NaN/inf, or T too small
            return int(np.argmax(x))
        ids = None  # None: every token
        if 0 < s.top_k < x.size:
            ids = _top_k(x, s.top_k, top, self.ZERO_BEYOND * max(s.temperature, 1.0))
        if s.top_p < 1:
            ids = self._nucleus_ids(x, top, ids)
        if s.min_p > 0:
            ids = _min_p(x, top, s.min_p, ids)
        # the smallest float32 step at least: a huge T leaves -inf logits at weight 0
        scale = np.float32(max(inverse, 1e-45))
        if ids is None:
            return self._draw_any(_weights(x, top, scale))
        w = _weights(x[ids], top, scale)
        if ids.size > self.ARGSORT_MAX:
            return self._draw_any(_spread(ids, w, x.size))
        order, cum = _by_weight(w)
        at = int(np.searchsorted(cum, self._rng.random() * cum[-1], side="right"))
        return int(ids[order[min(at, cum.size - 1)]])

    def _nucleus_ids(self, x: np.ndarray, top: float, ids: np.ndarray | None) -> np.ndarray:
        """The ids (ascending) of the nucleus of mass ``top_p`` among ``ids`` (None:
        the vocabulary), by the softmax of the logits as they are."""
        w = _weights(x if ids is None else x[ids], top, ONE)
        if ids is not None and ids.size <= self.ARGSORT_MAX:
            return _heaviest(ids, w, self.sampling.top_p * float(w.sum(dtype=np.float64)))
        if ids is not None:
            w = _spread(ids, w, x.size)
        target = self.sampling.top_p * float(w.sum(dtype=np.float64))
        near = np.arange(w.size)
        for floor in self.NUCLEUS_FLOORS:
            above = np.flatnonzero(w >= floor)
            if float(w[above].sum(dtype=np.float64)) >= target:
                near = above  # the nucleus lies among these
                break
        if near.size <= self.ARGSORT_MAX:
            return _heaviest(near, w[near], target)
        return np.flatnonzero(self._nucleus(w, np.sort(w[near]), target))

    @staticmethod
    def _nucleus(w: np.ndarray, ascending: np.ndarray, target: float) -> np.ndarray:
        """Which tokens of weights ``w`` are in the nucleus of mass ``target``, from
        the nucleus's candidates' weights sorted (``ascending``): the weight where their
        sum from the top reaches it, the tokens above it and as many tied with it as
        the nucleus holds (a sort of values, not of indices)."""
        v = ascending[::-1]
        k = _search(*_block_sums(v), target, "left")
        return _largest(w, v[k], k + 1)

    def _draw_any(self, w: np.ndarray) -> int:
        """A token of the whole vocabulary, as likely as its weight in ``w``: the block
        first, then the token within it."""
        blocks, cum = _block_sums(w)
        return _search(blocks, cum, self._rng.random() * cum[-1], "right")


ONE = np.float32(1.0)  # the logits as they are: top-k, top-p and min-p's softmax


def _weights(x: np.ndarray, top: float, scale: np.float32) -> np.ndarray:
    """exp((x - top) * scale) in float32: in [0, 1], 1 at the largest logit ``top``."""
    with np.errstate(over="ignore"):  # -3e38 - 3e38 is -inf: weight 0
        w = np.asarray(x - top, dtype=np.float32)
    w *= scale
    return np.exp(w, out=w)


def _by_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order of weights ``w``, heaviest first (ties: the lower index), and their
    running float64 sum in that order: an argsort of the few."""
    order = np.argsort(-w, kind="stable")
    return order, np.cumsum(w[order], dtype=np.float64)


def _heaviest(ids: np.ndarray, w: np.ndarray, target: float) -> np.ndarray:
    """The ids (ascending) of the heaviest of ``ids`` (weights ``w``; ties: the lowest
    ids) whose running sum reaches ``target``."""
    order, cum = _by_weight(w)
    return np.sort(ids[order[: min(int(np.searchsorted(cum, target)) + 1, cum.size)]])


def _spread(ids: np.ndarray, w: np.ndarray, size: int) -> np.ndarray:
    """Weights ``w`` of tokens ``ids`` as a vocabulary's weights, 0 elsewhere."""
    out = np.zeros(size, dtype=np.float32)
    out[ids] = w
    return out


def _at_least(x: np.ndarray, floor: float) -> np.ndarray:
    """Which logits are at least ``floor`` (a floor below the float32 range is the
    range's bottom: no cast overflows)."""
    return x >= max(floor, -FLOAT32_MAX)


def _above(x: np.ndarray, floor: float) -> np.ndarray:
    """The ids (ascending) of logits at least ``floor``."""
    return np.flatnonzero(_at_least(x, floor))


def _min_p(x: np.ndarray, top: float, min_p: float, ids: np.ndarray | None) -> np.ndarray:
    """The ids of ``ids`` (None: the vocabulary) at least ``min_p`` times as likely as
    the most likely token: logit - ``top`` >= ln(min_p), decided in float64 after a
    float32 threshold with room for its rounding."""
    floor = math.log(min_p)
    if ids is None:
        cut = top + floor
        ids = _above(x, cut - 1e-5 * (1 + abs(cut)))
    return ids[x[ids].astype(np.float64) - top >= floor]


def _top_k(x: np.ndarray, k: int, top: float, zero_beyond: float) -> np.ndarray:
    """The ids (ascending) of the ``k`` largest logits ``x`` (largest ``top``), or of
    fewer where the rest lie ``zero_beyond`` below it (they weigh 0 at every step):
    a threshold found by counts (a pass each, no ids), doubled until ``k`` are above
    it, then halved between a span too narrow and one holding far more, so the
    partition is of a few (Gemma 3's logits, k 40: one pass for two tokens in three)."""
    narrow, wide = 0.0, None  # spans with fewer than k above, and with k or more
    span = 8.0
    for _ in range(8):
        n = int(np.count_nonzero(_at_least(x, top - span)))
        if n < k:
            narrow = span
            if wide is None and span >= zero_beyond:
                break  # the rest weigh nothing at any step
        else:
            wide = span
            if n <= 64 * k:
                break
        if wide is None:
            span *= 2
        else:  # an eighth while nothing is too narrow yet (flat logits), else between
            span = (narrow + wide) / 2 if narrow else wide / 8
    if wide is not None:
        found = _above(x, top - wide)
    elif span >= zero_beyond:
        found = _above(x, top - span)  # fewer than k: all that weigh anything
    else:  # spread beyond the search (a huge temperature): every finite logit
        found = np.flatnonzero(x > -np.inf)
    if found.size > k and float(x[found].min()) == top:
        return found[:k]  # all tied at the top (flat logits): the lowest ids
    return _top_k_of(x, k, found)


def _top_k_of(x: np.ndarray, k: int, ids: np.ndarray) -> np.ndarray:
    """The ``k`` of ``ids`` (ascending) with the largest logits, ties at the k-th
    value: the lowest ids."""
    if ids.size <= k:
        return ids
    vals = x[ids]
    return ids[_largest(vals, np.partition(vals, vals.size - k)[vals.size - k], k)]


def _largest(v: np.ndarray, cut: float, n: int) -> np.ndarray:
    """Which ``n`` entries of ``v`` are its largest, ``cut`` being the n-th largest
    value: all above it, then as many tied with it as are left, the lowest indices."""
    keep = v > cut
    ties = np.flatnonzero(v == cut)[: n - int(np.count_nonzero(keep))]
    keep[ties] = True
    return keep


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
        n = len(t)
        # a unit of k tokens repeats only where the last token is the one k before it:
        # that test first (each token of a 512-token answer took 276 us, now 15)
        for k in self.PERIODS:
            span = max(self.MIN_SPAN, self.ROUNDS * k)
            if n < span or t[-1] != t[-1 - k]:
                continue
            if all(t[-i] == t[-i - k] for i in range(2, span - k + 1)):
                return True
        for k in self.LONG:
            rounds = 2 if k >= self.TWICE else self.LONG_ROUNDS
            if n < rounds * k:
                break
            if t[-1] != t[-1 - k]:
                continue
            unit = t[-k:]
            if len(set(unit)) <= max(self.PERIODS):
                continue  # a run of few tokens ("66666"): the short rule's, with its span
            if all(t[len(t) - (r + 1) * k : len(t) - r * k] == unit for r in range(1, rounds)):
                self.repeated = (rounds - 1) * k
                return True
        return False
