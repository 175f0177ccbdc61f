"""Prompts for asking about and summarizing a document.

Instruction-tuned models get their own chat template (from the GGUF); base
models get a plain completion prompt. A prompt is split around the document so
the session can stream the document in chunks and knows the question's tokens,
which serve as the observation window of question-aware eviction.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, replace
from types import FrameType

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError
from ..native.model import Model

_DOC = "\x00KVTRIM_DOCUMENT\x00"

SUMMARY_INSTRUCTION = "Summarize the document above in a few sentences."


Span = tuple[int, int]  # [start, end) in characters


@dataclass(frozen=True)
class Prompt:
    """``prefix`` + ``document`` + ``suffix``; ``suffix`` is also the question window.

    ``prefix_markup`` / ``suffix_markup``: the character spans the chat template
    wrote (``<start_of_turn>`` and the like), the only text tokenized with control
    tokens parsed. Everything else, the document and every user text included, is
    tokenized as plain text, so a document cannot forge a turn or an end of text.
    """

    prefix: str
    document: str
    suffix: str
    stops: tuple[str, ...]
    add_bos: bool
    prefix_markup: tuple[Span, ...] = ()
    suffix_markup: tuple[Span, ...] = ()


def _render_chat(
    template: str, model: Model, user: str, system: str = ""
) -> tuple[str, tuple[Span, ...]]:
    messages = [{"role": "system", "content": system}] if system.strip() else []
    return _render_marked(template, model, [*messages, {"role": "user", "content": user}])


_CONTENT = re.compile("\x00KVTRIM_CONTENT_([0-9]+)\x00")


def _render_marked(
    template: str, model: Model, messages: list[dict[str, str]]
) -> tuple[str, tuple[Span, ...]]:
    """Render with each message's content as a placeholder, then put the contents
    in: returns the text and the spans the template itself wrote (its markup)."""
    marked = [{**m, "content": f"\x00KVTRIM_CONTENT_{i}\x00"} for i, m in enumerate(messages)]
    rendered = _render_messages(template, model, marked)
    trims = _trims(template)
    parts: list[str] = []
    markup: list[Span] = []
    at = length = 0
    for match in _CONTENT.finditer(rendered):
        template_text = rendered[at : match.start()]
        content = messages[int(match.group(1))].get("content", "")
        content = content.strip() if trims else content
        if template_text:
            markup.append((length, length + len(template_text)))
        parts += [template_text, content]
        length += len(template_text) + len(content)
        at = match.end()
    if at < len(rendered):
        markup.append((length, length + len(rendered) - at))
        parts.append(rendered[at:])
    return "".join(parts), tuple(markup)


def _trims(template: str) -> bool:
    """Whether the template trims each message's content (Gemma's and Llama 3's do),
    so the text put back in place of a placeholder must be trimmed too."""
    return "trim" in template


def _cut(spans: tuple[Span, ...], at: int, end: int) -> tuple[Span, ...]:
    """``spans`` clipped to [at, end) and moved to start at 0."""
    return tuple((max(a, at) - at, min(b, end) - at) for a, b in spans if min(b, end) > max(a, at))


RENDER_SECONDS = 2.0  # a chat template renders a conversation in well under 10 ms
MAX_TEMPLATE_CHARS = 256 * 1024  # real templates are 1-20 KB
MAX_MARKUP_CHARS = 64 * 1024  # what a template may write around the messages' contents


class _Deadline:
    """A trace function that stops a render past ``RENDER_SECONDS`` (Jinja compiles a
    template to Python, so every loop step of it is a traced line)."""

    def __init__(self) -> None:
        self.until = time.monotonic() + RENDER_SECONDS
        self.lines = 0

    def __call__(self, frame: FrameType, event: str, arg: object) -> _Deadline:
        self.lines += 1
        if self.lines % 4096 == 0 and time.monotonic() > self.until:
            raise TimeoutError(f"it did not finish within {RENDER_SECONDS:.0f} s")
        return self


def _render_messages(template: str, model: Model, messages: list[dict[str, str]]) -> str:
    """The template rendered in Jinja's immutable sandbox, bounded in time and size.
    ``raise_exception`` in the template is a ValueError (it refuses the conversation);
    anything else that goes wrong is a ``TemplateError`` naming the model file."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    if len(template) > MAX_TEMPLATE_CHARS:
        raise _template_error(model, ValueError(f"it is {len(template):,} characters long"))
    native = model.native
    previous = sys.gettrace()
    try:
        compiled = env.from_string(template)
        sys.settrace(_Deadline())
        try:
            rendered = compiled.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=native.token_get_text(native.token_bos()),
                eos_token=native.token_get_text(native.token_eos()),
                raise_exception=raise_exception,
            )
        finally:
            sys.settrace(previous)
    except (
        jinja2.TemplateError,
        TypeError,
        AttributeError,
        LookupError,
        ArithmeticError,
        MemoryError,
        RecursionError,
        TimeoutError,
    ) as exc:
        raise _template_error(model, exc) from None
    if len(rendered) > MAX_MARKUP_CHARS + sum(len(m.get("content", "")) for m in messages):
        raise _template_error(model, ValueError(f"it wrote {len(rendered):,} characters"))
    return rendered


