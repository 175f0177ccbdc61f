"""Requests of ``kvtrim bench --peer`` through the OpenAI Python SDK (a real client),
the same for llama-server and ``kvtrim serve``; and the figures each server returns
beside OpenAI's fields: llama-server's ``timings``, kvtrim's ``kvtrim`` object.

Units: seconds, tokens, tokens per second, bytes.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 3600.0  # a 64K-token read on 2 cores takes minutes
MODEL = "default"  # both servers serve the one model they loaded, whatever the name


class Refused(Exception):
    """The server answered a request with a 4xx: ``status: its message`` (llama-server
    refuses a prompt longer than its context, 64K tokens past a 32K trained context)."""


def client(url: str) -> Any:
    """An ``openai.OpenAI`` client of the server at ``url``: no retries, no key."""
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S)


@dataclass
class Reply:
    """One request's answer and times: ``latency_s`` to the last byte, ``ttft_s``
    to the first text (streaming only), ``extra``: the ``usage``, ``timings`` and
    ``kvtrim`` objects the server returned (streaming: the last of each)."""

    text: str
    latency_s: float
    ttft_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_EXTRA = ("usage", "timings", "kvtrim")


def _keep_extra(into: dict[str, Any], body: dict[str, Any]) -> None:
    for key in _EXTRA:
        if body.get(key) is not None:
            into[key] = body[key]


def _piece(chunk: dict[str, Any], chat: bool) -> str:
    """The text a stream chunk adds ('' for a chunk without choices or text)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if chat:
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def _stream(make: Any, chat: bool, **body: Any) -> Reply:
    """A streaming request; the time to the first chunk with text is its TTFT."""
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    extra: dict[str, Any] = {}
    for chunk in make(stream=True, stream_options={"include_usage": True}, **body):
        data = chunk.model_dump()
        piece = _piece(data, chat)
        if piece and ttft is None:
            ttft = time.perf_counter() - t0
        parts.append(piece)
        _keep_extra(extra, data)
    return Reply("".join(parts), time.perf_counter() - t0, ttft, extra)


def complete(
    api: Any,
    prompt: str,
    max_tokens: int,
    stream: bool = False,
    temperature: float = 0.0,
    ignore_eos: bool = False,
) -> Reply:
    """``/v1/completions``, greedy (or sampled at ``temperature``); ``ignore_eos``:
    llama-server's field (kvtrim's too), the answer runs to ``max_tokens``."""
    body: dict[str, Any] = {
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature
    }  # fmt: skip
    if ignore_eos:
        body["extra_body"] = {"ignore_eos": True}
    if stream:
        return _stream(api.completions.create, False, **body)
    t0 = time.perf_counter()
    data = api.completions.create(**body).model_dump()
    reply = Reply(data["choices"][0]["text"] or "", time.perf_counter() - t0)
    _keep_extra(reply.extra, data)
    return reply


def chat(
    api: Any,
    system: str,
    question: str,
    max_tokens: int,
    stream: bool = False,
    stop: list[str] | None = None,
) -> Reply:
    """``/v1/chat/completions``, greedy: the document as the system message, the
    question as the user's; ``stop``: where the chat format ends an answer."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if stop:
        body["stop"] = stop
    if stream:
        return _stream(api.chat.completions.create, True, **body)
    import openai

    t0 = time.perf_counter()
    try:
        data = api.chat.completions.create(**body).model_dump()
    except openai.BadRequestError as exc:
        raise Refused(f"{exc.status_code}: {_message(exc.body)}") from None
    reply = Reply(data["choices"][0]["message"]["content"] or "", time.perf_counter() - t0)
    _keep_extra(reply.extra, data)
    return reply


def _message(body: object) -> str:
    """The error message of an error body (OpenAI's and llama-server's shapes)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(body)[:200]


def figures(reply: Reply) -> dict[str, Any]:
    """What a server said about one request, under common names: prompt tokens
    (all, and of them cached: not read again), completion tokens, its own prompt
    reading speed (llama-server: ``timings.prompt_per_second``; kvtrim:
    ``kvtrim.prefill_tokens_per_s``) and kvtrim's ``kv_bytes_held``."""
    usage = reply.extra.get("usage") or {}
    timings = reply.extra.get("timings") or {}
    own = reply.extra.get("kvtrim") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None:
        cached = timings.get("cache_n")
    speed = timings.get("prompt_per_second", own.get("prefill_tokens_per_s"))
    return {
        "prompt_tokens": usage.get("prompt_tokens", timings.get("prompt_n")),
        "cached_tokens": cached,
        "completion_tokens": usage.get("completion_tokens", timings.get("predicted_n")),
        "server_prompt_tokens_per_s": speed,
        "server_prompt_ms": timings.get("prompt_ms"),
        "kv_bytes_held": own.get("kv_bytes_held"),
    }


def _p50(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def load(
    url: str,
    prompts: list[str],
    clients: int,
    gen: int | Sequence[int],
    stream: bool,
    temperature: float = 0.0,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """``prompts`` sent by ``clients`` threads through one SDK client, each thread
    sending the next prompt when its last answer came: requests/s over the wall
    time, latency and TTFT p50, and the answers in prompt order. ``gen``: tokens at
    most for every request, or one figure for each prompt."""
    most = [gen] * len(prompts) if isinstance(gen, int) else list(gen)
    if len(most) != len(prompts):
        raise ValueError(f"{len(most)} lengths for {len(prompts)} prompts")
    api = client(url)
    replies: list[Reply | None] = [None] * len(prompts)
    nxt = iter(range(len(prompts)))
    lock = threading.Lock()
    stop = threading.Event()  # a failed request or Ctrl+C: no client sends another

    def worker() -> None:
        while not stop.is_set():
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            try:
                replies[i] = complete(api, prompts[i], most[i], stream, temperature, ignore_eos)
            except BaseException:
                stop.set()
                raise

    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(worker) for _ in range(clients)]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                stop.set()
                raise
    finally:
        api.close()
    wall = time.perf_counter() - start
    done = [r for r in replies if r is not None]
    counts = [figures(r)["completion_tokens"] for r in done]
    return {
        "wall_s": wall,
        "requests_per_s": len(done) / wall,
        "latency_p50_s": _p50([r.latency_s for r in done]),
        "ttft_p50_s": _p50([r.ttft_s for r in done]) if stream else None,
        "completion_tokens": counts,
        "prompt_tokens": [figures(r)["prompt_tokens"] for r in done],
        "answers": [r.text for r in done],
    }


# llama_decode calls and the tokens they held, as each server counts them on /metrics
# (llama-server with --metrics: prompt tokens read + tokens predicted; kvtrim: its pool)
_DECODES = {
    "llamacpp:n_decode_total": "decodes",
    "llamacpp:prompt_tokens_total": "tokens",
    "llamacpp:tokens_predicted_total": "tokens",
    "kvtrim_pool_decode_steps": "decodes",
    "kvtrim_pool_decode_tokens": "tokens",
}


def decode_counts(url: str) -> dict[str, float] | None:
    """``{"decodes": n, "tokens": n}`` from the server's ``/metrics`` so far, or None
    where it counts neither (kvtrim with one sequence runs no pool)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    got: dict[str, float] = {}
    for name, value in re.findall(r"^([A-Za-z_:]+) ([0-9.eE+-]+)$", text, re.M):
        if name in _DECODES:
            key = _DECODES[name]
            got[key] = got.get(key, 0.0) + float(value)
    return got if got.get("decodes") else None
