"""Summaries part by part (issue 22, item 8): the document cut at its seams
(documents/parts.py), the part prompt, the tidying of each part's sentences and the
summarizer's events (runtime/summary.py) with a fake session; one test on the real
model that a summary of a document of several sections covers more than one."""

from __future__ import annotations

import itertools
import types

import pytest

from engine.documents.parts import headings, split_parts
from engine.runtime.summary import (
    MAX_PARTS,
    Summarizer,
    SummaryDone,
    merged,
    part_budget,
    part_count,
    sentences,
    summary_reason,
    tidy,
)
from engine.session.prompts import PART_CUE, Prompt, overview_prompt, part_summary_prompt
from engine.stats import Done, Evicted, KVStats, Progress, Token

SECTIONS = {
    "Bees": "Honey bees live in hives of thousands. The queen lays the eggs and the "
    "workers gather nectar from clover and lavender. A hive makes honey to eat in winter.",
    "Volcanoes": "A volcano erupts when magma rises through the crust. Ash clouds can "
    "ground aircraft for days, and lava flows bury roads and fields on the slopes.",
    "Chess": "Chess is played on a board of sixty-four squares. Each player moves a king, "
    "a queen, rooks, bishops, knights and pawns, and the game ends in checkmate.",
    "Bread": "Bread is made of flour, water, salt and yeast. The dough rises for hours, "
    "is shaped into loaves and bakes in a hot oven until the crust is brown.",
}


def markdown(sections: dict[str, str], repeat: int = 1) -> str:
    return "\n\n".join(f"## {t}\n\n" + "\n\n".join([body] * repeat) for t, body in sections.items())


# -- parts ------------------------------------------------------------------


def test_parts_cover_the_text_and_start_at_headings():
    text = markdown(SECTIONS, repeat=3)
    parts = split_parts(text, 4)
    assert [p.title for p in parts] == list(SECTIONS)
    assert [text[p.start : p.end].split("\n")[0] for p in parts] == [f"## {t}" for t in SECTIONS]
    assert parts[0].start == 0 and parts[-1].end == len(text)
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))


def test_parts_fall_back_to_paragraphs_lines_sentences_then_anywhere():
    paragraphs = "\n\n".join(f"Paragraph {i} has a sentence. And another." for i in range(8))
    cuts = [p.start for p in split_parts(paragraphs, 4)[1:]]
    assert all(paragraphs[c - 2 : c] == "\n\n" for c in cuts)
    one_line = " ".join(f"Sentence number {i} is here." for i in range(40))
    cuts = [p.start for p in split_parts(one_line, 4)[1:]]
    assert all(one_line[c - 2 : c] == ". " for c in cuts)
    blob = "x" * 1000
    assert [p.start for p in split_parts(blob, 4)] == [0, 250, 500, 750]
    assert [(p.start, p.end) for p in split_parts("tiny", 9)] == [(0, 2), (2, 4)]
    assert len(split_parts(blob, 1)) == 1


HEADED = """                    GNU GENERAL PUBLIC LICENSE

  0. Definitions.

  "This License" refers to version 3.

What's New in IDLE 3.11.0
(since 3.10.0)
Released on 2022-10-24
=========================

gh-97527: Fix a bug.

Setext title
------------

==============================================================================
*05.1*\tThe vimrc file\t\t\t\t\t*vimrc-intro*

DESCRIPTION
       GNU tar is an archiving program.

   Compression options
       -a, --auto-compress

# An ATX heading #
"""


def test_headings_by_their_form():
    titles = [t for _, t in headings(HEADED)]
    assert titles == [
        "GNU GENERAL PUBLIC LICENSE",
        "0. Definitions.",
        "What's New in IDLE 3.11.0",
        "Setext title",
        "The vimrc file",
        "DESCRIPTION",
        "Compression options",
        "An ATX heading",
    ]
    at = dict((t, a) for a, t in headings(HEADED))
    assert HEADED[at["The vimrc file"] :].startswith("=====")  # the rule goes with it


