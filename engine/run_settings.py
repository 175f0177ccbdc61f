"""The settings of one ``kvtrim ask`` or ``summarize`` run, read from the command
line in one place. The single-file path and ``summarize --out`` (batch.py) both
open their sessions and generate through ``RunSettings``, so every option reaches
every file by construction.

>>> settings = RunSettings.from_args(args)
>>> with settings.open(engine) as session:
...     events = settings.summarize(session, text)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .prompts import summary_prompt
from .runtime import Engine
from .sampling import Sampling
from .session import Session, SessionConfig
from .stats import Event


@dataclass(frozen=True)
class RunSettings:
    """Session options (``Engine.session``'s keywords), generation options and the
    text the answer starts with."""

    policy: str = "snapkv"
    budget_tokens: int = 1024
    chunk_tokens: int | None = None
    question_aware: bool = True
    positions: str = "compact"
    flash_attn: str = "auto"
    kv_type: str = "f16"
    swa_cache: str = "window"
    whole_words: bool = True
    max_tokens: int = 128
    sampling: Sampling = field(default_factory=Sampling)
    stops: tuple[str, ...] | None = None  # None: the prompt's own
    answer_prefix: str = ""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunSettings:
        """The settings ``kvtrim ask``/``summarize``'s options name (see cli._common)."""
        return cls(
            policy=args.policy,
            budget_tokens=args.budget,
            chunk_tokens=args.chunk,
            question_aware=not args.no_question_aware,
            positions=args.positions,
            flash_attn=args.flash_attn,
            kv_type=args.kv_type,
            swa_cache=args.swa_cache,
            whole_words=getattr(args, "whole_words", True),
            max_tokens=args.max_tokens,
            sampling=Sampling(args.temperature, args.top_p, args.seed),
            stops=tuple(args.stop) if args.stop is not None else None,
            answer_prefix=args.answer_prefix.strip(),
        )

    def session_options(self) -> dict[str, Any]:
        """``Engine.session``'s keyword arguments."""
        return {
            "chunk_tokens": self.chunk_tokens,
            "question_aware": self.question_aware,
            "positions": self.positions,
            "flash_attn": self.flash_attn,
            "kv_type": self.kv_type,
            "swa_cache": self.swa_cache,
            "whole_words": self.whole_words,
        }

    def generation(self) -> dict[str, Any]:
        """``Session.run``'s keyword arguments."""
        stops = list(self.stops) if self.stops is not None else None
        return {"max_tokens": self.max_tokens, "sampling": self.sampling, "stops": stops}

    def config(self, engine: Engine) -> SessionConfig:
        """The session's configuration (``Engine.session`` builds the same)."""
        return engine.config(self.budget_tokens, **self.session_options())

    def open(self, engine: Engine) -> Session:
        """A new session with these settings."""
        return engine.session(self.policy, self.budget_tokens, **self.session_options())

    def ask(self, session: Session, document: str, question: str) -> Iterator[Event]:
        """Read ``document`` and answer ``question``."""
        gen = self.generation()
        return session.ask(document, question, answer_prefix=self.answer_prefix, **gen)

    def summarize(self, session: Session, document: str) -> Iterator[Event]:
        """Read ``document`` and summarize it; the summary starts with ``answer_prefix``."""
        if not self.answer_prefix:
            return session.summarize(document, **self.generation())
        prompt = summary_prompt(session.model, document, answer_prefix=self.answer_prefix)
        return session.run(prompt, **self.generation())

    def answer(self, generated: str) -> str:
        """The whole answer: ``answer_prefix`` and what the model wrote after it."""
        return " ".join(t for t in (self.answer_prefix, generated.strip()) if t)
