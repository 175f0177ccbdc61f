"""The RULER-style suite (``kvtrim bench --ruler``): documents, scores and the report
with a fake tokenizer and synthetic records; one real-model run at the end."""

from __future__ import annotations

import gzip
import io
import json
import random
import re
from types import SimpleNamespace

import pytest
from helpers.json_server import JsonServer

from engine.bench import ruler, ruler_report, texts
from engine.cli import bench as bench_cli
from engine.cli.main import main, parse_args
from engine.errors import ConfigError
from engine.policies import evicting


class Chars:
    """A tokenizer of one token per character: token counts are lengths."""

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(map(chr, tokens))


TOK = Chars()


@pytest.mark.parametrize("name", ruler.HAYSTACKS)
def test_haystacks_have_the_length_asked_for(name):
    offset = ruler.paragraph_start(name, random.Random(0))
    text = ruler.haystack(name, TOK, 5000, offset)
    if name != "noise":
        assert offset > 0 and ruler._source(name)[1][offset - 2 : offset] == "\n\n"
    assert len(text) == 5000
    assert ruler.haystack_source(name)
    if name == "noise":
        assert text.startswith("The grass is green. The sky is blue.")
        assert set(re.split(r"(?<=\.) ", text.strip())[:-1]) <= set(
            re.split(r"(?<=\.) ", ruler.FILLER.strip())
        )


def test_the_numbers_haystack_is_dense_with_numbers():
    text = ruler.haystack("numbers", TOK, 20_000)
    assert len(re.findall(r"\d+", text)) > 100


def test_wrap_repeats_a_short_text():
    assert ruler.wrap("abc", 1, 10, "|") == "bc|abc|abc"
    assert ruler.wrap("abcdef", 2, 3, "|") == "cde"


def test_release_notes_fall_back_in_order(tmp_path):
    notes = tmp_path / "NEWS.gz"
    with gzip.open(notes, "wt") as f:
        f.write("- gh-issue-12345: Fix 3.11.2   \nthings.\n")
    missing = str(tmp_path / "absent.gz")
    source, text = texts.read_release_notes((("gone", missing), ("mine", str(notes))))
    assert source == f"mine ({notes})"
    assert text == "- gh-issue-12345: Fix 3.11.2\nthings.\n"
    source, text = texts.read_release_notes((("gone", missing),))
    assert source.startswith("IDLE's NEWS.txt") and len(text) > 1000


def test_unknown_haystack_and_task_fail():
    with pytest.raises(ConfigError, match="haystack"):
        ruler.haystack("poetry", TOK, 100)
    with pytest.raises(ConfigError, match="task"):
        ruler.make_item(TOK, "qa", "essay", 1000, 0.5, 0)


@pytest.mark.parametrize("task", ruler.TASKS)
@pytest.mark.parametrize("name", ruler.HAYSTACKS)
def test_needles_sit_near_their_depths(task, name):
    item = ruler.make_item(TOK, task, name, 4000, 0.4, 0)
    doc = item.document
    assert abs(len(doc) - 4000) < 40
    for depth, sentence in item.needles.planted:
        at = doc.find(sentence)
        assert at >= 0, sentence
        assert doc.count(sentence) == 1
        assert depth - 0.06 < at / len(doc) < depth + 0.03, (sentence, at / len(doc))
    for value in item.needles.expected:
        assert value in doc


def test_needles_start_at_a_line_or_sentence_boundary():
    for name in ruler.HAYSTACKS:
        doc = ruler.make_item(TOK, "niah_multikey", name, 3000, 0.3, 1).document
        for match in re.finditer(r"One of the special magic (numbers|codes)", doc):
            before = doc[: match.start()]
            assert before == "" or before.endswith(("\n", ". ")), repr(before[-20:])


def test_items_are_reproducible_and_differ_by_grid_point():
    a = ruler.make_item(TOK, "niah_single", "essay", 2000, 0.5, 0)
    b = ruler.make_item(TOK, "niah_single", "essay", 2000, 0.5, 0)
    assert a == b
    others = [
        ruler.make_item(TOK, "niah_single", "essay", 2000, 0.5, 1),
        ruler.make_item(TOK, "niah_single", "essay", 2000, 0.4, 0),
        ruler.make_item(TOK, "niah_single", "essay", 2048, 0.5, 0),
        ruler.make_item(TOK, "niah_single", "essay", 2000, 0.5, 0, seed=1),
    ]
    assert all(o.needles.expected != a.needles.expected for o in others)


