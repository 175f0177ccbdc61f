"""The settings panel: model (a file, the embedded default, or one that LM Studio,
Ollama or Hugging Face already downloaded), GPU layers, threads, eviction policy and its
parameters, KV cache type, system prompt and theme, each with a one-line
explanation.

It edits a ``Settings`` object in place and says so through two signals:
``changed`` (applies to the next message) and ``reload_requested`` (model,
GPU layers or threads changed: the worker reloads the model off the GUI thread).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.native.embedded import DEFAULT, EMBEDDED
from engine.native.finder import FoundModel, find_models
from engine.native.kvmemory import KV_TYPES
from engine.policies import POLICIES
from engine.session.config import usable_cpus

from .found_models import FoundModels
from .policy_params import PolicyParams
from .settings import MAX_TEMPERATURE, MIN_BUDGET, Settings

KV_TYPE_LABELS = {"f16": "f16 (default)", "q8_0": "q8_0", "q4_0": "q4_0"}
KV_TYPE_HELP = (
    "q8_0 halves K (and V for streaming/full) with a small quality cost; "
    "policies that read attention keep V in f16."
)
KV_TYPE_TIP = (
    "f16: full precision. q8_0: about half the bytes, a small quality cost. "
    "q4_0: about a quarter, a larger cost. H2O, TOVA and SnapKV read attention "
    "and keep V in f16; StreamingLLM and the full cache quantize V too (flash attention on)."
)
@dataclass(frozen=True)
class Number:
    """A number the panel edits: a ``Settings`` field, its row and its range
    (the CLI's: ``engine/cli/main.py``'s request options)."""

    group: str
    field: str
    label: str
    hint: str
    low: float
    high: float
    step: float = 1
    suffix: str = ""
    decimals: int = 0  # 0: a whole number

    def box(self, value: float) -> QAbstractSpinBox:
        """A spin box over the range, showing ``value``."""
        box: QSpinBox | QDoubleSpinBox
        if self.decimals:
            box = QDoubleSpinBox()
            box.setDecimals(self.decimals)
            box.setRange(self.low, self.high)
            box.setSingleStep(self.step)
            box.setValue(float(value))
        else:
            box = QSpinBox()
            box.setRange(int(self.low), int(self.high))
            box.setSingleStep(int(self.step))
            box.setGroupSeparatorShown(True)
            box.setValue(int(value))
        box.setSuffix(self.suffix)
        box.setToolTip(f"{self.low:g} to {self.high:,g}")
        return box


NUMBERS = (
    Number(
        "Eviction",
        "budget_tokens",
        "KV budget",
        "Tokens the cache keeps; memory is fixed by it.",
        MIN_BUDGET,
        131072,
        256,
        " tokens",
    ),
    Number(
        "Chat",
        "max_tokens",
        "Max tokens",
        'The longest answer; it stops there ("max tokens reached").',
        1,
        32768,
        64,
        " tokens",
    ),
    Number(
        "Chat",
        "temperature",
        "Temperature",
        "0 answers greedily, the same each time; higher samples more freely (Regenerate "
        "uses at least 0.7).",
        0.0,
        MAX_TEMPERATURE,
        0.1,
        decimals=2,
    ),
)


def policy_defaults(name: str) -> dict[str, float]:
    """The parameters the policy ``name`` declares, at the paper's defaults."""
    return {t.name: t.default for t in POLICIES[name].tunables()}


def _combo() -> QComboBox:
    """A combo box as narrow as a short item: long items are cut in the box only."""
    combo = QComboBox()
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(8)
    return combo


