"""The two servers of ``kvtrim bench --peer``: llama.cpp's ``llama-server`` and
``kvtrim serve``, each a subprocess of its own on a free loopback port, ready when
``GET /health`` answers 200 (both servers have it), always stopped afterwards
(terminate, then kill), also on Ctrl+C and errors.

Each start writes the server's stdout and stderr to a log file; llama-server's
KV bytes are read from it (the ``llama_kv_cache: size = X MiB`` lines, one per
cache: a model with sliding-window layers has two). Units: bytes, seconds.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from ..errors import PeerError
from ..native.cpu import resolve_repack

PEER = "llama-server"
KVTRIM = "kvtrim"
HOST = "127.0.0.1"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "peer" / "build_llama_server.sh"
READY_S = 600.0  # a server that has not answered /health by then failed to start
STOP_S = 15.0  # seconds between terminate and kill

LINKAGE = {
    "shared": "with shared libraries beside it (llama.cpp's default build, as its releases are)",
    "static": "statically into the binary (about 4% faster at prompts than the shared "
    "build on 2 cores; not llama.cpp's default)",
}


def linkage(binary: str) -> str:
    """How ``binary`` links llama.cpp, as the build script wrote it beside the binary
    (``version``: "0.3.36 shared"); a binary built elsewhere says so."""
    try:
        with open(Path(binary).parent / "version", "rb") as f:
            words = f.read(256).decode("utf-8").split()
    except (OSError, UnicodeDecodeError):
        words = []
    if words and re.fullmatch(r"\d+\.\d+\.\d+", words[0]):
        if len(words) == 1:  # the script before issue 37's linkage choice built it static
            words.append("static")
        if len(words) == 2 and words[1] in LINKAGE:
            return f"built from llama-cpp-python {words[0]}'s llama.cpp, linked {LINKAGE[words[1]]}"
    return "not built by scripts/peer/build_llama_server.sh (its linkage unknown)"


# kvtrim's chat format for a model without a chat template (session/prompts.py
# chat_prompt), for llama-server, which would otherwise fall back to ChatML
FALLBACK_TEMPLATE = """\
{%- for m in messages -%}
{%- if m['role'] == 'system' -%}
{{ m['content'] | trim }}{{ '\\n\\n' }}
{%- elif m['role'] == 'user' and loop.last -%}
{{ 'Question: ' }}{{ m['content'] | trim }}{{ '\\nAnswer:' }}
{%- elif m['role'] == 'user' -%}
{{ 'Question: ' }}{{ m['content'] | trim }}{{ '\\n' }}
{%- elif m['role'] == 'assistant' -%}
{{ 'Answer: ' }}{{ m['content'] | trim }}{{ '\\n\\n' }}
{%- endif -%}
{%- endfor -%}
"""
_KV_SIZE = re.compile(r"llama_kv_cache: size = +([0-9.]+) MiB \(")
_NEW_CONTEXT = "llama_context: constructing llama_context"
_MIB = 2**20


@dataclass(frozen=True)
class Launch:
    """One server start. ``ctx``: llama-server's ``-c`` (cells over all its ``-np``
    slots); ``kv_cells``, ``budget`` and ``policy``: kvtrim serve's options."""

    server: str
    parallel: int = 1
    ctx: int | None = None
    kv_cells: int | None = None
    budget: int = 512
    policy: str = "snapkv"
    kv_layout: str = "shared"  # kvtrim --kv-layout (several requests only)

    @property
    def label(self) -> str:
        """How the report names this server and its settings."""
        if self.server == PEER:
            return f"{PEER} -np {self.parallel} -c {self.ctx}"
        cells = f" --kv-cells {self.kv_cells}" if self.kv_cells else ""
        if self.kv_layout != "shared":
            cells += f" --kv-layout {self.kv_layout}"
        return (
            f"{KVTRIM} --parallel {self.parallel}{cells} --policy {self.policy} "
            f"--budget {self.budget}"
        )


