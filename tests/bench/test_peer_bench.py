"""``kvtrim bench --peer llama-server`` (engine/bench/peer*.py): the log and response
parsing, the alternation, the targets and the report without a model or a binary;
end to end against a fake peer (tests/helpers/fake_llama_server.py: kvtrim serve taking
llama-server's options) and, where it is built, the real llama-server."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from helpers.json_server import JsonServer

from engine.bench import peer, peer_report
from engine.bench import peer_client as pc
from engine.bench import peer_servers as ps
from engine.cli.main import main
from engine.errors import ConfigError, PeerError
from engine.native.cpu import resolve_repack
from engine.session.config import default_threads
from engine.session.prompts import chat_prompt

ROOT = Path(__file__).resolve().parents[2]
FAKE_PEER = ROOT / "tests" / "helpers" / "fake_llama_server.py"
MIB = 2**20
THREADS = min(2, default_threads())  # not more than this worker may use (conftest)

# llama-server's log with -lv 4, as it reads for the default model (-np 4 -c 1024)
PEER_LOG = """\
0.02.332.367 I llama_context: constructing llama_context
0.02.332.389 I llama_context: n_seq_max             = 4
0.02.332.623 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 256 cells
0.02.332.666 I llama_kv_cache:        CPU KV buffer size =     3.00 MiB
0.02.332.781 I llama_kv_cache: size =    3.00 MiB (   256 cells,   3 layers,  4/4 seqs), \
K (f16):    1.50 MiB, V (f16):    1.50 MiB
0.02.332.804 I llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
0.02.332.897 I llama_kv_cache:        CPU KV buffer size =    15.00 MiB
0.02.340.978 I llama_kv_cache: size =   15.00 MiB (   256 cells,  15 layers,  4/4 seqs), \
K (f16):    7.50 MiB, V (f16):    7.50 MiB
0.02.770.652 I srv    load_model: prompt cache is enabled, size limit: 8192 MiB
"""


# ---------------------------------------------------------------- parsing


def test_kv_bytes_sum_the_cache_lines_of_llama_servers_log():
    assert ps.kv_log_bytes(PEER_LOG) == 18 * MIB  # the global and the sliding-window cache
    assert ps.kv_log_bytes("no cache here\n") is None


def test_kv_bytes_count_only_the_last_context_made():
    first = PEER_LOG.replace("3.00 MiB (", "99.00 MiB (")
    assert ps.kv_log_bytes(first + PEER_LOG) == 18 * MIB
    assert ps.kv_log_bytes("llama_kv_cache: size =    1.25 MiB (  10 cells") == round(1.25 * MIB)


def test_figures_from_llama_servers_timings():
    timings = {"cache_n": 9203, "prompt_n": 19, "prompt_ms": 80.0, "prompt_per_second": 237.5}
    usage = {"prompt_tokens": 9222, "completion_tokens": 7}
    got = pc.figures(pc.Reply("x", 1.0, extra={"timings": timings, "usage": usage}))
    assert got["server_prompt_tokens_per_s"] == 237.5
    assert got["cached_tokens"] == 9203  # no prompt_tokens_details: timings.cache_n
    assert (got["prompt_tokens"], got["completion_tokens"]) == (9222, 7)
    assert got["kv_bytes_held"] is None
    usage["prompt_tokens_details"] = {"cached_tokens": 9000}
    assert pc.figures(pc.Reply("x", 1.0, extra={"usage": usage}))["cached_tokens"] == 9000
    bare = pc.figures(pc.Reply("x", 1.0, extra={"timings": timings}))
    assert bare["prompt_tokens"] == 19


def test_figures_from_kvtrims_own_object():
    own = {"prefill_tokens_per_s": 812.4, "kv_bytes_held": 15_728_640}
    usage = {"prompt_tokens": 9222, "prompt_tokens_details": {"cached_tokens": 0}}
    got = pc.figures(pc.Reply("x", 1.0, extra={"kvtrim": own, "usage": usage}))
    assert got["server_prompt_tokens_per_s"] == 812.4
    assert got["kv_bytes_held"] == 15_728_640 and got["cached_tokens"] == 0


def test_stream_pieces_and_extras():
    assert pc._piece({"choices": []}, chat=True) == ""
    assert pc._piece({"choices": [{"delta": {"role": "assistant"}}]}, chat=True) == ""
    assert pc._piece({"choices": [{"delta": {"content": " 6"}}]}, chat=True) == " 6"
    assert pc._piece({"choices": [{"text": "a"}]}, chat=False) == "a"
    into: dict = {}
    pc._keep_extra(into, {"usage": None, "timings": {"cache_n": 1}, "id": "x"})
    pc._keep_extra(into, {"usage": {"prompt_tokens": 3}})
    assert into == {"timings": {"cache_n": 1}, "usage": {"prompt_tokens": 3}}


def test_the_fallback_template_renders_kvtrims_chat_format():
    """A model without a chat template: llama-server gets a template that renders
    what kvtrim reads (session/prompts.chat_prompt), not ChatML."""
    jinja2 = pytest.importorskip("jinja2")
    model = SimpleNamespace(info=SimpleNamespace(chat_template=None), add_bos=True)
    messages = [
        {"role": "system", "content": "  The document.\n "},
        {"role": "user", "content": "Q1? "},
        {"role": "assistant", "content": " A1."},
        {"role": "user", "content": " What is the pass key?"},
    ]
    p = chat_prompt(model, messages)
    rendered = jinja2.Template(ps.FALLBACK_TEMPLATE).render(messages=messages)
    assert rendered == p.prefix + p.document + p.suffix


def _completions(fail_at: int | None = None) -> JsonServer:
    """A tiny /v1/completions server: answers ``ok`` with a usage and llama-server's
    timings, or a 500 from request ``fail_at`` on (``len(server.requests)`` counts)."""
    requests: list[object] = []

    def reply(path: str, body: object) -> tuple[int, dict]:
        requests.append(body)
        failed = fail_at is not None and len(requests) >= fail_at
        return 500 if failed else 200, {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": "m",
            "choices": [{"text": "ok", "index": 0, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            "timings": {"prompt_per_second": 100.0, "cache_n": 0},
        }

    return JsonServer(reply)


def test_load_sends_every_prompt_once_from_n_clients():
    server = _completions()
    try:
        got = pc.load(server.url, [f"p{i}" for i in range(6)], 3, 2, stream=False)
    finally:
        server.close()
    assert len(server.requests) == 6 and got["answers"] == ["ok"] * 6
    assert got["completion_tokens"] == [2] * 6 and got["prompt_tokens"] == [5] * 6
    assert got["requests_per_s"] == pytest.approx(6 / got["wall_s"])
    assert got["latency_p50_s"] > 0 and got["ttft_p50_s"] is None


def test_load_sends_each_prompt_its_own_length():
    """``gen`` as one figure a prompt: each request's ``max_tokens`` is its own; a
    list of another length is refused before anything is sent."""
    server = _completions()
    try:
        pc.load(server.url, ["a", "b", "c"], 2, [32, 22, 26], stream=False)
        with pytest.raises(ValueError, match="2 lengths for 3 prompts"):
            pc.load(server.url, ["a", "b", "c"], 2, [32, 22], stream=False)
    finally:
        server.close()
    sent = {body["prompt"]: body["max_tokens"] for _, body in server.requests}
    assert sent == {"a": 32, "b": 22, "c": 26} and len(server.requests) == 3


def test_load_stops_sending_after_a_failed_request():
    import openai

    server = _completions(fail_at=2)
    try:
        with pytest.raises(openai.InternalServerError):
            pc.load(server.url, [f"p{i}" for i in range(20)], 1, 2, stream=False)
    finally:
        server.close()
    assert len(server.requests) == 2


# ---------------------------------------------------------------- alternation


def test_every_configuration_runs_both_servers_each_round_in_turned_order():
    cfg = peer.PeerConfig()
    steps = peer.schedule(cfg)
    assert steps[0].part == "serve" and steps[-1].part == "reuse"
    groups: dict = {}
    for i, s in enumerate(steps):
        groups.setdefault((s.part, s.round, s.config), []).append((i, s.launch.server))
    for (_, r, config), runs in groups.items():
        order = [i for i, _ in runs]
        assert order == list(range(order[0], order[0] + len(order))), "no other start between"
        servers = [w for _, w in runs]
        if r % 2:  # odd rounds: kvtrim first, so a drift within a round favours neither
            servers.reverse()
        assert servers[0] == ps.PEER and all(w == ps.KVTRIM for w in servers[1:]), config
    per_part = {p: {c for (q, _, c) in groups if q == p} for p in peer.PARTS}
    for part, r, config in groups:
        assert r in range(cfg.rounds) and config in per_part[part]
    assert len(groups) == cfg.rounds * sum(len(v) for v in per_part.values())
    rounds = [s.round for s in steps if s.part == "serve"]
    assert rounds == sorted(rounds), "each round of a part is whole before the next"


def test_the_servers_settings_per_configuration():
    cfg = peer.PeerConfig()
    serve = dict(peer.configurations(cfg, "serve"))
    a, b = serve["8 clients"]
    assert (a.server, a.parallel, a.ctx) == (ps.PEER, 8, 8 * 256)
    assert (b.server, b.parallel, b.kv_cells, b.budget) == (ps.KVTRIM, 8, 2048, 512)
    one = serve["1 clients"][1]
    assert (one.parallel, one.kv_cells, one.budget) == (1, None, 512)
    prefill = dict(peer.configurations(cfg, "prefill"))
    assert list(prefill) == ["8192 tokens", "32768 tokens", "65536 tokens", peer.DEMO]
    a, *kv = prefill["65536 tokens"]
    assert (a.parallel, a.ctx) == (1, 65536 + 512)
    assert [(k.policy, k.budget, k.parallel) for k in kv] == [
        ("snapkv", 1024, 1),
        ("snapkv", 4096, 1),
    ]
    a, b = prefill[peer.DEMO]
    assert (a.ctx, b.policy, b.budget) == (10240, "full", 10240)
    ((config, (a, b)),) = peer.configurations(cfg, "reuse")
    assert (config, a.ctx, b.budget, b.parallel) == (peer.DEMO, 10240, 1024, 1)


def test_kvtrims_pool_holds_as_many_cells_as_llama_servers_slots():
    """A mix whose slots grow (480-token prompts: -c 8 x 768) gives kvtrim's pool as
    many cells, not 2,048 (it compressed every request: 0.52x, not the same job)."""
    serve = dict(peer.configurations(peer.PeerConfig(slot_cells=768), "serve"))
    for n in (4, 8):
        a, b = serve[f"{n} clients"]
        assert (a.ctx, b.kv_cells) == (n * 768, max(2048, n * 768))


def test_the_serve_part_with_kvtrims_streams_layout():
    """--peer-kv-layout streams: each kvtrim request its own --kv-cells/N cells, as
    llama-server gives each slot -c/N; one client stays a lone session."""
    cfg = peer.PeerConfig(kv_layout="streams")
    serve = dict(peer.configurations(cfg, "serve"))
    eight, one = serve["8 clients"][1], serve["1 clients"][1]
    assert eight.kv_layout == "streams" and one.kv_layout == "shared"
    assert eight.label.endswith("--kv-cells 2048 --kv-layout streams --policy snapkv --budget 512")
    argv = ps.kvtrim_argv("m", 1, 1, eight)
    assert argv[argv.index("--kv-layout") + 1] == "streams"
    assert "--kv-layout" not in ps.kvtrim_argv("m", 1, 1, one)


def test_the_quick_grid():
    cfg = peer.PeerConfig.quick()
    assert (cfg.rounds, cfg.clients, cfg.requests, cfg.lengths) == (1, [1, 2], 4, [2048, 4096])


def test_both_servers_get_the_same_model_and_threads():
    launch = ps.Launch(ps.PEER, 4, ctx=1024)
    argv = ps.peer_argv("/bin/llama-server", "/m.gguf", 8001, 3, launch, "/t.jinja")
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "/bin/llama-server"
    assert flags["-m"] == "/m.gguf" and flags["-t"] == flags["-tb"] == "3"
    assert (flags["-np"], flags["-c"], flags["--port"], flags["--host"]) == (
        "4",
        "1024",
        "8001",
        "127.0.0.1",
    )
    assert "-lv" in argv and argv[argv.index("--chat-template-file") + 1] == "/t.jinja"
    assert "--chat-template-file" not in ps.peer_argv("b", "m", 1, 1, launch)
    mine = ps.kvtrim_argv("/m.gguf", 8002, 3, ps.Launch(ps.KVTRIM, 4, kv_cells=2048))
    assert mine[:4] == [sys.executable, "-m", "engine.cli", "serve"]
    opts = dict(zip(mine[4::2], mine[5::2], strict=False))
    assert opts["--model"] == "/m.gguf" and opts["--threads"] == "3"
    assert (opts["--parallel"], opts["--kv-cells"], opts["--budget"]) == ("4", "2048", "512")
    assert "--kv-cells" not in ps.kvtrim_argv("m", 1, 1, ps.Launch(ps.KVTRIM, 1))
    assert "--no-repack" not in ps.peer_argv("b", "m", 1, 1, launch, repack=True)
    assert "--no-repack" in ps.peer_argv("b", "m", 1, 1, launch, repack=False)
    # by default repacking follows kvtrim's own decision for this CPU
    assert ("--no-repack" in argv) == (not resolve_repack().repack)
    # GPU layers: named to both always (a CUDA llama-server offloads what fits unasked)
    assert flags["-ngl"] == "0" and opts["--gpu-layers"] == "0"
    every = ps.peer_argv("b", "m", 1, 1, launch, gpu_layers=-1)  # llama-server's -1: auto
    assert every[every.index("-ngl") + 1] == "all"
    gpu = peer.PeerConfig(gpu_layers=99, peer_binary="b", model="m", threads=2)
    both = [
        peer.argv_for(gpu, launch)(1)
        for launch in dict(peer.configurations(gpu, "serve"))["8 clients"]
    ]
    assert both[0][both[0].index("-ngl") + 1] == "99"
    assert both[1][both[1].index("--gpu-layers") + 1] == "99"


def test_another_mix_of_prompt_and_output_lengths():
    """--peer-mix 64x96: the serve part's passages and outputs; llama-server's slots
    grow to hold a longer mix, never shrink."""
    from engine.cli.bench import _mix, _peer_config

    def config(
        mix: str, gpu_layers: int = 0, temperature: float = 0.0, ignore_eos: bool = False
    ) -> peer.PeerConfig:
        args = SimpleNamespace(
            quick=False, parts=None, clients=None, lengths=None, rounds=None, seed=None,
            peer_kv_layout=None, peer_mix=_mix(mix), peer_binary=Path("/bin/true"), model=None,
            threads=1, peer_gpu_layers=gpu_layers, peer_temperature=temperature,
            peer_ignore_eos=ignore_eos,
        )  # fmt: skip
        return _peer_config(args, io.StringIO())

    small, big = config("64x96"), config("600X200", gpu_layers=-1)
    assert (small.passage_tokens, small.gen_tokens, small.slot_cells) == (64, 96, 256)
    assert (big.passage_tokens, big.gen_tokens, big.slot_cells) == (600, 200, 1024)
    assert (small.gpu_layers, big.gpu_layers) == (0, -1)
    with pytest.raises(ConfigError, match="--peer-gpu-layers"):
        config("64x96", gpu_layers=-2)
    assert (small.temperature, config("64x96", temperature=1).temperature) == (0.0, 1.0)
    assert (small.ignore_eos, config("64x96", ignore_eos=True).ignore_eos) == (False, True)
    for bad in (-0.5, float("nan"), 2.5):
        with pytest.raises(ConfigError, match="--peer-temperature"):
            config("64x96", temperature=bad)
    for bad in ("64", "x9", "0x5", "ax5"):
        with pytest.raises(argparse.ArgumentTypeError):
            _mix(bad)


# ---------------------------------------------------------------- server processes


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "server.py"
    path.write_text(body)
    return [sys.executable, str(path)]


HEALTHY = """\
import http.server, signal, sys
if len(sys.argv) > 2:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
print("llama_kv_cache: size =    2.00 MiB (  10 cells", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_server_is_ready_on_health_and_stopped_when_the_block_fails(tmp_path):
    argv = _script(tmp_path, HEALTHY)
    server = ps.ServerProcess(lambda port: [*argv, str(port)], tmp_path / "a.log", ready_s=60)
    with pytest.raises(KeyboardInterrupt), server as url:
        assert url.startswith("http://127.0.0.1:")
        assert server.proc is not None and server.proc.poll() is None
        raise KeyboardInterrupt  # Ctrl+C in the middle of a measurement
    assert server.proc.poll() is not None
    assert ps.kv_log_bytes(server.log()) == 2 * MIB


def test_a_server_that_ignores_terminate_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(ps, "STOP_S", 0.5)
    argv = _script(tmp_path, HEALTHY)
    server = ps.ServerProcess(lambda port: [*argv, str(port), "stubborn"], tmp_path / "b.log")
    with server:
        pass
    assert server.proc is not None and server.proc.returncode == -9


def test_a_server_that_exits_before_it_is_ready_is_reported(tmp_path):
    argv = _script(tmp_path, "import sys\nprint('error: no such model')\nsys.exit(3)\n")
    server = ps.ServerProcess(lambda port: argv, tmp_path / "c.log")
    with pytest.raises(PeerError, match=r"exited \(3\)[\s\S]*no such model"), server:
        pass


def test_free_ports_are_loopback_ports_no_one_holds():
    port = ps.free_port()
    assert 1024 <= port <= 65535


# ---------------------------------------------------------------- targets and report


def _serve(server: str, clients: int, stream: bool, rps: float, r: int = 0) -> dict:
    return {
        "part": "serve",
        "round": r,
        "config": f"{clients} clients",
        "server": server,
        "budget": 512 if server == ps.KVTRIM else None,
        "policy": "snapkv" if server == ps.KVTRIM else None,
        "clients": clients,
        "stream": stream,
        "requests": 4,
        "requests_per_s": rps,
        "latency_p50_s": 1.0 / rps,
        "ttft_p50_s": 0.2 if stream else None,
        "completion_tokens": [32] * 4,
        "answers": ["a", "b", "c", "d"],
    }


def _prefill(config: str, server: str, wall: float, kv: int, *, policy="snapkv", budget=1024):
    length = int(config.split()[0]) if config[0].isdigit() else None
    prompt = length or 9222
    return {
        "part": "prefill",
        "round": 0,
        "config": config,
        "server": server,
        "budget": budget if server == ps.KVTRIM else None,
        "policy": policy if server == ps.KVTRIM else None,
        "length": length,
        "wall_s": wall,
        "prompt_tokens": prompt,
        "prompt_tokens_per_wall_s": prompt / wall,
        "server_prompt_tokens_per_s": prompt / (wall - 0.5),
        "kv_bytes": kv,
        "answer": " The pass key is 12345.",
        "hit": True,
    }


def _reuse(server: str, first: float, second: float, hit: bool = True) -> dict:
    return {
        "part": "reuse",
        "round": 0,
        "config": peer.DEMO,
        "server": server,
        "budget": 1024 if server == ps.KVTRIM else None,
        "policy": "snapkv" if server == ps.KVTRIM else None,
        "ttft_first_s": first,
        "ttft_second_s": second,
        "prompt_tokens": 9222,
        "cached_tokens_second": 9203,
        "answer_second": " The pass key is 68142." if hit else " 1. 2. 3.",
        "hit_first": True,
        "hit_second": hit,
    }


def _result(records: list[dict], **config) -> dict:
    cfg = {**vars(peer.PeerConfig()), "peer_binary": "/x/llama-server", "model": "/m/g.gguf"}
    return {
        "command": "kvtrim bench --peer llama-server",
        "model": "Gemma 3 270m",
        "config": {**cfg, **config},
        "records": records,
        "elapsed_s": 5.0,
    }


def _fake_run() -> dict:
    big, small = 200 * MIB, 15 * MIB
    records = [
        *(_serve(ps.PEER, c, s, 2.0) for c in (1, 4, 8) for s in (False, True)),
        *(
            _serve(ps.KVTRIM, c, s, 2.2 if c == 1 else 1.5)
            for c in (1, 4, 8)
            for s in (False, True)
        ),
        _prefill("32768 tokens", ps.PEER, 100.0, big),
        _prefill("32768 tokens", ps.KVTRIM, 90.0, small),
        _prefill("32768 tokens", ps.KVTRIM, 95.0, 40 * MIB, budget=4096),
        _prefill("65536 tokens", ps.PEER, 300.0, 2 * big),
        _prefill("65536 tokens", ps.KVTRIM, 310.0, small),
        _prefill(peer.DEMO, ps.PEER, 20.0, 50 * MIB),
        _prefill(peer.DEMO, ps.KVTRIM, 20.5, 120 * MIB, policy="full", budget=10240),
        _reuse(ps.PEER, 20.0, 0.5),
        _reuse(ps.KVTRIM, 20.0, 1.5),
    ]
    return _result(records)


def test_the_targets_from_records():
    found = {t: (m, ok) for t, m, ok in peer_report.targets(_fake_run())}
    serve = {t: ok for t, (_, ok) in found.items() if t.startswith("serve")}
    assert serve == {
        "serve, 1 client, plain: kvtrim req/s >= 1.0x llama-server's": True,
        "serve, 1 client, streaming: kvtrim req/s >= 1.0x llama-server's": True,
        "serve, 8 clients, plain: kvtrim req/s >= 1.0x llama-server's": False,
        "serve, 8 clients, streaming: kvtrim req/s >= 1.0x llama-server's": False,
    }
    demo = next(v for t, v in found.items() if t.startswith("full-cache prefill"))
    assert demo[1] is True and "(0.98x" in demo[0]  # 20.5 s against 20 s: 0.975x the tok/s
    long = {t.split(" tokens")[0]: v for t, v in found.items() if t.startswith("SnapKV")}
    assert long["SnapKV 1,024 on 32,768"][1] is True
    assert long["SnapKV 1,024 on 65,536"][1] is False  # 310 s against 300 s
    assert "(0.075x)" in long["SnapKV 1,024 on 32,768"][0]
    (reuse,) = [v for t, v in found.items() if t.startswith("second question")]
    assert reuse[1] is True and "(0.075x)" in reuse[0] and "llama-server 0.025x" in reuse[0]


def test_the_targets_need_the_answer_and_judge_only_what_ran():
    wrong = _result([_reuse(ps.PEER, 20.0, 0.5), _reuse(ps.KVTRIM, 20.0, 1.0, hit=False)])
    ((_, measured, ok),) = peer_report.targets(wrong)
    assert not ok and "right 0/1" in measured
    assert peer_report.targets(_result([])) == []
    quick = _result(
        [
            _prefill("2048 tokens", ps.PEER, 10.0, 20 * MIB),
            _prefill("4096 tokens", ps.PEER, 20.0, 30 * MIB),
            _prefill("4096 tokens", ps.KVTRIM, 15.0, 2 * MIB),
        ]
    )
    ((target, _, ok),) = peer_report.targets(quick)
    assert target.startswith("SnapKV 1,024 on 4,096 tokens") and ok  # the longest run


def test_a_document_llama_server_refuses_is_a_record_and_judged_by_kvtrims_answer(tmp_path):
    """llama-server refuses a prompt past its context (64K past a 32K trained context):
    the run goes on, the table says so and the target judges kvtrim's read alone."""
    refused = {
        "part": "prefill", "round": 0, "config": "65536 tokens", "server": ps.PEER,
        "budget": None, "policy": None, "length": 65536, "hit": False,
        "refused": "400: request (65534 tokens) exceeds the available context size",
    }  # fmt: skip
    result = _result([refused, _prefill("65536 tokens", ps.KVTRIM, 160.0, 15 * MIB)])
    ((target, measured, ok),) = peer_report.targets(result)
    assert target.startswith("SnapKV 1,024 on 65,536 tokens") and ok
    assert "llama-server refused the document (400: request" in measured and "1/1" in measured
    md = peer_report.markdown(result, peer_report.plot(result, tmp_path))
    assert "refused: 400: request" in md


def test_a_4xx_answer_is_refused_with_the_servers_message():
    import openai

    class Chats:
        def create(self, **body):
            response = httpx.Response(400, request=httpx.Request("POST", "http://x/v1"))
            raise openai.BadRequestError(
                "bad", response=response, body={"error": {"message": "too long for me"}}
            )

    api = type("Api", (), {"chat": type("C", (), {"completions": Chats()})()})()
    with pytest.raises(pc.Refused, match="400: too long for me"):
        pc.chat(api, "doc", "q", 4)


def test_medians_over_rounds():
    records = [_serve(ps.PEER, 1, False, v, r) for r, v in enumerate((1.0, 3.0, 2.5))]
    med = peer_report.serve_medians(_result(records))
    assert med[(1, False, ps.PEER)]["requests_per_s"] == 2.5
    assert med[(1, False, ps.PEER)]["rounds"] == 3


def test_the_report(tmp_path):
    result = _fake_run()
    path = peer_report.write(result, tmp_path)
    md = path.read_text()
    assert path.name == "peer.md" and (tmp_path / "peer.png").stat().st_size > 5000
    for heading in ("## Serve", "## Prefill", "## Reuse", "## Targets (issue 24)", "## How"):
        assert heading in md
    assert "![kvtrim against llama-server](peer.png)" in md
    assert "| 8 | plain | 2.00 | 1.50 | 0.75x |" in md
    assert "| demo (passkey.txt) | llama-server | 9222 | 20.0 | 1.00 |" in md
    assert "| 32768 tokens | kvtrim snapkv 1024 | 32768 | 90.0 | 0.90 |" in md
    assert md.count("- MISSED: ") == 3 and md.count("- met: ") == 5
    assert "/x/llama-server" in md and "median of 3 round(s)" in md
    assert "stopped before the other starts (llama-server first);" in md
    assert "the range of 3 rounds holds the ratio's true median with 75% confidence" in md
    table = [ln for ln in md.splitlines() if ln.startswith("| 32768 tokens")]
    assert table[0].split(" | ")[1] == "llama-server", "llama-server's row first"


def test_the_report_says_which_server_ran_first_in_a_round():
    """Runs of the counterbalanced schedule turn the order round in odd rounds."""
    records = [
        {**_serve(ps.PEER, 8, False, 2.0, 0), "order": 0},
        {**_serve(ps.KVTRIM, 8, False, 1.9, 0), "order": 1},
        {**_serve(ps.KVTRIM, 8, False, 2.1, 1), "order": 2},
        {**_serve(ps.PEER, 8, False, 2.0, 1), "order": 3},
    ]
    md = peer_report.markdown(_result(records))
    assert "(llama-server first in even rounds, kvtrim first in odd ones)" in md


def test_the_report_of_one_part(tmp_path):
    result = _result([_reuse(ps.PEER, 20.0, 0.5), _reuse(ps.KVTRIM, 20.0, 1.0)])
    md = peer_report.markdown(result, peer_report.plot(result, tmp_path))
    assert "## Reuse" in md and "## Serve" not in md and "## Prefill" not in md
    assert (tmp_path / "peer.png").exists()
    assert peer_report.plot(_result([]), tmp_path / "none") is None


# ---------------------------------------------------------------- the command


def test_bad_options_fail_before_anything_runs(tmp_path):
    err = io.StringIO()
    argv = ["bench", "--peer", "llama-server", "--out", str(tmp_path)]
    assert main([*argv, "--parts", "serve,nope", "--peer-binary", "/bin/true"], err=err) == 2
    assert "unknown part 'nope'" in err.getvalue()
    err = io.StringIO()
    assert main([*argv, "--peer-binary", str(tmp_path / "none")], err=err) == 2
    assert "is not an executable file" in err.getvalue()
    err = io.StringIO()
    assert main([*argv, "--clients", "0", "--peer-binary", "/bin/true"], err=err) == 2
    assert "at least 1" in err.getvalue()
    assert not (tmp_path / "peer.json").exists()


def test_report_only_rewrites_the_report(tmp_path):
    (tmp_path / "peer.json").write_text(json.dumps(_fake_run()))
    out = io.StringIO()
    argv = ["bench", "--peer", "llama-server", "--report-only", "--out", str(tmp_path)]
    assert main(argv, out=out, err=io.StringIO()) == 0
    assert "MISS  serve, 8 clients, plain" in out.getvalue()
    assert (tmp_path / "peer.md").exists() and (tmp_path / "peer.png").exists()


# ---------------------------------------------------------------- end to end


def _small(tmp_path: Path, binary: str) -> peer.PeerConfig:
    """Every part, as small as it goes: 1 client, 2 requests, a 1K document, a demo of
    ~1,200 tokens with the demo's pass key."""
    text = (ROOT / "resources" / "samples" / "passkey.txt").read_text()
    at = text.find("The pass key is 68142")
    demo = tmp_path / "demo.txt"
    demo.write_text(text[:2000] + text[at - 1000 : at + 1000] + text[-1000:])
    from engine.native.embedded import default_model_path

    return peer.PeerConfig(
        peer_binary=binary,
        model=str(default_model_path()),
        threads=2,
        rounds=1,
        clients=[1],
        requests=2,
        warmup=1,
        gen_tokens=8,
        lengths=[1024],
        budgets=[256],
        demo_file=str(demo),
        demo_cells=2048,
        reuse_budget=512,
    )


def _check_run(result: dict, out_dir: Path) -> None:
    records = result["records"]
    assert [r["order"] for r in records] == sorted(r["order"] for r in records)
    assert {r["part"] for r in records} == set(peer.PARTS)
    serve = [r for r in records if r["part"] == "serve"]
    assert len(serve) == 4 and all(r["requests_per_s"] > 0 for r in serve)
    assert all(r["ttft_p50_s"] > 0 for r in serve if r["stream"])
    for r in [r for r in records if r["part"] == "prefill"]:
        assert r["prompt_tokens"] > 900 and r["wall_s"] > 0 and r["kv_bytes"] > 0, r
        assert r["server_prompt_tokens_per_s"] > 0
    (a, b) = [r for r in records if r["part"] == "reuse"]
    assert (a["server"], b["server"]) == (ps.PEER, ps.KVTRIM)
    assert b["cached_tokens_second"] > 1000, "kvtrim read the document once"
    assert b["hit_second"], b["answer_second"]
    md = peer_report.write(result, out_dir).read_text()
    assert "## Targets (issue 24)" in md and (out_dir / "peer.png").exists()
    logs = sorted((out_dir / "peer-logs").glob("*.log"))
    assert len(logs) == len(peer.schedule(peer.PeerConfig(**result["config"])))


def _no_servers_left(before: set[int]) -> None:
    import psutil

    time.sleep(0.5)
    me = psutil.Process()
    assert {p.pid for p in me.children(recursive=True)} <= before


@pytest.mark.slow
def test_every_part_against_a_fake_peer(tmp_path, engine):
    fake = tmp_path / "llama-server"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_PEER}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cfg = _small(tmp_path, str(fake))
    result = peer.run(cfg, engine, tmp_path / "out", lambda line: None, "test")
    _check_run(result, tmp_path / "out")
    _no_servers_left(before)


