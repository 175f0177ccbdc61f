"""``kvtrim serve``: an OpenAI-compatible HTTP API (FastAPI) with the eviction
policy as server configuration.

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streamed as
server-sent events or not) and ``/metrics`` (Prometheus). Requests run one at a
time on the engine thread, each in its own session (see runner.py); a request
may override the policy and budget with ``kv_policy``/``kv_budget``/``kv_keep_ratio``.

Before the app reads a request, guards.py checks its Host header, its API key
and its body size; prompts are tokenized off the event loop; a client that goes
away cancels its job, and so does the server shutting down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    ConfigError,
    ContextOverflowError,
    KvtrimError,
    OutOfMemoryError,
)
from ..policies import POLICIES, make_policy
from ..prompts import chat_prompt
from ..runtime import Engine
from ..sampling import Sampling
from ..stats import Done, Result, Token
from .guards import LOOPBACK_HOSTS, BodyLimit, HostCheck, KeyCheck
from .metrics import CountRequests, Metrics
from .runner import EngineRunner, Job, Overloaded, ShuttingDown
from .schemas import MAX_TOKENS, ChatRequest, CompletionRequest, Reply, error_body

T = TypeVar("T")

QUESTION_TOKENS = 32  # a raw completion prompt's last tokens vote at each eviction
MIN_BUDGET = 16  # the engine's smallest cache (session.MIN_CHUNK)
MIN_TEMPERATURE = 1e-5  # below it sampling is greedy anyway, and logits / T overflow
DISCONNECT_POLL_S = 0.25  # how often a waiting request checks that its client is there
SHUTDOWN_GRACE_S = 5.0  # sse-starlette waits this long for a stream's last event


@dataclass(frozen=True)
class ServerConfig:
    """The server's defaults and limits; a request may override policy, budget
    (up to ``max_kv_budget``) and keep ratio. Checked when made: a bad setting
    raises ``ConfigError`` (``kvtrim serve`` reports it before loading the model)."""

    policy: str = "snapkv"
    budget_tokens: int = 2048
    keep_ratio: float | None = None  # budget = ratio x prompt tokens, at most budget_tokens
    api_key: str | None = None
    max_queue: int = 16
    max_prompt_tokens: int = 262_144
    max_tokens: int = 256  # chat default when the request sets none
    max_kv_budget: int | None = None  # a request's kv_budget at most; None: budget_tokens
    max_body_bytes: int = 16 * 2**20
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS  # Host header names; "*" allows any

    def __post_init__(self) -> None:
        for ok, message in self._checks():
            if not ok:
                raise ConfigError(message)
        policy = make_policy(self.policy)
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
        ]

    @property
    def kv_budget_limit(self) -> int:
        """The largest ``kv_budget`` a request may ask for."""
        return self.max_kv_budget or self.budget_tokens


class ApiError(Exception):
    """An error to return in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        code: str | None = None,
        param: str | None = None,
        metric: str = "invalid_request",
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param
        self.metric = metric  # the ``kind`` label of kvtrim_errors_total


def _from_engine(exc: BaseException) -> ApiError:
    """An engine error as an HTTP error in OpenAI's shape."""
    if isinstance(exc, Overloaded):
        return ApiError(429, str(exc), "rate_limit_error", "queue_full", metric="overloaded")
    if isinstance(exc, ShuttingDown):
        return ApiError(503, str(exc), "server_error", "server_shutdown", metric="shutdown")
    if isinstance(exc, ContextOverflowError):
        code = "context_length_exceeded"
        return ApiError(400, str(exc), "invalid_request_error", code, metric=code)
    if isinstance(exc, OutOfMemoryError):
        message = f"{exc}; try a smaller kv_budget"
        return ApiError(503, message, "server_error", "out_of_memory", metric="out_of_memory")
    if isinstance(exc, ConfigError):
        return ApiError(400, str(exc), "invalid_request_error", "invalid_value")
    if isinstance(exc, KvtrimError):
        return ApiError(500, str(exc), "server_error", "engine_error", metric="engine")
    message = f"internal error: {exc}"
    return ApiError(500, message, "server_error", "internal_error", metric="internal")


def _sampling(req: CompletionRequest | ChatRequest) -> Sampling:
    """The request's sampling; a refused setting is a 400."""
    temperature = req.temperature if req.temperature >= MIN_TEMPERATURE else 0.0
    try:
        return Sampling(temperature, req.top_p, req.seed)
    except ConfigError as exc:
        raise ApiError(400, str(exc), "invalid_request_error", "invalid_value") from exc


