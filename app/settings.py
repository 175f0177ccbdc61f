"""The app's settings: one typed object, versioned, stored as JSON in the user's
config folder and written atomically (a crash never leaves half a file)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.native.kvmemory import KV_TYPES
from engine.policies import POLICIES
from engine.runtime.batch import write_atomic
from engine.runtime.spec import RequestSpec
from engine.session.sampling import Sampling
from engine.session.sizing import MIN_CHUNK

MIN_BUDGET = MIN_CHUNK  # the smallest --budget the CLI takes
MAX_TEMPERATURE = 2.0

SCHEMA_VERSION = 1


@dataclass
class Settings:
    """What the settings panel edits. Defaults suit the embedded model on a CPU."""

    model_path: str = ""  # empty: the embedded default model
    gpu_layers: int = 0
    threads: int = 0  # 0: one per physical core
    policy: str = RequestSpec.policy  # the request defaults: declared once, in RequestSpec
    budget_tokens: int = RequestSpec.budget_tokens
    kv_type: str = "f16"  # the KV cache's type: f16, q8_0 or q4_0 (engine.kvmemory.KV_TYPES)
    # per policy, the parameters the user changed from the paper's defaults
    policy_params: dict[str, dict[str, float]] = field(default_factory=dict)
    max_tokens: int = RequestSpec.max_tokens
    temperature: float = Sampling.temperature
    system_prompt: str = ""
    answer_prefix: str = ""  # what answers start with: steers base models
    theme: str = "system"  # system, light or dark
    window_geometry: str = ""  # QWidget.saveGeometry(), base64: size and place at the last close
    splitter_sizes: list[int] = field(default_factory=list)  # sidebar, chat, tabs (pixels)

    def validated(self) -> Settings:
        """A copy with out-of-range values replaced by defaults."""
        d = Settings()
        out = Settings(**asdict(self))
        if out.policy not in POLICIES:
            out.policy = d.policy
        if out.budget_tokens < MIN_BUDGET:
            out.budget_tokens = d.budget_tokens
        if out.kv_type not in KV_TYPES:
            out.kv_type = d.kv_type
        if out.theme not in ("system", "light", "dark"):
            out.theme = d.theme
        out.gpu_layers = max(0, out.gpu_layers)
        out.threads = max(0, out.threads)
        out.max_tokens = max(1, out.max_tokens)
        out.temperature = min(max(0.0, out.temperature), MAX_TEMPERATURE)
        sizes = out.splitter_sizes
        if len(sizes) != 3 or not all(isinstance(n, int) and n >= 0 for n in sizes):
            out.splitter_sizes = []
        out.policy_params = {
            name: _valid_params(name, params)
            for name, params in out.policy_params.items()
            if name in POLICIES and isinstance(params, dict)
        }
        return out


def _valid_params(policy: str, params: dict[str, Any]) -> dict[str, float]:
    """The parameters of ``policy`` in ``params`` that it takes, in range (each policy's
    fields say which: ``Policy.tunables``); the rest are dropped."""
    out = {}
    for tunable in POLICIES[policy].tunables():
        if tunable.name in params:
            try:
                out[tunable.name] = tunable.check(params[tunable.name])
            except ConfigError:
                continue
    try:
        POLICIES[policy](**out)  # together (SnapKV's kernel must be odd): else the defaults
    except ConfigError:
        return {}
    return out


def load(path: Path) -> Settings:
    """Settings from ``path``; missing, unreadable or foreign files give defaults."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Settings()
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA_VERSION:
        return Settings()
    known = {f.name: f.type for f in fields(Settings)}
    values: dict[str, Any] = {}
    default = Settings()
    for name in known:
        if name in raw and isinstance(raw[name], type(getattr(default, name))):
            values[name] = raw[name]
    return Settings(**values).validated()


def save(settings: Settings, path: Path) -> None:
    """Write atomically: a temporary file in the same folder, fsync, then rename."""
    write_atomic(path, json.dumps({"schema": SCHEMA_VERSION, **asdict(settings)}, indent=1))


def default_paths() -> tuple[Path, Path]:
    """(settings file, history database) in the user's config and data folders."""
    import platformdirs

    config = Path(platformdirs.user_config_dir("kvtrim", appauthor=False))
    data = Path(platformdirs.user_data_dir("kvtrim", appauthor=False))
    return config / "settings.json", data / "history.sqlite3"
