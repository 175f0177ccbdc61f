"""``kvtrim chat FILE``: a conversation about a document, in a terminal or scripted.

On a terminal: a prompt with readline history, answers streamed as they are
generated, Ctrl+C stops an answer (Ctrl+C or Ctrl+D at the prompt quits), and
``/summarize``, ``/kept [PATH]``, ``/help``, ``/quit``. With ``--script
FILE.jsonl``, ``--json`` or a stdin that is not a terminal: JSON lines in
(``{"question": "...", "answer_prefix": "..."}`` or ``{"summarize": true}``),
one JSON object per turn out.

kvtrim chat notes.txt --budget 1024
kvtrim chat notes.txt --script turns.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

from ..documents.load import load_document, read_regular
from ..errors import (
    Cancelled,
    DocumentError,
    EngineError,
    KvtrimError,
    ModelError,
    OutOfMemoryError,
    shown,
)
from ..runtime.chat import Chat, SavedChat, Turn, record, status_line
from ..runtime.spec import RequestSpec
from ..runtime.states import default_store
from ..stats import Event, Progress, Token
from . import types
from .options import engine_from_args

PROMPT = "> "
HISTORY_ENV = "KVTRIM_CHAT_HISTORY"  # a file for readline history; empty: none
FATAL = (OutOfMemoryError, EngineError, ModelError)  # these end a chat (exit 2)
LINE_KEYS = ("question", "answer_prefix", "summarize")
HELP = """\
Ask anything about the document; the answer streams as it is written.
  /summarize     summarize the document
  /kept [PATH]   write what the cache holds over the text as HTML (default kept.html)
  /help          this help
  /quit          leave (also Ctrl+D, or Ctrl+C at the prompt)
