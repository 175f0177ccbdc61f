"""``kvtrim serve``: the OpenAI-compatible server on uvicorn."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, TextIO

from ..errors import ConfigError
from ..native.cpu import REPACK_MODES, requested_mode
from ..policies import POLICIES, help_lines, parse_settings
from ..pool.kvpool import LAYOUTS, SHARES
from ..serve.config import ServerConfig
from ..serve.guards import LOOPBACK_HOSTS, WILDCARD_ADDRESSES
from . import types
from .options import Option, add_options, engine_from_args, policy_args_help
from .types import kv_options

_POLICY_OPTIONS: tuple[Option, ...] = (  # the cache policy and the model
    (
        ("--policy", "--kv-cache-policy"),
        {
            "choices": list(POLICIES),
            "default": ServerConfig.policy,
            "help": f"eviction policy (default: {ServerConfig.policy}). {help_lines()}",
        },
    ),
    (
        ("--policy-arg",),
        {
            "dest": "policy_args",
            "action": "append",
            "default": None,
            "metavar": "NAME=VALUE",
            "help": f"a parameter of the policy (repeatable): {policy_args_help()}",
        },
    ),
    (
        ("--budget",),
        {
            "type": int,
            "default": ServerConfig.budget_tokens,
            "metavar": "N",
            "help": f"KV cells kept per request (default: {ServerConfig.budget_tokens})",
        },
    ),
    (
        ("--keep-ratio", "--h2o-keep-ratio"),
        {
            "type": float,
            "default": None,
            "metavar": "R",
            "help": "keep this fraction of each prompt's tokens (at most --budget)",
        },
    ),
    (
        ("--max-kv-budget",),
        {
            "type": int,
            "default": None,
            "metavar": "N",
            "help": "the largest kv_budget a request may ask for (default: --budget)",
        },
    ),
    types.MODEL_OPTION,
    (("--gpu-layers",), {"type": int, "default": 0, "metavar": "N"}),
    (("--threads",), {"type": int, "default": None, "metavar": "N"}),
    (
        ("--repack",),
        {
            "choices": REPACK_MODES,
            "default": None,
            "help": "llama.cpp's CPU weight repacking (default: $KVTRIM_REPACK, else auto: "
            "off on CPUs with AMX, where it crashes)",
        },
    ),
)


def _access_options() -> tuple[Option, ...]:
    """Where the server listens and whom it answers (``--api-key``'s default is
    ``$KVTRIM_API_KEY`` as it is when the parser is built)."""
    return (
        (("--host",), {"default": "127.0.0.1", "help": "default: loopback only"}),
        (("--port",), {"type": int, "default": 8000}),
        (
            ("--allowed-host",),
            {
                "action": "append",
                "default": [],
                "metavar": "NAME",
                "help": "also answer requests whose Host header names NAME (repeatable; "
                "'*': any). Loopback names and --host are always answered; the check stops "
                "DNS rebinding",
            },
        ),
        (
            ("--api-key",),
            {
                "default": os.environ.get("KVTRIM_API_KEY"),
                "help": "require 'Authorization: Bearer KEY' (default: $KVTRIM_API_KEY, else none)",
            },
        ),
    )


_CAPACITY_OPTIONS: tuple[Option, ...] = (  # how many requests, cells and bytes
    (("--max-queue",), {"type": int, "default": ServerConfig.max_queue, "metavar": "N"}),
    (
        ("--parallel",),
        {
            "type": int,
            "default": ServerConfig.parallel,
            "metavar": "N",
            "help": "requests decoded together, as sequences of one context (default: "
            f"{ServerConfig.parallel}; 1: one at a time)",
        },
    ),
    (
        ("--kv-cells",),
        {
            "type": int,
            "default": None,
            "metavar": "N",
            "help": "KV cells the parallel requests share (default: what one request at the "
            "largest budget holds: budget x 1.25 + 64)",
        },
    ),
    (
        ("--share",),
        {
            "choices": SHARES,
            "default": ServerConfig.share,
            "help": "split the cells by each request's length (default) or evenly",
        },
    ),
    (
        ("--kv-layout",),
        {
            "choices": LAYOUTS,
            "default": ServerConfig.layout,
            "help": "shared: one pool of --kv-cells that requests share by --share "
            "(default); streams: each request its own --kv-cells/--parallel cells, whose "
            "attention then spans only its own cells (faster reading on a CPU when several "
            "run)",
        },
    ),
    (
        ("--max-prompt-tokens",),
        {"type": int, "default": ServerConfig.max_prompt_tokens, "metavar": "N"},
    ),
    (
        ("--max-tokens",),
        {"type": int, "default": ServerConfig.max_tokens, "metavar": "N", "help": "chat default"},
    ),
    (
        ("--max-body-mb",),
        {
            "type": float,
            "default": ServerConfig.max_body_bytes / 2**20,
            "metavar": "MB",
            "help": "refuse request bodies over this many MiB with 413 (default: "
            f"{ServerConfig.max_body_bytes / 2**20:g})",
        },
    ),
    (
        ("--max-connections",),
        {
            "type": int,
            "default": 64,
            "metavar": "N",
            "help": "open connections at most; more get 503 (default: 64)",
        },
    ),
)


def add_parser(sub: Any) -> None:
    """Registers ``serve`` on the ``kvtrim`` subcommands."""
    p = sub.add_parser(
        "serve",
        help="serve /v1/completions and /v1/chat/completions with eviction",
        description="An OpenAI-compatible server whose KV cache policy is server configuration; "
        "a request may override it with kv_policy, kv_budget or kv_keep_ratio.",
    )
    add_options(p, _POLICY_OPTIONS)
    kv_options(p)
    add_options(p, (*_access_options(), *_CAPACITY_OPTIONS))


def allowed_hosts(host: str, extra: list[str]) -> tuple[str, ...]:
    """Host header names the server answers to: loopback, ``host`` unless it
    is a wildcard address, and ``extra``."""
    named = [] if host in WILDCARD_ADDRESSES else [host]
    return (*LOOPBACK_HOSTS, *named, *extra)


def check_options(args: argparse.Namespace) -> None:
    """What ``ServerConfig`` does not hold; raises ``ConfigError``."""
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {args.threads}")
    if args.gpu_layers < -1:
        raise ConfigError(f"--gpu-layers must be -1 (all) or more, got {args.gpu_layers}")
    if not (math.isfinite(args.max_body_mb) and args.max_body_mb > 0):
        raise ConfigError(f"--max-body-mb must be a positive number, got {args.max_body_mb}")
    if args.max_connections < 1:
        raise ConfigError(f"--max-connections must be at least 1, got {args.max_connections}")


def main(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Checks every option, then loads the model and serves until stopped."""
    from ..serve.api import create_app
    from ..serve.background import Server, uvicorn_config

    check_options(args)
    server_config = ServerConfig(
        policy=args.policy,
        policy_settings=parse_settings(args.policy, args.policy_args or ()),
        budget_tokens=args.budget,
        keep_ratio=args.keep_ratio,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_prompt_tokens=args.max_prompt_tokens,
        max_tokens=args.max_tokens,
        max_kv_budget=args.max_kv_budget,
        max_body_bytes=int(args.max_body_mb * 2**20),
        allowed_hosts=allowed_hosts(args.host, args.allowed_host),
        parallel=args.parallel,
        kv_cells=args.kv_cells,
        share=args.share,
        layout=args.kv_layout,
    )
    requested_mode(args.repack)  # a bad $KVTRIM_REPACK is one line before the model loads
    with engine_from_args(args) as engine:
        for note in engine.notes:
            err.write(f"note: {note}\n")
        if args.host not in LOOPBACK_HOSTS and not args.api_key:
            err.write(f"warning: serving on {args.host} without --api-key\n")
        if args.host in WILDCARD_ADDRESSES and not args.allowed_host:
            err.write("note: only loopback Host names are answered; name others --allowed-host\n")
        err.write(
            f"kvtrim: {engine.model_name} on http://{args.host}:{args.port}/v1 "
            f"(policy {args.policy}, budget {args.budget}, {args.parallel} in parallel "
            f"sharing {server_config.pool_cells} KV cells); metrics at /metrics\n"
        )
        app = create_app(engine, server_config)
        settings = uvicorn_config(
            app,
            host=args.host,
            port=args.port,
            log_level="info",
            limit_concurrency=args.max_connections,
        )
        Server(settings, on_shutdown=app.state.on_shutdown).run()
    return 0
