"""``ServerConfig``: the server's defaults and limits, checked when made, before
``kvtrim serve`` loads a model or builds the app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..policies import DEFAULT, POLICIES, make_policy
from ..pool.kvpool import LAYOUTS, MIN_SHARE, QUESTION_ROOM, SHARES
from .guards import LOOPBACK_HOSTS
from .schemas import MAX_TOKENS

MIN_BUDGET = 16  # the engine's smallest cache (session.MIN_CHUNK)


@dataclass(frozen=True)
class ServerConfig:
    """The server's defaults and limits; a request may override policy, budget
    (up to ``max_kv_budget``) and keep ratio. Checked when made: a bad setting
    raises ``ConfigError`` (``kvtrim serve`` reports it before loading the model)."""

    policy: str = DEFAULT
    policy_settings: tuple[tuple[str, Any], ...] = ()  # the policy's parameters (parse_settings)
    budget_tokens: int = 2048
    keep_ratio: float | None = None  # budget = ratio x prompt tokens, at most budget_tokens
    api_key: str | None = None
    max_queue: int = 16
    max_prompt_tokens: int = 262_144
    max_tokens: int = 256  # chat default when the request sets none
    max_kv_budget: int | None = None  # a request's kv_budget at most; None: budget_tokens
    max_body_bytes: int = 16 * 2**20
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS  # Host header names; "*" allows any
    parallel: int = 4  # requests decoded together in one context (see engine/pool/kvpool.py)
    kv_cells: int | None = None  # the KV cells all of them share; None: see pool_cells
    share: str = "length"  # how the cells are split between requests (pool.SHARES)
    layout: str = "shared"  # one pool of cells, or one KV stream per request (pool.LAYOUTS)

    def __post_init__(self) -> None:
        for ok, message in self._checks():
            if not ok:
                raise ConfigError(message)
        policy = make_policy(self.policy, **dict(self.policy_settings))
        if policy.evicts and self.budget_tokens < policy.protected(self.budget_tokens) + 1:
            raise ConfigError(
                f"--budget {self.budget_tokens} is too small for {self.policy}: it keeps "
                f"{policy.protected(self.budget_tokens)} sink and recent tokens"
            )

    def _checks(self) -> list[tuple[bool, str]]:
        budget, ratio, limit = self.budget_tokens, self.keep_ratio, self.max_kv_budget
        return [
            (self.policy in POLICIES, f"--policy must be one of {', '.join(POLICIES)}"),
            (budget >= MIN_BUDGET, f"--budget must be at least {MIN_BUDGET}, got {budget}"),
            (ratio is None or 0 < ratio <= 1, f"--keep-ratio must be in (0, 1], got {ratio}"),
            (self.api_key is None or bool(self.api_key.strip()), "--api-key is empty"),
            (self.max_queue >= 1, f"--max-queue must be at least 1, got {self.max_queue}"),
            (
                self.max_prompt_tokens >= 1,
                f"--max-prompt-tokens must be at least 1, got {self.max_prompt_tokens}",
            ),
            (
                1 <= self.max_tokens <= MAX_TOKENS,
                f"--max-tokens must be in 1..{MAX_TOKENS}, got {self.max_tokens}",
            ),
            (
                limit is None or limit >= budget,
                f"--max-kv-budget ({limit}) must be at least --budget ({budget})",
            ),
            (self.max_body_bytes >= 1024, "--max-body-mb must be at least 1 KiB"),
            (bool(self.allowed_hosts), "allowed_hosts is empty: no request could be answered"),
            (1 <= self.parallel <= 64, f"--parallel must be in 1..64, got {self.parallel}"),
            (
                self.kv_cells is None or self.kv_cells >= MIN_SHARE,
                f"--kv-cells must be at least {MIN_SHARE}, got {self.kv_cells}",
            ),
            (self.share in SHARES, f"--share must be one of {', '.join(SHARES)}"),
            (self.layout in LAYOUTS, f"--kv-layout must be one of {', '.join(LAYOUTS)}"),
        ]

    @property
    def pool_cells(self) -> int:
        """The KV cells shared by the parallel requests: ``kv_cells``, or by default
        what one request at the largest budget may hold (budget, a quarter for the
        chunk, the question's room), so running in parallel takes no more KV memory
        than one request did."""
        if self.kv_cells is not None:
            return self.kv_cells
        budget = self.kv_budget_limit
        return budget + budget // 4 + QUESTION_ROOM

    @property
    def kv_budget_limit(self) -> int:
        """The largest ``kv_budget`` a request may ask for."""
        return self.max_kv_budget or self.budget_tokens