async def _unless_gone(request: Request, job: Job, waiting: Awaitable[T]) -> T:
    """What ``waiting`` gives; if the client goes away first, ``job`` is
    cancelled and the request ends with 499 (nginx's "client closed request")."""
    task = asyncio.ensure_future(waiting)
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await request.is_disconnected():
            job.cancel()
            task.cancel()
            raise ApiError(
                499,
                "the client closed the request",
                "invalid_request_error",
                "client_closed",
                metric="cancelled",
            )


def _add_middleware(app: FastAPI, config: ServerConfig, metrics: Metrics) -> None:
    """Outermost first (each added one wraps the others): the request counter,
    then the Host, key and body-size guards."""

    def refused(kind: str) -> None:
        metrics.errors.labels(kind).inc()

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    if config.api_key is not None:
        app.add_middleware(KeyCheck, key=config.api_key, on_refuse=refused)
    app.add_middleware(HostCheck, allowed=config.allowed_hosts, on_refuse=refused)
    app.add_middleware(CountRequests, counter=metrics.requests)


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every error in OpenAI's shape, counted by kind."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        metrics.errors.labels(exc.metric).inc()
        return JSONResponse(error_body(str(exc), exc.kind, exc.code, exc.param), exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own errors (unknown path, wrong method, unparsable or too large body)."""
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        codes = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        code = codes.get(exc.status_code, "invalid_body")
        metrics.errors.labels("invalid_request" if exc.status_code == 400 else code).inc()
        return JSONResponse(error_body(str(exc.detail), kind, code), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        if first.get("type") == "json_invalid" or not where:
            message = "We could not parse the JSON body of your request (send a JSON object)."
            code = "json_invalid"
        else:
            message, code = f"{where}: {first.get('msg', 'invalid value')}", "invalid_value"
        metrics.errors.labels("invalid_request").inc()
        return JSONResponse(error_body(message, "invalid_request_error", code, where or None), 400)


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """The ASGI app; ``app.state`` holds the runner, the metrics and
    ``on_shutdown`` (for ``background.Server``: cancels the running work)."""
    metrics = Metrics()
    runner = EngineRunner(engine, config.max_queue)
    model = engine.model
    model_id = model.info.path.rsplit("/", 1)[-1].removesuffix(".gguf")

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        runner.close()  # finish queued requests, free the session

    app = FastAPI(title="kvtrim", lifespan=lifespan)
    app.state.runner, app.state.metrics, app.state.on_shutdown = runner, metrics, runner.stop
    _add_middleware(app, config, metrics)
    _add_error_handlers(app, metrics)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "kvtrim"}],
        }

    @app.get("/metrics")
    def prometheus() -> Response:
        metrics.queue.set(runner.waiting)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    def job_for(
        req: CompletionRequest | ChatRequest,
        head: list[int],
        tail: list[int],
        stops: list[str],
        max_tokens: int,
    ) -> Job:
        if req.n != 1:
            raise ApiError(400, "only n=1 is supported", "invalid_request_error", param="n")
        policy = req.kv_policy or config.policy
        if policy not in POLICIES:
            raise ApiError(
                400,
                f"unknown kv_policy {policy!r}; choose one of {', '.join(POLICIES)}",
                "invalid_request_error",
                param="kv_policy",
            )
        if req.kv_budget is not None and req.kv_budget > config.kv_budget_limit:
            raise ApiError(
                400,
                f"kv_budget {req.kv_budget} is over this server's limit of "
                f"{config.kv_budget_limit} tokens",
                "invalid_request_error",
                "invalid_value",
                "kv_budget",
            )
        n_prompt = len(head) + len(tail)
        if n_prompt > config.max_prompt_tokens:
            raise ApiError(
                400,
                f"the prompt has {n_prompt} tokens; this server accepts at most "
                f"{config.max_prompt_tokens}",
                "invalid_request_error",
                "context_length_exceeded",
                "prompt",
                metric="context_length_exceeded",
            )
        budget = req.kv_budget or config.budget_tokens
        ratio = req.kv_keep_ratio or config.keep_ratio
        if ratio is not None:
            budget = min(budget, max(64, math.ceil(ratio * n_prompt)))
        if policy == "full" and n_prompt + max_tokens > budget:
            raise ApiError(
                400,
                f"{n_prompt} prompt tokens plus max_tokens {max_tokens} do not "
                f"fit a {budget}-token cache that never evicts; raise kv_budget or "
                "choose an eviction policy",
                "invalid_request_error",
                "context_length_exceeded",
                "prompt",
                metric="context_length_exceeded",
            )
        return Job(head, tail, policy, budget, (), max_tokens, _sampling(req), stops)

    def completion_job(req: CompletionRequest) -> Job:
        """Checks and tokenization, run off the event loop (a long prompt takes seconds)."""
        if req.echo or req.logprobs is not None:
            raise ApiError(
                400,
                "echo and logprobs are not supported",
                "invalid_request_error",
                param="echo" if req.echo else "logprobs",
            )
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if len(prompts) != 1:
            raise ApiError(
                400, "send one prompt per request", "invalid_request_error", param="prompt"
            )
        tokens = model.tokenize(prompts[0], add_bos=model.add_bos)
        if not tokens:
            raise ApiError(400, "the prompt is empty", "invalid_request_error", param="prompt")
        split = max(len(tokens) - QUESTION_TOKENS, 0)
        if split == 0 and len(tokens) > 1:
            split = 1
        return job_for(req, tokens[:split], tokens[split:], req.stops(), req.max_tokens or 16)

    def chat_job(req: ChatRequest) -> Job:
        """Checks, the chat template and tokenization, run off the event loop."""
        if req.logprobs:
            raise ApiError(
                400, "logprobs are not supported", "invalid_request_error", param="logprobs"
            )
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in req.messages
        ]
        try:
            prompt = chat_prompt(model, messages)
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid_request_error", param="messages") from exc
        head = model.tokenize(prompt.prefix, add_bos=prompt.add_bos, markup=prompt.prefix_markup)
        tail = model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
        max_tokens = req.max_completion_tokens or req.max_tokens or config.max_tokens
        return job_for(req, head, tail, [*req.stops(), *prompt.stops], max_tokens)

    def submit(job: Job) -> Future[Result]:
        try:
            return runner.submit(job)
        except (Overloaded, ShuttingDown) as exc:
            raise _from_engine(exc) from exc

    async def respond(request: Request, req: CompletionRequest | ChatRequest, job: Job) -> Any:
        reply = Reply(isinstance(req, ChatRequest), req.model or model_id)
        if not req.stream:
            result: Result = await _unless_gone(request, job, asyncio.wrap_future(submit(job)))
            metrics.finished(result.stats)
            return reply.full(result.text, result.reason, result.stats)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        job.sink = lambda event: loop.call_soon_threadsafe(queue.put_nowait, event)
        future = submit(job)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, f))
        # the status goes out with the first event: a job the engine refuses
        # (its budget, its memory) is an HTTP error, not a 200 with an error event
        first = await _unless_gone(request, job, queue.get())
        if isinstance(first, Future) and first.exception() is not None:
            raise _from_engine(first.exception())
        events = stream(reply, job, first, queue)
        return EventSourceResponse(events, shutdown_grace_period=SHUTDOWN_GRACE_S)

    async def stream(
        reply: Reply, job: Job, first: Any, queue: asyncio.Queue[Any]
    ) -> AsyncIterator[dict[str, str]]:
        try:
            if reply.chat:
                yield {"data": json.dumps(reply.chunk(""))}
            item = first
            while not isinstance(item, Future):
                if isinstance(item, Token) and item.text:
                    yield {"data": json.dumps(reply.chunk(item.text))}
                elif isinstance(item, Done):
                    metrics.finished(item.stats)
                    finish = "length" if item.reason == "length" else "stop"
                    yield {"data": json.dumps(reply.chunk(None, finish, item.stats))}
                item = await queue.get()
            exc = item.exception()
            if exc is not None:  # an engine error, or the server shutting down
                error = _from_engine(exc)
                metrics.errors.labels(error.metric).inc()
                body = error_body(str(error), error.kind, error.code, error.param)
                yield {"data": json.dumps(body)}
            yield {"data": "[DONE]"}
        except asyncio.CancelledError:
            job.cancel()  # the client went away: stop reading and generating for it
            metrics.errors.labels("cancelled").inc()
            raise

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await respond(request, req, await run_in_threadpool(completion_job, req))

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request) -> Any:
        return await respond(request, req, await run_in_threadpool(chat_job, req))

    return app
