"""Answers that stop (issue 36, item 5): after the app's Summarize, "What is the pass
key?" wrote "The pass key is 68142. Remember it. 68142 is the pass key. The pass key
is 68142. ..." until max tokens; the loop guard now catches a unit of a sentence or
two and the answer ends after its first round, as the full cache's does."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.runtime.chat import Chat

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "samples" / "passkey.txt"


def test_after_a_summary_the_pass_key_answer_stops_after_one_round(engine):
    with engine.session("snapkv", 1024) as s:
        chat = Chat(s, SAMPLE.read_text(), model_name="m")
        chat.turn(None)  # Summarize, part by part
        turn = chat.turn("What is the pass key?")
    assert turn.text.count("68142") <= 2, turn.text  # "... 68142. Remember it. 68142 ..."
    assert turn.text.count("The pass key is") == 1, turn.text
    assert turn.reason in ("stop", "eog", "repetition") and turn.stats.generated_tokens < 100