def _template_error(model: Model, exc: BaseException) -> TemplateError:
    why = " ".join(str(exc).split())[:160] or type(exc).__name__
    return TemplateError(
        f"{model.info.path}: its chat template cannot be used ({type(exc).__name__}: {why})"
    )


Sources = list[tuple[str, str | None, list[int]]]  # (name, text, tokens) for the memory map


def prompt_tokens(model: Model, prompt: Prompt) -> tuple[list[int], list[int], Sources]:
    """``prompt`` as the tokens a session reads (its prefix and document), the tokens
    of its question part, and the sources of both for the memory map."""
    head = model.tokenize(prompt.prefix, add_bos=prompt.add_bos, markup=prompt.prefix_markup)
    body = model.tokenize(prompt.document)
    tail = model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
    sources: Sources = [
        ("prompt", prompt.prefix, head),
        ("document", prompt.document, body),
        ("question", prompt.suffix, tail),
    ]
    return head + body, tail, sources


def check_template(model: Model) -> str | None:
    """Render a sample conversation once (as a model is loaded), so a template that
    cannot work is refused with one line before any chat starts. A template that
    renders without writing the conversation's messages would drop every question:
    the model then gets plain prompts (``model.info.chat_template`` is cleared), and
    the returned note says so."""
    template = model.info.chat_template
    if not template:
        return None
    try:
        _render_chat(template, model, "Hello?", system="Be brief.")
        _render_chat(template, model, "Hello?")
        marked = [{"role": "user", "content": "\x00KVTRIM_CONTENT_0\x00"}]
        writes_messages = "\x00KVTRIM_CONTENT_0\x00" in _render_messages(template, model, marked)
    except ValueError as exc:  # the template refuses even a plain question
        raise _template_error(model, exc) from None
    if writes_messages:
        return None
    model.info = replace(model.info, chat_template=None)
    return (
        "the model's chat template does not write the conversation's messages (a question "
        "would be dropped); kvtrim gives this model plain prompts instead"
    )


_TAG = re.compile(r"\s*(<[^<>\s]{2,40}>)")


def _answer_cue(model: Model, answer_prefix: str) -> str:
    """``answer_prefix`` as the start of the answer: after "Answer:" with a space in a
    plain prompt; with a chat template, as the assistant's message starts in the
    template's own rendering (right after the generation prompt, no added space)."""
    prefix = answer_prefix.strip()
    if not prefix:
        return ""
    template = model.info.chat_template
    return f"{_answer_lead(template, model)}{prefix}" if template else f" {prefix}"


def _answer_lead(template: str, model: Model) -> str:
    """The whitespace a template writes between its generation prompt and an
    assistant message's content; usually none (the prompt ends in "model\n")."""
    user = {"role": "user", "content": "?"}
    mark = "\x00KVTRIM_ANSWER\x00"
    try:
        opened = _render_messages(template, model, [user])
        written = _render_messages(template, model, [user, {"role": "assistant", "content": mark}])
    except Exception:  # a template that cannot render an answer: nothing to learn
        return ""
    at = written.find(mark)
    lead = written[len(opened) : at] if written.startswith(opened) and at >= len(opened) else ""
    return lead if lead.isspace() else ""