def test_single_needle_is_rulers():
    needles = ruler.niah_single(random.Random(3), 0.5)
    [(depth, sentence)] = needles.planted
    [value] = needles.expected
    assert depth == 0.5
    assert re.fullmatch(r"One of the special magic numbers for [a-z]+-[a-z]+ is: \d{7}\.", sentence)
    key = sentence.split(" for ")[1].split(" is")[0]
    assert key in needles.question and key in needles.answer_prefix
    assert value in sentence


def test_multikey_distractors_have_the_values_shape_but_differ():
    needles = ruler.niah_multikey(random.Random(5), 0.7)
    [value] = needles.expected
    assert len(needles.planted) == 6 and needles.planted[0][0] == 0.7
    assert value in needles.planted[0][1]
    assert len(needles.distractors) == 5
    assert len(set(needles.distractors) | {value}) == 6
    for d in needles.distractors:
        assert re.fullmatch(r"\d{7}", d)
    keys = {re.search(r"for (\S+) is", s).group(1) for _, s in needles.planted}
    assert len(keys) == 4, "four keys"
    asked = re.search(r"for (\S+) mentioned", needles.question).group(1)
    codes = [s for _, s in needles.planted if "magic codes" in s]
    assert len(codes) == 2 and any(asked in s for s in codes), "a code for the asked key"
    numbers = [s for _, s in needles.planted if "magic numbers" in s and asked in s]
    assert numbers == [needles.planted[0][1]], "one number for the asked key"


def test_multivalue_plants_four_numbers_for_one_key():
    needles = ruler.niah_multivalue(random.Random(7), 0.1)
    assert len(needles.expected) == 4 == len(set(needles.expected))
    assert [d for d, _ in needles.planted] == pytest.approx([0.1, 0.35, 0.6, 0.85])
    keys = {re.search(r"for (\S+) is", s).group(1) for _, s in needles.planted}
    assert len(keys) == 1


def test_variable_tracking_chain():
    needles = ruler.variable_tracking(random.Random(11), 0.4)
    value = re.search(r"value (\d+)", needles.question).group(1)
    assignments = {}
    for _, sentence in needles.planted:
        name, rhs = re.fullmatch(r"VAR ([A-Z]{5}) = (.+)\.", sentence).groups()
        assignments[name] = rhs
    assert len(assignments) == 10, "two chains of 5 names, all different"

    def resolve(name):
        rhs = assignments[name]
        return resolve(rhs[4:]) if rhs.startswith("VAR ") else rhs

    assert sorted(n for n in assignments if resolve(n) == value) == sorted(needles.expected)
    assert len(needles.expected) == 5
    other = {resolve(n) for n in assignments} - {value}
    assert len(other) == 1 and other.pop() in needles.distractors
    chain = [(d, s) for d, s in needles.planted if any(f"VAR {n} =" in s for n in needles.expected)]
    depths = [d for d, _ in chain]
    assert depths == sorted(depths) and depths[0] == 0.4, "the chain reads in order"
    assert f"{len(needles.expected)} variables" in needles.answer_prefix


def test_variable_tracking_document_reads_the_chain_in_order():
    item = ruler.make_item(TOK, "variable_tracking", "essay", 6000, 0.1, 0)
    chain = item.needles.expected
    at = [item.document.find(f"VAR {n} =") for n in chain]
    assert all(a >= 0 for a in at) and at == sorted(at)


def test_score():
    assert ruler.score("niah_single", "The number is 1234567.", ["1234567"]) == 1.0
    assert ruler.score("niah_single", "It is 7654321", ["1234567"]) == 0.0
    assert ruler.score("niah_multivalue", "1111111, 2222222", ["1111111", "2222222", "3"]) == (
        pytest.approx(2 / 3)
    )
    names = ["ABCDE", "FGHIJ", "KLMNO", "PQRST"]
    answer = "abcde, FGHIJ, ZZZZZ and QQQQQ"
    assert ruler.score("variable_tracking", answer, names) == 0.5, "extras cost nothing"
    assert ruler.score("niah_single", "anything", []) == 0.0
    with pytest.raises(ConfigError):
        ruler.score("qa", "x", ["x"])


