"""A session's compressed cache, saved and restored: a conversation resumes, a
Regenerate restarts its answer and a second question about the same document
continues, without reading the document again.

A ``SavedState`` holds llama.cpp's serialized sequence (positions, K and V of every
held cell: ``llama_state_seq_get_data``) and kvtrim's own state of it: the ids,
positions and words of the held tokens (kv/cache.py), the order of their cells (the
restore writes them to cells 0..n-1 in that order, as ``KVCache.rebind`` knows), what
the policy observed, the last logits, the memory map's sources (trace.py) and the
document the follow-ups recall from. It is tied to a fingerprint: the model file
(size and a hash of its first 4 MiB, which hold the metadata), llama-cpp-python's
version, ``STATE_VERSION`` and every setting that shapes the cache; a mismatch, or a
corrupt or truncated file, is a ``StateError`` with a one-line reason, never a
wrong answer. On disk it is one ``.npz`` (numpy's zip of arrays, read with
``allow_pickle=False``), written atomically. Sizes in bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import llama_cpp
import numpy as np

from ..errors import DamagedStateError, EngineError, StateError
from ..kv.cells import EMPTY, CellMap
from ..native.model import Model, collected_log
from ..policies import Policy
from ..stats import KVStats
from . import state_checks
from .config import SessionConfig
from .follow_up import FollowUps
from .reader import Reader
from .trace import Segment, TokenTrace


class Session(Protocol):
    """What of a ``core.Session`` a saved state reads and writes."""

    model: Model
    policy: Policy
    config: SessionConfig
    reader: Reader
    turns: FollowUps

    @property
    def stats(self) -> KVStats: ...

    @property
    def trace(self) -> TokenTrace: ...

    @property
    def n_ctx_max(self) -> int: ...

    def reset(self) -> None: ...

STATE_VERSION = 1
SUFFIX = ".kvstate"
MAX_STATE_BYTES = 4 << 30  # a state file larger than this is refused unread
_HASHED_BYTES = 4 << 20  # of the model file: its header and metadata


@functools.lru_cache(maxsize=16)
def _model_hash(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(_HASHED_BYTES))
    return digest.hexdigest()[:32]


def model_fingerprint(path: str) -> dict[str, Any]:
    """What identifies a model file: its size and the hash of its first 4 MiB."""
    st = os.stat(path)
    return {"bytes": st.st_size, "sha256_head": _model_hash(path, st.st_size, st.st_mtime_ns)}


def fingerprint(session: Session) -> dict[str, Any]:
    """Everything a saved cache depends on (JSON values)."""
    config = dataclasses.asdict(session.config)
    config.pop("n_threads")  # numerics aside, threads do not change what a cache holds
    config.pop("batch_tokens")
    policy = session.policy
    settings = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
    return {
        "kvtrim_state": STATE_VERSION,
        "llama_cpp": llama_cpp.__version__,
        "model": model_fingerprint(session.model.info.path),
        "policy": policy.name,
        "policy_settings": {k: v for k, v in settings.items() if not k.startswith("_")},
        "config": config,
        "kv_type": session.stats.kv_type,
    }


def mismatch(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why a cache saved with ``saved`` cannot run as ``now``, in words, or None."""
    names = {
        "kvtrim_state": "another version of kvtrim's saved state",
        "llama_cpp": "another llama-cpp-python",
        "model": "another model file",
        "policy": "another policy",
        "policy_settings": "other policy settings",
        "config": "other cache settings",
        "kv_type": "another KV cache type",
    }
    for key, words in names.items():
        if saved.get(key) != now.get(key):
            if key == "config":
                diff = sorted(k for k in now[key] if saved[key].get(k) != now[key][k])
                return f"it was saved with {words} ({', '.join(diff)})"
            return f"it was saved with {words}"
    return None


