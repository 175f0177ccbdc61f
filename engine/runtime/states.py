"""Where saved caches live: a folder of ``.kvstate`` files (conversations, documents
asked about again) bounded in bytes, the least recently used removed first, and the
same bound in RAM for the server. A key is any string (a chat id, a digest of a
prompt's tokens); the file name is its SHA-256. Sizes in bytes.

>>> store = StateStore(Path("~/.local/share/kvtrim/states").expanduser(), max_bytes=2 << 30)
>>> store.put("chat-3", session.snapshot({"turns": 2}))
>>> saved = store.get("chat-3")   # StateError (with the reason) when there is none
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import DamagedStateError, StateError
from ..session.state import SUFFIX, SavedState

STATES_ENV = "KVTRIM_STATES"  # the folder of saved caches; empty: save none
DISK_BYTES = 2 << 30  # saved caches on disk at most (about 130 conversations at 15 MB)
RAM_BYTES = 512 << 20  # saved caches a server keeps in RAM at most
STALE_PARTIAL_S = 600.0  # a write takes seconds: an older .partial file was killed midway


def default_store() -> StateStore | None:
    """The user's saved caches: ``$KVTRIM_STATES`` (empty: none), else ``states`` in
    the user data folder (where the app keeps its chats' caches too)."""
    override = os.environ.get(STATES_ENV)
    if override is not None:
        return StateStore(Path(override)) if override else None
    from platformdirs import user_data_dir

    return StateStore(Path(user_data_dir("kvtrim", appauthor=False)) / "states")


def key_digest(*parts: object) -> str:
    """A short, file-name-safe digest of ``parts`` (their ``repr``s, in order)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(repr(part).encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()[:32]


def tokens_digest(tokens: Iterable[int]) -> str:
    """A digest of token ids (a prompt's prefix), independent of how they are held."""
    digest = hashlib.sha256()
    for token in tokens:
        digest.update(int(token).to_bytes(4, "little", signed=True))
    return digest.hexdigest()[:32]


class StateStore:
    """Saved caches in ``folder``, at most ``max_bytes`` together; reading one marks
    it used, and writing one removes the least recently used beyond the bound."""

    def __init__(self, folder: Path, *, max_bytes: int = DISK_BYTES) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}{SUFFIX}"

    def put(self, key: str, state: SavedState) -> int:
        """Write ``state`` under ``key`` (atomically); return its bytes on disk. A
        folder that cannot be written raises ``StateError``: the caller goes on."""
        try:
            size = state.write(self.path(key))
        except OSError as exc:
            raise StateError(f"cannot save the cache in {self.folder}: {exc.strerror}") from None
        self._prune(keep=self.path(key))
        return size

    def get(self, key: str) -> SavedState:
        """The state saved under ``key``; ``StateError`` when there is none or it is
        damaged (a damaged file is removed)."""
        path = self.path(key)
        try:
            state = SavedState.read(path)
        except StateError:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)  # damaged: it would only fail again
            raise
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be pruned
        return state

    def restore(self, key: str, session: Any) -> SavedState:
        """The state saved under ``key``, put into ``session``; ``StateError`` with the
        reason when there is none or it cannot be used, and a damaged file is removed
        so the next run does not trip over it (``DamagedStateError``)."""
        state = self.get(key)
        try:
            session.restore(state)
        except DamagedStateError:
            self.delete(key)
            raise
        return state

    def size(self, key: str) -> int:
        """Bytes saved under ``key`` (0: none)."""
        try:
            return self.path(key).stat().st_size
        except OSError:
            return 0

    def delete(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self.path(key).unlink()

    def _prune(self, keep: Path) -> None:
        """Remove the least recently used files until the folder is within bounds, and
        what writes killed midway left (a ``.partial`` file no write has touched for
        ``STALE_PARTIAL_S``: never read, it would only take room)."""
        now = time.time()
        with contextlib.suppress(OSError):
            for partial in self.folder.glob(f".*{SUFFIX}.*.partial"):
                with contextlib.suppress(OSError):
                    if now - partial.stat().st_mtime > STALE_PARTIAL_S:
                        partial.unlink()
        with self._lock:
            try:
                files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self._files()]
            except OSError:
                return
            total = sum(size for _, size, _ in files)
            for _, size, path in sorted(files):
                if total <= self.max_bytes:
                    break
                if path != keep:
                    with contextlib.suppress(OSError):
                        path.unlink()
                        total -= size

    def _files(self) -> list[Path]:
        try:
            return [p for p in self.folder.iterdir() if p.suffix == SUFFIX and p.is_file()]
        except OSError:
            return []


class RamStates:
    """Saved caches in RAM, at most ``max_bytes`` together, least recently used out
    first (the server's: a second question about a document skips its reading)."""

    def __init__(self, max_bytes: int = RAM_BYTES) -> None:
        self.max_bytes = max_bytes
        self._states: OrderedDict[str, SavedState] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: str, state: SavedState) -> None:
        if state.nbytes > self.max_bytes:
            return
        with self._lock:
            self._states[key] = state
            self._states.move_to_end(key)
            while sum(s.nbytes for s in self._states.values()) > self.max_bytes:
                self._states.popitem(last=False)

    def get(self, key: str) -> SavedState:
        """The state saved under ``key``; ``StateError`` when there is none."""
        with self._lock:
            state = self._states.get(key)
            if state is None:
                raise StateError("there is no saved cache")
            self._states.move_to_end(key)
            return state

    def restore(self, key: str, session: Any) -> SavedState:
        """As ``StateStore.restore``: a damaged state is dropped."""
        state = self.get(key)
        try:
            session.restore(state)
        except DamagedStateError:
            with self._lock:
                self._states.pop(key, None)
            raise
        return state

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._states.values())
