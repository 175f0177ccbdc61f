"""A document asked about twice is read once (issue 24).

The first request reads its text (prompt and document, evicting with its question
voting) and, at the session's "read" checkpoint, the cache holding that compressed
text is saved (session/state.py's format, the one the app's chats resume from),
keyed by the settings and the text's tokens. A later request with the same settings
and text restores it and asks its own question (``Session.reask``): the windows of
the text the first compression evicted that best match the new question come back
(BM25, as in follow-ups) before the question is read. Saved on disk for
``kvtrim ask`` (``StateStore``), in RAM for the server (``RamStates``), the least
recently used out first. Sizes in tokens.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..errors import DamagedStateError, StateError
from ..session.core import Session, Sources
from ..session.state import SavedState
from ..stats import Done, Event, Restored
from .spec import RequestSpec
from .states import RamStates, StateStore, key_digest, tokens_digest

MIN_PREFIX_TOKENS = 1024  # a shorter text reads in about as long as its cache restores


@dataclass
class PrefixCache:
    """Saved reads of texts, in ``states``; texts of ``min_tokens`` or more."""

    states: StateStore | RamStates
    min_tokens: int = MIN_PREFIX_TOKENS

    def key(self, spec: RequestSpec, head: Sequence[int]) -> str:
        return "prefix-" + key_digest(spec.session_key(), tokens_digest(head))

    def run(
        self,
        session: Session,
        spec: RequestSpec,
        head: Sequence[int],
        tail: Sequence[int],
        question: str,
        sources: Sources | None = None,
        stops: Sequence[str] = (),
    ) -> Iterator[Event]:
        """Read ``head`` and answer ``tail`` (``question``: its text, for recall), from
        the saved read of ``head`` when there is one (a ``Restored`` event comes
        first, its ``seen`` the tokens not read again), else reading and saving it."""
        gen = _gen(spec, stops)
        if len(head) < self.min_tokens:
            yield from session.run_tokens(head, tail, sources=sources, question=question, **gen)
            return
        key = self.key(spec, head)
        restored = self._restore(session, key)
        if restored is not None:
            yield restored
            if not restored.reason:
                yield from session.reask(tail, question, **gen)
                return
        read: list[SavedState] = []
        session.reader.checkpoint = lambda name: _keep(session, name, read)
        try:
            for event in session.run_tokens(head, tail, sources=sources, question=question, **gen):
                if isinstance(event, Done) and read:  # before the caller may stop reading
                    self._put(key, read[0])
                yield event
        finally:
            session.reader.checkpoint = None

    def _restore(self, session: Session, key: str) -> Restored | None:
        """The saved read of ``key`` put into ``session``: a ``Restored`` event, with
        its ``reason`` where the file was damaged (removed: the text is read again);
        None where there is none or it is another model's or settings'."""
        start = time.perf_counter()
        try:
            self.states.restore(key, session)
        except DamagedStateError as exc:
            note = f"{exc}; reading the document again"
            return Restored(0, 0, time.perf_counter() - start, session.stats, note)
        except StateError:  # none, or another model's: read the text again
            return None
        stats = session.stats
        stats.cached_tokens = stats.tokens_seen
        return Restored(stats.cells_used, stats.tokens_seen, time.perf_counter() - start, stats)

    def _put(self, key: str, state: SavedState) -> None:
        with contextlib.suppress(StateError):  # unwritable: the next one reads again
            self.states.put(key, state)


def _keep(session: Session, name: str, into: list[SavedState]) -> None:
    if name == "read" and not into:
        into.append(session.snapshot())


def _gen(spec: RequestSpec, stops: Sequence[str]) -> dict[str, object]:
    return {"max_tokens": spec.max_tokens, "sampling": spec.sampling, "stops": tuple(stops)}
