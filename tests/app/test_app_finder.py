"""The settings panel lists the models other tools downloaded (found when the
Settings tab first opens) and choosing one loads it, with a fake engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fakes import FakeEngine
from helpers.model_stores import gguf, hf_cache

from app.settings import Settings, load
from app.settings_panel import SettingsPanel
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread
from engine.native.finder import FoundModel


class Loads:
    """An engine factory that records the paths it was asked to load."""

    def __init__(self) -> None:
        self.paths: list[object] = []

    def __call__(self, path, layers, threads):
        self.paths.append(path)
        engine = FakeEngine()
        engine.model_name = f"Fake ({path or 'default'})"
        return engine


@pytest.fixture
def stores(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """An LM Studio model in a fake home and a Hugging Face cache, in the environment."""
    home = tmp_path / "home"
    lm = gguf(home / ".lmstudio" / "models" / "pub" / "repo" / "tiny-Q4_K_M.gguf", 2_000_000)
    hub = hf_cache(tmp_path)
    for key in ("LMSTUDIO_HOME", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return lm, hub


def test_found_models_are_listed_and_choosing_one_loads_it(qtbot, tmp_path, stores):
    lm, _ = stores
    loads = Loads()
    w = MainWindow(
        WorkerThread(loads), Store(tmp_path / "h.sqlite3"), Settings(), tmp_path / "s.json"
    )
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.model_name == "Fake (default)", timeout=5000)
    panel = w.panel
    assert panel.found_models.itemText(0) == "Not looked yet"
    w.tabs.setCurrentIndex(w.tabs.count() - 1)  # the Settings tab: the first look
    qtbot.waitUntil(lambda: panel.found_models.count() > 1, timeout=5000)
    texts = [panel.found_models.itemText(i) for i in range(panel.found_models.count())]
    assert "pub/repo: tiny-Q4_K_M.gguf · LM Studio · 2 MB" in texts
    assert any(t.startswith("unsloth/gemma-3-270m-it-GGUF: ") for t in texts)
    index = panel.found_models.findData(str(lm))
    assert index > 0
    assert panel.found_models.itemData(index, 3) == str(lm)  # the path as its tooltip

    panel.found_models.setCurrentIndex(index)
    panel.found_models.activated.emit(index)  # as a user's choice does
    qtbot.waitUntil(lambda: w.model_name == f"Fake ({lm})", timeout=5000)
    assert loads.paths[-1] == str(lm)
    assert w.settings.model_path == str(lm)
    assert load(tmp_path / "s.json").model_path == str(lm)
    qtbot.waitUntil(lambda: panel.found_models.isEnabled(), timeout=5000)
    assert panel.found_models.currentIndex() == index

    panel.model_path.setText("")  # "Use default": the list shows no choice again
    assert panel.found_models.currentIndex() == 0
    w.close()


def test_refresh_looks_again_and_an_empty_result_says_so(qtbot):
    found: list[list[FoundModel]] = [[]]
    panel = SettingsPanel(Settings(), find=lambda: found[0])
    qtbot.addWidget(panel)
    panel.refresh_models()
    assert panel.found_models.count() == 1
    assert panel.found_models.itemText(0).startswith("None found")
    found[0] = [FoundModel("llama3.2:1b", Path("/m/blob"), "Ollama", 1_300_000_000)]
    panel.refresh_models_button.click()
    assert panel.found_models.itemText(0) == "Choose one of 1 model…"
    assert panel.found_models.itemText(1) == "llama3.2:1b · Ollama · 1.3 GB"
    with qtbot.waitSignal(panel.reload_requested) as signal:
        panel.found_models.activated.emit(1)
    assert signal.args == ["/m/blob", 0, None]


def test_threads_offered_are_the_cpus_this_process_may_use(qtbot, monkeypatch):
    """Under taskset or a container's cpuset the panel offers no more threads than
    the CPUs kvtrim may run on (the CLI's --threads check counts the same way)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    panel = SettingsPanel(Settings(), find=list)
    qtbot.addWidget(panel)
    assert panel.threads.maximum() == 1
