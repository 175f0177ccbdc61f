"""What ``kvtrim serve`` checks before it runs a request, apart from HTTP: a
parsed request (schemas.py) and the server's limits (config.py) become a ``Job``
or an ``ApiError``. ``JobBuilder`` needs only something that tokenizes, so every
check is testable without a server or a model.

Cheap checks (``n``, ``echo``, ``logprobs``, the policy and budget asked for)
come before tokenizing, which takes seconds for a long prompt; the checks that
need the token count (``max_prompt_tokens``, a full cache that cannot hold the
prompt) come after. The prompt's text is never inspected: text that looks like a
control token is tokenized as plain text (see ``Model.tokenize``).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from ..errors import ConfigError
from ..policies import POLICIES, parse_settings
from ..runtime.spec import RequestSpec
from ..session.prompts import chat_prompt
from ..session.sampling import Sampling
from .api_errors import ApiError, invalid
from .config import ServerConfig
from .runner import Job
from .schemas import ChatRequest, CompletionRequest

QUESTION_TOKENS = 32  # a raw completion prompt's last tokens vote at each eviction
MIN_TEMPERATURE = 1e-5  # below it sampling is greedy anyway, and logits / T overflow
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

Request = CompletionRequest | ChatRequest


class Tokenizer(Protocol):
    """What ``JobBuilder`` uses of ``engine.model.Model``."""

    add_bos: bool
    info: Any

    def tokenize(
        self, text: str, *, add_bos: bool = False, markup: Any = ()
    ) -> list[int]: ...  # pragma: no cover - a protocol


def sampling(req: Request) -> Sampling:
    """The request's sampling; a refused setting is a 400."""
    temperature = req.temperature if req.temperature >= MIN_TEMPERATURE else 0.0
    try:
        return Sampling(
            temperature, req.top_p, req.seed, max(req.top_k, 0), req.min_p, req.ignore_eos
        )
    except ConfigError as exc:
        raise invalid(str(exc), code="invalid_value") from exc


def policy_settings(req: Request, config: ServerConfig, policy: str) -> tuple[tuple[str, Any], ...]:
    """The request's ``kv_policy_args`` for ``policy`` (checked), else the server's own
    where it runs the server's policy."""
    given = getattr(req, "kv_policy_args", None)
    if given is None:
        return config.policy_settings if policy == config.policy else ()
    try:
        return parse_settings(policy, given)
    except ConfigError as exc:
        raise invalid(str(exc), "kv_policy_args", "invalid_value") from None


def check_overrides(req: Request, config: ServerConfig) -> str:
    """``n``, ``kv_policy`` and ``kv_budget`` against what this server runs;
    returns the policy's name."""
    if req.n != 1:
        raise invalid("only n=1 is supported", "n")
    policy = req.kv_policy or config.policy
    if policy not in POLICIES:
        raise invalid(
            f"unknown kv_policy {policy!r}; choose one of {', '.join(POLICIES)}", "kv_policy"
        )
    if req.kv_budget is not None and req.kv_budget > config.kv_budget_limit:
        raise invalid(
            f"kv_budget {req.kv_budget} is over this server's limit of "
            f"{config.kv_budget_limit} tokens",
            "kv_budget",
            "invalid_value",
        )
    return policy


def _too_long(message: str) -> ApiError:
    code = "context_length_exceeded"
    return invalid(message, "prompt", code, metric=code)


def budget_for(
    req: Request, config: ServerConfig, policy: str, n_prompt: int, max_tokens: int
) -> int:
    """The cache budget of a prompt of ``n_prompt`` tokens: the request's or the
    server's, cut by a keep ratio; refuses a prompt over ``max_prompt_tokens`` and
    one that a cache that never evicts cannot hold with its answer."""
    if n_prompt > config.max_prompt_tokens:
        raise _too_long(
            f"the prompt has {n_prompt} tokens; this server accepts at most "
            f"{config.max_prompt_tokens}"
        )
    budget = req.kv_budget or config.budget_tokens
    ratio = req.kv_keep_ratio or config.keep_ratio
    if ratio is not None:
        budget = min(budget, max(64, math.ceil(ratio * n_prompt)))
    if not POLICIES[policy].evicts and n_prompt + max_tokens > budget:
        raise _too_long(
            f"{n_prompt} prompt tokens plus max_tokens {max_tokens} do not "
            f"fit a {budget}-token cache that never evicts; raise kv_budget or "
            "choose an eviction policy"
        )
    return budget


def completion_text(req: CompletionRequest) -> str:
    """The one prompt of a completion request; ``echo`` and ``logprobs`` are refused."""
    if req.echo or req.logprobs is not None:
        raise invalid("echo and logprobs are not supported", "echo" if req.echo else "logprobs")
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if len(prompts) != 1:
        raise invalid("send one prompt per request", "prompt")
    return prompts[0]


def split_question(tokens: list[int]) -> tuple[list[int], list[int]]:
    """A raw prompt as ``(head, tail)``: its last ``QUESTION_TOKENS`` vote at each
    eviction; the tail is never empty, and the head is not when there are two tokens."""
    split = max(len(tokens) - QUESTION_TOKENS, 0)
    if split == 0 and len(tokens) > 1:
        split = 1
    return tokens[:split], tokens[split:]


def chat_messages(req: ChatRequest) -> list[dict[str, str]]:
    """The messages as ``role``/``content`` text (``developer`` is ``system``);
    ``logprobs`` is refused."""
    if req.logprobs:
        raise invalid("logprobs are not supported", "logprobs")
    return [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in req.messages
    ]


class JobBuilder:
    """Turns a parsed request into a ``Job`` for the engine thread, or raises
    ``ApiError``. Tokenizes: run it off the event loop."""

    def __init__(self, model: Tokenizer, config: ServerConfig) -> None:
        self.model, self.config = model, config

    def completion(self, req: CompletionRequest) -> Job:
        text = completion_text(req)
        policy = check_overrides(req, self.config)
        tokens = self.model.tokenize(text, add_bos=self.model.add_bos)
        if not tokens:
            raise invalid("the prompt is empty", "prompt")
        head, tail = split_question(tokens)
        max_tokens = COMPLETION_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        return self._job(req, policy, head, tail, req.stops(), max_tokens)

    def chat(self, req: ChatRequest) -> Job:
        messages = chat_messages(req)
        policy = check_overrides(req, self.config)
        try:
            prompt = chat_prompt(self.model, messages)  # type: ignore[arg-type]
        except ValueError as exc:
            raise invalid(str(exc), "messages") from exc
        model = self.model
        head = model.tokenize(prompt.prefix, add_bos=prompt.add_bos, markup=prompt.prefix_markup)
        tail = model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
        given = (req.max_completion_tokens, req.max_tokens, self.config.max_tokens)
        max_tokens = next(n for n in given if n is not None)
        return self._job(req, policy, head, tail, [*req.stops(), *prompt.stops], max_tokens)

    def _job(
        self,
        req: Request,
        policy: str,
        head: list[int],
        tail: list[int],
        stops: list[str],
        max_tokens: int,
    ) -> Job:
        budget = budget_for(req, self.config, policy, len(head) + len(tail), max_tokens)
        spec = RequestSpec(
            policy=policy,
            policy_settings=policy_settings(req, self.config, policy),
            budget_tokens=budget,
            max_tokens=max_tokens,
            sampling=sampling(req),
            stops=tuple(stops),
        )
        return Job(head, tail, spec)