Ctrl+C while an answer is read or written stops that answer.
"""


def add_options(p: argparse.ArgumentParser) -> None:
    """Options of ``chat`` beyond those it shares with ``ask`` (cli._common)."""
    p.add_argument(
        "--script",
        type=Path,
        default=None,
        metavar="FILE.jsonl",
        help='turns as JSON lines: {"question": "...", "answer_prefix": "..."} or '
        '{"summarize": true}; one JSON object per turn is printed',
    )
    p.add_argument(
        "--new",
        action="store_true",
        help="start a new conversation (by default the last one about the same file "
        "resumes from its saved cache, when the model and settings are the same)",
    )
    p.add_argument(
        "--recall-tokens",
        type=types.at_least(0, "tokens"),
        default=None,
        metavar="N",
        help="evicted document tokens a follow-up may bring back (default: a chunk; 0: none)",
    )
    helps = {  # shared options that mean something a little different here
        "--json": "JSON lines in (stdin) and out, even on a terminal",
        "--show-kept": "at the end, write what the cache held over the text as HTML",
        "--stop": "stop string of every answer (repeatable)",
        "--answer-prefix": "text every answer to a question starts with (script lines "
        "may give their own)",
    }
    for action in p._actions:
        for option in action.option_strings:
            action.help = helps.get(option, action.help)


def parse_line(line: str) -> tuple[str | None, str | None]:
    """A script line as ``(question or None for a summary, answer_prefix or None)``;
    ``ValueError`` says what is wrong with it."""
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:  # '[' * 100000: the parser's stack, not a traceback (issue 23)
        raise ValueError("not JSON: nested too deeply") from None
    if not isinstance(item, dict):
        raise ValueError("a line must be a JSON object")
    unknown = sorted(set(item) - set(LINE_KEYS))
    if unknown:
        raise ValueError(f"unknown key {', '.join(map(repr, unknown))}; use {', '.join(LINE_KEYS)}")
    question, prefix, summarize = (item.get(k) for k in LINE_KEYS)
    if summarize not in (None, True):
        raise ValueError('"summarize" must be true')
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError('"answer_prefix" must be a string')
    if summarize:
        if question is not None or prefix is not None:
            raise ValueError('"summarize" goes alone, without a question or answer_prefix')
        return None, None
    if not isinstance(question, str) or not question.strip():
        raise ValueError('a line needs a non-empty "question" or "summarize": true')
    return question, prefix


def as_text(line: str) -> str:
    """``line`` as valid Unicode: bytes that were not UTF-8 (read with Python's
    surrogate escapes) become U+FFFD, so no output echoes them as raw bytes."""
    return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run_script(chat: Chat, lines: Iterable[str], out: TextIO) -> int:
    """Run each JSON line as a turn, printing one JSON object per turn (or per bad
    line, with ``error``). 0 when every line ran, 1 if any failed."""
    failed = False

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        out.flush()

    for number, raw in enumerate(lines, start=1):
        line = as_text(raw)
        if not line.strip():
            continue
        try:
            question, prefix = parse_line(line)
        except ValueError as exc:
            emit({"line": number, "error": str(exc)})
            failed = True
            continue
        try:
            with ctrl_c_stops(chat):
                turn = chat.turn(question, prefix)
        except FATAL:
            raise
        except KvtrimError as exc:
            emit({"line": number, "turn": chat.started, "error": str(exc)})
            failed = True
            continue
        resumed = {"resumed": chat.resumed}
        if chat.resume_note and len(chat.history) == 1:
            resumed["resume_note"] = chat.resume_note  # type: ignore[assignment]
        emit({**record(turn), **resumed, "line": number})
        if turn.reason == "cancelled":  # Ctrl+C: the rest of the script is not run
            raise Cancelled("cancelled")
    return 1 if failed else 0


@contextmanager
def ctrl_c_stops(chat: Chat) -> Iterator[None]:
    """Ctrl+C stops the chat's turn (``Chat.stop``) instead of raising
    ``KeyboardInterrupt`` until the block ends (only the main thread gets signals)."""
    chat.stopping.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    llama_log = logging.getLogger("kvtrim.llama")
    level = llama_log.level

    def handler(_sig: int, _frame: object) -> None:
        llama_log.setLevel(logging.CRITICAL)  # llama.cpp logs the abort as a failed decode
        chat.stop()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        llama_log.setLevel(level)


def _dim(text: str, stream: TextIO) -> str:
    return f"\033[2m{text}\033[0m" if _isatty(stream) else text


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or closed
        return False


def _answer(chat: Chat, question: str | None, out: TextIO, err: TextIO) -> Turn:
    """One interactive turn: progress while reading, the answer streamed to ``out``."""
    progress = _isatty(err)
    shown = False

    def on_event(event: Event) -> None:
        nonlocal shown
        if isinstance(event, Progress) and progress:
            err.write(f"\rreading {event.done:,}/{event.total:,} tokens")
            err.flush()
            shown = True
        elif isinstance(event, Token):
            if shown:
                err.write("\r\033[K")
                shown = False
            out.write(event.text)
            out.flush()

    prefix = chat.answer_prefix.strip() if question else ""
    try:
        with ctrl_c_stops(chat):
            if prefix:
                out.write(prefix)
                out.flush()
            turn = chat.turn(question, on_event=on_event)
    finally:
        if shown:
            err.write("\r\033[K")
    if turn.reason == "cancelled":
        out.write(" [stopped]\n" if turn.text or prefix else "[stopped]\n")
        if not chat.session.can_follow_up:
            err.write(_dim("the document is read again with the next question", err) + "\n")
            return turn
    else:
        out.write("\n" if turn.text.strip() or prefix else "(no answer)\n")
    out.flush()
    err.write(_dim(status_line(turn), err) + "\n")
    err.flush()
    return turn


def interactive(chat: Chat, read_line: Callable[[str], str], out: TextIO, err: TextIO) -> int:
    """The prompt loop; ``read_line`` is ``input`` on a terminal. Returns 0."""
    while True:
        try:
            line = as_text(read_line(PROMPT)).strip()
        except (EOFError, KeyboardInterrupt):  # Ctrl+D or Ctrl+C at the prompt
            out.write("\n")
            out.flush()
            return 0
        if not line:
            continue
        question: str | None = line
        if line.startswith("/"):
            command, _, rest = line.partition(" ")
            if command in ("/quit", "/exit", "/q"):
                return 0
            if command == "/help":
                out.write(HELP)
                continue
            if command == "/kept":
                try:
                    path = chat.write_kept(Path(rest.strip() or "kept.html"))
                    err.write(f"wrote {path.resolve()}\n")
                except KvtrimError as exc:
                    err.write(f"kvtrim: error: {shown(exc)}\n")
                continue
            if command != "/summarize":
                err.write(f"unknown command {command}; /help lists them\n")
                continue
            question = None
        try:
            _answer(chat, question, out, err)
        except FATAL:
            raise
        except KvtrimError as exc:  # this turn failed; the chat goes on
            err.write(f"kvtrim: error: {shown(exc)}\n")


def _resumed_line(chat: Chat) -> str:
    """What a terminal chat says of the saved conversation about this file."""
    if chat.resumed:
        n = len(chat.earlier)
        return (
            f"resumed the conversation of {n} turn{'s' * (n != 1)} about this file from its "
            f"saved cache ({chat.resume_s:.1f} s; --new starts over)"
        )
    if not chat.resume_note:
        return ""
    note = chat.resume_note
    if not note.startswith("the saved cache"):
        note = f"the saved conversation's cache {note}"
    return f"not resumed: {note}; reading again"


def history_file() -> Path | None:
    """Where readline history is kept: ``$KVTRIM_CHAT_HISTORY`` (empty: nowhere),
    else ``chat_history`` in the user data folder."""
    override = os.environ.get(HISTORY_ENV)
    if override is not None:
        return Path(override) if override else None
    from platformdirs import user_data_dir

    return Path(user_data_dir("kvtrim", appauthor=False)) / "chat_history"


def usable_history(path: Path | None, err: TextIO | None = None) -> Path | None:
    """``path`` when readline may read and rewrite it: absent, or a regular file that
    is not a symlink (a FIFO would block the prompt, a symlink's target would be cut
    to 1,000 lines); else None, said in one line on ``err``."""
    if path is None:
        return None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        mode, why = 0, exc.strerror or type(exc).__name__
    else:
        why = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
    if stat.S_ISREG(mode):
        return path
    if err is not None:
        err.write(f"kvtrim: chat history not kept: {shown(path)} is {why}\n")
    return None


@contextmanager
def readline_history(path: Path | None, err: TextIO | None = None) -> Iterator[None]:
    """Up/down arrows recall earlier lines (where ``readline`` exists: not on plain
    Windows); history is loaded from and saved to ``path`` when it can be (see
    ``usable_history``)."""
    try:
        import readline
    except ImportError:
        yield
        return
    readline.set_history_length(1000)
    path = usable_history(path, err)
    if path is not None:
        with suppress(OSError):
            readline.read_history_file(path)
    try:
        yield
    finally:
        if path is not None:
            with suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(path)


def _script_lines(path: Path) -> list[str]:
    """The script's lines, read as documents are: regular files only (a FIFO or
    /dev/zero is refused, not read forever), at most ``MAX_DOCUMENT_BYTES``."""
    try:
        return read_regular(path, "script").decode("utf-8").splitlines()
    except FileNotFoundError:
        raise DocumentError(f"{path}: script not found") from None
    except IsADirectoryError:
        raise DocumentError(f"{path}: a directory, not a script") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{path}: the script is not UTF-8 text") from None
    except OSError as exc:
        raise DocumentError(f"{path}: cannot read the script: {exc.strerror or exc}") from None


def main(args: argparse.Namespace, out: TextIO, err: TextIO, inp: TextIO | None = None) -> int:
    """Run ``kvtrim chat``; ``inp`` is stdin unless a test passes another stream."""

    inp = inp or sys.stdin
    text = load_document(args.file)
    lines = _script_lines(args.script) if args.script is not None else None
    scripted = lines is not None or args.json or not _isatty(inp)
    with engine_from_args(args) as engine:
        for note in engine.notes:
            err.write(f"note: {note}\n")
        spec = RequestSpec.from_args(args)
        session = spec.open(engine)
        with session:
            store = default_store()
            chat = Chat(
                session,
                text,
                max_tokens=spec.max_tokens,
                sampling=spec.sampling,
                stops=list(spec.stops) if spec.stops is not None else None,
                answer_prefix=spec.answer_prefix,
                model_name=engine.model_name,
                saved=SavedChat(store, text) if store is not None else None,
            )
            if not args.new:
                chat.resume()
            if scripted:
                code = run_script(chat, lines if lines is not None else inp, out)
            else:
                err.write(
                    f"{Path(args.file).name}: {len(text):,} characters, {engine.model_name}, "
                    f"{spec.policy} at a {spec.budget_tokens:,}-token budget. /help for commands.\n"
                )
                if note := _resumed_line(chat):
                    err.write(note + "\n")
                with readline_history(history_file(), err):
                    code = interactive(chat, input, out, err)
            if args.show_kept is not None and chat.history:
                chat.write_kept(args.show_kept)
    return code
