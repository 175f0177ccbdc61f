"""``RequestSpec``: everything one request runs with, in one frozen value.

The session's settings are ``session.config.SessionOptions``' fields, inherited,
so each is declared once; generation's (tokens, sampling, stops, the answer's first
words) and the policy (its name and parameters) are added here. Every path opens
its session from a spec: ``kvtrim ask``/``summarize``/``chat`` (``from_args``;
``summarize --out`` and ``--parallel`` too, so every option reaches every file by
construction), the server's jobs, the app's jobs and the benchmarks that compare
settings; ``session_key`` is what a kept session must match to be reused (the
server's and the app's reuse checks).

>>> spec = RequestSpec.from_args(args)
>>> with spec.open(engine) as session:
...     events = spec.summarize(session, text)
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..policies import DEFAULT, Policy, make_policy, parse_settings
from ..session.config import SessionConfig, SessionOptions
from ..session.core import Session
from ..session.sampling import Sampling
from ..stats import Event
from .summary import Summarizer

if TYPE_CHECKING:
    from ..pool.kvpool import KVPool
    from .engine import Engine


@dataclass(frozen=True, kw_only=True)
class RequestSpec(SessionOptions):
    """One request's settings: the session's (see ``SessionOptions``), the policy
    (``policy_settings``: its own parameters, e.g. H2O's heavy share) and generation's.
    Made with keywords: ``RequestSpec(policy="snapkv", budget_tokens=512)``."""

    policy: str = DEFAULT
    policy_settings: tuple[tuple[str, Any], ...] = ()
    max_tokens: int = 128
    sampling: Sampling = field(default_factory=Sampling)
    stops: tuple[str, ...] | None = None  # None: the prompt's own
    answer_prefix: str = ""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RequestSpec:
        """The spec a command's options name: each option whose ``dest`` is a field's
        name sets it (see cli/main.py ``_common``); sampling, stops and the answer
        prefix are made from their parts."""
        plain = (*SessionOptions.names(), "policy", "max_tokens")
        policy = getattr(args, "policy", DEFAULT)
        return cls(
            **{name: getattr(args, name) for name in plain if hasattr(args, name)},
            policy_settings=parse_settings(policy, getattr(args, "policy_args", None) or ()),
            sampling=Sampling(args.temperature, args.top_p, args.seed, args.top_k, args.min_p),
            stops=tuple(args.stop) if args.stop is not None else None,
            answer_prefix=args.answer_prefix.strip(),
        )

    def session_key(self) -> tuple[Any, ...]:
        """The settings a session is made with: a kept session with the same key can
        run this request (generation settings do not matter)."""
        return (self.policy, self.policy_settings, *self.options().values())

    def make_policy(self) -> Policy:
        return make_policy(self.policy, **dict(self.policy_settings))

    def config(self, engine: Engine) -> SessionConfig:
        """The session's configuration, with the engine's threads and defaults."""
        options = self.options()
        return engine.config(options.pop("budget_tokens"), **options)

    def open(self, engine: Engine) -> Session:
        """A new session (its own context) with these settings."""
        options = self.options() | dict(self.policy_settings)
        return engine.session(self.policy, options.pop("budget_tokens"), **options)

    def open_in(
        self,
        engine: Engine,
        pool: KVPool,
        n_tokens: int,
        *,
        cancel: Any = None,
        label: str = "",
        arrival: object | None = None,
    ) -> Session:
        """A session in a new sequence of ``pool`` for a job of ``n_tokens`` tokens
        (``arrival``: the request's ``KVPool.expect`` key)."""
        session = pool.open(
            self.make_policy(),
            self.config(engine),
            n_tokens,
            cancel=cancel,
            label=label,
            arrival=arrival,
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
        """Read ``document`` and summarize it part by part (summary.py: ``max_tokens``
        is each part's most); the summary starts with ``answer_prefix``."""
        summarizer = Summarizer(
            session,
            max_tokens=self.max_tokens,
            sampling=self.sampling,
            stops=self.stops,
            answer_prefix=self.answer_prefix,
        )
        return summarizer.events(document)

    def answer(self, generated: str) -> str:
        """The whole answer: ``answer_prefix`` and what the model wrote after it."""
        return " ".join(t for t in (self.answer_prefix, generated.strip()) if t)
