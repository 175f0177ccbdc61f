"""Every ``kvtrim ask``/``summarize`` option reaches every session: ``summarize
--out`` with several files opens each file's session with the same settings as a
single file (issue 14). A recording fake engine, no model; one short real run."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.docs_for_tests import prose

from engine.cli import main as cli
from engine.cli import options as cli_options
from engine.runtime.spec import RequestSpec
from engine.runtime.summary_text import fact_sentence
from engine.session.prompts import Prompt
from engine.session.sampling import Sampling
from engine.stats import Done, KVStats

OPTIONS = [
    "--policy", "h2o",
    "--policy-arg", "recent_ratio=0.25",
    "--budget", "512",
    "--chunk", "64",
    "--positions", "original",
    "--position-gap", "8",
    "--no-question-aware",
    "--recall-first",
    "--flash-attn", "off",
    "--kv-type", "q8_0",
    "--swa-cache", "full",
    "--answer-prefix", "  In short,  ",
    "--max-tokens", "7",
    "--temperature", "0.5",
    "--top-p", "0.9",
    "--seed", "3",
    "--stop", "END",
    "--stop", "STOP",
    "--threads", "1",
]  # fmt: skip
SESSION = {
    "chunk_tokens": 64,
    "question_aware": False,
    "positions": "original",
    "position_gap": 8,
    "flash_attn": "off",
    "kv_type": "q8_0",
    "swa_cache": "full",
    "whole_words": True,
    "recall_tokens": None,
    "recall_first": True,
    "recent_ratio": 0.25,  # the policy's own parameter (--policy-arg)
}
ENGINE = {"kv_type": "q8_0", "swa_cache": "full", "n_threads": 1}  # cli._engine's
GENERATION = {"max_tokens": 7, "sampling": Sampling(0.5, 0.9, 3), "stops": ["END", "STOP"]}
# options that are not a session's: the model (for both paths, cli._engine) and output
ELSEWHERE = {"file", "out", "json", "show_kept", "verbose", "model", "gpu_layers", "repack"}
ELSEWHERE |= {"threads", "parallel"}  # --parallel: test_parallel_summaries_use_the_same_config


class FakeSession:
    def __init__(self, log: dict[str, Any], policy: str, budget: int) -> None:
        self.log, self.policy, self.budget = log, policy, budget
        self.model = SimpleNamespace(
            info=SimpleNamespace(chat_template=None), add_bos=True, tokenize=str.split
        )
        self.capacity = budget + budget // 4  # a summary's parts (summary.py)

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def cancel(self) -> None:
        pass

    def _done(self) -> Any:
        stats = KVStats(self.policy, self.budget, 256, 1024, tokens_seen=100, prompt_tokens=100)
        yield Done("a summary.", "stop", stats)

    def summarize(self, document: str, **gen: Any) -> Any:
        self.log["runs"].append(("summarize", None, gen))
        return self._done()

    def ask(self, document: str, question: str, *, answer_prefix: str = "", **gen: Any) -> Any:
        self.log["runs"].append(("ask", answer_prefix, gen))
        return self._done()

    def run(self, prompt: Prompt, **gen: Any) -> Any:
        self.log["runs"].append(("run", prompt.suffix, gen))
        return self._done()


def fake_engine(log: dict[str, Any]) -> type:
    class FakeEngine:
        model_name = "fake"
        notes = ()
        model = SimpleNamespace(
            device_note=None, cpu_path=SimpleNamespace(describe=lambda: "cpu", repack="off")
        )

        def __init__(self, *args: Any, **kw: Any) -> None:
            log["engines"].append(kw)

        def __enter__(self) -> FakeEngine:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def session(self, policy: str, budget: int, **kw: Any) -> FakeSession:
            log["sessions"].append((policy, budget, kw))
            return FakeSession(log, policy, budget)

    return FakeEngine


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    record: dict[str, Any] = {"engines": [], "sessions": [], "runs": []}
    monkeypatch.setattr(cli_options, "Engine", fake_engine(record))
    return record


@pytest.fixture
def docs(tmp_path: Path) -> list[Path]:
    paths = [tmp_path / "a.txt", tmp_path / "b.md"]
    for i, p in enumerate(paths):
        p.write_text(prose(5, seed=i))
    return paths


def _session(spec: RequestSpec) -> dict[str, Any]:
    """The session options a spec opens its session with, beside the budget, and the
    policy's parameters."""
    options = {k: v for k, v in spec.options().items() if k != "budget_tokens"}
    return options | dict(spec.policy_settings)


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def test_summarize_out_passes_every_option_to_every_file(log, docs, tmp_path):
    code, _, err = _main("summarize", str(docs[0]), "--json", *OPTIONS)
    assert code == 0, err
    single = (log["engines"].pop(), log["sessions"].pop(), log["runs"].pop())

    out_dir = tmp_path / "out"
    code, _, err = _main(
        "summarize", *map(str, docs), "--out", str(out_dir), "--parallel", "1", *OPTIONS
    )
    assert code == 0, err
    assert len(log["sessions"]) == len(log["runs"]) == 2
    (engine_kw,) = log["engines"]  # one model for every file
    assert engine_kw == single[0]
    assert engine_kw.items() >= ENGINE.items()
    for session, run in zip(log["sessions"], log["runs"], strict=True):
        assert (session, run) == single[1:]  # the same settings as a single file
    assert session == ("h2o", 512, SESSION)
    kind, suffix, gen = run
    assert kind == "run" and suffix.endswith("Summary: In short,") and gen == GENERATION
    summary = (out_dir / "a.txt.md").read_text()
    fact = fact_sentence(docs[0].read_text(), "In short, a summary.")  # quoted after it
    assert summary.startswith(f"# a.txt\n\nIn short, a summary. “{fact}”\n")
    assert "h2o, budget 512" in summary


