"""``RequestSpec``: everything one request runs with, in one frozen value.

The session's settings (policy, budget, chunk, positions, question-aware
eviction, flash attention, cache types, recall) and generation's (tokens,
sampling, stops, the answer's first words). Every path opens its session from a
spec: ``kvtrim ask``/``summarize`` (``from_args``; ``summarize --out`` and
``--parallel`` too, so every option reaches every file by construction), the
server's jobs and the app's jobs; ``session_key`` is what a kept session must
match to be reused (the server's and the app's reuse checks).

>>> spec = RequestSpec.from_args(args)
>>> with spec.open(engine) as session:
...     events = spec.summarize(session, text)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..policies import Policy, make_policy
from ..session.core import Session, SessionConfig
from ..session.prompts import summary_prompt
from ..session.sampling import Sampling
from ..stats import Event

if TYPE_CHECKING:
    from ..pool.kvpool import KVPool
    from .engine import Engine


@dataclass(frozen=True)
class RequestSpec:
    """One request's settings. ``kv_type``/``swa_cache`` None: the engine's default;
    ``policy_settings``: the policy's own parameters (e.g. H2O's heavy share)."""

    policy: str = "snapkv"
    budget_tokens: int = 1024
    chunk_tokens: int | None = None
    question_aware: bool = True
    positions: str = "compact"
    flash_attn: str = "auto"
    kv_type: str | None = None
    swa_cache: str | None = None
    whole_words: bool = True
    recall_tokens: int | None = None
    policy_settings: tuple[tuple[str, Any], ...] = ()
    max_tokens: int = 128
    sampling: Sampling = field(default_factory=Sampling)
    stops: tuple[str, ...] | None = None  # None: the prompt's own
    answer_prefix: str = ""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RequestSpec:
        """The spec ``kvtrim ask``/``summarize``'s options name (see cli._common)."""
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
            recall_tokens=getattr(args, "recall_tokens", None),
            max_tokens=args.max_tokens,
            sampling=Sampling(args.temperature, args.top_p, args.seed),
            stops=tuple(args.stop) if args.stop is not None else None,
            answer_prefix=args.answer_prefix.strip(),
        )

    def session_key(self) -> tuple[Any, ...]:
        """The settings a session is made with: a kept session with the same key can
        run this request (generation settings do not matter)."""
        return (
            self.policy,
            self.budget_tokens,
            self.chunk_tokens,
            self.question_aware,
            self.positions,
            self.flash_attn,
            self.kv_type,
            self.swa_cache,
            self.whole_words,
            self.recall_tokens,
            self.policy_settings,
        )

    def session_options(self) -> dict[str, Any]:
        """``SessionConfig``'s fields this spec sets (beside the budget)."""
        return {
            "chunk_tokens": self.chunk_tokens,
            "question_aware": self.question_aware,
            "positions": self.positions,
            "flash_attn": self.flash_attn,
            "kv_type": self.kv_type,
            "swa_cache": self.swa_cache,
            "whole_words": self.whole_words,
            "recall_tokens": self.recall_tokens,
        }

    def make_policy(self) -> Policy:
        return make_policy(self.policy, **dict(self.policy_settings))

    def config(self, engine: Engine) -> SessionConfig:
        """The session's configuration, with the engine's threads and defaults."""
        return engine.config(self.budget_tokens, **self.session_options())

    def open(self, engine: Engine) -> Session:
        """A new session (its own context) with these settings."""
        options = self.session_options() | dict(self.policy_settings)
        return engine.session(self.policy, self.budget_tokens, **options)

    def open_in(
        self, engine: Engine, pool: KVPool, n_tokens: int, *, cancel: Any = None, label: str = ""
    ) -> Session:
        """A session in a new sequence of ``pool`` for a job of ``n_tokens`` tokens."""
        session = pool.open(
            self.make_policy(), self.config(engine), n_tokens, cancel=cancel, label=label
        )
        assert isinstance(session, Session)
        return session

    def generation(self) -> dict[str, Any]:
        """``Session.run``'s keyword arguments."""
        stops = list(self.stops) if self.stops is not None else None
        return {"max_tokens": self.max_tokens, "sampling": self.sampling, "stops": stops}

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
