"""llama-server as the RULER suite's full-cache reference (``kvtrim bench --ruler
--peer llama-server``): what a user would run instead of kvtrim, built from the
llama.cpp that llama-cpp-python vendors (issue 19's peer), fed the very tokens
kvtrim's session reads, greedy, with the prompt's own stop strings.

One server for the whole run, ``-np 1 -c`` the model's trained context; an item
whose prompt does not fit is not asked (kvtrim's full cache skips it too).
Units: tokens, seconds.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from ..runtime.engine import Engine
from ..session.prompts import ask_prompt, prompt_tokens
from .peer_servers import PEER, Launch, ServerProcess, peer_argv

TIMEOUT_S = 3600.0  # a 32K-token read on 2 cores takes minutes
SETTING = (PEER, None, "original")  # the setting its records carry: the full cache


def prompt_ids(
    engine: Engine, document: str, question: str, answer_prefix: str
) -> tuple[list[int], tuple[str, ...]]:
    """The tokens kvtrim's ``Session.ask`` reads for this item (prefix, document,
    question and answer cue) and the prompt's stop strings."""
    prompt = ask_prompt(engine.model, document, question, answer_prefix)
    head, tail, _ = prompt_tokens(engine.model, prompt)
    return head + tail, tuple(prompt.stops)


def server(binary: str, model: str, threads: int, n_ctx: int, log_path: Any) -> ServerProcess:
    """llama-server with one slot of ``n_ctx`` cells, llama.cpp's other defaults."""
    launch = Launch(server=PEER, parallel=1, ctx=n_ctx)
    return ServerProcess(lambda port: peer_argv(binary, model, port, threads, launch), log_path)


def complete(
    url: str, tokens: list[int], stops: tuple[str, ...], max_tokens: int
) -> dict[str, Any]:
    """One greedy ``/completion`` of ``tokens``; the record's fields: ``text`` (the
    answer as written), ``reason`` (``length`` where it stopped at ``max_tokens``, else ``stop``),
    ``length_tokens``, ``prefill_s``, ``total_s``, or ``error`` with the server's
    message where it refused (a 4xx or 5xx)."""
    body = {
        "prompt": tokens,
        "n_predict": max_tokens,
        "temperature": 0,
        "stop": list(stops),
        "cache_prompt": False,
    }
    start = time.perf_counter()
    reply = httpx.post(f"{url}/completion", json=body, timeout=TIMEOUT_S)
    total = time.perf_counter() - start
    if reply.status_code >= 400:
        why = " ".join(reply.text.split())[:300]
        return {"error": f"{PEER} {reply.status_code}: {why}", "text": "", "total_s": total}
    data = reply.json()
    timings = data.get("timings") or {}
    return {
        "error": None,
        "text": data.get("content") or "",
        "reason": "length"
        if data.get("stop_type") == "limit" or data.get("stopped_limit")
        else "stop",
        "length_tokens": timings.get("prompt_n", len(tokens)),
        "prefill_s": (timings.get("prompt_ms") or 0.0) / 1000,
        "total_s": total,
    }
