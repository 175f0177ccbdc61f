"""The chosen policy's parameters in the settings panel: one row per field the policy
declares with ``param()`` (its label, help and range: ``Policy.tunables``), rebuilt
when the policy changes, so a new policy needs nothing here."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.policies import POLICIES, Tunable

RECENCY_NOTE = (
    "{label} keeps the sinks and the newest tokens: budget {budget:,} minus {sinks:,} "
    "sinks = a recent window of {window:,} tokens."
)


def _box(tunable: Tunable, value: float) -> QAbstractSpinBox:
    """A spin box over the parameter's range, showing ``value``."""
    low, high = tunable.param.low, tunable.param.high
    box: QSpinBox | QDoubleSpinBox
    if tunable.kind is float:
        box = QDoubleSpinBox()
        box.setDecimals(2)
        box.setSingleStep(0.05)
        box.setRange(low, high)
        box.setValue(float(value))
    else:
        box = QSpinBox()
        box.setRange(int(low), int(high))
        box.setGroupSeparatorShown(True)
        box.setValue(int(value))
    box.setToolTip(tunable.describe())
    return box


class PolicyParams(QWidget):
    """Rows for one policy's parameters; ``edited`` carries ``(name, value)``."""

    edited = Signal(str, float)

    def __init__(self) -> None:
        super().__init__()
        self.boxes: dict[str, QAbstractSpinBox] = {}
        self.hints: dict[str, QLabel] = {}
        self.name = ""
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self._rows = QWidget()
        self._form = QFormLayout(self._rows)
        self._form.setContentsMargins(0, 0, 0, 0)
        self._form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: #8a9099; font-size: 11px;")
        layout.addWidget(self._rows)
        layout.addWidget(self.note)

    def show_policy(self, name: str, values: dict[str, float], budget: int) -> None:
        """The rows of policy ``name`` with ``values`` (its defaults where not set)."""
        while self._form.rowCount():
            self._form.removeRow(0)
        self.boxes, self.hints = {}, {}
        cls = POLICIES[name]
        for tunable in cls.tunables():
            box = _box(tunable, values.get(tunable.name, tunable.default))
            box.valueChanged.connect(  # type: ignore[attr-defined]
                lambda value, key=tunable.name: self.edited.emit(key, float(value))
            )
            hint = QLabel(tunable.param.help)
            hint.setWordWrap(True)
            hint.setStyleSheet("color: #8a9099; font-size: 11px;")
            self.boxes[tunable.name], self.hints[tunable.name] = box, hint
            self._form.addRow(tunable.param.label, box)
            self._form.addRow(hint)
        self.name = name
        self.refresh_note(values, budget)

    def refresh_note(self, values: dict[str, float], budget: int) -> None:
        """The line under the rows: a recency policy's window (the budget less its
        sinks), or that the policy has nothing to set."""
        cls, note = POLICIES[self.name], ""
        if cls.recency_only:  # the score is recency: what the sinks leave is recent
            sinks = int(values.get("n_sink", cls.n_sink))
            window = max(budget - sinks, 0)
            note = RECENCY_NOTE.format(label=cls.label, budget=budget, sinks=sinks, window=window)
        elif not self.boxes:
            note = f"{cls.label} has no parameters to set."
        self.note.setText(note)
        self.note.setVisible(bool(note))
