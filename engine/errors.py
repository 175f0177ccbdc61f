"""Errors a user can hit, each with a one-line message that names the problem."""

from __future__ import annotations


class KvtrimError(Exception):
    """Base class: the message is meant to be shown to a user as it is."""


class ModelError(KvtrimError):
    """The model file is missing, empty, truncated or not a GGUF llama.cpp can load."""


class TemplateError(ModelError):
    """The model's chat template cannot render a conversation: a Jinja error, a
    blocked sandbox escape, no end within its time, or a prompt too long."""


class DocumentError(KvtrimError):
    """The document cannot be read as text (missing, binary, undecodable, empty)."""


class ConfigError(KvtrimError):
    """A budget, chunk size or policy setting that cannot work."""


class OutputError(KvtrimError):
    """A result cannot be written: the output folder is a file, the disk is full."""


class ContextOverflowError(KvtrimError):
    """The input does not fit the cache and the policy does not evict (``full``)."""


class OutOfMemoryError(KvtrimError):
    """llama.cpp could not allocate the cache or compute buffers."""


class Cancelled(KvtrimError):
    """The run was cancelled; the session stays usable."""


class StateError(KvtrimError):
    """A saved cache cannot be used here: another model, settings or version, or a
    corrupt or truncated file. The message says why; the caller reads the text again."""


class DamagedStateError(StateError):
    """A saved cache whose file is damaged (truncated, bits flipped, not kvtrim's, or
    with values no session could have written): unlike another model's or settings'
    cache, it is of no use to anyone, and its file is removed."""


class PeerError(KvtrimError):
    """A benchmark's server (llama-server, kvtrim serve) did not start: the message
    names its log and ends with the log's last lines."""


class EngineError(KvtrimError):
    """llama.cpp returned an error the engine did not expect."""


class CacheFullError(EngineError):
    """``llama_decode`` found no free KV cells for the batch (nothing was decoded)."""


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]} | {0x9B: "\\x9b"}
del _CONTROL[0x09]  # a tab is shown as it is


def shown(text: object) -> str:
    """``text`` as a terminal or a UTF-8 file may show it: bytes that were not UTF-8
    (a file name's surrogate escapes) become U+FFFD and control characters (ESC, which
    starts terminal sequences; CR, NUL, ...) are written as ``\\xNN``."""
    raw = str(text).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return raw.translate(_CONTROL)
