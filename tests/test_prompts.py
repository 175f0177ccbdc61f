"""Prompts: plain completion for base models, the GGUF's chat template otherwise."""

from __future__ import annotations

import dataclasses
import types

from engine.prompts import ask_prompt, follow_up_prompt, summary_prompt

GEMMA_IT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_base_model_gets_a_plain_prompt(engine):
    p = ask_prompt(engine.model, "DOC", "Who?", answer_prefix="The answer is")
    assert p.prefix == "" and p.document == "DOC"
    assert p.suffix.endswith("Question: Who?\nAnswer: The answer is")
    assert p.add_bos and "\n\n" in p.stops
    assert summary_prompt(engine.model, "DOC").suffix.endswith("In summary,")


def test_instruction_model_gets_its_chat_template(engine):
    info = dataclasses.replace(engine.model.info, chat_template=GEMMA_IT_TEMPLATE)
    fake = types.SimpleNamespace(info=info, native=engine.model.native, add_bos=True)
    p = ask_prompt(fake, "THE DOCUMENT", "What is the pass key?")
    assert p.prefix.startswith("<bos><start_of_turn>user\n")
    assert p.document == "THE DOCUMENT"
    assert p.suffix.endswith("Question: What is the pass key?<end_of_turn>\n<start_of_turn>model\n")
    assert not p.add_bos, "the template already writes <bos>"
    assert p.stops == ()


def test_system_prompt_and_follow_up_turns(engine):
    base = ask_prompt(engine.model, "DOC", "Who?", system="Be brief.")
    assert base.prefix.startswith("Be brief.\n\n")
    turn = follow_up_prompt(engine.model, "And then?", answer_prefix="Then")
    assert turn.suffix == "\n\nQuestion: And then?\nAnswer: Then" and not turn.add_bos
    info = dataclasses.replace(engine.model.info, chat_template=GEMMA_IT_TEMPLATE)
    fake = types.SimpleNamespace(info=info, native=engine.model.native, add_bos=True)
    chat = ask_prompt(fake, "DOC", "Who?", system="Be brief.")
    assert chat.prefix.startswith("<bos><start_of_turn>system\nBe brief.<end_of_turn>")
    turn = follow_up_prompt(fake, "And then?")
    assert turn.suffix == (
        "<end_of_turn>\n<start_of_turn>user\nAnd then?<end_of_turn>\n<start_of_turn>model\n"
    )
