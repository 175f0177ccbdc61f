"""``kvtrim serve`` against the server a user would run instead: llama.cpp's own
``llama-server``, built from the llama.cpp that the pinned llama-cpp-python vendors
(scripts/peer/build_llama_server.sh), with the same model file and threads
(``kvtrim bench --peer llama-server``).

Both servers run the same workloads in one run, alternating: per part, round and
configuration llama-server (A) then kvtrim (B) in even rounds and B then A in odd
ones, so a drift of the machine within a round favours neither; each started as a
subprocess of its own and stopped before the next starts, so never both at once
(``schedule``).
Requests go through the OpenAI Python SDK (peer_client.py).

- ``serve``: 16 distinct ~160-token passages of real text (texts.py), 32 tokens
  generated greedily each, ``/v1/completions``, N concurrent clients (1/4/8),
  plain and streaming, after a 3-request warm-up. llama-server ``-np N -c
  N*256``; kvtrim ``--parallel N --kv-cells 2048 --budget 512`` (N=1: no
  ``--kv-cells``). Requests/s, latency p50, TTFT p50.
- ``prefill``: real text of 8K/32K/64K tokens with a pass key planted in the
  middle, asked about in a chat (the document as the system message); llama-server
  with a context that holds it (``-np 1``), kvtrim SnapKV at budgets 1,024 and
  4,096; and the README's 9K demo (resources/samples/passkey.txt) with the full
  cache (``--policy full --budget 10240``) against llama-server ``-c 10240``.
  Wall time, prompt tokens/s as each server reports it, the fact, KV bytes (each
  from its own report: llama-server's log, kvtrim's ``kv_bytes_held``).
- ``reuse``: two questions about passkey.txt in a streaming chat, the document the
  system message: TTFT of the second against the first, both answers, the cached
  prompt tokens each server reports.

Units: seconds, tokens, bytes. Records go to ``OUT/peer.json`` as they come, each
server's log to ``OUT/peer-logs/``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..documents.load import load_document
from ..runtime.engine import Engine
from ..session.prompts import chat_prompt
from . import peer_client as pc
from .peer_servers import (
    FALLBACK_TEMPLATE,
    KVTRIM,
    PEER,
    Launch,
    ServerProcess,
    kv_log_bytes,
    kvtrim_argv,
    peer_argv,
)
from .records import Records
from .robustness import DEMO_FILE, DEMO_KEY
from .tasks import key_for, real_haystack, real_text

PARTS = ("serve", "prefill", "reuse")
PEERS = (PEER,)
# the planted fact is a pass key, as in the demo; the embedded base model answers these
# in the chat format without an answer prefix (the demo's question it answers "1. 2. 3.")
QUESTION = "What is the pass key?"
SECOND_QUESTION = "The text hides a pass key. What is it?"
DEMO = "demo"  # the configuration of the demo document (``demo_file``)
WARMUP_TEXT_TOKENS = 120  # the warm-up chat of prefill and reuse: a short passage


@dataclass
class PeerConfig:
    """What ``kvtrim bench --peer`` runs; ``peer_binary``, ``model`` and ``threads``
    are filled in by the command (the same model file and threads for both)."""

    peer: str = PEER
    peer_binary: str = ""
    peer_build: str = ""  # how it was built and linked (peer_servers.linkage)
    model: str = ""
    chat_template_file: str = ""  # llama-server's, where the model has no chat template
    threads: int = 1
    gpu_layers: int = 0  # both servers' (llama-server -ngl, kvtrim serve --gpu-layers)
    temperature: float = 0.0  # the serve part's; > 0 where greedy loops (random weights)
    ignore_eos: bool = False  # the serve part's: every answer runs to gen_tokens on both
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    rounds: int = 3
    clients: list[int] = field(default_factory=lambda: [1, 4, 8])
    requests: int = 16  # per client count and mode, each a distinct passage
    warmup: int = 3
    passage_tokens: int = 160
    gen_tokens: int = 32
    slot_cells: int = 256  # llama-server -c = clients x this
    kv_cells: int = 2048  # kvtrim --kv-cells with more than one client, at least llama-server's -c
    serve_budget: int = 512
    kv_layout: str = "shared"  # the serve part's kvtrim --kv-layout with several clients
    lengths: list[int] = field(default_factory=lambda: [8192, 32768, 65536])
    budgets: list[int] = field(default_factory=lambda: [1024, 4096])
    ctx_room: int = 512  # llama-server -c = document tokens + this
    answer_tokens: int = 16
    demo_file: str = str(DEMO_FILE)  # the 9K README demo, its pass key demo_key
    demo_key: str = DEMO_KEY
    demo_cells: int = 10240  # the demo: llama-server -c, kvtrim --policy full --budget
    reuse_budget: int = 1024
    depth: float = 0.5  # where the pass key sits in the prefill documents
    seed: int = 1

    @classmethod
    def quick(cls) -> PeerConfig:
        """A few minutes: 1 and 2 clients, 4 requests, 2K and 4K documents, 1 round."""
        return cls(rounds=1, clients=[1, 2], requests=4, lengths=[2048, 4096])


@dataclass(frozen=True)
class Step:
    """One server start of the run: its part, round, configuration (what both
    servers are measured on) and settings."""

    part: str
    round: int
    config: str
    launch: Launch


def configurations(cfg: PeerConfig, part: str) -> list[tuple[str, list[Launch]]]:
    """Each configuration of ``part`` with its server starts, llama-server first
    (``schedule`` turns the order round in odd rounds)."""
    if part == "serve":
        return [
            (
                f"{n} clients",
                [
                    Launch(PEER, n, ctx=n * cfg.slot_cells),
                    Launch(
                        KVTRIM,
                        n,
                        kv_cells=max(cfg.kv_cells, n * cfg.slot_cells) if n > 1 else None,
                        budget=cfg.serve_budget,
                        kv_layout=cfg.kv_layout if n > 1 else "shared",
                    ),
                ],
            )
            for n in cfg.clients
        ]
    demo_peer = Launch(PEER, 1, ctx=cfg.demo_cells)
    if part == "reuse":
        return [(DEMO, [demo_peer, Launch(KVTRIM, 1, budget=cfg.reuse_budget)])]
    docs = [
        (
            f"{n} tokens",
            [
                Launch(PEER, 1, ctx=n + cfg.ctx_room),
                *(Launch(KVTRIM, 1, budget=b) for b in cfg.budgets),
            ],
        )
        for n in cfg.lengths
    ]
    return [*docs, (DEMO, [demo_peer, Launch(KVTRIM, 1, budget=cfg.demo_cells, policy="full")])]


def schedule(cfg: PeerConfig) -> list[Step]:
    """Every server start in order: per part, round and configuration, llama-server
    first in even rounds and last in odd ones (a counterbalanced order)."""
    return [
        Step(part, r, config, launch)
        for part in cfg.parts
        for r in range(cfg.rounds)
        for config, launches in configurations(cfg, part)
        for launch in (launches[::-1] if r % 2 else launches)
    ]


@dataclass
class Workload:
    """The texts both servers get: the serve part's passages, each sent once per
    server (plain, streaming and warm-up passages apart: llama-server keeps a cache of
    prompts in RAM and would not read a passage sent twice again), the prefill
    documents with their pass keys, the demo's text, a warm-up passage."""

    plain: list[str]
    streaming: list[str]
    warmups: list[str]
    documents: dict[int, tuple[str, int]]
    demo: str
    short: str
    stops: list[str]  # where the model's chat format ends an answer (both servers get them)

    @classmethod
    def build(cls, engine: Engine, cfg: PeerConfig) -> Workload:
        """Real text cut to token counts with ``engine``'s tokenizer (the servers'
        model file)."""
        n = cfg.passage_tokens
        count = 2 * cfg.requests + cfg.warmup
        texts = [real_text(engine, n, 3_000 + 5_000 * i) for i in range(count)]
        documents = {}
        for i, length in enumerate(cfg.lengths):
            key = key_for(cfg.seed, cfg.depth, i)
            doc = real_haystack(engine, length, cfg.depth, key, 200_000 + 400_000 * i)
            documents[length] = (doc, key)
        return cls(
            plain=texts[: cfg.requests],
            streaming=texts[cfg.requests : 2 * cfg.requests],
            warmups=texts[2 * cfg.requests :],
            documents=documents,
            demo=load_document(cfg.demo_file),
            short=real_text(engine, WARMUP_TEXT_TOKENS, 150_000),
            stops=list(chat_prompt(engine.model, [{"role": "user", "content": "?"}]).stops),
        )


