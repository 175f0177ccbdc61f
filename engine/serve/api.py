"""``kvtrim serve``: an OpenAI-compatible HTTP API (FastAPI) with the eviction
policy as server configuration.

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streamed as
server-sent events or not) and ``/metrics`` (Prometheus). Up to ``parallel``
requests run at once as sequences of one context, each in its own session (see
runner.py and pool.py); a request may override the policy and budget with
``kv_policy``/``kv_budget``/``kv_keep_ratio``.

Before the app reads a request, guards.py checks its Host header, its API key
and its body size; validation.py turns the parsed body into a job (off the
event loop: prompts are tokenized there) or a refusal; a client that goes away
cancels its job, and so does the server shutting down. This module only wires
those together and streams the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..pool.kvpool import ROUND_TOKENS
from ..runtime.engine import Engine
from ..stats import Done, Result, Token
from .api_errors import ApiError, from_engine, from_http, from_validation
from .config import ServerConfig
from .guards import BodyLimit, HostCheck, KeyCheck
from .metrics import CountRequests, Metrics
from .runner import EngineRunner, Job, Overloaded, ShuttingDown
from .schemas import ChatRequest, CompletionRequest, Reply
from .validation import JobBuilder

__all__ = ["ApiError", "ServerConfig", "create_app"]

T = TypeVar("T")
Parsed = CompletionRequest | ChatRequest

MESSAGE_BYTES = 16  # what a chat message's template adds, counted as bytes of text
SHUTDOWN_GRACE_S = 5.0  # sse-starlette waits this long for a stream's last event


async def _gone(request: Request) -> None:
    """Return when the client has gone: with the body read, the server's next
    ASGI message is ``http.disconnect`` (no polling). A broken receive counts as
    gone."""
    with contextlib.suppress(Exception):
        while (await request.receive())["type"] != "http.disconnect":
            pass


async def _unless_gone(request: Request, job: Job, waiting: Awaitable[T]) -> T:
    """What ``waiting`` gives; if the client goes away first, ``job`` is
    cancelled and the request ends with 499 (nginx's "client closed request")."""
    task = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_gone(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
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

    def answer(error: ApiError) -> JSONResponse:
        metrics.errors.labels(error.metric).inc()
        return JSONResponse(error.body(), error.status)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return answer(from_http(exc.status_code, str(exc.detail)))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(from_validation(exc.errors()))


def _fits_a_round(req: Parsed) -> bool:
    """Whether the request's text, with ``MESSAGE_BYTES`` for each chat message's (or
    prompt's) template, is at most ``ROUND_TOKENS`` bytes, so its prompt fits one
    pooled round (a token holds at least a byte) and is parsed in about a millisecond:
    only such a request holds the rounds while it is on its way. A document larger
    than a round is read over several rounds anyway, and the others' answers do not
    wait for its parse."""
    if isinstance(req, ChatRequest):
        parts: list[Any] = req.messages
    else:
        parts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    extra = len(parts) * MESSAGE_BYTES  # each message (or prompt) its template's share
    if extra > ROUND_TOKENS:
        return False
    texts = [p.text() for p in parts] if isinstance(req, ChatRequest) else parts
    if sum(len(t) for t in texts) + extra > ROUND_TOKENS:  # characters: no more than bytes
        return False
    return sum(len(t.encode("utf-8", "replace")) for t in texts) + extra <= ROUND_TOKENS


class _Responder:
    """Runs a job and answers with its result, whole or as server-sent events."""

    def __init__(self, runner: EngineRunner, metrics: Metrics, model_id: str) -> None:
        self.runner, self.metrics, self.model_id = runner, metrics, model_id

    def submit(self, job: Job) -> Future[Result]:
        try:
            return self.runner.submit(job)
        except (Overloaded, ShuttingDown) as exc:
            raise from_engine(exc) from exc

    async def run(self, request: Request, req: Parsed, build: Callable[[Any], Job]) -> Any:
        """Build the job off the event loop (tokenizing), then answer it; the pool's
        rounds expect it from the start where its text fits a round
        (``EngineRunner.arriving``)."""
        with self.runner.arriving(_fits_a_round(req)) as arrival:
            job = await run_in_threadpool(build, req)
            arrival.built()
            job.arrival = arrival.key
            return await self.respond(request, req, job)

    async def respond(self, request: Request, req: Parsed, job: Job) -> Any:
        reply = Reply(isinstance(req, ChatRequest), req.model or self.model_id)
        if not req.stream:
            waiting = asyncio.wrap_future(self.submit(job))
            try:
                result: Result = await _unless_gone(request, job, waiting)
            except ApiError:
                raise
            except Exception as exc:  # the engine refused it: as a stream's first event is
                raise from_engine(exc) from exc
            self.metrics.finished(result.stats)
            return reply.full(result.text, result.reason, result.stats)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        job.sink = lambda event: loop.call_soon_threadsafe(queue.put_nowait, event)
        future = self.submit(job)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, f))
        # the status goes out with the first event: a job the engine refuses
        # (its budget, its memory) is an HTTP error, not a 200 with an error event
        first = await _unless_gone(request, job, queue.get())
        if isinstance(first, Future) and first.exception() is not None:
            raise from_engine(first.exception())
        events = self.stream(reply, job, first, queue)
        return EventSourceResponse(events, shutdown_grace_period=SHUTDOWN_GRACE_S)

    async def stream(
        self, reply: Reply, job: Job, first: Any, queue: asyncio.Queue[Any]
    ) -> AsyncIterator[dict[str, str]]:
        try:
            if reply.chat:
                yield {"data": json.dumps(reply.chunk(""))}
            item = first
            while not isinstance(item, Future):
                if isinstance(item, Token) and item.text:
                    yield {"data": json.dumps(reply.chunk(item.text))}
                elif isinstance(item, Done):
                    self.metrics.finished(item.stats)
                    finish = "length" if item.reason == "length" else "stop"
                    yield {"data": json.dumps(reply.chunk(None, finish, item.stats))}
                item = await queue.get()
            exc = item.exception()
            if exc is not None:  # an engine error, or the server shutting down
                error = from_engine(exc)
                self.metrics.errors.labels(error.metric).inc()
                yield {"data": json.dumps(error.body())}
            yield {"data": "[DONE]"}
        except asyncio.CancelledError:
            job.cancel()  # the client went away: stop reading and generating for it
            self.metrics.errors.labels("cancelled").inc()
            raise


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """The ASGI app; ``app.state`` holds the runner, the metrics and
    ``on_shutdown`` (for ``background.Server``: cancels the running work)."""
    metrics = Metrics()
    if config.parallel > 1:
        metrics.pool_cells = config.pool_cells
    runner = EngineRunner(
        engine,
        config.max_queue,
        parallel=config.parallel,
        kv_cells=config.pool_cells,
        share=config.share,
        layout=config.layout,
    )
    model_id = engine.model.info.path.rsplit("/", 1)[-1].removesuffix(".gguf")
    jobs = JobBuilder(engine.model, config)
    responder = _Responder(runner, metrics, model_id)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        runner.close()  # finish queued requests, free the session

    app = FastAPI(title="kvtrim", lifespan=lifespan)
    app.state.runner, app.state.metrics, app.state.on_shutdown = runner, metrics, runner.stop
    _add_middleware(app, config, metrics)
    _add_error_handlers(app, metrics)

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Up and ready (as llama-server's /health); no API key needed."""
        return {"status": "ok", "queued": runner.waiting}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "kvtrim"}],
        }

    @app.get("/metrics")
    def prometheus() -> Response:
        metrics.queue.set(runner.waiting)
        if runner.pool is not None:
            metrics.pool(runner.pool.snapshot())
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await responder.run(request, req, jobs.completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request) -> Any:
        return await responder.run(request, req, jobs.chat)

    return app
