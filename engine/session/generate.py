"""Generation after a read: sample, stop, and keep the cache bounded while the
answer grows. Sizes in tokens, times in seconds."""

from __future__ import annotations

import codecs
import functools
import time
from collections.abc import Iterator

import numpy as np

from ..errors import CacheFullError, Cancelled, ConfigError, EngineError
from ..native.context import Pick
from ..stats import Done, Event, Token
from .reader import Reader
from .sampling import LoopGuard, Sampler, Sampling, StopMatcher


def generate(
    reader: Reader,
    *,
    max_tokens: int,
    sampling: Sampling,
    stops: tuple[str, ...] = (),
) -> Iterator[Event]:
    """Generate up to ``max_tokens`` tokens after what ``reader`` fed. A stop string
    the model wrote leaves the cache again (its tokens are removed), so the next
    turn's markup follows the answer's own text. Ends with ``Done`` and its reason:
    ``eog`` (the model's end), ``stop``, ``length`` or ``repetition`` (LoopGuard);
    with ``sampling.ignore_eos`` only a stop string or the length. A token is decoded
    after it was yielded, the last one at the next use of the cache (``_add``)."""
    reader.settle()
    if reader.logits is None:
        raise ConfigError("nothing to continue from: feed a prompt first")
    reader.answering(stops)
    reader.reserve(max_tokens)
    sample, looping, matcher = Sampler(sampling), LoopGuard(), StopMatcher(stops)
    banned = np.asarray(reader.model.eog_ids if sampling.ignore_eos else (), dtype=np.int64)
    stop_tags, utf8 = set(stops), codecs.getincrementaldecoder("utf-8")("replace")
    stats, cache, model = reader.stats, reader.cache, reader.model
    start, base, reason = time.perf_counter(), stats.decode_s, "length"
    reader.trace.start_answer()
    starts: list[tuple[int, int]] = []  # (id, characters of the answer before it)
    pick = functools.partial(_sample_without, sample, banned)
    try:
        for _ in range(max_tokens):
            token = _next(reader, pick)
            if stats.first_token_s is None:
                stats.first_token_s = time.perf_counter() - reader.t0
            ended = _ends_before(reader, token, stop_tags, matcher)
            if ended:
                reason = ended
                break
            if cache.n_used >= reader.sizing.capacity:
                yield from reader.evict([])
            starts.append((_add(reader, token), len(matcher.text)))
            stats.generated_tokens += 1
            stats.decode_s = base + time.perf_counter() - start
            text, hit = matcher.feed(utf8.decode(model.piece(token)))
            if hit:
                _forget_stop(reader, starts, len(matcher.text))
            reader.sync_stats()
            yield Token(token, text, stats)
            if hit:
                reason = "stop"
                break
            if not sampling.ignore_eos and looping(token):
                reason = "repetition"
                _cut_repeat(reader, starts, matcher, looping.repeated)
                break
    finally:
        stats.decode_s = base + time.perf_counter() - start
        reader.ctx.rest()  # a pool's next batch no longer waits for this sequence
    yield from _end(reader, matcher, utf8, reason)


def _end(
    reader: Reader, matcher: StopMatcher, utf8: codecs.IncrementalDecoder, reason: str
) -> Iterator[Event]:
    """The answer's held-back text and its ``Done``, with the figures of the cache it
    leaves: those the last token was yielded with miss the decode of that token before
    an end or a stop was sampled, and the tokens a loop's cut removed."""
    reader.sync_stats()
    tail = matcher.flush() + (utf8.decode(b"", final=True) if reason != "stop" else "")
    if tail:
        yield Token(-1, tail, reader.stats)
    yield Done(matcher.text, reason, reader.stats)


def _next(reader: Reader, pick: Pick) -> int:
    """The answer's next token: the last one decoded (once its caller had it) and the
    next picked from its logits where llama.cpp left them (in a pool, by the
    scheduler's thread); the first one from the logits the read left."""
    token = _decode_pending(reader, pick)
    if token is not None:
        return token
    if reader.logits is None:
        raise EngineError("no logits to sample the answer's next token from")
    with reader.ctx.busy():
        return pick(reader.logits)