@pytest.mark.parametrize(
    ("text", "runaway"),
    [
        ("0000000000", True),
        ("The number is 1234567.1111111111111", True),
        ("the the the the the ", True),
        ("1234 1234 1234 1234 1234", True),
        ("abab", False),
        ("1111111", False),
        ("The special magic number is 1234567.", False),
        ("1234567, 2345678, 3456789 and 4567890", False),
        ("", False),
        ("   ", False),
    ],
)
def test_repeats_to_the_end(text, runaway):
    assert ruler.repeats_to_the_end(text) is runaway


def test_the_default_grid():
    cfg = ruler.RulerConfig()
    assert cfg.settings[0] == ("full", None, "original")
    assert list(ruler.DEFAULT_POLICIES) == evicting()  # every evicting policy
    assert len(cfg.settings) == 1 + len(evicting()) * 2 * 4  # x budgets x position modes
    assert ("streaming", 4096, "original") in cfg.settings
    assert ("snapkv", 1024, "auto") in cfg.settings, "the default setting"
    assert len(cfg.documents()) == 4 * 3 * 6 * 3
    assert [d[0] for d in cfg.documents()] == sorted(d[0] for d in cfg.documents())
    quick = ruler.RulerConfig.quick()
    assert len(quick.documents()) * len(quick.settings) == 12
    quick.check()
    assert quick.part(0) == ["snapkv"] and quick.part(1) == [1024]


def test_config_check_fails_on_bad_settings():
    for settings in (
        [("fast", 1024, "compact")],
        [("snapkv", 1024, "shifted")],
        [("h2o", None, "compact")],
    ):
        with pytest.raises(ConfigError):
            ruler.RulerConfig(settings=settings).check()
    with pytest.raises(ConfigError, match="task"):
        ruler.RulerConfig(tasks=["qa"]).check()


def test_cli_parses_ruler_quick():
    args = parse_args(["bench", "--ruler", "--quick"])
    assert args.ruler and args.quick
    cfg = bench_cli._ruler_config(args)
    assert cfg == ruler.RulerConfig.quick()


def test_cli_options_reach_the_ruler_grid():
    args = parse_args(
        [
            "bench",
            "--ruler",
            "--policies",
            "h2o,tova",
            "--budgets",
            "512",
            "--positions",
            "compact",
            "--lengths",
            "1024,2048",
            "--parts",
            "variable_tracking",
            "--trials",
            "2",
        ]
    )
    cfg = bench_cli._ruler_config(args)
    assert cfg.settings == [
        ("full", None, "original"),
        ("h2o", 512, "compact"),
        ("tova", 512, "compact"),
    ]
    assert cfg.lengths == [1024, 2048] and cfg.tasks == ["variable_tracking"] and cfg.trials == 2
    for bad in (["--positions", "shifted"], ["--budgets", "1/8"], ["--parts", "qa"]):
        with pytest.raises(ConfigError):
            bench_cli._ruler_config(parse_args(["bench", "--ruler", *bad]))


class FakeSession:
    """Answers from the document itself (the full cache), or a runaway (snapkv), or
    refuses (original positions)."""

    def __init__(self, policy, budget, positions):
        if positions == "original" and policy != "full":
            raise ConfigError("no original positions here")
        self.policy, self.budget = policy, budget

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def ask(self, doc, question, *, answer_prefix, max_tokens):
        key = re.search(r"for (\S+) mentioned", question).group(1)
        value = re.search(rf"numbers for {key} is: (\d+)", doc).group(1)
        return iter([(doc, value)])

    def collect(self, events):
        doc, value = next(events)
        stats = SimpleNamespace(
            prompt_tokens=len(doc) + 50,
            prefill_s=0.5,
            kv_bytes=1000 * self.budget,
            cells_peak=self.budget,
            evicted_tokens=0,
        )
        if self.policy == "full":
            return SimpleNamespace(text=f" {value}.", reason="stop", stats=stats)
        return SimpleNamespace(text=" 1" + "0" * 20, reason="length", stats=stats)


