"""The status line (model, policy, budget, the shown chat's saved cache, CPU path) and
what a settings change means for the shown chat: said before the next message
re-reads, with a button to keep the settings its saved cache was made with."""

from __future__ import annotations

from typing import Any, Protocol

from PySide6.QtWidgets import QLabel

from engine.policies import label as policy_label

from .chat_pane import ChatPane
from .saved_caches import SavedCaches
from .settings import Settings
from .settings_panel import SettingsPanel


class Window(Protocol):
    """What ``Status`` uses of the main window."""

    settings: Settings
    panel: SettingsPanel
    pane: ChatPane
    answering: Any  # answering.Answering

    def shown_chat(self) -> int | None: ...


class Status:
    """The status line's label and the saved caches it reports."""

    def __init__(self, window: Window) -> None:
        self.w = window
        self.label = QLabel()  # hidden by a passing status-bar message
        self.model_name = "loading model…"
        self.cpu_note = ""
        self.caches = SavedCaches()  # each chat's saved cache: its size, its settings
        self.kept: dict[str, Any] = {}  # the request settings before the last change

    def update(self, *, model: str | None = None, cpu: str | None = None) -> None:
        """Show the line again (``model`` when one loaded, ``cpu``: llama.cpp's path)."""
        self.model_name = self.model_name if model is None else model
        self.cpu_note = self.cpu_note if cpu is None else cpu
        w = self.w
        parts = [
            self.model_name,
            policy_label(w.panel.policy_name()),
            f"budget {w.settings.budget_tokens:,} tokens",
        ]
        if (kv_type := w.panel.kv_type_name()) != "f16":
            parts.append(f"KV {kv_type}")
        parts.append(self.caches.status(w.shown_chat()))
        self.label.setText(" · ".join(p for p in (*parts, self.cpu_note) if p))

    def saved(self, chat: int, size: int) -> None:
        """A chat's cache is on disk (``size`` bytes): it resumes without a re-read."""
        self.caches.saved(chat, size)
        self.update()

    def chat_shown(self) -> None:
        """Another chat is shown: no note of the last one's."""
        self.w.pane.switch_note.show_note(None)
        self.kept = self.w.panel.request_settings()
        self.update()

    def settings_changed(self) -> None:
        """Say what the change costs the shown chat (nothing when the settings match
        its cache, or it has none)."""
        w = self.w
        note = self.caches.switch_note(w.shown_chat(), w.answering.session_key())
        w.pane.switch_note.show_note(note)
        if note is None:
            self.kept = w.panel.request_settings()
        self.update()

    def keep_settings(self) -> None:
        """Back to the settings the shown chat's cache was made with."""
        if self.kept:
            self.w.panel.restore_request_settings(self.kept)
        self.w.pane.switch_note.show_note(None)
        self.update()
