"""The friendly entry point: a loaded model that opens sessions.

>>> from engine import Engine
>>> with Engine() as eng, eng.session("snapkv", budget_tokens=1024) as s:
...     result = s.collect(s.ask(open("notes.txt").read(), "What is the pass key?"))
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..native.model import Model
from ..policies import DEFAULT, Policy, make_policy
from ..session.config import SessionOptions
from ..session.core import MAX_BATCH, Session, SessionConfig
from ..session.prompts import check_template


class Engine:
    """Owns the model; sessions (one per policy and budget) share it."""

    def __init__(
        self,
        model_path: Path | str | None = None,
        *,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        repack: str | None = None,
        kv_type: str = "f16",
        swa_cache: str = "window",
        batch_tokens: int = MAX_BATCH,
    ) -> None:
        """``kv_type``, ``swa_cache`` and ``batch_tokens``: the defaults of every
        session (see ``SessionConfig``)."""
        # a bad value fails here
        SessionConfig(kv_type=kv_type, swa_cache=swa_cache, batch_tokens=batch_tokens)
        self.model = Model(model_path, n_gpu_layers=n_gpu_layers, repack=repack)
        try:
            template_note = check_template(self.model)  # a template that cannot work: now
        except BaseException:
            self.model.close()
            raise
        notes = (self.model.device_note, template_note)
        self.notes = tuple(note for note in notes if note)
        """What the user should know about this model on this machine, a line each."""
        self.n_threads = n_threads
        self.kv_type = kv_type
        self.swa_cache = swa_cache
        self.batch_tokens = batch_tokens

    @property
    def model_name(self) -> str:
        return self.model.info.name

    def session(
        self,
        policy: str | Policy = DEFAULT,
        budget_tokens: int = SessionOptions.budget_tokens,
        **options: Any,
    ) -> Session:
        """A new session with its own cache; the model is not reloaded. ``options``:
        ``SessionConfig``'s fields (see ``session.config.SessionOptions``); any other
        keyword is a parameter of the policy named by ``policy``."""
        names = {f.name for f in fields(SessionConfig)}
        settings = {k: v for k, v in options.items() if k not in names}
        if isinstance(policy, str):
            policy = make_policy(policy, **settings)
        elif settings:
            raise ConfigError(f"unknown session options: {', '.join(sorted(settings))}")
        config = self.config(budget_tokens, **{k: v for k, v in options.items() if k in names})
        return Session(self.model, policy, config)

    def config(
        self,
        budget_tokens: int = SessionOptions.budget_tokens,
        *,
        swa_cache: str | None = None,
        kv_type: str | None = None,
        batch_tokens: int | None = None,
        **options: Any,
    ) -> SessionConfig:
        """A session configuration with this engine's threads and cache defaults."""
        return SessionConfig(
            budget_tokens=budget_tokens,
            n_threads=self.n_threads,
            swa_cache=swa_cache or self.swa_cache,
            kv_type=kv_type or self.kv_type,
            batch_tokens=self.batch_tokens if batch_tokens is None else batch_tokens,
            **options,
        )

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
