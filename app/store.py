"""Conversation history in SQLite: conversations, their messages and documents.

Plain Python (no Qt), so the GUI, tests and a crash-recovery check share it.
Every write commits before it returns and the database runs in WAL mode, so a
message shown as sent survives a crash or a kill of the app.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from .transcript import escape_markdown_line, to_markdown

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_s REAL NOT NULL,
    updated_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    content TEXT NOT NULL,
    created_s REAL NOT NULL,
    meta TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    path TEXT NOT NULL,
    tokens INTEGER,
    added_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_s: float
    updated_s: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str
    content: str
    created_s: float
    meta: str = ""  # an answer's figures (tok/s, first token, policy), shown under it


@dataclass(frozen=True)
class Document:
    id: int
    conversation_id: int
    name: str
    path: str
    tokens: int | None


class Store:
    """One SQLite file of conversations (WAL, foreign keys, commit per write)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path} was written by a newer kvtrim (schema {version})")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(messages)")}
        if "meta" not in columns:  # schema 1 -> 2
            self._db.execute("ALTER TABLE messages ADD COLUMN meta TEXT NOT NULL DEFAULT ''")
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    # -- conversations ----------------------------------------------------

    def new_conversation(self, title: str = "New chat") -> Conversation:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO conversations(title, created_s, updated_s) VALUES (?, ?, ?)",
            (title, now, now),
        )
        return Conversation(int(cur.lastrowid or 0), title, now, now)

    def conversations(self) -> list[Conversation]:
        """Newest first."""
        rows = self._db.execute(
            "SELECT id, title, created_s, updated_s FROM conversations "
            "ORDER BY updated_s DESC, id DESC"
        ).fetchall()
        return [Conversation(*row) for row in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self._db.execute(
            "UPDATE conversations SET title = ?, updated_s = ? WHERE id = ?",
            (title.strip() or "Untitled", time.time(), conversation_id),
        )

    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def delete_empty(self) -> int:
        """Delete the conversations that hold no message; returns how many."""
        cur = self._db.execute(
            "DELETE FROM conversations WHERE NOT EXISTS "
            "(SELECT 1 FROM messages WHERE messages.conversation_id = conversations.id)"
        )
        return cur.rowcount

    # -- messages and documents -------------------------------------------

    def add_message(self, conversation_id: int, role: str, content: str, meta: str = "") -> Message:
        now = time.time()
        with self._db:  # one transaction: the message and the conversation's timestamp
            self._db.execute("BEGIN")
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, created_s, meta) "
                "VALUES (?, ?, ?, ?, ?)",
                (conversation_id, role, content, now, meta),
            )
            self._db.execute(
                "UPDATE conversations SET updated_s = ? WHERE id = ?", (now, conversation_id)
            )
        return Message(int(cur.lastrowid or 0), conversation_id, role, content, now, meta)

    def update_message(self, message_id: int, content: str, meta: str | None = None) -> None:
        """Replace a message's text (a regenerated answer) and, if given, its figures."""
        if meta is None:
            self._db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))
        else:
            self._db.execute(
                "UPDATE messages SET content = ?, meta = ? WHERE id = ?",
                (content, meta, message_id),
            )

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self._db.execute(
            "SELECT id, conversation_id, role, content, created_s, meta FROM messages "
            "WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [Message(*row) for row in rows]

    def add_document(
        self,
        conversation_id: int,
        path: Path,
        tokens: int | None = None,
    ) -> Document:
        cur = self._db.execute(
            "INSERT INTO documents(conversation_id, name, path, tokens, added_s) "
            "VALUES (?, ?, ?, ?, ?)",
            (conversation_id, path.name, str(path), tokens, time.time()),
        )
        return Document(int(cur.lastrowid or 0), conversation_id, path.name, str(path), tokens)

    def documents(self, conversation_id: int) -> list[Document]:
        rows = self._db.execute(
            "SELECT id, conversation_id, name, path, tokens FROM documents "
            "WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [Document(*row) for row in rows]

    def export_markdown(self, conversation_id: int) -> str:
        """The conversation as Markdown: title, attached documents, then each turn,
        each message's text shown as written (``transcript.to_markdown``)."""
        title = self._db.execute(
            "SELECT title FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if title is None:
            raise KeyError(conversation_id)
        lines = [f"# {escape_markdown_line(title[0])}", ""]
        docs = self.documents(conversation_id)
        if docs:
            listed = ", ".join(d.name for d in docs)
            lines += [escape_markdown_line(f"Documents: {listed}"), ""]
        names = {"user": "You", "assistant": "kvtrim", "system": "System"}
        for m in self.messages(conversation_id):
            lines += [f"**{names[m.role]}:**", "", to_markdown(m.content), ""]
            if m.meta:
                lines += [f"*{escape_markdown_line(m.meta)}*", ""]
        return "\n".join(lines)


def open_store(path: Path) -> tuple[Store, str | None]:
    """The history at ``path``, or, when it cannot be used (its folder is a file, no
    permission, a newer schema, a corrupt database), a history kept in memory for this
    run and the one line saying why."""
    try:
        return Store(path), None
    except (OSError, sqlite3.Error, RuntimeError) as exc:
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        return Store(":memory:"), f"History is not saved this time: {path} cannot be used ({why})."