def _sample_without(sample: Sampler, banned: np.ndarray, logits: np.ndarray) -> int:
    """``sample(logits)`` with the ``banned`` tokens made impossible; ``logits`` are
    as they were after (masked in place and restored: a copy of Gemma's 262,144
    would cost more than the sampler)."""
    if not banned.size:
        return sample(logits)
    kept = logits[banned]
    logits[banned] = -np.inf
    try:
        return sample(logits)
    finally:
        logits[banned] = kept


def _add(reader: Reader, token: int) -> int:
    """Add ``token`` to the answer and return its id. It is decoded at the next use of
    the cache (``Reader.settle``): the next token's sampling, after the caller had
    this one (a streamed token leaves a decode earlier: the first token's time at 8
    clients is a pooled step shorter), or a follow-up's read or a saved state. The
    last one is then never decoded for a one-shot request (nothing reads what it
    predicts; llama-server does not decode it either)."""
    reader.trace.add_answer_token(token)
    at = reader.cache.next_id
    reader.pending = token
    return at


def _decode_pending(reader: Reader, pick: Pick) -> int | None:
    """Decode the answer's newest token (``_add``) and return the next one, chosen by
    ``pick`` from its logits where llama.cpp left them (the copy of Gemma's 262,144
    logits cost more than the greedy pick). Unlike ``Reader.settle`` a cancel stops it:
    the token then stays pending, as the last one of an answer does, and its cells are
    never written. Nothing pending (the first token, or after ``settle``): None, and a
    stop set meanwhile ends the answer empty, as that token's decode did before it was
    yielded."""
    token, reader.pending = reader.pending, None
    if token is None:
        if reader.ctx.cancel_event.is_set():
            raise Cancelled("cancelled")
        return None
    try:
        return reader.decode([token], logits=True, pick=pick)
    except (Cancelled, CacheFullError):  # raised before llama.cpp wrote a cell
        reader.pending = token
        raise


def _ends_before(
    reader: Reader, token: int, stop_tags: set[str], matcher: StopMatcher
) -> str | None:
    """Why the answer ends before ``token`` is kept: ``eog`` (the model's end), ``stop``
    (a stop tag, or the first sentence complete where an answer prefix was given)."""
    model = reader.model
    if model.is_eog(token):
        return "eog"
    if stop_tags and _is_stop_tag(reader, token, stop_tags):
        return "stop"
    if matcher.ends_sentence(model.piece(token).decode("utf-8", "replace")):
        return "stop"
    return None


def _cut_repeat(
    reader: Reader, starts: list[tuple[int, int]], matcher: StopMatcher, repeated: int
) -> None:
    """A sentence said again (``repeated`` tokens long, 0: a short loop, kept as it is):
    the answer ends at its first saying, in the cache and in the text."""
    if repeated:
        _forget_stop(reader, starts, starts[-repeated][1])
        matcher.text = matcher.text[: starts[-repeated][1]]


def _forget_stop(reader: Reader, starts: list[tuple[int, int]], kept: int) -> None:
    """Remove the generated tokens that begin at or after character ``kept`` of the
    answer (the stop string and anything after it) from the cache."""
    gone = [i for i, at in starts if at >= kept]
    if gone:
        reader.settle(keep=False)  # the answer's last token goes too, if not decoded
        reader.cache.drop_tail(min(gone))


def _is_stop_tag(reader: Reader, token: int, tags: set[str]) -> bool:
    """A control token whose text is a stop (a turn end the GGUF does not list as
    end of generation: see ``prompts.turn_stops``)."""
    if reader.model.piece(token):
        return False  # plain text: the stop matcher sees it
    return reader.model.piece(token, special=True).decode("utf-8", "replace") in tags