def turn_stops(template: str, model: Model) -> tuple[str, ...]:
    """The tag a template writes right after an assistant's message ("<end_of_turn>",
    "<|im_end|>", "<|eot_id|>"), as a stop: a model that writes it as text, or as a
    control token its GGUF does not list as end of generation, still stops there."""
    mark = "\x00KVTRIM_ANSWER\x00"
    try:
        rendered, _ = _render_marked(
            template,
            model,
            [
                {"role": "user", "content": "?"},
                {"role": "assistant", "content": mark},
                {"role": "user", "content": "?"},
            ],
        )
    except Exception:  # a template that cannot render a second turn has no stop to give
        return ()
    found = _TAG.match(rendered[rendered.find(mark) + len(mark) :])
    return (found.group(1),) if found else ()


def _split(
    model: Model,
    user_before: str,
    user_after: str,
    plain: tuple[str, str, tuple[str, ...]],
    document: str,
    system: str = "",
) -> Prompt:
    template = model.info.chat_template
    if template:
        rendered, markup = _render_chat(template, model, f"{user_before}{_DOC}{user_after}", system)
        cut = rendered.find(_DOC)
        prefix, suffix = rendered[:cut], rendered[cut + len(_DOC) :]
        bos_text = model.native.token_get_text(model.native.token_bos())
        add_bos = model.add_bos and not prefix.startswith(bos_text)
        return Prompt(
            prefix,
            document,
            suffix,
            turn_stops(template, model),
            add_bos,
            _cut(markup, 0, cut),
            _cut(markup, cut + len(_DOC), len(rendered)),
        )
    prefix, suffix, stops = plain
    if system.strip():
        prefix = f"{system.strip()}\n\n{prefix}"
    return Prompt(prefix, document, suffix, stops, model.add_bos)


def ask_prompt(
    model: Model, document: str, question: str, answer_prefix: str = "", system: str = ""
) -> Prompt:
    """A question about a document; the answer follows the prompt.

    ``answer_prefix`` starts the answer ("The pass key is"), which steers base
    models that would otherwise answer in general terms.
    """
    question = question.strip()
    cue = _answer_cue(model, answer_prefix)
    prompt = _split(
        model,
        "Read the document and answer the question after it.\n\n<document>\n",
        f"\n</document>\n\nQuestion: {question}",
        (
            "",
            f"\n\nAnswer the question using the text above.\nQuestion: {question}\nAnswer:",
            ("\n\n", "\nQuestion:"),
        ),
        document,
        system,
    )
    return replace(prompt, suffix=prompt.suffix + cue)


def summary_prompt(
    model: Model,
    document: str,
    instruction: str = SUMMARY_INSTRUCTION,
    system: str = "",
    answer_prefix: str = "",
) -> Prompt:
    """A summary of a document; ``answer_prefix`` starts it, as in ``ask_prompt``."""
    prompt = _split(
        model,
        "<document>\n",
        f"\n</document>\n\n{instruction}",
        ("", "\n\nIn summary,", ("\n\n",)),
        document,
        system,
    )
    return replace(prompt, suffix=prompt.suffix + _answer_cue(model, answer_prefix))


PART_INTRO = "Below is a section of a document, followed by a short summary of it."
PART_INSTRUCTION = "Summarize this section of a document in two or three sentences."
PART_CUE = "This section describes"


def part_summary_prompt(model: Model, part: str, cue: str = PART_CUE, system: str = "") -> Prompt:
    """A summary of one part of a document (runtime/summary.py), starting with
    ``cue``. A base model gets a frame it can continue: the part, then "Summary:
    This section describes", ending at a blank line. Measured on parts of five real
    documents (scripts/summary_eval.py), "describes" makes Gemma 3 270M say what
    the part is about, where "Summary: This section" alone wrote "is a summary of
    the following:" and "TL;DR:" or "In summary," looped on one sentence. An
    instruction-tuned model gets ``PART_INSTRUCTION`` in its chat template, the cue
    starting its answer."""
    prompt = _split(
        model,
        f"{PART_INSTRUCTION}\n\n<document>\n",
        "\n</document>",
        (f"{PART_INTRO}\n\n", "\n\nSummary:", ("\n\n",)),
        part,
        system,
    )
    return replace(prompt, suffix=prompt.suffix + _answer_cue(model, cue))


OVERVIEW_CUE = "Overall, the document describes"


