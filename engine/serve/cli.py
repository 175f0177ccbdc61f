"""``kvtrim serve``: the OpenAI-compatible server on uvicorn."""

from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from ..policies import POLICIES
from ..runtime import Engine


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve /v1/completions and /v1/chat/completions with eviction",
        description="An OpenAI-compatible server whose KV cache policy is server configuration; "
        "a request may override it with kv_policy, kv_budget or kv_keep_ratio.",
    )
    p.add_argument("--policy", "--kv-cache-policy", choices=list(POLICIES), default="snapkv")
    p.add_argument(
        "--budget", type=int, default=2048, metavar="N", help="KV cells kept per request"
    )
    p.add_argument(
        "--keep-ratio",
        "--h2o-keep-ratio",
        type=float,
        default=None,
        metavar="R",
        help="keep this fraction of each prompt's tokens (at most --budget)",
    )
    p.add_argument("--model", default=None, metavar="PATH")
    p.add_argument("--gpu-layers", type=int, default=0, metavar="N")
    p.add_argument("--threads", type=int, default=None, metavar="N")
    p.add_argument("--host", default="127.0.0.1", help="default: loopback only")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("KVTRIM_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $KVTRIM_API_KEY, else none)",
    )
    p.add_argument("--max-queue", type=int, default=16, metavar="N")
    p.add_argument("--max-prompt-tokens", type=int, default=262_144, metavar="N")
    p.add_argument("--max-tokens", type=int, default=256, metavar="N", help="chat default")


def main(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import uvicorn

    from .api import ServerConfig, create_app

    config = ServerConfig(
        policy=args.policy,
        budget_tokens=args.budget,
        keep_ratio=args.keep_ratio,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens=args.max_tokens,
    )
    with Engine(args.model, n_gpu_layers=args.gpu_layers, n_threads=args.threads) as engine:
        if engine.model.device_note:
            err.write(f"note: {engine.model.device_note}\n")
        if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
            err.write(f"warning: serving on {args.host} without --api-key\n")
        err.write(
            f"kvtrim: {engine.model_name} on http://{args.host}:{args.port}/v1 "
            f"(policy {args.policy}, budget {args.budget}); metrics at /metrics\n"
        )
        uvicorn.run(create_app(engine, config), host=args.host, port=args.port, log_level="info")
    return 0
