"""Hostile chat templates (issue 23, FAIL 1-3): a model whose template cannot work is
refused as it loads, with one line naming the file, never a traceback or a hang.
Each case is a copy of the default model with only its template rewritten."""

from __future__ import annotations

import io
import time

import pytest
from helpers.gguf_files import gguf_with_template

from engine import Engine, ModelError
from engine.cli.main import main
from engine.errors import TemplateError
from engine.native.embedded import default_model_path
from engine.serve.api_errors import from_engine

pytestmark = pytest.mark.slow

GOOD = (
    "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n"
    "{% endfor %}"
)
CASES = {
    "syntax": ("{% if %}" + GOOD, "TemplateSyntaxError"),
    "sandbox escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}" + GOOD, "SecurityError"),
    "raise_exception": ("{{ raise_exception('no chats here') }}" + GOOD, "no chats here"),
    "include": ("{% include '/etc/passwd' %}" + GOOD, "TypeError"),
    "never ends": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}" + GOOD,
        "did not finish within 2 s",
    ),
    "huge": (GOOD + "x" * 300_000, "300,"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-templates")
    paths = {}
    for name, (template, _) in CASES.items():
        paths[name] = out / f"{name.replace(' ', '_')}.gguf"
        gguf_with_template(default_model_path(), paths[name], template)
    paths["not utf-8"] = out / "not_utf8.gguf"
    gguf_with_template(default_model_path(), paths["not utf-8"], b"\xff\xfe\xc0 {{ x }}")
    return paths


@pytest.mark.parametrize("case", list(CASES))
def test_a_template_that_cannot_work_is_refused_at_load_in_one_line(models, case):
    start = time.monotonic()
    with pytest.raises(TemplateError) as caught:
        Engine(models[case])
    message = str(caught.value)
    assert message.startswith(str(models[case])) and "chat template cannot be used" in message
    assert CASES[case][1] in message and "\n" not in message
    assert time.monotonic() - start < 10, "bounded, not a hang"


def test_template_bytes_that_are_not_utf8_are_a_model_error(models):
    with pytest.raises(ModelError, match="not UTF-8"):
        Engine(models["not utf-8"])


@pytest.mark.parametrize("case", ["never ends", "sandbox escape", "not utf-8"])
def test_kvtrim_ask_says_one_line_and_exits_2(models, case, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The pass key is 4242.")
    err = io.StringIO()
    code = main(["ask", str(doc), "-q", "What is the pass key?", "--model", str(models[case])],
                out=io.StringIO(), err=err)
    assert code == 2
    assert err.getvalue().startswith("kvtrim: error:") and err.getvalue().count("\n") == 1
    assert "Traceback" not in err.getvalue()


def test_the_server_names_a_template_error():
    error = from_engine(TemplateError("m.gguf: its chat template cannot be used (x)"))
    assert (error.status, error.code) == (500, "model_template_error")


def test_a_template_that_ignores_the_messages_gets_plain_prompts(tmp_path):
    """Issue 23 WEAK: a template that writes no message silently dropped the question
    from every prompt; now the model gets plain prompts and a note says why."""
    path = tmp_path / "ignores.gguf"
    gguf_with_template(default_model_path(), path, "<start_of_turn>user\nHi<end_of_turn>\n")
    doc = tmp_path / "doc.txt"
    doc.write_text("Notes. The pass key is 4242. More notes.")
    with Engine(path) as engine:
        assert engine.model.info.chat_template is None
        (note,) = engine.notes
        assert "does not write the conversation's messages" in note
    out, err = io.StringIO(), io.StringIO()
    argv = ["ask", str(doc), "-q", "What is the pass key?", "--model", str(path)]
    argv += ["--answer-prefix", "The pass key is", "--max-tokens", "6"]
    assert main(argv, out=out, err=err) == 0
    assert "note: the model's chat template does not write" in err.getvalue()
    assert "4242" in out.getvalue()