def overview_prompt(
    model: Model, document: str, summaries: list[str], cue: str = OVERVIEW_CUE, system: str = ""
) -> Prompt:
    """The whole document again, then its parts' ``summaries`` as the question (they
    vote at every eviction) and ``cue``: a sentence on the whole document, after which
    the cache holds the document for follow-ups (runtime/summary.py)."""
    listing = "\n".join(f"- {s}" for s in summaries)
    sections = f"\n\nSummaries of its sections:\n{listing}"
    prompt = _split(
        model,
        "Read the document and the summaries of its sections after it.\n\n<document>\n",
        f"\n</document>{sections}\n\nSummarize the whole document in one sentence.",
        ("", f"{sections}\n\n{cue}", ("\n\n",)),
        document,
        system,
    )
    if not model.info.chat_template:
        return prompt  # the cue ends the plain suffix, without _answer_cue's space
    return replace(prompt, suffix=prompt.suffix + _answer_cue(model, cue))


EXCERPT_INTRO = "From the document:"
EXCERPT_GAP = "\n…\n"  # between two excerpts; the session inserts their tokens


def follow_up_prompt(
    model: Model, question: str, answer_prefix: str = "", *, excerpt: bool = False
) -> Prompt:
    """The next turn of a chat, appended after the previous answer in the cache.

    With a chat template it is the text the template writes between the end of
    an assistant message and the next generation prompt. ``excerpt``: the user's
    message starts with passages of the document that the session re-decodes
    (recall.py) between ``prefix`` and ``suffix``; else ``prefix`` is empty.
    """
    question = question.strip()
    cue = _answer_cue(model, answer_prefix)
    template = model.info.chat_template
    intro = f"{EXCERPT_INTRO}\n" if excerpt else ""
    outro = "\n\n" if excerpt else ""
    if not template:
        before = f"\n\n{intro}"
        turn = f"{outro if excerpt else before}Question: {question}\nAnswer:{cue}"
        return Prompt(before if excerpt else "", "", turn, ("\n\n", "\nQuestion:"), False)
    mark = "\x00KVTRIM_ANSWER\x00"
    user = f"{intro}{_DOC}{outro}{question}" if excerpt else question
    rendered, markup = _render_marked(
        template,
        model,
        [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": mark},
            {"role": "user", "content": user},
        ],
    )
    cut = rendered.find(mark) + len(mark)
    stops = turn_stops(template, model)
    if not excerpt:
        turn = rendered[cut:] + cue
        return Prompt("", "", turn, stops, False, (), _cut(markup, cut, len(rendered)))
    doc = rendered.find(_DOC)
    end = len(rendered)
    return Prompt(
        rendered[cut:doc],
        "",
        rendered[doc + len(_DOC) :] + cue,
        stops,
        False,
        _cut(markup, cut, doc),
        _cut(markup, doc + len(_DOC), end),
    )


def chat_prompt(model: Model, messages: list[dict[str, str]]) -> Prompt:
    """A whole conversation (OpenAI-style ``role``/``content`` dicts) ending in a user
    message. ``prefix`` holds everything before that message's text; ``suffix`` is
    its text plus the generation prompt, so it votes at every eviction."""
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("the last message must come from the user")
    template = model.info.chat_template
    last = messages[-1]["content"]
    if template:
        mark = "\x00KVTRIM_QUESTION\x00"
        rendered, markup = _render_marked(
            template, model, [*messages[:-1], {"role": "user", "content": mark}]
        )
        cut = rendered.find(mark)
        before, after = rendered[:cut], rendered[cut + len(mark) :]
        bos_text = model.native.token_get_text(model.native.token_bos())
        add_bos = model.add_bos and not before.startswith(bos_text)
        question = last.strip() if _trims(template) else last
        tail = _cut(markup, cut + len(mark), len(rendered))
        tail = tuple((a + len(question), b + len(question)) for a, b in tail)
        stops = turn_stops(template, model)
        return Prompt(before, "", question + after, stops, add_bos, _cut(markup, 0, cut), tail)
    parts: list[str] = []
    for m in messages[:-1]:
        role, content = m.get("role"), m.get("content", "").strip()
        if role == "system":
            parts.append(f"{content}\n\n")
        elif role == "user":
            parts.append(f"Question: {content}\n")
        elif role == "assistant":
            parts.append(f"Answer: {content}\n\n")
    return Prompt(
        "".join(parts),
        "",
        f"Question: {last.strip()}\nAnswer:",
        ("\nQuestion:", "\n\n"),
        model.add_bos,
    )