class FakeEngine:
    def __init__(self, n_ctx_train):
        self.model = Chars()
        self.model.info = SimpleNamespace(name="fake", n_ctx_train=n_ctx_train)
        self.opened = []

    def session(self, policy, budget, *, positions):
        self.opened.append((policy, budget, positions))
        return FakeSession(policy, budget, positions)


def test_run_records_every_item(tmp_path):
    cfg = ruler.RulerConfig.quick()
    cfg.lengths = [1000, 3000]
    engine = FakeEngine(n_ctx_train=2048)
    steps = []
    result = ruler.run(cfg, engine, tmp_path, steps.append, "kvtrim bench --ruler")
    records = result["records"]
    assert json.loads((tmp_path / "ruler.json").read_text())["records"] == records
    assert result["haystack_sources"]["numbers"] == texts.release_notes()[0]
    full = [r for r in records if r["policy"] == "full"]
    assert {r["length"] for r in full} == {1000}, "the full cache only where it fits"
    assert len(records) == len(steps) == 2 * 2 * 3 + 2 * 2 * 2
    assert all(r["score"] == 1.0 and r["reason"] == "stop" and not r["runaway"] for r in full)
    assert all(r["budget"] is None and r["budget_tokens"] > r["doc_tokens"] + 128 for r in full)
    compact = [r for r in records if r["positions"] == "compact"]
    assert all(r["runaway"] and r["score"] == 0.0 and r["budget"] == 1024 for r in compact)
    assert all(r["kv_bytes"] == 1024 * 1000 and r["prefill_s"] == 0.5 for r in compact)
    refused = [r for r in records if r["policy"] == "snapkv" and r["positions"] == "original"]
    assert refused and all(r["error"].startswith("ConfigError") for r in refused)
    assert all(r["score"] is None for r in refused)
    for r in records:
        assert r["haystack_source"] == ruler.haystack_source(r["haystack"])
        assert abs(r["doc_tokens"] - r["length"]) < 40
    assert ruler_report.markdown(result, [])


def test_a_run_can_take_the_full_cache_from_an_earlier_run(tmp_path):
    cfg = ruler.RulerConfig.quick()
    cfg.lengths = [1000]
    first = ruler.run(cfg, FakeEngine(n_ctx_train=2048), tmp_path / "a", print, "first")
    args = parse_args(["bench", "--ruler", "--quick", "--lengths", "1000"])
    args.reference = tmp_path / "a" / "ruler.json"
    again = bench_cli._ruler_config(args)
    assert all(policy != "full" for policy, _, _ in again.settings)
    engine = FakeEngine(n_ctx_train=2048)
    second = ruler.run(again, engine, tmp_path / "b", print, "second")
    assert all(policy != "full" for policy, _, _ in engine.opened), "not run again"
    old = [r for r in first["records"] if r["policy"] == "full"]
    new = [r for r in second["records"] if r["policy"] == "full"]
    assert len(new) == len(old) == 4
    assert all(r["reused_from"] == str(args.reference) for r in new)
    assert [r["expected"] for r in new] == [r["expected"] for r in old]
    again.seed = 1
    with pytest.raises(ConfigError, match="another seed"):
        ruler.run(again, engine, tmp_path / "c", print, "third")


def _rec(policy, budget, positions, length, task, score, **extra):
    n_values = round(1 / score) if score else 1  # the answer holds the first whole
    expected = [f"{i}234567" for i in range(1, n_values + 1)]
    rec = {
        "expected": expected,
        "answer": f"{expected[0]}." if score else "",
        "task": task,
        "haystack": "essay",
        "length": length,
        "depth": 0.5,
        "trial": 0,
        "policy": policy,
        "budget": budget,
        "positions": positions,
        "score": score,
        "runaway": False,
        "error": None,
    }
    rec.update(extra)
    return rec