def test_a_part_takes_the_heading_it_falls_under():
    text = markdown(SECTIONS, repeat=6)
    parts = split_parts(text, 8)
    assert {p.title for p in parts} == set(SECTIONS)
    assert split_parts("no headings at all. " * 50, 3)[1].title == ""


# -- sizes, reasons, sentences ----------------------------------------------


def test_part_count_and_budget():
    assert part_budget(1280, 128) == 1280 - 48 - 128
    assert part_budget(300, 200) == 256  # never below MIN_PART_TOKENS
    assert part_count(900, 1000) == 1
    assert part_count(3000, 1000) == 3
    assert part_count(30_000, 1000) == MAX_PARTS
    assert part_count(30_000, 1000, max_parts=20) == 20


def test_summary_reason():
    assert summary_reason(["stop", "eog", "stop"]) == "stop"
    assert summary_reason(["stop", "eog"]) == "eog"
    assert summary_reason(["stop", "length", "repetition"]) == "length"
    assert summary_reason([]) == "empty"


def test_tidy_joins_lines_drops_repeats_and_the_unfinished():
    seen: set[str] = set()
    raw = "This section describes the vimrc\nfile.  It is used to set-\nup Vim.  It is used to"
    want = "This section describes the vimrc file. It is used to set-up Vim."
    assert tidy(raw, seen, finished=False) == want
    again = "This section describes plugins. It is used to set-up Vim! Fourth. Fifth. Sixth."
    assert tidy(again, seen) == "This section describes plugins. Fourth."
    hanging = "This section describes plugins. It is a good place to start."
    assert tidy(hanging, seen) == "", "the first said before: the rest hangs on it"
    assert tidy("This section describes the following:", set()) == ""  # nothing follows
    assert tidy("This section describes bread, ", set()) == "This section describes bread."
    assert tidy("This section describes bread", set(), finished=False) == ""  # cut short
    loop = "It keeps the model's layers, the model's layers, the model's layers, the layers."
    assert tidy(f"This section describes caches. {loop} Done.", set()) == (
        "This section describes caches. Done."
    )
    assert sentences('He said "stop." Then (at last) it ended.') == [
        'He said "stop."',
        "Then (at last) it ended.",
    ]


def _stats(**counts: int) -> KVStats:
    return KVStats("snapkv", 1024, 1280, 100, **counts)


def test_merged_sums_counts_and_keeps_the_largest_cells():
    first = _stats(prompt_tokens=900, generated_tokens=30, evicted_tokens=5, cells_peak=1000)
    first.first_token_s = 2.0
    live = _stats(prompt_tokens=500, generated_tokens=10, cells_peak=700, tokens_seen=510)
    total = merged(first, live)
    assert (total.prompt_tokens, total.generated_tokens, total.evicted_tokens) == (1400, 40, 5)
    assert total.cells_peak == 1000 and total.first_token_s == 2.0
    assert merged(None, live) == live and merged(None, live) is not live


# -- the prompt -------------------------------------------------------------

GEMMA_IT = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _model(template: str | None = None) -> types.SimpleNamespace:
    native = types.SimpleNamespace(
        token_bos=lambda: 2, token_eos=lambda: 1, token_get_text=lambda t: "<bos>"
    )
    info = types.SimpleNamespace(chat_template=template, path="fake.gguf")
    return types.SimpleNamespace(info=info, native=native, add_bos=True, tokenize=str.split)


def test_part_prompt_for_a_base_model():
    p = part_summary_prompt(_model(), "THE PART", system="Be brief.")
    assert p.document == "THE PART" and p.add_bos
    assert p.prefix.startswith("Be brief.\n\nBelow is a section of a document")
    assert p.suffix == f"\n\nSummary: {PART_CUE}" and p.stops == ("\n\n",)
    assert part_summary_prompt(_model(), "X", cue="In short,").suffix.endswith("Summary: In short,")


