"""A chat resumes from its saved compressed cache instead of reading again.

After each answer the worker saves two states of the chat's session (see
engine/session/state.py): ``pre``, the cache as the answer began (the question read,
its logits), and ``post``, the cache after the answer. A follow-up after a restart,
or in a chat that was not the last one used, restores ``post`` and continues; a
Regenerate restores ``pre`` and answers again. Each is tied to the chat (its id, the
request's session settings, the system prompt, the document) and to the turns it
holds; anything else, or a file of another model, version or a damaged one, is a
re-read with the reason in one line. Qt-free: the worker calls it on its thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine import Restored, StateError
from engine.errors import DamagedStateError
from engine.runtime.states import StateStore, key_digest
from engine.session.state import SavedState

POST, PRE = "post", "pre"


def _turns_digest(history: tuple[tuple[str, str], ...]) -> str:
    return key_digest(*history)


@dataclass
class ChatStates:
    """The saved caches of the app's chats, in ``store``."""

    store: StateStore

    def _key(self, conversation: int, kind: str) -> str:
        return f"chat-{conversation}-{kind}"

    def save(self, job: Any, kind: str, state: SavedState, history: tuple) -> int:
        """Save ``state`` as the chat's ``kind`` state, holding ``history`` (the turns
        before the answer, for ``pre``; with it, for ``post``); its bytes."""
        state.meta["extra"] = {
            **state.extra,
            "job": key_digest(*job.key()),
            "turns": _turns_digest(history),
            "question": job.question,
        }
        return self.store.put(self._key(job.conversation, kind), state)

    def load(self, job: Any, kind: str, history: tuple) -> SavedState:
        """The chat's ``kind`` state if it was made for this job and these turns;
        ``StateError`` with the reason otherwise."""
        state = self.store.get(self._key(job.conversation, kind))
        extra = state.extra
        if extra.get("job") != key_digest(*job.key()):
            raise StateError("it was saved with other settings, a system prompt or document")
        if extra.get("turns") != _turns_digest(history):
            raise StateError("the conversation changed since it was saved")
        if kind == PRE and extra.get("question") != job.question:
            raise StateError("it was saved for another question")
        return state

    def disk_bytes(self, conversation: int) -> int:
        return sum(self.store.size(self._key(conversation, k)) for k in (POST, PRE))

    def delete(self, conversation: int, kinds: tuple[str, ...] = (POST, PRE)) -> None:
        for kind in kinds:
            self.store.delete(self._key(conversation, kind))


def restore(
    session: Any, load: Callable[[], SavedState], discard: Callable[[], None] = lambda: None
) -> Restored:
    """Restore what ``load`` gives into ``session``; a ``Restored`` event, with
    ``reason`` set when it could not be used (the session is then empty). A damaged
    one is ``discard``ed, so the next start does not trip over it."""
    start = time.perf_counter()
    try:
        state = load()
        session.restore(state)
    except StateError as exc:
        if isinstance(exc, DamagedStateError):
            discard()
        return Restored(0, 0, time.perf_counter() - start, session.stats, str(exc))
    stats = session.stats
    return Restored(stats.cells_used, stats.tokens_seen, time.perf_counter() - start, stats)