def _real_binary() -> Path | None:
    found = os.environ.get("KVTRIM_LLAMA_SERVER") or ROOT / ".variants/llama-server/llama-server"
    path = Path(found)
    return path if path.is_file() and os.access(path, os.X_OK) else None


@pytest.mark.slow
@pytest.mark.skipif(_real_binary() is None, reason="no llama-server built ($KVTRIM_LLAMA_SERVER)")
def test_every_part_against_the_real_llama_server(tmp_path, engine):
    cfg = _small(tmp_path, str(_real_binary()))
    result = peer.run(cfg, engine, tmp_path / "out", lambda line: None, "test")
    _check_run(result, tmp_path / "out")
    peer_kv = [
        r["kv_bytes"] for r in result["records"] if r["server"] == ps.PEER and "kv_bytes" in r
    ]
    assert peer_kv and all(kv > 0 for kv in peer_kv), "read from llama-server's log"


@pytest.mark.slow
def test_the_command_quick_serve_part_against_a_fake_peer(tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_PEER}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out_dir = tmp_path / "out"
    argv = ["bench", "--peer", "llama-server", "--peer-binary", str(fake), "--quick"]
    argv += ["--parts", "serve", "--clients", "1", "--threads", str(THREADS), "--out", str(out_dir)]
    out = io.StringIO()
    assert main(argv, out=out, err=io.StringIO()) == 0
    assert "serve, 1 client, plain" in out.getvalue()
    result = json.loads((out_dir / "peer.json").read_text())
    assert [(r["server"], r["stream"]) for r in result["records"]] == [
        (ps.PEER, False),
        (ps.PEER, True),
        (ps.KVTRIM, False),
        (ps.KVTRIM, True),
    ]
    assert result["config"]["threads"] == THREADS and result["config"]["peer_binary"] == str(fake)
    assert "linkage unknown" in result["config"]["peer_build"]  # not the build script's
    assert "linkage unknown" in (out_dir / "peer.md").read_text()