@dataclass
class SavedState:
    """A session's cache as bytes and arrays; ``meta`` holds the fingerprint, the
    counts and whatever the caller added under ``meta["extra"]``."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    kv: bytes = b""

    @property
    def nbytes(self) -> int:
        """Bytes in RAM (the KV cells and the arrays)."""
        return len(self.kv) + sum(a.nbytes for a in self.arrays.values())

    @property
    def extra(self) -> dict[str, Any]:
        return self.meta.get("extra", {})  # type: ignore[no-any-return]

    def write(self, path: Path) -> int:
        """Write atomically (a temporary file renamed into place); return its bytes."""
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = dict(self.arrays)
        entries["meta"] = np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8)
        entries["kv"] = np.frombuffer(self.kv, dtype=np.uint8)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **entries)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path.stat().st_size

    @classmethod
    def read(cls, path: Path) -> SavedState:
        """Read a state file; ``StateError`` when it is no such file or is damaged."""
        try:
            size = path.stat().st_size
            if size > MAX_STATE_BYTES:
                raise StateError(f"the saved cache is {size:,} bytes, over the limit")
            data = path.read_bytes()
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                entries = {name: npz[name] for name in npz.files}
        except (FileNotFoundError, NotADirectoryError):  # the states folder may be a file
            raise StateError("there is no saved cache") from None
        except IsADirectoryError:
            raise DamagedStateError("the saved cache is a folder, not a file") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise DamagedStateError(f"the saved cache is damaged ({type(exc).__name__})") from None
        try:
            meta = json.loads(entries.pop("meta").tobytes())
            kv = entries.pop("kv").tobytes()
        except (KeyError, ValueError, UnicodeDecodeError):
            raise DamagedStateError("the saved cache is damaged (no header)") from None
        fp = meta.get("fingerprint") if isinstance(meta, dict) else None
        if not isinstance(fp, dict) or fp.get("kvtrim_state") is None:
            raise DamagedStateError("the file is not a kvtrim saved cache")
        return cls(meta, entries, kv)


# -- what the policy carries --------------------------------------------------

_POLICY = "policy."


def _policy_arrays(policy: Policy) -> dict[str, np.ndarray]:
    """The policy's ``state_dict()`` as named arrays of the file."""
    return {_POLICY + k: np.asarray(v) for k, v in policy.state_dict().items()}


def _load_policy(policy: Policy, arrays: dict[str, np.ndarray]) -> None:
    """Give the policy back its state: ``policy.<key>`` arrays, or those of a file
    written before policies had ``state_dict`` (``policy_<field>[.<key>]``: H2O's
    ``policy_ids``, SnapKV's ``policy_rows.0.ids``, TOVA's ``policy_last.attn``)."""
    policy.reset()
    state = {k[len(_POLICY) :]: v for k, v in arrays.items() if k.startswith(_POLICY)}
    if not state:
        legacy = {k[len("policy_") :]: v for k, v in arrays.items() if k.startswith("policy_")}
        state = {(k.split(".", 1)[1] if "." in k else k): v for k, v in legacy.items()}
    if state:
        policy.load_state_dict(state)


# -- the memory map's sources ---------------------------------------------------


def _trace_arrays(session: Session) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    segments = session.trace.segments
    meta = [{"name": s.name, "text": s.text, "first_id": s.first_id} for s in segments]
    arrays = {"trace.scores": session.trace.scores}
    for i, s in enumerate(segments):
        arrays[f"trace.{i}.starts"], arrays[f"trace.{i}.ends"] = s.char_starts, s.char_ends
    return meta, arrays


def _load_trace(session: Session, meta: list[dict[str, Any]], arrays: dict[str, Any]) -> None:
    trace = session.trace
    trace.segments = [
        Segment(m["name"], m["text"], m["first_id"], arrays[f"trace.{i}.starts"],
                arrays[f"trace.{i}.ends"])
        for i, m in enumerate(meta)
    ]  # fmt: skip
    trace.scores = np.array(arrays["trace.scores"], dtype=np.float32)


# -- snapshot and restore -------------------------------------------------------


def snapshot(session: Session, extra: dict[str, Any] | None = None) -> SavedState:
    """The session's cache as it is now (an answer's last token decoded and pending
    position shifts applied first: llama.cpp does not save them). ``extra``: the
    caller's own JSON values."""
    reader, turns = session.reader, session.turns
    save_seq = getattr(reader.ctx, "save_seq", None)
    if save_seq is None:
        raise StateError("a sequence of the shared KV pool cannot be saved")
    reader.settle()
    reader.cache.apply_shifts()
    cache = reader.cache
    arrays = {"ids": cache.ids, "lpos": cache.lpos, "words": cache.words}
    if cache.cells is not None:
        arrays["cell_positions"] = cache.cells.pos[cache.cells.pos != EMPTY]
    elif session.policy.needs().cell_map:  # read without capture: cells in position order
        arrays["cell_positions"] = np.sort(cache.lpos)
    if reader.logits is not None:
        arrays["logits"] = reader.logits
    if turns.document is not None:
        arrays["document"] = np.asarray(turns.document[1], dtype=np.int32)
    arrays["copy_ids"], arrays["copy_src"] = turns.copy_ids, turns.copy_src
    arrays |= _policy_arrays(session.policy)
    segments, trace = _trace_arrays(session)
    arrays |= trace
    s = session.stats
    meta = {
        "fingerprint": fingerprint(session),
        "next_id": cache.next_id,
        "next_lpos": cache.next_lpos,
        "evicted": cache.evicted,
        "compactions": cache.compactions,
        "flash_attn": reader.flash,  # the V cache's layout its KV cells are in
        "predicted": reader.predicted,  # a turn ended here (its logits may not be kept)
        "word": [cache._word, cache._word_len, cache._joins],
        "document_first_id": turns.document[0] if turns.document is not None else None,
        "segments": segments,
        "stats": {"prompt_tokens": s.prompt_tokens, "evictions": s.evictions,
                  "generated_tokens": s.generated_tokens, "cells_peak": s.cells_peak},
        "extra": extra or {},
    }  # fmt: skip
    return SavedState(meta, arrays, save_seq())