def _result():
    records = [
        _rec("full", None, "original", 2048, "niah_single", 1.0),
        _rec("full", None, "original", 2048, "niah_multikey", 1.0),
        _rec("snapkv", 1024, "compact", 2048, "niah_single", 1.0),
        _rec("snapkv", 1024, "compact", 2048, "niah_multikey", 0.0),
        _rec("snapkv", 1024, "compact", 4096, "niah_single", 0.5),
        _rec("snapkv", 1024, "compact", 4096, "niah_multikey", 0.0, runaway=True),
        _rec("snapkv", 1024, "original", 4096, "niah_single", 0.25),
        _rec("snapkv", 1024, "original", 4096, "niah_multikey", None, error="ConfigError: no"),
    ]
    return {
        "command": "kvtrim bench --ruler --quick",
        "model": "fake-model",
        "config": {
            "tasks": ["niah_single", "niah_multikey"],
            "haystacks": ["essay"],
            "depths": [0.5],
            "trials": 1,
            "max_tokens": 32,
        },
        "haystack_sources": {"essay": texts.SOURCE},
        "n_ctx_train": 32768,
        "records": records,
    }


def test_report_tables(tmp_path):
    result = _result()
    path = ruler_report.write(result, tmp_path)
    md = path.read_text()
    assert path == tmp_path / "ruler.md"
    assert "kvtrim bench --ruler --quick" in md and "pydoc_data" in md
    assert "| setting | 2048 | 4096 |" in md
    assert "| full | 100% | - |" in md
    assert "| snapkv 1024 compact | 50% | 25% |" in md
    assert "| snapkv 1024 original | - | 25% |" in md, "the error is left out of the mean"
    assert "## Per task at 2,048 tokens (the longest with a full-cache reference)" in md
    assert "## Per task at 4,096 tokens (the longest)" in md
    assert "| setting | niah_single | niah_multikey |" in md
    assert "| snapkv 1024 compact | 50% | 0% |" in md
    assert "| snapkv 1024 compact | 4 | 1 | 0 | 0 | 0 |" in md, "runaway count"
    assert "| snapkv 1024 original | 2 | 0 | 0 | 0 | 1 |" in md, "error count"
    assert "## Whole-value accuracy by length" in md
    assert "![ruler.png](ruler.png)" in md
    assert "met: full cache: niah_single" in md
    assert (tmp_path / "ruler.png").stat().st_size > 1000
    assert ruler_report.targets(result) == [
        (
            "full cache: niah_single found at every length it fits (2,048 tokens)",
            "1/1",
            True,
        ),
        ("no kvtrim answer runs to the token limit repeating itself", "1", False),
    ]


def test_report_without_a_full_reference(tmp_path):
    result = _result()
    result["records"] = [r for r in result["records"] if r["policy"] != "full"]
    md = ruler_report.markdown(result, [])
    assert "full-cache reference" not in md and "(the longest)" in md
    assert [ok for *_, ok in ruler_report.targets(result)] == [False], "only the runaway one"


def test_whole_score_counts_a_value_only_as_a_whole_number():
    assert ruler.whole_score("niah_single", "The number is 1234567.", ["1234567"]) == 1.0
    assert ruler.whole_score("niah_single", "12345670234.", ["1234567"]) == 0.0
    assert ruler.score("niah_single", "12345670234.", ["1234567"]) == 1.0, "RULER's counts it"
    assert ruler.whole_score("niah_multivalue", "1111111, 22222229", ["1111111", "2222222"]) == 0.5
    assert ruler.whole_score("variable_tracking", "abcde and FGHIJK", ["ABCDE", "FGHIJ"]) == 0.5
    with pytest.raises(ConfigError):
        ruler.whole_score("qa", "x", ["x"])


def _issue_27(default_scores, past_scores):
    """Records for issue 27's targets: the full cache and the default setting at
    8K and 16K on two haystacks, and the default alone at 64K."""
    default = ruler_report.default_setting()
    records = []
    for (n, task, hay), value in default_scores.items():
        records.append(_rec("full", None, "original", n, task, 1.0, haystack=hay))
        records.append(_rec(*default, n, task, value, haystack=hay))
    for task, value in past_scores.items():
        records.append(_rec(*default, 65536, task, value))
    return {**_result(), "records": records}


