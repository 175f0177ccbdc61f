"""A benchmark's result file, rewritten after every record: a long run that stops
(or is stopped) keeps what it measured. Used by ``--kv-memory`` and ``--multiturn``."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


class Records:
    """``result`` = the command, the config, the model and the records so far, with the
    seconds elapsed since the start (``elapsed_s``)."""

    def __init__(self, path: Path, command: str, config: Any, model: str) -> None:
        """``config``: a dataclass instance, written as a dict."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.result: dict[str, Any] = {
            "command": command,
            "config": asdict(config),
            "model": model,
            "records": [],
        }
        self._start = time.perf_counter()

    def emit(self, record: dict[str, Any]) -> None:
        """Add ``record`` and rewrite the file."""
        self.result["records"].append(record)
        self.result["elapsed_s"] = time.perf_counter() - self._start
        self.path.write_text(json.dumps(self.result, indent=1))