def test_without_options_both_paths_use_the_defaults(log, docs, tmp_path):
    code, out, _ = _main("summarize", str(docs[0]), "--json")
    fact = fact_sentence(docs[0].read_text(), "a summary.")
    assert code == 0 and json.loads(out)["answer"] == f"A summary. “{fact}”"  # no cue shown
    batch = ("summarize", *map(str, docs), "--out", str(tmp_path / "o"), "--parallel", "1")
    assert _main(*batch)[0] == 0
    defaults = RequestSpec(kv_type="f16", swa_cache="window")  # the CLI's defaults
    for policy, budget, kw in log["sessions"]:
        assert (policy, budget, kw) == ("snapkv", 1024, _session(defaults))
    for kind, suffix, gen in log["runs"]:  # a summary of one part, its prompt's stops
        assert kind == "run" and suffix.endswith("Summary: This section describes")
        assert gen == defaults.generation() | {"stops": ["\n\n"]}
    assert len(log["runs"]) == 3


def test_ask_passes_the_answer_prefix_and_every_option(log, docs):
    code, out, err = _main("ask", str(docs[0]), "-q", "Who?", "--json", *OPTIONS)
    assert code == 0, err
    assert log["sessions"] == [("h2o", 512, SESSION)]
    assert log["runs"] == [("ask", "In short,", GENERATION)]
    assert json.loads(out)["answer"] == "In short, a summary."