@pytest.mark.parametrize(
    ("version", "says"),
    [
        ("0.3.36 shared\n", "linked with shared libraries beside it (llama.cpp's default"),
        ("0.3.36 static\n", "linked statically into the binary"),
        ("0.3.36\n", "linked statically into the binary"),  # the script before the choice
        ("0.3.36 lto\n", "linkage unknown"),
        ("notes from elsewhere\n", "linkage unknown"),
        (b"\xff\xfe\x00junk", "linkage unknown"),
        (None, "linkage unknown"),
    ],
)
def test_the_report_says_how_llama_server_was_linked(tmp_path, version, says):
    """A static llama-server reads prompts ~4% faster than the shared build that
    llama.cpp makes by default (issue 37): the report names the one it ran."""
    binary = tmp_path / "llama-server"
    binary.write_text("")
    if isinstance(version, bytes):
        (tmp_path / "version").write_bytes(version)
    elif version is not None:
        (tmp_path / "version").write_text(version)
    built = ps.linkage(str(binary))
    assert says in built
    if "unknown" not in says:
        assert built.startswith("built from llama-cpp-python 0.3.36's llama.cpp")
    cfg = dataclasses.asdict(peer.PeerConfig(peer_binary=str(binary), model="m.gguf"))
    how = "\n".join(peer_report._notes({"config": {**cfg, "peer_build": built}}))
    assert f"`{binary}`, {built}, its defaults" in how
    assert "built built" not in how and "built not built" not in how


LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1280
llamacpp:tokens_predicted_total 256
llamacpp:n_decode_total 96
llamacpp:n_busy_slots_per_decode 3.5
"""


def _serving(monkeypatch: pytest.MonkeyPatch, texts: list[str]) -> None:
    """``urlopen`` answers each call with the next of ``texts`` ('' fails to connect)."""

    def urlopen(url: str, timeout: float) -> io.BytesIO:
        text = texts.pop(0)
        if not text:
            raise ConnectionRefusedError(url)
        return io.BytesIO(text.encode())

    monkeypatch.setattr(pc.urllib.request, "urlopen", urlopen)


def test_decode_counts_read_either_servers_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    kvtrim = "kvtrim_pool_decode_steps 40.0\nkvtrim_pool_decode_tokens 1000.0\n"
    _serving(monkeypatch, [LLAMA_METRICS, kvtrim, "kvtrim_pool_decode_steps 0.0\n", ""])
    assert pc.decode_counts("http://x") == {"decodes": 96.0, "tokens": 1536.0}
    assert pc.decode_counts("http://x") == {"decodes": 40.0, "tokens": 1000.0}
    assert pc.decode_counts("http://x") is None  # one sequence: kvtrim runs no pool
    assert pc.decode_counts("http://x") is None  # not reachable
    assert peer._decodes({"decodes": 10, "tokens": 100}, {"decodes": 30, "tokens": 500}) == {
        "decodes": 20,
        "tokens_per_decode": 20.0,
    }
    assert peer._decodes(None, {"decodes": 3, "tokens": 9}) == {}


def test_ignore_eos_goes_to_both_servers_as_their_field():
    """--peer-ignore-eos: each completion carries ``ignore_eos`` (llama-server's field,
    and kvtrim's), so both write every answer to its length; off, nothing is added."""
    sent: list[dict] = []

    class Completions:
        def create(self, **body):
            sent.append(body)
            return SimpleNamespace(model_dump=lambda: {"choices": [{"text": "x"}]})

    api = SimpleNamespace(completions=Completions())
    pc.complete(api, "p", 96, ignore_eos=True)
    pc.complete(api, "p", 96)
    assert sent[0]["extra_body"] == {"ignore_eos": True} and "extra_body" not in sent[1]
    assert "ignore_eos" in peer_report._sampling_line(0.0, True)
    assert "ignore_eos" not in peer_report._sampling_line(0.0)


def test_report_says_where_kvtrim_ended_answers_early():
    """A greedy serve load where kvtrim wrote fewer tokens (its loop guard) gets a note
    with both lengths, and with several clients why they fall out of step; equal
    lengths, a sampled load or a load with no answers get none."""
    short = _serve(ps.KVTRIM, 4, True, 1.8)
    short["completion_tokens"] = [32, 22, 26, 32]
    records = [_serve(ps.PEER, 4, True, 2.0), short, _serve(ps.PEER, 8, False, 2.0),
               _serve(ps.KVTRIM, 8, False, 2.0)]  # fmt: skip
    notes = "\n".join(peer_report._notes(_result(records)))
    assert "(4 clients streaming: 28.0 against 32.0 tokens a request)" in notes
    assert "out of step" in notes and "8 clients" not in notes
    alone = {**short, "clients": 1, "config": "1 clients"}
    one = "\n".join(peer_report._notes(_result([{**records[0], "clients": 1}, alone])))
    assert "1 client streaming: 28.0 against 32.0" in one and "out of step" not in one
    sampled = "\n".join(peer_report._notes(_result(records, temperature=1.0)))
    assert "fewer tokens" not in sampled
    empty = {**short, "completion_tokens": []}
    for kvtrim in (_serve(ps.KVTRIM, 4, True, 1.8), empty):
        even = "\n".join(peer_report._notes(_result([records[0], kvtrim])))
        assert "fewer tokens" not in even


def test_each_rounds_ratio_pairs_the_servers_of_that_round(tmp_path):
    """The per-round ratios pair kvtrim's and llama-server's runs of one round; the
    table and the targets show their range and how many reached the target."""
    records = [
        *(_serve(ps.PEER, 8, False, v, r) for r, v in enumerate((2.0, 2.5, 2.0))),
        *(_serve(ps.KVTRIM, 8, False, v, r) for r, v in enumerate((2.1, 2.0, 1.9))),
        _serve(ps.PEER, 8, True, 2.0, 0),  # no kvtrim run in this round: no ratio
    ]
    result = _result(records)
    ratios = peer_report.serve_round_ratios(result)
    assert ratios == {(8, False): pytest.approx([1.05, 0.8, 0.95])}
    md = peer_report.markdown(result, peer_report.plot(result, tmp_path))
    assert "| 8 | plain | 2.00 | 2.00 | 1.00x | 0.80-1.05 (1/3) |" in md
    ((_, measured, ok),) = [t for t in peer_report.targets(result) if t[0].startswith("serve")]
    assert ok and measured.endswith("(1.00x; per round 0.80-1.05 (1/3))")