def test_issue_27_targets_met():
    cells = {(n, t, h): 1.0 for n in (8192, 16384) for t in ("niah_single",) for h in ("a", "b")}
    found = ruler_report.targets(_issue_27(cells, {"niah_single": 1.0}))
    assert [ok for *_, ok in found] == [True, True, True, True]
    assert "within 5 points" in found[1][0] and "worst +0 points" in found[1][1]
    assert "past the trained context (32,768 tokens)" in found[2][0] and found[2][1].startswith(
        "worst 100%"
    )


def test_issue_27_targets_missed_name_the_worst_cell():
    cells = {(n, "niah_single", h): 1.0 for n in (8192, 16384) for h in ("a", "b")}
    cells[(16384, "niah_single", "b")] = 0.0  # b: mean 50 points behind over 8K-16K
    found = ruler_report.targets(_issue_27(cells, {"niah_single": 0.5}))
    assert found[1][2] is False and found[1][1] == "worst +50 points behind (niah_single, b)"
    assert found[2][2] is False and found[2][1] == "worst 50% (niah_single)"


def test_ran_on_counts_a_value_found_only_inside_a_longer_number():
    ran = _rec("snapkv", 1024, "bounded", 4096, "niah_single", 1.0, answer="12345670234.")
    clean = _rec("snapkv", 1024, "bounded", 4096, "niah_single", 1.0)
    assert ruler_report.ran_on(ran) and not ruler_report.ran_on(clean)
    assert ruler_report.whole(ran) == 0.0 and ruler_report.whole(clean) == 1.0


def test_report_of_json_records(tmp_path):
    """The report reads what ruler.json holds (settings as lists, budgets null)."""
    result = json.loads(json.dumps(_result()))
    assert "| full | 100% | - |" in ruler_report.markdown(result, [])


@pytest.mark.slow
def test_real_ruler_quick(tmp_path):
    """``kvtrim bench --ruler --quick`` on the default model, one of its two tasks
    (``--parts``: the other's scoring is tested without a model above)."""
    out = io.StringIO()
    parts = "niah_single,essay,numbers"
    argv = ["bench", "--ruler", "--quick", "--parts", parts, "--out", str(tmp_path)]
    assert main(argv, out=out, err=io.StringIO()) == 0
    result = json.loads((tmp_path / "ruler.json").read_text())
    md = (tmp_path / "ruler.md").read_text()
    assert "## Accuracy by length" in md and (tmp_path / "ruler.png").exists()
    records = result["records"]
    assert len(records) == 6 and all(r["error"] is None for r in records)  # 2 haystacks x 3
    assert {r["task"] for r in records} == {"niah_single"}
    full = [r for r in records if r["policy"] == "full" and r["task"] == "niah_single"]
    assert full and all(r["score"] == 1.0 for r in full), [r["answer"] for r in full]
    for r in records:
        assert r["haystack_source"] and r["length_tokens"] > 1900 and r["kv_bytes"] > 0


def test_ruler_parts_name_tasks_and_haystacks_and_depths_count():
    import argparse

    from engine.cli import bench as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["bench", "--ruler", "--parts", "niah_single,numbers", "--depths", "2"]
    )
    cfg = bench_cli._ruler_config(args)
    assert cfg.tasks == ["niah_single"] and cfg.haystacks == ["numbers"]
    assert cfg.depths == [0.25, 0.75]