def test_every_run_option_is_read_into_the_settings():
    """An option added to ask/summarize must reach RequestSpec (or be listed here)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summarize = sub.choices["summarize"]
    dests = {a.dest for a in summarize._actions} - {"help"}
    args = cli.parse_args(["summarize", "x.txt", *OPTIONS])
    read: set[str] = set()

    class Spy:
        def __getattr__(self, name: str) -> Any:
            read.add(name)
            return getattr(args, name)

    settings = RequestSpec.from_args(Spy())  # type: ignore[arg-type]
    assert dests - read == ELSEWHERE
    assert _session(settings) == SESSION and settings.generation() == GENERATION
    assert settings.answer_prefix == "In short," and settings.answer(" text ") == "In short, text"


@pytest.mark.slow
def test_a_real_batch_with_options(tmp_path):
    """The real engine takes every keyword; the summary starts with the prefix."""
    doc = tmp_path / "a.txt"
    doc.write_text(prose(40, seed=5))
    out_dir = tmp_path / "out"
    argv = ["summarize", str(doc), "--out", str(out_dir), "--budget", "128", "--chunk", "32"]
    argv += ["--positions", "original", "--kv-type", "q8_0", "--answer-prefix", "In short,"]
    code, out, err = _main(*argv, "--max-tokens", "3", "--json")
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["error"] is None and row["prompt_tokens"] > 128
    assert (out_dir / "a.txt.md").read_text().startswith("# a.txt\n\nIn short,")


def test_parallel_summaries_use_the_same_config(engine):
    """``summarize --parallel`` opens each document's session in a pool from
    ``RequestSpec.config``; it must be the config ``RequestSpec.open`` gives."""
    from engine.runtime.batch import make_pool
    from engine.runtime.spec import RequestSpec

    settings = RequestSpec(
        policy="h2o",
        budget_tokens=300,
        chunk_tokens=48,
        question_aware=False,
        positions="original",
        kv_type="q8_0",
        whole_words=False,
        max_tokens=4,
    )
    with settings.open(engine) as alone:
        assert settings.config(engine) == alone.config
    pool = make_pool(engine, settings, 2)
    try:
        from engine.policies import make_policy

        with pool.open(make_policy("h2o"), settings.config(engine), 5000) as pooled:
            assert pooled.config.positions == "original" and not pooled.config.question_aware
            assert pooled.config.kv_type == "q8_0" and not pooled.config.whole_words
            assert pool.cells == 512  # budget + chunk (348), as llama.cpp rounds them
    finally:
        pool.close()


def test_auto_positions_compact_short_texts_and_bound_long_ones():
    """The default, ``auto``: compact while the text read is at most AUTO_SPAN
    budgets, bounded beyond; the other modes do not look at the length."""
    from engine.session.config import AUTO_SPAN, BOUNDED_GAP

    spec = RequestSpec(budget_tokens=1024)
    assert spec.positions == "auto"
    assert spec.hole(AUTO_SPAN * 1024, 1024) == 0
    assert spec.hole(AUTO_SPAN * 1024 + 1, 1024) == BOUNDED_GAP
    assert spec.hole(AUTO_SPAN * 1024 + 1) == BOUNDED_GAP, "the spec's own budget by default"
    assert spec.hole(AUTO_SPAN * 256 + 1, 256) == BOUNDED_GAP, "a pooled session's budget"
    assert RequestSpec(position_gap=5).hole(10**6, 1024) == 5
    for mode, want in (("compact", 0), ("bounded", BOUNDED_GAP), ("original", None)):
        assert RequestSpec(positions=mode).hole(10**6, 1024) == want
        assert RequestSpec(positions=mode).hole(0, 1024) == want
    args = cli.parse_args(["ask", "x.txt", "-q", "?"])
    assert args.positions == "auto" and RequestSpec.from_args(args).positions == "auto"


def test_position_gap_bounds_the_holes_of_bounded_positions():
    """``--position-gap`` (added as one SessionOptions field and one flag: issue 21's
    proof) is the hole ``bounded`` leaves; compact closes holes, original keeps them."""
    from engine.errors import ConfigError
    from engine.session.config import BOUNDED_GAP, SessionConfig

    assert RequestSpec(positions="bounded", position_gap=8).hole() == 8
    assert RequestSpec(positions="bounded").hole() == BOUNDED_GAP
    assert RequestSpec(positions="compact", position_gap=8).hole() == 0
    assert RequestSpec(positions="original").hole() is None
    spec = RequestSpec.from_args(cli.parse_args(["ask", "x.txt", "-q", "?", "--position-gap", "3"]))
    assert spec.position_gap == 3 and SessionConfig(**spec.options()).hole() == 0
    with pytest.raises(ConfigError, match="position_gap must be >= 1"):
        RequestSpec(position_gap=0)
    with pytest.raises(ConfigError, match="at least 1"):
        cli.parse_args(["ask", "x.txt", "-q", "?", "--position-gap", "0"])


def test_default_threads_never_pass_the_cpus_this_process_may_use(monkeypatch):
    """Under ``taskset -c 0`` (or a container's cpuset) llama.cpp's spinning threads
    would share one CPU: the default follows the affinity, and --threads says so."""
    import argparse
    import os

    from engine.cli import types
    from engine.session import config

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert config.usable_cpus() == 1 and config.default_threads() == 1
    with pytest.raises(argparse.ArgumentTypeError, match="more than the 1 logical CPUs"):
        types.threads("2")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert config.default_threads() <= config.usable_cpus() == 64