def _row(*widgets: QWidget, stretch_first: bool = True) -> QWidget:
    """Widgets side by side, the first taking the room left."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    for i, widget in enumerate(widgets):
        layout.addWidget(widget, 1 if i == 0 and stretch_first else 0)
    return row


def _explained(widget: QWidget, text: str) -> QWidget:
    box = QWidget()
    form = QFormLayout(box)
    form.setContentsMargins(0, 0, 0, 0)
    form.addRow(widget)
    hint = QLabel(text)
    hint.setWordWrap(True)
    hint.setProperty("hint", True)
    hint.setStyleSheet("color: #8a9099; font-size: 11px;")
    form.addRow(hint)
    return box


def _builtin_models() -> QComboBox:
    """The models kvtrim ships, by title; one not installed is listed, disabled, with
    the command that installs it."""
    combo = _combo()
    for m in EMBEDDED.values():
        combo.addItem(m.title, m.name)
        item = combo.model().item(combo.count() - 1)  # type: ignore[attr-defined]
        item.setToolTip(f"{m.name}: {m.about}")
        if not m.installed():
            item.setEnabled(False)
            item.setToolTip(f"{m.name}: not installed: {m.install}")
    return combo


class SettingsPanel(QWidget):
    """Edits ``settings``; the window saves it when ``changed`` fires."""

    changed = Signal()
    reload_requested = Signal(object, int, object)  # model path or None, gpu layers, threads

    def __init__(
        self,
        settings: Settings,
        parent: QWidget | None = None,
        find: Callable[[], list[FoundModel]] = find_models,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self.models = FoundModels(find)  # the first look: when the panel is first shown
        self.found_models = self.models.combo
        self.refresh_models_button = self.models.refresh_button
        self.numbers: dict[str, QAbstractSpinBox] = {}  # NUMBERS' boxes by settings field
        outer = QVBoxLayout(self)
        for title, build in (
            ("Model", self._model_group),
            ("Eviction", self._eviction_group),
            ("Chat", self._chat_group),
        ):
            group = QGroupBox(title)
            form = QFormLayout(group)
            form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
            build(form)
            outer.addWidget(group)
        outer.addStretch(1)
        self.budget = self.numbers["budget_tokens"]
        self.policy.currentIndexChanged.connect(self._policy_edited)
        self._show_policy()

    def _model_group(self, form: QFormLayout) -> None:
        """The model file, one found on this computer, GPU layers, threads, Reload."""
        self.model_path = QLineEdit(self.settings.model_path)
        self.model_path.setPlaceholderText("embedded default (Gemma 3 270M)")
        self.model_path.setReadOnly(True)
        form.addRow(self.model_path)
        choose, default = QPushButton("Choose GGUF…"), QPushButton("Use default")
        choose.clicked.connect(self._choose_model)
        default.clicked.connect(lambda: self.model_path.setText(""))
        form.addRow(_row(choose, default))
        self.builtin = _builtin_models()
        self.builtin.activated.connect(lambda i: self._choose_found(self.builtin.itemData(i)))
        form.addRow("Built in", _explained(self.builtin, "Models kvtrim ships: no download."))
        self.models.chosen.connect(self._choose_found)
        form.addRow(
            "On this computer",
            _explained(self.models, "GGUF models LM Studio, Ollama and Hugging Face downloaded."),
        )
        self.models.select(self.settings.model_path)
        self.gpu_layers = QSpinBox()
        self.gpu_layers.setRange(0, 999)
        self.gpu_layers.setValue(self.settings.gpu_layers)
        self.gpu_layers.setToolTip("0 runs on the CPU; 999 offloads every layer")
        form.addRow("GPU layers", _explained(self.gpu_layers, "Layers offloaded to the GPU."))
        self.threads = QSpinBox()
        self.threads.setRange(0, usable_cpus())
        self.threads.setSpecialValueText("auto")
        self.threads.setValue(self.settings.threads)
        threads_help = "CPU threads; auto = one per core this app may use."
        form.addRow("Threads", _explained(self.threads, threads_help))
        self.reload_button = QPushButton("Reload model")
        self.reload_button.setEnabled(False)
        self.reload_button.clicked.connect(self._reload)
        form.addRow(self.reload_button)
        self.model_path.textChanged.connect(self.models.select)
        self.model_path.textChanged.connect(self._show_builtin)
        self._show_builtin(self.model_path.text())
        for signal in (
            self.model_path.textChanged,
            self.gpu_layers.valueChanged,
            self.threads.valueChanged,
        ):
            signal.connect(self.refresh_reload_button)

    def _eviction_group(self, form: QFormLayout) -> None:
        """The policy, the KV budget, the cache type and the policy's parameters."""
        self.policy = _combo()
        for name, cls in POLICIES.items():
            self.policy.addItem(cls.label, name)
        self.policy.setCurrentIndex(self.policy.findData(self.settings.policy))
        self.policy_help = QLabel()
        self.policy_help.setWordWrap(True)
        form.addRow("Policy", self.policy)
        form.addRow(self.policy_help)
        self._add_numbers(form, "Eviction")
        self.kv_type = _combo()
        for name in KV_TYPES:
            self.kv_type.addItem(KV_TYPE_LABELS.get(name, name), name)
        self.kv_type.setCurrentIndex(max(0, self.kv_type.findData(self.settings.kv_type)))
        self.kv_type.setToolTip(KV_TYPE_TIP)
        self.kv_type.currentIndexChanged.connect(self._edited)
        form.addRow("KV cache type", _explained(self.kv_type, KV_TYPE_HELP))
        self.policy_params = PolicyParams()
        self.policy_params.edited.connect(self._param_edited)
        form.addRow(self.policy_params)

    def _chat_group(self, form: QFormLayout) -> None:
        """Max tokens, temperature, the system prompt, the answer's start, the theme."""
        self._add_numbers(form, "Chat")
        self.system_prompt = QPlainTextEdit(self.settings.system_prompt)
        self.system_prompt.setPlaceholderText("System prompt (optional)")
        self.system_prompt.setMaximumHeight(60)
        self.system_prompt.textChanged.connect(self._edited)
        form.addRow("System prompt", self.system_prompt)
        self.answer_prefix = QLineEdit(self.settings.answer_prefix)
        self.answer_prefix.setPlaceholderText("e.g. The pass key is")
        self.answer_prefix.textChanged.connect(self._edited)
        form.addRow(
            "Answer starts with",
            _explained(self.answer_prefix, "Steers base models, which continue text."),
        )
        self.theme = _combo()
        for mode in ("system", "light", "dark"):
            self.theme.addItem(mode.capitalize(), mode)
        self.theme.setCurrentIndex(self.theme.findData(self.settings.theme))
        self.theme.currentIndexChanged.connect(self._edited)
        form.addRow("Theme", self.theme)

    def _add_numbers(self, form: QFormLayout, group: str) -> None:
        """The group's rows of ``NUMBERS``: each edits its settings field."""
        for number in NUMBERS:
            if number.group != group:
                continue
            box = number.box(getattr(self.settings, number.field))
            box.valueChanged.connect(  # type: ignore[attr-defined]
                lambda value, field=number.field: self._number_edited(field, value)
            )
            self.numbers[number.field] = box
            form.addRow(number.label, _explained(box, number.hint))

    def _number_edited(self, field: str, value: float) -> None:
        setattr(self.settings, field, value)
        if field == "budget_tokens":
            self._show_note()  # a recency policy's window follows the budget
        self.changed.emit()

    # -- what the window reads --------------------------------------------

    def policy_name(self) -> str:
        return str(self.policy.currentData())

    @property
    def params(self) -> dict[str, QAbstractSpinBox]:
        """The current policy's parameter boxes, by name."""
        return self.policy_params.boxes

    def policy_settings(self) -> tuple[tuple[str, float], ...]:
        """The current policy's parameters as the engine takes them."""
        name = self.policy_name()
        values = {**policy_defaults(name), **self.settings.policy_params.get(name, {})}
        return tuple(sorted((k, v) for k, v in values.items() if k in policy_defaults(name)))

    def kv_type_name(self) -> str:
        """The KV cache type chosen: a key of ``engine.kvmemory.KV_TYPES``."""
        return str(self.kv_type.currentData())

    def set_policy(self, name: str) -> None:
        self.policy.setCurrentIndex(self.policy.findData(name))

    def request_settings(self) -> dict[str, Any]:
        """The settings a chat's cache depends on (to put back with
        ``restore_request_settings``)."""
        s = self.settings
        params = {k: dict(v) for k, v in s.policy_params.items()}
        return {"policy": s.policy, "kv_type": s.kv_type, "budget_tokens": s.budget_tokens,
                "policy_params": params}  # fmt: skip

    def restore_request_settings(self, kept: dict[str, Any]) -> None:
        """Put back what ``request_settings`` returned, in the settings and the boxes."""
        s = self.settings
        s.policy, s.kv_type = kept["policy"], kept["kv_type"]
        s.budget_tokens = kept["budget_tokens"]
        s.policy_params = {k: dict(v) for k, v in kept["policy_params"].items()}
        for widget in (self.policy, self.kv_type, self.budget):
            widget.blockSignals(True)
        self.set_policy(s.policy)
        self.kv_type.setCurrentIndex(self.kv_type.findData(s.kv_type))
        self.budget.setValue(s.budget_tokens)  # type: ignore[attr-defined]
        for widget in (self.policy, self.kv_type, self.budget):
            widget.blockSignals(False)
        self._show_policy()

    # -- models found on this computer -------------------------------------

    def showEvent(self, event: QShowEvent) -> None:
        """The first time the panel opens, look for downloaded models."""
        super().showEvent(event)
        if not self.models.scanned:
            self.models.refresh()

    def refresh_models(self) -> None:
        self.models.refresh()

    def _show_builtin(self, model: str) -> None:
        """Select the built-in model ``model`` names ("" is the default), else none."""
        self.builtin.setCurrentIndex(self.builtin.findData(model.strip().lower() or DEFAULT))

    def _choose_found(self, path: str) -> None:
        """A found model chosen: it becomes the model path and loads at once."""
        self.model_path.setText(path)
        if self.reload_button.isEnabled():
            self._reload()

    # -- edits ------------------------------------------------------------

    def _choose_model(self) -> None:
        name, _ = QFileDialog.getOpenFileName(
            self, "Choose a GGUF model", str(Path.home()), "GGUF models (*.gguf)"
        )
        if name:
            self.model_path.setText(name)

    def set_busy(self, busy: bool) -> None:
        """No model change while the engine works."""
        self.found_models.setEnabled(not busy)
        if busy:
            self.reload_button.setEnabled(False)
        else:
            self.refresh_reload_button()

    def refresh_reload_button(self) -> None:
        """Enabled only when the model, GPU layers or threads differ from the loaded ones."""
        s = self.settings
        self.reload_button.setEnabled(
            (self.model_path.text(), self.gpu_layers.value(), self.threads.value())
            != (s.model_path, s.gpu_layers, s.threads)
        )

    def _reload(self) -> None:
        s = self.settings
        s.model_path = self.model_path.text()
        s.gpu_layers, s.threads = self.gpu_layers.value(), self.threads.value()
        self.reload_button.setEnabled(False)
        self.changed.emit()
        self.reload_requested.emit(s.model_path or None, s.gpu_layers, s.threads or None)

    def _policy_edited(self) -> None:
        self._show_policy()
        self._edited()

    def _show_policy(self) -> None:
        name = self.policy_name()
        cls = POLICIES.get(name)
        self.policy_help.setText(cls.help if cls is not None else "")
        if cls is not None:
            values = {**policy_defaults(name), **self.settings.policy_params.get(name, {})}
            self.policy_params.show_policy(name, values, self.settings.budget_tokens)

    def _param_edited(self, key: str, value: float) -> None:
        name = self.policy_name()
        params = self.settings.policy_params.setdefault(name, {})
        default = policy_defaults(name).get(key)
        kind = type(default) if default is not None else float
        if value == default:
            params.pop(key, None)
        else:
            params[key] = kind(value)
        self._show_note()  # a recency policy's window is the budget less its sinks
        self._edited()

    def _show_note(self) -> None:
        name = self.policy_name()
        values = {**policy_defaults(name), **self.settings.policy_params.get(name, {})}
        self.policy_params.refresh_note(values, self.settings.budget_tokens)

    def _edited(self) -> None:
        s = self.settings
        s.policy = self.policy_name()
        s.kv_type = self.kv_type_name()
        s.system_prompt = self.system_prompt.toPlainText().strip()
        s.answer_prefix = self.answer_prefix.text().strip()
        s.theme = str(self.theme.currentData())
        self.changed.emit()
