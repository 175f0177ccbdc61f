"""After the app's Summarize of the README's sample (issue 36): the figures are the
document's, not its parts' summed (the Graphs tab said "1,224 of 19,274 tokens" and
llama.cpp's default at 72.0 MB for a 9,232-token text, 42.8 MB); and "What is the pass
key?" wrote "The pass key is 68142. Remember it. 68142 is the pass key. The pass key is
68142. ..." until max tokens, where the loop guard now ends it after its first round."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.runtime.chat import Chat

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[2] / "resources" / "samples" / "passkey.txt"


def test_after_a_summary_the_pass_key_answer_stops_after_one_round(engine):
    with engine.session("snapkv", 1024) as s:
        chat = Chat(s, SAMPLE.read_text(), model_name="m")
        shown: list = []  # what the app's graphs and status line get: the events' figures
        chat.turn(None, on_event=shown.append)  # Summarize, part by part, then the whole
        turn = chat.turn("What is the pass key?")
    doc_tokens = len(engine.model.tokenize(SAMPLE.read_text()))
    seen = [e.stats.tokens_seen for e in shown if hasattr(e, "stats")]
    assert max(seen) < doc_tokens * 1.05  # never the parts' sum (19,274 for 9,232)
    stats = shown[-1].stats  # the summary's Done
    assert stats.reads > 2 and doc_tokens <= stats.tokens_seen < doc_tokens * 1.05
    assert stats.kv_bytes_llama_default < stats.layout.llama_default(int(doc_tokens * 1.05))
    assert stats.prompt_tokens > doc_tokens  # what was read, over every pass
    assert turn.text.count("68142") <= 2, turn.text  # "... 68142. Remember it. 68142 ..."
    assert turn.text.count("The pass key is") == 1, turn.text
    assert turn.reason in ("stop", "eog", "repetition") and turn.stats.generated_tokens < 100
