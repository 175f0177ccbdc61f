"""A conversation about one document: turns over a session, with their figures.

The first turn reads the document (``Session.ask`` or ``summarize``); later turns
are follow-ups that continue the same cache. A first read that was stopped leaves
nothing to follow up, so the next turn reads the document again.

>>> chat = Chat(session, text, max_tokens=128)
>>> turn = chat.turn("What is the pass key?", answer_prefix="The pass key is")
>>> record(turn)["recalled_tokens"]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from ..errors import Cancelled, ConfigError, StateError
from ..session.core import Session
from ..session.prompts import SUMMARY_INSTRUCTION
from ..session.sampling import Sampling
from ..stats import Done, Event, KVStats, Recalled, Token
from .states import StateStore, key_digest
from .summary import Summarizer

EXCERPT_CHARS = 200  # recalled excerpts are cut to this many characters in records
_MB = 1024 * 1024


def turn_events(
    session: Session,
    document: str,
    question: str | None,
    *,
    answer_prefix: str = "",
    system: str = "",
    stops: Sequence[str] | None = None,
    **gen: Any,
) -> tuple[bool, Iterator[Event]]:
    """The one rule of a conversation's turn: a session that holds the document
    (``can_follow_up``) continues it with a follow-up; any other reads the document
    and asks ``question`` or, for None, summarizes it part by part (summary.py,
    settled: the cache then holds the whole document for follow-ups). Returns
    whether the document is read, and the events.
    ``answer_prefix`` applies to questions only."""
    prefix = answer_prefix if question else ""
    if session.can_follow_up:
        instruction = question or SUMMARY_INSTRUCTION
        return False, session.follow_up(instruction, answer_prefix=prefix, stops=stops or (), **gen)
    if question is None:
        summary = Summarizer(session, system=system, stops=stops, **gen)
        return True, summary.events(document, settle=True)
    return True, session.ask(
        document, question, answer_prefix=prefix, system=system, stops=stops, **gen
    )


@dataclass(frozen=True)
class SavedChat:
    """Where a conversation about one text is saved between runs: its cache after each
    turn, in ``store`` under a key made of the text and the system prompt (so the
    next run about the same file finds it; other settings or another model are told
    apart by the saved cache itself, with the reason)."""

    store: StateStore
    document: str
    system: str = ""

    @property
    def key(self) -> str:
        return "chat-cli-" + key_digest(self.document, self.system)


@dataclass(frozen=True)
class Turn:
    """One question (or summary) and its answer; ``reason`` is the session's
    finish reason, or ``cancelled`` when the turn was stopped."""

    number: int
    kind: str  # "question" or "summarize"
    question: str
    answer_prefix: str
    text: str  # what the model generated (after the prefix)
    reason: str
    reads_document: bool
    seconds: float
    stats: KVStats
    excerpts: tuple[str, ...] = ()

    @property
    def answer(self) -> str:
        """The prefix and the generated text, as one answer."""
        return " ".join(t for t in (self.answer_prefix.strip(), self.text.strip()) if t)


class Chat:
    """Turns about ``document`` in ``session``; ``history`` keeps every turn."""

    def __init__(
        self,
        session: Session,
        document: str,
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] | None = None,
        answer_prefix: str = "",
        model_name: str = "",
        saved: SavedChat | None = None,
    ) -> None:
        """``stops`` end every turn's answer (the first read's replace the prompt's
        own, follow-ups add them); ``answer_prefix`` is the default for questions;
        ``saved``: where the conversation is kept between runs (see ``resume``)."""
        self.session = session
        self.document = document
        self.max_tokens = max_tokens
        self.sampling = sampling or Sampling()
        self.stops = stops
        self.answer_prefix = answer_prefix
        self.model_name = model_name
        self.history: list[Turn] = []
        self.started = 0  # turns begun, failed ones included
        self.saved = saved
        self.earlier: list[tuple[str, str]] = []  # (question, answer) of earlier runs
        self.resumed = False
        self.resume_note = ""  # why a saved conversation was not resumed
        self.resume_s = 0.0  # what restoring it took, counted in the first turn
        self.stopping = threading.Event()  # set by ``stop``, cleared when a turn ends

    def resume(self) -> bool:
        """Continue the conversation saved about this text, if there is one that this
        session can hold (the same model and settings); else say why in
        ``resume_note`` and start afresh."""
        if self.saved is None:
            return False
        start = time.perf_counter()
        try:
            state = self.saved.store.restore(self.saved.key, self.session)
        except StateError as exc:  # none saved yet needs no note; a damaged one is removed
            self.resume_note = "" if "no saved cache" in str(exc) else str(exc)
            return False
        self.earlier = [tuple(t) for t in state.extra.get("turns", [])]  # type: ignore[misc]
        self.started = len(self.earlier)
        self.resumed = True
        self.resume_s = time.perf_counter() - start
        return True

    def _save(self, turn: Turn) -> None:
        """After an answer: the cache is saved and the session takes the saved layout
        (the next run continues exactly as this one would)."""
        if self.saved is None or turn.reason == "cancelled":
            return
        turns = [*self.earlier, *((t.question, t.answer) for t in self.history)]
        try:
            state = self.session.snapshot({"turns": turns})
            self.session.restore(state)
            self.saved.store.put(self.saved.key, state)
        except StateError as exc:
            self.resume_note = f"the conversation is not saved: {exc}"

    def stop(self) -> None:
        """Stop the running turn (thread- and signal-safe); a turn about to begin
        stops at its first event."""
        self.stopping.set()
        self.session.cancel()

    def turn(
        self,
        question: str | None,
        answer_prefix: str | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> Turn:
        """Ask ``question`` (None: summarize), calling ``on_event`` for each event.

        ``stop()`` (or ``session.cancel()``) ends the turn with reason ``cancelled``;
        other engine errors propagate."""
        self.started += 1
        if answer_prefix is None:
            answer_prefix = self.answer_prefix
        prefix = answer_prefix if question else ""
        session = self.session
        gen: dict[str, Any] = {"max_tokens": self.max_tokens, "sampling": self.sampling}
        reads, events = turn_events(
            session, self.document, question, answer_prefix=prefix, stops=self.stops, **gen
        )
        start = time.perf_counter()
        parts: list[str] = []
        excerpts: tuple[str, ...] = ()
        reason = "cancelled"
        try:
            for event in events:
                if self.stopping.is_set():  # stopped before the session began the turn
                    session.cancel()
                if isinstance(event, Recalled):
                    excerpts = event.excerpts
                elif isinstance(event, Token):
                    parts.append(event.text)
                elif isinstance(event, Done):
                    reason = event.reason
                    parts = [event.text]  # the whole answer (a loop's repeats dropped)
                if on_event is not None:
                    on_event(event)
        except Cancelled:
            reason = "cancelled"
        finally:
            self.stopping.clear()
        turn = Turn(
            number=self.started,
            kind="question" if question else "summarize",
            question=question or SUMMARY_INSTRUCTION,
            answer_prefix=prefix,
            text="".join(parts),
            reason=reason,
            reads_document=reads,
            seconds=time.perf_counter() - start + (self.resume_s if not self.history else 0),
            stats=replace(session.stats),  # a copy: later turns change the session's
            excerpts=excerpts,
        )
        self.history.append(turn)
        self._save(turn)
        return turn

    def write_kept(self, path: Path) -> Path:
        """Write the memory map as an HTML page (see kept_html.py) with the last turn."""
        from ..session.kept_html import render_html, write_page

        if not self.history:
            raise ConfigError("nothing read yet: ask a question first")
        last = self.history[-1]
        page = render_html(
            self.session.memory_map(),
            model=self.model_name,
            question=last.question,
            answer=last.answer,
        )
        write_page(path, page)
        return path


def _cut(text: str, limit: int = EXCERPT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def record(turn: Turn) -> dict[str, Any]:
    """One turn as a JSON-ready object (script mode prints one per line)."""
    s = turn.stats
    return {
        "turn": turn.number,
        "kind": turn.kind,
        "question": turn.question,
        "answer": turn.answer,
        "reason": turn.reason,
        "reads_document": turn.reads_document,
        "seconds": round(turn.seconds, 3),
        "cells_used": s.cells_used,
        "kv_bytes": s.kv_bytes,
        "kv_bytes_llama_default": s.kv_bytes_llama_default,
        "tokens_seen": s.tokens_seen,
        "evicted_tokens": s.evicted_tokens,
        "recalled_tokens": s.recalled_tokens,
        "recalled_excerpts": [_cut(t) for t in turn.excerpts],
        "recall_host_bytes": s.recall_host_bytes,
        "rss_bytes": psutil.Process().memory_info().rss,
    }


def status_line(turn: Turn) -> str:
    """The figures of a turn in one line, for a person."""
    s = turn.stats
    parts = [
        f"KV {s.kv_bytes / _MB:.1f} MB held vs {s.kv_bytes_llama_default / _MB:.1f} MB "
        "llama.cpp default",
        f"{s.cells_used:,} tokens kept, {s.evicted_tokens:,} evicted",
    ]
    if turn.excerpts:
        n = len(turn.excerpts)
        parts.append(f"brought back {s.recalled_tokens:,} tokens from {n} passage{'s' * (n != 1)}")
    parts.append(f"{turn.seconds:.1f} s")
    return " | ".join(parts)
