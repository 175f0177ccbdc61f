"""The fidelity run's parts that need no model (issue 34, item 2): intervals, the
documents and their facts, scoring, resuming from the records, and the report."""

from __future__ import annotations

import json

import pytest

from engine.bench import fidelity, fidelity_docs, fidelity_report
from engine.bench.intervals import paired_difference, separated, wilson
from engine.errors import ConfigError


class Chars:
    """A tokenizer with one token per character."""

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(map(chr, tokens))


def test_wilson_is_honest_at_the_edges_and_matches_known_values():
    assert wilson(0, 30) == pytest.approx((0.0, 0.1135), abs=1e-4)
    assert wilson(30, 30) == pytest.approx((0.8865, 1.0), abs=1e-4)
    assert wilson(21, 24) == pytest.approx((0.6900, 0.9566), abs=1e-4)  # issue 34's 69-96%
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(5, 4)


def test_paired_difference_separates_only_what_the_items_show():
    same = [True] * 20 + [False] * 10
    d, low, high = paired_difference(same, same)
    assert d == 0 and low < 0 < high and not separated(low, high)
    d, low, high = paired_difference([True] * 30, [False] * 30)
    assert d == 1 and separated(low, high) and high == 1
    # discordant pairs in both directions: no separation
    a = [True, False] * 15
    b = [False, True] * 15
    d, low, high = paired_difference(a, b)
    assert d == 0 and low < -0.2 and high > 0.2
    with pytest.raises(ValueError):
        paired_difference([True], [True, False])


@pytest.mark.parametrize("name", fidelity_docs.HAYSTACKS)
def test_a_document_plants_every_fact_and_rebuilds_the_same(name):
    doc = fidelity_docs.make_document(Chars(), name, 3000, index=4)
    again = fidelity_docs.make_document(Chars(), name, 3000, index=4)
    assert doc == again and doc.digest == again.digest
    assert abs(len(doc.text) - 3000) < 60
    assert [f.kind for f in doc.asked] == ["name", "number", "code"]  # 4 % 3: the second first
    for fact in doc.asked:
        assert doc.text.count(fact.sentence) == 1
        start, end = fidelity_docs.value_span(doc, fact)
        assert doc.text[start:end] == fact.value
        assert len(fact.distractors) == 2 and fact.value not in fact.distractors
        for value in fact.distractors:
            assert value in doc.text  # planted under another label
    other = fidelity_docs.make_document(Chars(), name, 3000, index=5)
    assert other.digest != doc.digest


def test_the_kinds_take_turns_as_the_first_question():
    firsts = [fidelity_docs.make_document(Chars(), "prose", 800, i).asked[0].kind for i in range(6)]
    assert firsts == ["number", "name", "code"] * 2


def test_an_answer_is_right_with_the_whole_value_and_no_distractor():
    fact = fidelity_docs.Fact("number", "amber", "58316", 0.3, ("40729", "11111"))
    judge = fidelity_docs.judge
    assert judge(fact, "58316.")["right"]
    assert not judge(fact, "583160")["found"]  # inside a longer number: a user reads that
    assert judge(fact, "58316 or 40729") == {"found": True, "distracted": True, "right": False}
    name = fidelity_docs.Fact("name", "onyx", "Hiroko Iwasaki", 0.5, ("Oskar Mbeki",))
    assert judge(name, "hiroko iwasaki, the lead")["right"]
    assert not judge(name, "Hiroko Iwasakis")["found"]


def _record(**over):
    rec = {"model_file": "m.gguf", "model": "M", "n_ctx_train": 8192, "haystack": "prose",
           "length": 2048, "doc": 0, "setting": "full", "policy": "full", "budget": None,
           "positions": "original", "q": 0, "path": "first", "digest": "abc", "right": True,
           "error": None}  # fmt: skip
    return rec | over