def peer_argv(
    binary: str,
    model: str,
    port: int,
    threads: int,
    launch: Launch,
    template: str = "",
    repack: bool | None = None,
    gpu_layers: int = 0,
) -> list[str]:
    """llama-server's command line: its defaults but for the slots, context, threads
    and GPU layers (``-ngl``, named always: a CUDA build's default offloads what fits),
    a log that shows its KV caches (``-lv 4``: libllama's info lines), where
    ``template`` names a file, that chat template, and ``--no-repack`` where kvtrim
    turns repacking off too (``repack`` None: kvtrim's own default decision,
    ``native.cpu.resolve_repack``; AMX CPUs crash repacking)."""
    if repack is None:
        repack = resolve_repack().repack
    chat = ["--jinja", "--chat-template-file", template] if template else []
    chat += [] if repack else ["--no-repack"]
    return [
        binary,
        "-m",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-ngl",
        "all" if gpu_layers < 0 else str(gpu_layers),  # its -1 would be "auto"
        "-np",
        str(launch.parallel),
        "-c",
        str(launch.ctx),
        "-lv",
        "4",
        "--metrics",  # llama_decode calls per load (peer_client.decode_counts)
        *chat,
    ]


def kvtrim_argv(
    model: str, port: int, threads: int, launch: Launch, gpu_layers: int = 0
) -> list[str]:
    """``kvtrim serve``'s command line, run by this Python (``python -m engine.cli``)."""
    argv = [
        sys.executable,
        "-m",
        "engine.cli",
        "serve",
        "--model",
        model,
        "--host",
        HOST,
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--parallel",
        str(launch.parallel),
        "--policy",
        launch.policy,
        "--budget",
        str(launch.budget),
        "--max-queue",
        "64",
        "--gpu-layers",
        str(gpu_layers),
    ]
    if launch.kv_cells:
        argv += ["--kv-cells", str(launch.kv_cells)]
    if launch.kv_layout != "shared":
        argv += ["--kv-layout", launch.kv_layout]
    return argv


def free_port() -> int:
    """A loopback TCP port no one listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def kv_log_bytes(log: str) -> int | None:
    """Bytes of llama-server's KV caches from its log: the sum of the
    ``llama_kv_cache: size = X MiB (...)`` lines of the last context it made (one
    line per cache: a sliding-window model has two; X covers every slot's stream);
    None without any. The log prints MiB to two decimals: good to ~5 KiB a line."""
    start = log.rfind(_NEW_CONTEXT)
    found = _KV_SIZE.findall(log[max(start, 0) :])
    if not found:
        return None
    return sum(round(float(mib) * _MIB) for mib in found)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ('' when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess:
    """A server subprocess, as a context manager: ``with ServerProcess(...) as url``
    starts it on a free loopback port and returns its base URL once ``/health``
    answers 200; leaving the block stops it (terminate, then kill after
    ``STOP_S``), whatever ended the block. Its own process group, so a Ctrl+C
    reaches this process only and the ``finally`` stops the server."""

    def __init__(
        self, argv_for: Callable[[int], list[str]], log_path: Path, ready_s: float = READY_S
    ) -> None:
        """``argv_for(port)``: the command line for a port."""
        self.argv_for = argv_for
        self.log_path = log_path
        self.ready_s = ready_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0  # time.perf_counter() at the start
        self.ready_after_s: float | None = None

    def __enter__(self) -> str:
        port = free_port()
        argv = self.argv_for(port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            self.started = time.perf_counter()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://{HOST}:{port}"
        try:
            self._wait_ready(url)
        except BaseException:
            self.stop()
            raise
        self.ready_after_s = time.perf_counter() - self.started
        return url

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_ready(self, url: str) -> None:
        """Until ``/health`` answers 200; raises when the process exits or
        ``ready_s`` pass first."""
        assert self.proc is not None
        deadline = time.perf_counter() + self.ready_s
        with httpx.Client(timeout=5) as http:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise PeerError(
                        f"{self.log_path.name}: the server exited ({self.proc.returncode}) "
                        f"before it was ready:\n{log_tail(self.log_path)}"
                    )
                try:
                    if http.get(f"{url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
        raise PeerError(f"{self.log_path.name}: not ready after {self.ready_s:.0f} s")

    def stop(self) -> int | None:
        """Terminate the server, kill it if it is still there after ``STOP_S``;
        returns its exit status (None when it never started)."""
        proc = self.proc
        if proc is None:
            return None
        try:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pass
        finally:  # also when a second Ctrl+C comes while it stops
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode

    def log(self) -> str:
        """What the server has written so far."""
        return self.log_path.read_text(errors="replace")
