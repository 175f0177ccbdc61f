"""Shared fixtures: one real default model for the whole run; the fast tier.

``pytest -m "not slow"`` runs the tests of pure logic only. A test is ``slow`` when
it uses a fixture that holds the real model (``SLOW_FIXTURES``) or is marked so;
a test not marked slow that loads a model anyway fails with a line saying so, in
the fast tier and in the full run alike (llama.cpp refuses a real model file, in
this process and in its children: tests/fastguard), so the marks cannot fall
behind the tests and CI needs no separate fast-tier run to check them."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

import pytest

# Qt tests run headless; set before pytest-qt creates the QApplication
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# crash logs of app.main runs go to a scratch folder, not the user's
os.environ.setdefault("KVTRIM_CRASH_DIR", tempfile.mkdtemp(prefix="kvtrim-crashes-"))
# saved caches (kvtrim chat's conversations, kvtrim ask's documents): none unless a
# test names a folder, so no test resumes what another left
os.environ["KVTRIM_STATES"] = ""

from engine import Engine

# a numeric variant for the real model's tests (scripts/numeric_margins.py sets these;
# $KVTRIM_REPACK and $LLAMA_CPP_LIB_PATH are read by the engine itself)
THREADS_ENV, BATCH_ENV = "KVTRIM_TEST_THREADS", "KVTRIM_TEST_BATCH"


def engine_variant() -> dict[str, int]:
    """``Engine`` arguments of the numeric variant asked for in the environment."""
    out = {}
    if os.environ.get(THREADS_ENV):
        out["n_threads"] = int(os.environ[THREADS_ENV])
    if os.environ.get(BATCH_ENV):
        out["batch_tokens"] = int(os.environ[BATCH_ENV])
    return out


@pytest.fixture(scope="session")
def engine() -> Engine:
    eng = Engine(**engine_variant())
    yield eng
    eng.close()


SLOW_FIXTURES = frozenset(
    {
        "engine",
        "quick",
        "pool",
        "server",
        "client",
        "unevicted",
        "conversation_doc",
        "text_tags",
        "tiny_models",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: loads the real model or runs the benchmark")
    _pin_xdist_worker()


def _pin_xdist_worker() -> None:
    """Under ``pytest -n N`` give each worker its own share of the CPUs this run may use,
    so each llama.cpp (whose threads spin while they wait) runs on CPUs no other worker
    uses; the engine's default threads follow the share (``default_threads``), and so do
    the commands a test starts, which inherit it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    k = int(worker[2:])
    share = cpus[k * len(cpus) // count : (k + 1) * len(cpus) // count] or [cpus[k % len(cpus)]]
    for tid in os.listdir("/proc/self/task"):  # every thread, the ones started before too
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), share)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_model_unless_marked_slow(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """A test that is not marked slow may not load a model (undone after it)."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    from llama_cpp import _internals

    here = os.path.join(os.path.dirname(__file__), "fastguard")
    monkeypatch.setattr(_internals, "LlamaModel", _internals.LlamaModel)  # undone after
    sys.path.insert(0, here)
    try:
        import sitecustomize as guard
    finally:
        sys.path.remove(here)
    guard.install()
    monkeypatch.setenv("KVTRIM_FAST_TIER", "1")
    paths = [here, os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    yield