def test_llama_server_gets_the_tokens_greedy_with_the_prompts_stops():
    from engine.bench import ruler_peer

    def reply(body):
        if len(body["prompt"]) > 3:
            return 400, {"error": {"message": "request (4 tokens) exceeds the context size"}}
        timings = {"prompt_n": 3, "prompt_ms": 250.0}
        if body["prompt"] == [2, 7, 8]:  # this llama.cpp's field for a reply cut at n_predict
            return 200, {"content": " 4242", "stop_type": "limit", "timings": timings}
        return 200, {"content": " 42.", "stop_type": "word", "timings": timings}

    server = JsonServer(lambda path, body: reply(body))
    try:
        got = ruler_peer.complete(server.url, [2, 7, 9], ("\n\n",), 32)
        refused = ruler_peer.complete(server.url, [2, 7, 9, 11], ("\n\n",), 32)
        cut = ruler_peer.complete(server.url, [2, 7, 8], ("\n\n",), 32)
    finally:
        server.close()
    path, body = server.requests[0]
    assert path == "/completion"
    assert body == {
        "prompt": [2, 7, 9],
        "n_predict": 32,
        "temperature": 0,
        "stop": ["\n\n"],
        "cache_prompt": False,
    }
    assert got["error"] is None and got["text"] == " 42." and got["reason"] == "stop"
    assert got["length_tokens"] == 3 and got["prefill_s"] == 0.25
    assert refused["error"].startswith("llama-server 400: ") and "exceeds" in refused["error"]
    assert cut["reason"] == "length" and cut["text"] == " 4242"


def test_run_asks_llama_server_each_item_that_fits(tmp_path, monkeypatch):
    from engine.bench import ruler_peer

    cfg = ruler.RulerConfig.quick()
    cfg.lengths = [1000, 3000]
    cfg.settings.insert(1, ruler_peer.SETTING)
    cfg.peer_binary = "/usr/bin/llama-server"
    engine = FakeEngine(n_ctx_train=2048)
    asked = []

    def prompt_ids(engine, document, question, answer_prefix):
        key = re.search(r"for (\S+) mentioned", question).group(1)
        value = re.search(rf"numbers for {key} is: (\d+)", document).group(1)
        asked.append(len(document))
        return [int(value)], ("\n\n",)

    def reply(body):
        value = body["prompt"][0]
        return 200, {"content": f" {value}. {value}", "stopped_limit": True, "timings": {}}

    server = JsonServer(lambda path, body: reply(body))
    monkeypatch.setattr(ruler_peer, "prompt_ids", prompt_ids)
    monkeypatch.setattr(ruler, "_peer_url", lambda cfg, engine, out_dir, stack: server.url)
    try:
        result = ruler.run(cfg, engine, tmp_path, lambda _: None, "kvtrim bench --ruler --peer")
    finally:
        server.close()
    peer = [r for r in result["records"] if r["policy"] == "llama-server"]
    assert len(peer) == len(asked) == 2 * 2, "every item of the length that fits, once"
    assert {r["length"] for r in peer} == {1000}
    assert all(r["score"] == 1.0 and r["whole_score"] == 1.0 for r in peer)
    assert all(r["reason"] == "length" and not r["runaway"] for r in peer)
    assert all(r["error"] is None and r["evicted_tokens"] == 0 for r in peer)
    md = ruler_report.markdown(result, [])
    assert "| llama-server (full cache) | 100% |" in md
    for r in result["records"]:  # llama-server has no loop guard: its runaways are not kvtrim's
        r["runaway"] = r["policy"] == "llama-server"
    targets = {t: ok for t, _, ok in ruler_report.targets(result)}
    assert targets["no kvtrim answer runs to the token limit repeating itself"] is True
    assert "| llama-server (full cache) | 4 | 4 |" in ruler_report.markdown(result, [])
    rows = [line.split(" |")[0] for line in md.splitlines() if line.startswith("| ")]
    assert rows.index("| llama-server (full cache)") == rows.index("| full") + 1


def test_cli_ruler_with_peer_adds_llama_server_after_the_full_cache(tmp_path):
    import sys

    args = parse_args(
        ["bench", "--ruler", "--peer", "llama-server", "--peer-binary", sys.executable]
    )
    cfg = bench_cli._ruler_config(args, io.StringIO())
    assert cfg.settings[:2] == [("full", None, "original"), ("llama-server", None, "original")]
    assert cfg.peer_binary and cfg.model.endswith(".gguf") and cfg.threads >= 1
    with pytest.raises(ConfigError, match="needs its binary"):
        ruler.RulerConfig(settings=[("llama-server", None, "original")]).check()
    missing = ["bench", "--ruler", "--peer", "llama-server", "--peer-binary", str(tmp_path)]
    with pytest.raises(ConfigError, match="not an executable file"):
        bench_cli._ruler_config(parse_args(missing), io.StringIO())