def test_the_journal_resumes_drops_a_cut_last_line_and_refuses_another_document(tmp_path):
    path = tmp_path / fidelity.RECORDS
    path.write_text(json.dumps(_record()) + "\n" + '{"model_file": "m.gg')  # killed mid-write
    journal = fidelity.Journal(path)
    key = fidelity.item_key(_record())
    assert len(journal.records) == 1 and journal.has(key, "abc")
    assert not journal.has(fidelity.item_key(_record(doc=1)), "abc")
    with pytest.raises(ConfigError, match="another document"):
        journal.has(key, "not-abc")
    path.write_text("not json\n" + json.dumps(_record()) + "\n")
    with pytest.raises(ConfigError, match="line 1"):
        fidelity.Journal(path)


def test_the_questions_of_a_document_and_the_settings_of_a_grid():
    assert fidelity.questions(("full", None, "original"), 2) == [
        (0, "first"),
        (1, "follow"),
        (2, "follow"),
    ]
    assert fidelity.questions(("snapkv", 256, "compact"), 1) == [
        (0, "first"),
        (0, "recall"),
        (1, "follow"),
    ]
    cfg = fidelity.FidelityConfig(budgets=[256, 1024])
    assert [fidelity.label(s) for s in cfg.settings()] == [
        "full",
        "snapkv-256-compact",
        "snapkv-256-bounded",
        "snapkv-1024-compact",
        "snapkv-1024-bounded",
    ]
    lengths = [length for length, _, _ in cfg.documents()]
    assert lengths == sorted(lengths) and len(lengths) == 3 * 30 * 5
    for bad in (
        {"positions": ["auto"]},
        {"policies": ["full"]},
        {"haystacks": ["poetry"]},
        {"follow_ups": 3},
    ):
        with pytest.raises(ConfigError):
            fidelity.FidelityConfig(**bad).check()


def _cell(n_right: int, n: int, setting: str, **over) -> list[dict]:
    policy, budget, positions = (
        ("full", None, "original") if setting == "full" else ("snapkv", 256, setting)
    )
    name = "full" if setting == "full" else f"snapkv-256-{setting}"
    path = "first" if setting == "full" else "recall"  # the default path (recall_first)
    return [
        _record(doc=i, setting=name, policy=policy, budget=budget, positions=positions,
                right=i < n_right, kept=1.0 if i % 2 else 0.0, path=path, **over)
        for i in range(n)
    ]  # fmt: skip


def test_the_report_reads_auto_off_its_records_and_judges_the_targets():
    records = _cell(27, 30, "full")
    records += _cell(26, 30, "compact", auto_is=True)
    records += _cell(20, 30, "bounded", auto_is=False)
    result = {"runs": [{"command": "kvtrim bench --fidelity", "model": "M"}], "records": records}
    text = fidelity_report.markdown(result)
    assert "snapkv-256-auto" in text and "26/30 87%" in text
    assert "| prose | 2,048 (8) |" in text
    [within] = fidelity_report.targets(result)
    assert within[2] and "-3 points" in within[1]  # 26 against 27: inside 5 points
    worse = records[:30] + _cell(24, 30, "compact", auto_is=True) + records[60:]
    [within] = fidelity_report.targets({"runs": [], "records": worse})
    assert not within[2] and "-10 points" in within[1]
    few = _cell(3, 3, "full") + _cell(3, 3, "compact", auto_is=True)
    [within] = fidelity_report.targets({"runs": [], "records": few})
    assert not within[2] and "0 with >= 30 items" in within[1]


def test_past_the_trained_context_is_held_against_the_full_cache_at_half_of_it():
    records = _cell(20, 30, "full", length=4096)
    records += _cell(19, 30, "compact", auto_is=False, length=16384)
    records += _cell(19, 30, "bounded", auto_is=True, length=16384)
    past = [t for t in fidelity_report.targets({"runs": [], "records": records}) if "past" in t[0]]
    assert past and past[0][2] and "19/30" in past[0][1] and "20/30" in past[0][1]


def test_the_first_path_reads_without_recall_whatever_the_default():
    """recall_first is on by default (issue 34); the ``first`` path is the question
    without it (the ``recall`` path has it), or the two paths would measure the same."""
    from engine.session.config import SessionOptions

    assert SessionOptions().recall_first  # the default the path must not follow
    for setting in (("snapkv", 256, "compact"), ("keydiff", 1024, "bounded")):
        spec = fidelity._spec(setting, setting[1], fidelity.FidelityConfig())
        assert spec.recall_first is False and spec.policy == setting[0]