Measure = Callable[[str, Step, Workload, PeerConfig, ServerProcess], Iterator[dict[str, Any]]]


def measure_serve(
    url: str, step: Step, work: Workload, cfg: PeerConfig, server: ServerProcess
) -> Iterator[dict[str, Any]]:
    """The warm-up, then the plain passages and the streaming ones, from N clients."""
    api = pc.client(url)
    for text in work.warmups:
        pc.complete(api, text, cfg.gen_tokens)
    api.close()
    clients = step.launch.parallel
    for stream, passages in ((False, work.plain), (True, work.streaming)):
        before = pc.decode_counts(url)
        got = pc.load(
            url, passages, clients, cfg.gen_tokens, stream, cfg.temperature, cfg.ignore_eos
        )
        yield {
            "clients": clients,
            "stream": stream,
            "requests": len(passages),
            **got,
            **_decodes(before, pc.decode_counts(url)),
        }


def _decodes(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """llama_decode calls and tokens per call of one load, from the two /metrics reads."""
    if before is None or after is None:
        return {}
    decodes = after["decodes"] - before["decodes"]
    tokens = after.get("tokens", 0.0) - before.get("tokens", 0.0)
    return {"decodes": int(decodes), "tokens_per_decode": tokens / decodes if decodes else None}


def _warm_chat(url: str, work: Workload) -> Any:
    """An SDK client after one short chat (first-request costs out of the figures)."""
    api = pc.client(url)
    pc.chat(api, work.short, QUESTION, 4, stop=work.stops)
    return api


def _kv_bytes(step: Step, server: ServerProcess, figures: dict[str, Any]) -> int | None:
    """KV bytes as each server reports them: llama-server's log, kvtrim's answer."""
    if step.launch.server == PEER:
        return kv_log_bytes(server.log())
    return figures["kv_bytes_held"]


def measure_prefill(
    url: str, step: Step, work: Workload, cfg: PeerConfig, server: ServerProcess
) -> Iterator[dict[str, Any]]:
    """One question about one document: wall time, reading speed, the fact, KV bytes."""
    if step.config == DEMO:
        doc, key, length = work.demo, cfg.demo_key, None
    else:
        length = int(step.config.split()[0])
        doc, key = work.documents[length][0], str(work.documents[length][1])
    api = _warm_chat(url, work)
    try:
        reply = pc.chat(api, doc, QUESTION, cfg.answer_tokens, stop=work.stops)
    except pc.Refused as exc:  # llama-server: a document past its trained context
        yield {"length": length, "refused": str(exc), "key": key, "hit": False}
        return
    finally:
        api.close()
    figures = pc.figures(reply)
    prompt = figures["prompt_tokens"] or 0
    yield {
        "length": length,
        "wall_s": reply.latency_s,
        "prompt_tokens_per_wall_s": prompt / reply.latency_s,
        **figures,
        "kv_bytes": _kv_bytes(step, server, figures),
        "answer": reply.text,
        "key": key,
        "hit": key in reply.text,
    }


def measure_reuse(
    url: str, step: Step, work: Workload, cfg: PeerConfig, server: ServerProcess
) -> Iterator[dict[str, Any]]:
    """Two streamed questions about the demo document, one after the other."""
    api = _warm_chat(url, work)
    first = pc.chat(api, work.demo, QUESTION, cfg.answer_tokens, True, work.stops)
    second = pc.chat(api, work.demo, SECOND_QUESTION, cfg.answer_tokens, True, work.stops)
    api.close()
    one, two = pc.figures(first), pc.figures(second)
    yield {
        "ttft_first_s": first.ttft_s,
        "ttft_second_s": second.ttft_s,
        "latency_first_s": first.latency_s,
        "latency_second_s": second.latency_s,
        "prompt_tokens": two["prompt_tokens"],
        "cached_tokens_first": one["cached_tokens"],
        "cached_tokens_second": two["cached_tokens"],
        "answer_first": first.text,
        "answer_second": second.text,
        "hit_first": cfg.demo_key in first.text,
        "hit_second": cfg.demo_key in second.text,
        "kv_bytes": _kv_bytes(step, server, two),
    }


MEASURES: dict[str, Measure] = {
    "serve": measure_serve,
    "prefill": measure_prefill,
    "reuse": measure_reuse,
}


def argv_for(cfg: PeerConfig, launch: Launch) -> Callable[[int], list[str]]:
    """The command line of ``launch`` for a port."""
    if launch.server == PEER:
        return lambda port: peer_argv(
            cfg.peer_binary,
            cfg.model,
            port,
            cfg.threads,
            launch,
            cfg.chat_template_file,
            gpu_layers=cfg.gpu_layers,
        )
    return lambda port: kvtrim_argv(cfg.model, port, cfg.threads, launch, cfg.gpu_layers)


def _slug(i: int, step: Step) -> str:
    who = step.launch.server if step.launch.server == PEER else f"kvtrim-{step.launch.budget}"
    config = step.config.replace(" ", "").replace(".", "-")
    return f"{i:03d}-{step.part}-{config}-{who}-r{step.round}.log"


def _line(i: int, n: int, record: dict[str, Any]) -> str:
    """A progress line: the step and a record's numbers."""
    figures = " ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in record.items()
        if isinstance(v, (int, float)) and k not in ("round", "order")
    )
    return f"[{i + 1}/{n}] {record['part']} {record['config']} {record['label']}: {figures}"


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM raises ``SystemExit`` while inside (in the main thread), so that the
    ``finally`` of every running server stops it, as on Ctrl+C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(
    cfg: PeerConfig,
    engine: Engine,
    out_dir: Path,
    step: Callable[[str], None],
    command: str,
) -> dict[str, Any]:
    """Every step of ``schedule(cfg)``, one server at a time; the result as
    ``OUT/peer.json`` holds it (rewritten after each record)."""
    if not engine.model.info.chat_template:  # llama-server would use ChatML
        path = out_dir / "peer-logs" / "chat-template.jinja"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(FALLBACK_TEMPLATE)
        cfg.chat_template_file = str(path.resolve())
    records = Records(out_dir / "peer.json", command, cfg, engine.model_name)
    work = Workload.build(engine, cfg)
    steps = schedule(cfg)
    with _sigterm_exits():
        for i in range(len(steps)):
            _run_step(cfg, work, out_dir, records, i, steps, step)
    return records.result


def _run_step(
    cfg: PeerConfig,
    work: Workload,
    out_dir: Path,
    records: Records,
    i: int,
    steps: list[Step],
    progress: Callable[[str], None],
) -> None:
    """Start step ``i``'s server, measure, record each result, stop the server."""
    s = steps[i]
    kvtrim = s.launch.server == KVTRIM
    server = ServerProcess(argv_for(cfg, s.launch), out_dir / "peer-logs" / _slug(i, s))
    with server as url:
        for measured in MEASURES[s.part](url, s, work, cfg, server):
            record = {
                "part": s.part,
                "round": s.round,
                "order": i,
                "config": s.config,
                "server": s.launch.server,
                "label": s.launch.label,
                "budget": s.launch.budget if kvtrim else None,
                "policy": s.launch.policy if kvtrim else None,
                "ready_s": server.ready_after_s,
                **measured,
            }
            records.emit(record)
            progress(_line(i, len(steps), record))
