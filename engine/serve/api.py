"""``kvtrim serve``: an OpenAI-compatible HTTP API (FastAPI) with the eviction
policy as server configuration.

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streamed as
server-sent events or not) and ``/metrics`` (Prometheus). Requests run one at a
time on the engine thread, each in its own session (see runner.py); a request
may override the policy and budget with ``kv_policy``/``kv_budget``/``kv_keep_ratio``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    ConfigError,
    ContextOverflowError,
    KvtrimError,
    OutOfMemoryError,
)
from ..policies import POLICIES
from ..prompts import chat_prompt
from ..runtime import Engine
from ..sampling import Sampling
from ..stats import Done, Result, Token
from .metrics import Metrics
from .runner import EngineRunner, Job, Overloaded
from .schemas import ChatRequest, CompletionRequest, Reply, error_body

QUESTION_TOKENS = 32  # a raw completion prompt's last tokens vote at each eviction


@dataclass(frozen=True)
class ServerConfig:
    """The server's defaults; a request may override policy, budget and keep ratio."""

    policy: str = "snapkv"
    budget_tokens: int = 2048
    keep_ratio: float | None = None  # budget = ratio x prompt tokens, at most budget_tokens
    api_key: str | None = None
    max_queue: int = 16
    max_prompt_tokens: int = 262_144
    max_tokens: int = 256  # chat default when the request sets none


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


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """The ASGI app; ``app.state`` holds the runner and the metrics."""
    metrics = Metrics()
    runner = EngineRunner(engine, config.max_queue)
    model = engine.model
    model_id = model.info.path.rsplit("/", 1)[-1].removesuffix(".gguf")

    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header.removeprefix("Bearer ").strip()
        if not secrets.compare_digest(given.encode(), config.api_key.encode()):
            raise ApiError(
                401,
                "Incorrect API key provided.",
                "invalid_request_error",
                "invalid_api_key",
                metric="authentication",
            )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        runner.close()  # finish queued requests, free the session

    app = FastAPI(title="kvtrim", dependencies=[Depends(check_key)], lifespan=lifespan)
    app.state.runner, app.state.metrics = runner, metrics

    @app.middleware("http")
    async def count(request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        route = request.scope.get("route")
        endpoint = getattr(route, "path", "unmatched")  # no label per unknown path
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        metrics.errors.labels(exc.metric).inc()
        return JSONResponse(error_body(str(exc), exc.kind, exc.code, exc.param), exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own errors (unknown path, wrong method, unparsable body)."""
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_body")
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
        return Job(
            head,
            tail,
            policy,
            budget,
            (),
            max_tokens,
            Sampling(req.temperature, req.top_p, req.seed),
            stops,
        )

    async def respond(req: CompletionRequest | ChatRequest, job: Job, chat: bool) -> Any:
        reply = Reply(chat, req.model or model_id)
        if not req.stream:
            try:
                future = runner.submit(job)
                result: Result = await asyncio.wrap_future(future)
            except Exception as exc:
                raise _from_engine(exc) from exc
            metrics.finished(result.stats)
            return reply.full(result.text, result.reason, result.stats)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        job.sink = lambda event: loop.call_soon_threadsafe(queue.put_nowait, event)
        try:
            future = runner.submit(job)
        except Overloaded as exc:
            raise _from_engine(exc) from exc
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, f))
        return EventSourceResponse(stream(reply, job, queue, chat))

    async def stream(
        reply: Reply, job: Job, queue: asyncio.Queue[Any], chat: bool
    ) -> AsyncIterator[dict[str, str]]:
        try:
            if chat:
                yield {"data": json.dumps(reply.chunk(""))}
            while True:
                item = await queue.get()
                if isinstance(item, Token) and item.text:
                    yield {"data": json.dumps(reply.chunk(item.text))}
                elif isinstance(item, Done):
                    metrics.finished(item.stats)
                    finish = "length" if item.reason == "length" else "stop"
                    yield {"data": json.dumps(reply.chunk(None, finish, item.stats))}
                elif isinstance(item, Future):
                    exc = item.exception()
                    if exc is not None:
                        error = _from_engine(exc)
                        metrics.errors.labels(error.metric).inc()
                        body = error_body(str(error), error.kind, error.code, error.param)
                        yield {"data": json.dumps(body)}
                    break
            yield {"data": "[DONE]"}
        except asyncio.CancelledError:
            job.cancel()  # the client went away: stop reading and generating for it
            metrics.errors.labels("cancelled").inc()
            raise

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Any:
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
        job = job_for(req, tokens[:split], tokens[split:], req.stops(), req.max_tokens or 16)
        return await respond(req, job, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest) -> Any:
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
        head = model.tokenize(prompt.prefix, add_bos=prompt.add_bos)
        tail = model.tokenize(prompt.suffix)
        max_tokens = req.max_completion_tokens or req.max_tokens or config.max_tokens
        job = job_for(req, head, tail, [*req.stops(), *prompt.stops], max_tokens)
        return await respond(req, job, chat=True)

    return app