def test_part_prompt_for_an_instruction_model():
    p = part_summary_prompt(_model(GEMMA_IT), "THE PART")
    assert p.prefix.startswith("<bos><start_of_turn>user\nSummarize this section")
    assert p.suffix.endswith(f"<start_of_turn>model\n{PART_CUE}")
    assert p.stops == ("<end_of_turn>",)


def test_overview_prompt_asks_about_the_whole_with_the_summaries():
    p = overview_prompt(_model(), "THE DOC", ["This section describes A.", "B."])
    assert p.document == "THE DOC" and p.prefix == "" and p.stops == ("\n\n",)
    assert p.suffix == (
        "\n\nSummaries of its sections:\n- This section describes A.\n- B.\n\n"
        "Overall, the document describes"
    )
    t = overview_prompt(_model(GEMMA_IT), "THE DOC", ["A."])
    assert "Summaries of its sections:\n- A.\n\nSummarize the whole document" in t.suffix
    assert t.suffix.endswith("<start_of_turn>model\nOverall, the document describes")


# -- the summarizer, with a fake session --------------------------------------


class FakeSession:
    """Answers each part with ``answers`` in turn; ``capacity`` sizes the parts."""

    def __init__(self, answers: list[tuple[str, str]], capacity: int = 300) -> None:
        self.model = _model()
        self.capacity = capacity
        self.answers = list(answers)
        self.prompts: list[Prompt] = []
        self.gen: list[dict] = []

    def run(self, prompt: Prompt, **gen):
        self.prompts.append(prompt)
        self.gen.append(gen)
        text, reason = self.answers.pop(0)
        n = len(prompt.document.split())
        yield Progress(n // 2, n, _stats(prompt_tokens=n // 2))
        yield Evicted(100, 20, _stats(prompt_tokens=n // 2, evicted_tokens=20))
        yield Progress(n, n, _stats(prompt_tokens=n + 10))
        yield Token(7, text, _stats(prompt_tokens=n + 10, generated_tokens=3))
        yield Done(text, reason, _stats(prompt_tokens=n + 10, generated_tokens=3, tokens_seen=n))


ANSWERS = [
    ("bees and their hive. They make honey.", "stop"),
    ("bees and their hive. Ash grounds aircraft.", "stop"),  # said before: dropped
    ("chess. The game ends in checkmate. And then", "length"),  # unfinished: dropped
    ("bread and the oven", "stop"),  # ended by the stop: kept, with a full stop
]


def _events(session: FakeSession, text: str, settle: bool = False, **options) -> list:
    return list(Summarizer(session, max_tokens=16, **options).events(text, settle=settle))


def test_each_part_is_read_alone_and_summarized_in_order():
    text = markdown(SECTIONS, repeat=8)  # some 1,000 words: 4 parts of 256 tokens or more
    s = FakeSession(list(ANSWERS))
    events = _events(s, text)
    assert [p.document.split("\n")[0] for p in s.prompts] == [f"## {t}" for t in SECTIONS]
    assert all(p.suffix.endswith(f"Summary: {PART_CUE}") for p in s.prompts)
    assert all(g["max_tokens"] == 16 and g["stops"] == ["\n\n"] for g in s.gen)
    tokens = [e.text for e in events if isinstance(e, Token)]
    assert tokens == [  # issue 36: the cue is kvtrim's wording: the part's heading instead
        "Bees: bees and their hive. They make honey.",
        "\n\nChess: chess. The game ends in checkmate.",
        "\n\nBread: bread and the oven.",
    ]
    done = events[-1]
    assert isinstance(done, SummaryDone) and done.text == "".join(tokens)
    assert done.reason == "length" and [p.reason for p in done.parts][2] == "length"
    assert done.parts[1].text == "" and done.parts[1].generated == ANSWERS[1][0]
    assert [p.title for p in done.parts] == list(SECTIONS)
    assert done.overview is None and len(s.prompts) == 4  # nothing to settle


def test_progress_runs_over_the_whole_document_and_figures_add_up():
    text = markdown(SECTIONS, repeat=8)
    s = FakeSession(list(ANSWERS))
    events = _events(s, text)
    progress = [e for e in events if isinstance(e, Progress)]
    dones = [e.done for e in progress]
    assert dones == sorted(dones) and progress[-1].done == progress[-1].total
    words = sum(len(p.document.split()) for p in s.prompts)
    stats = events[-1].stats
    assert stats.prompt_tokens == progress[-1].done == words + 40
    assert stats.generated_tokens == 12 and stats.tokens_seen == words
    evicted = [e.stats.evicted_tokens for e in events if isinstance(e, Evicted)]
    assert evicted == [20, 20, 20, 20]  # the parts before had none: their own count
    assert stats.first_token_s is not None


def test_settled_the_whole_document_is_read_last_with_the_summaries_as_question():
    text = markdown(SECTIONS, repeat=8)
    overview = ("bees, volcanoes, chess and bread. It is a good place to start.", "stop")
    s = FakeSession([*ANSWERS, overview])
    events = _events(s, text, settle=True)
    last = s.prompts[-1]
    assert len(s.prompts) == 5 and last.document == text
    assert "Summaries of its sections:\n- This section describes bees" in last.suffix
    assert last.suffix.endswith("\n\nOverall, the document describes")
    assert s.gen[-1]["max_tokens"] == 16  # min(max_tokens, OVERVIEW_TOKENS)
    done = events[-1]
    assert done.text.endswith("\n\nOverall: bees, volcanoes, chess and bread.")
    assert done.overview.reason == "stop" and len(done.parts) == 4
    progress = [e for e in events if isinstance(e, Progress)]
    words = sum(len(p.document.split()) for p in s.prompts)
    assert progress[-1].done == progress[-1].total == words + 50
    assert [e.done for e in progress] == sorted(e.done for e in progress)


def test_a_short_document_is_one_part_and_needs_no_settling():
    s = FakeSession([("a short note about bees.", "eog")], capacity=5000)
    events = _events(s, "Bees make honey. " * 20, settle=True)
    assert len(s.prompts) == 1
    assert events[-1].text == "A short note about bees."  # no heading: capitalized
    assert events[-1].reason == "eog"


def test_a_summary_cut_short_everywhere_is_never_empty():
    """Every part's only sentence cut by --max-tokens: tidy keeps none, and the
    summary is the first part's words as written, ended with an ellipsis."""
    s = FakeSession([("bees and the hive where", "length")], capacity=5000)
    events = _events(s, "Bees make honey. " * 20)
    assert events[-1].text == "Bees and the hive where…"
    shown = [e.text for e in events if isinstance(e, Token)]
    assert shown == [events[-1].text] and events[-1].reason == "length"
    assert events[-1].parts[0].shown == events[-1].text
    assert events[-1].parts[0].text == f"{PART_CUE} bees and the hive where…"


def test_the_answer_prefix_starts_the_first_part_and_stops_replace_the_prompts():
    text = markdown(SECTIONS, repeat=8)
    s = FakeSession(list(ANSWERS))
    events = _events(s, text, answer_prefix="In short,", stops=["END"])
    assert s.prompts[0].suffix.endswith("Summary: In short,")
    assert s.prompts[1].suffix.endswith(f"Summary: {PART_CUE}")
    assert all(g["stops"] == ["END"] for g in s.gen)
    first = next(e for e in events if isinstance(e, Token))
    assert first.text == "bees and their hive. They make honey."  # the prefix comes first
    assert events[-1].text.startswith("bees and their hive.")


@pytest.mark.slow
def test_a_summary_covers_several_sections(engine):
    """The real model: a document of four sections (570 tokens; three parts in a
    budget of 256) gives several sentences that name more than one section."""
    from engine.runtime.spec import RequestSpec

    text = markdown(SECTIONS, repeat=4)
    spec = RequestSpec(budget_tokens=256, max_tokens=64)
    with spec.open(engine) as session:
        done = [e for e in spec.summarize(session, text) if isinstance(e, Done)][-1]
    assert isinstance(done, SummaryDone) and len(done.parts) >= 3, done
    said = done.text.lower()
    assert len(sentences(done.text)) >= 3, done.text
    named = [t for t in SECTIONS if t.lower().rstrip("s") in said]
    assert len(named) >= 2, done.text
    assert done.reason in ("stop", "eog", "length", "repetition")


# -- the CLI's figures --------------------------------------------------------


def test_the_summary_line_and_json_say_why_it_ended():
    from engine.cli.main import _finished, _parts

    assert _finished({"finish_reason": "length"}) == "finished: length, --max-tokens reached"
    parts = [{"finish_reason": r} for r in ("stop", "stop", "length", "stop", "repetition")]
    assert _finished({"finish_reason": "length", "summary_parts": parts}) == (
        "finished: length, --max-tokens reached (5 parts: 3 stop, 1 length, 1 repetition)"
    )
    assert _parts(Done("x", "stop", _stats())) is None  # an answer has no parts
    s = FakeSession(list(ANSWERS))
    done = _events(s, markdown(SECTIONS, repeat=8))[-1]
    rows = _parts(done)
    assert [r["title"] for r in rows] == list(SECTIONS)
    assert rows[2] == {
        "part": 3,
        "title": "Chess",
        "finish_reason": "length",
        "generated_tokens": 3,
        "text": f"{PART_CUE} chess. The game ends in checkmate.",
    }


def test_a_summarys_figures_are_the_documents_not_its_parts_summed():
    """Issue 36: tokens seen are the largest read's (the document's), not the reads'
    sum; counts of work (tokens read, evictions, reads) are summed."""
    from engine.runtime.summary import merged
    from engine.stats import KVStats

    base = {"policy": "snapkv", "budget_tokens": 256, "n_ctx": 512, "kv_bytes_per_cell": 9216}
    part = KVStats(**base, tokens_seen=3000, prompt_tokens=3000, evictions=5, cells_peak=320)
    whole = KVStats(**base, tokens_seen=9000, prompt_tokens=9000, evictions=30, cells_peak=300)
    total = merged(merged(merged(None, part), part), whole)
    assert total.tokens_seen == 9000 and total.prompt_tokens == 15000
    assert total.evictions == 40 and total.reads == 3 and total.cells_peak == 320


def test_a_summary_shows_no_scaffold_and_quotes_the_parts_facts():
    """Issue 36, item 7: the cue the model continued is not shown, and the part's
    most fact-dense sentence is quoted where the model's words leave its facts out
    (the demo document's summary left out its one fact, the pass key)."""
    from engine.runtime.summary_text import fact_sentence, present

    part = ("The grass is green. The sky is blue. " * 30 + "The pass key is 68142. Remember it. "
            "68142 is the pass key. " + "Here we go. There and back again. " * 30)  # fmt: skip
    said = f"{PART_CUE} the grass is green."
    fact = fact_sentence(part, said)
    assert fact == "The pass key is 68142."
    assert fact_sentence(part, f"{PART_CUE} the pass key 68142.") is None  # said already
    shown = present(said, PART_CUE, "Intro", fact)
    assert shown == "Intro: the grass is green. “The pass key is 68142.”"
    assert PART_CUE not in shown
    code = "x = foo(1, 2); y = bar[3] + 44.\nThe release of Python 3.11 came in October.\n"
    assert fact_sentence(code) == "The release of Python 3.11 came in October."
    assert present("In short, bees.", "In short,", "Bees") == "In short, bees."  # the user's