def restore(session: Session, state: SavedState) -> None:
    """Put ``state`` into ``session`` (an own context, of the same fingerprint),
    replacing what it held. ``StateError`` with the reason when it cannot; the
    session is then empty, as after ``reset``."""
    why = mismatch(state.meta.get("fingerprint", {}), fingerprint(session))
    if why is not None:
        raise StateError(why)
    reader = session.reader
    if not hasattr(reader.ctx, "load_seq"):
        raise StateError("a saved cache cannot be restored into the shared KV pool")
    try:  # every array against its invariants before llama.cpp sees a byte
        state_checks.check(
            state.meta,
            state.arrays,
            n_vocab=session.model.info.n_vocab,
            max_position=reader.max_position,
            cells=session.n_ctx_max,
        )
    except DamagedStateError as exc:
        raise DamagedStateError(f"the saved cache is damaged: {exc}") from None
    session.reset()
    try:
        _restore(session, state)
    except StateError:
        session.reset()
        raise
    except (KeyError, ValueError, TypeError, IndexError, EngineError) as exc:
        session.reset()
        why = f"{type(exc).__name__}: {exc}"
        raise DamagedStateError(f"the saved cache is damaged ({why})") from None


def _restore(session: Session, state: SavedState) -> None:
    reader, turns, meta, a = session.reader, session.turns, state.meta, state.arrays
    ids, lpos, words = (np.asarray(a[k], dtype=np.int64) for k in ("ids", "lpos", "words"))
    n = len(ids)
    if not (len(lpos) == len(words) == n) or n > session.n_ctx_max:
        raise StateError(f"the saved cache holds {n:,} tokens, more than this budget's cells")
    # saved before flash_attn was kept: from a context made with flash_alone's
    reader.restoring(meta.get("flash_attn", reader.settings.flash_alone()))
    reader.reserve(n, shrink=True)
    if n:
        with collected_log() as lines:  # llama.cpp's complaint becomes the reason
            try:
                reader.ctx.load_seq(state.kv)  # type: ignore[attr-defined]
            except EngineError:
                said = f": llama.cpp says {lines[0]!r}" if lines else ""
                why = f"the saved cache is damaged (its KV cells{said})"
                raise DamagedStateError(why) from None
        if reader.ctx.pos_max() != int(lpos.max()):
            raise DamagedStateError("the saved cache does not match its own positions")
    cache = reader.cache
    cache.ids, cache.lpos, cache.words = ids, lpos, words
    cache.next_id, cache.next_lpos = int(meta["next_id"]), int(meta["next_lpos"])
    cache.evicted, cache.compactions = int(meta["evicted"]), int(meta["compactions"])
    cache._word, cache._word_len, cache._joins = meta["word"]
    if cache.cells is not None:
        order = np.asarray(a["cell_positions"], dtype=np.int64)
        if len(order) != n:
            raise StateError("the saved cache's cell map does not match its tokens")
        cache.cells = CellMap(reader.ctx.n_cells)
        cache.cells.pos[:n] = order
    reader.logits = np.array(a["logits"], dtype=np.float32) if "logits" in a else None
    reader.predicted = bool(meta.get("predicted", "logits" in a))  # older states: the logits
    _load_policy(session.policy, a)
    _load_trace(session, meta["segments"], a)
    if meta["document_first_id"] is not None:
        turns.document = (int(meta["document_first_id"]), a["document"].tolist())
    turns.copy_ids = np.asarray(a["copy_ids"], dtype=np.int64)
    turns.copy_src = np.asarray(a["copy_src"], dtype=np.int64)
    stats = reader.stats  # this request's reading and writing start at 0
    stats.evictions, stats.cells_peak = meta["stats"]["evictions"], meta["stats"]["cells_peak"]
    reader.sync_stats()
