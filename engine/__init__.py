"""kvtrim's engine: long documents in a bounded llama.cpp KV cache.

No Qt here: the command line, the tests and the GUI all drive this API.
"""

from __future__ import annotations

from .errors import (
    Cancelled,
    ConfigError,
    ContextOverflowError,
    DocumentError,
    EngineError,
    KvtrimError,
    ModelError,
    OutOfMemoryError,
    StateError,
    TemplateError,
)
from .native.embedded import default_model_path
from .native.model import Model, ModelInfo
from .policies import H2O, POLICIES, TOVA, Full, Policy, SnapKV, StreamingLLM, make_policy
from .runtime.engine import Engine
from .session.core import Session, SessionConfig
from .session.prompts import Prompt, ask_prompt, chat_prompt, summary_prompt
from .session.sampling import Sampling
from .stats import Done, Event, Evicted, KVStats, Progress, Recalled, Restored, Result, Token

__all__ = [
    "H2O",
    "POLICIES",
    "TOVA",
    "Cancelled",
    "ConfigError",
    "ContextOverflowError",
    "DocumentError",
    "Done",
    "Engine",
    "EngineError",
    "Event",
    "Evicted",
    "Full",
    "KVStats",
    "KvtrimError",
    "Model",
    "ModelError",
    "ModelInfo",
    "OutOfMemoryError",
    "Policy",
    "Progress",
    "Prompt",
    "Recalled",
    "Restored",
    "Result",
    "Sampling",
    "Session",
    "SessionConfig",
    "SnapKV",
    "StateError",
    "StreamingLLM",
    "TemplateError",
    "Token",
    "ask_prompt",
    "chat_prompt",
    "default_model_path",
    "make_policy",
    "summary_prompt",
]
