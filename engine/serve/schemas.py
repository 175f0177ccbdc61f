"""OpenAI request shapes (pydantic) and the response objects the server returns.

Fields OpenAI clients send that a local server cannot honour in a meaningful way
(penalties, ``user``, ...) are accepted and ignored, as llama.cpp's server does;
``n > 1``, ``echo`` and ``logprobs`` are refused with a 400. kvtrim's own fields
(``kv_policy``, ``kv_budget``, ``kv_keep_ratio``) override the server's eviction
settings for one request (the ``extra_body`` of the openai client); ``top_k``,
``min_p`` and ``ignore_eos`` are llama-server's extensions, with its defaults.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..session.sampling import CHAT
from ..stats import KVStats

FINISH = {"stop": "stop", "eog": "stop", "repetition": "stop", "length": "length"}
MAX_TOKENS = 32_768  # one answer at most; eviction would let it run for ever
MAX_SEED = 2**64 - 1
MAX_TOP_K = 2**31 - 1  # llama.cpp's int32; more than the vocabulary keeps it all
MAX_STOPS = 4  # stop strings per request, as OpenAI allows
MAX_STOP_CHARS = 256  # characters of one stop string


class KvOverrides(BaseModel):
    """Per-request eviction settings; None means the server's setting."""

    kv_policy: str | None = None
    kv_budget: int | None = Field(default=None, ge=16)
    kv_keep_ratio: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    kv_policy_args: dict[str, float] | None = Field(default=None, max_length=16)
    """The policy's parameters by name (``window``, ``kernel``...): each policy's
    fields (``Policy.tunables``), checked against their ranges."""


class _Sampling(KvOverrides):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = Field(default=CHAT.temperature, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(default=CHAT.top_p, gt=0, le=1, allow_inf_nan=False)
    # llama-server's extensions: JSON numbers only (strict: no true, "3" or 2.0)
    top_k: int = Field(default=CHAT.top_k, le=MAX_TOP_K, strict=True)  # <= 0: off
    min_p: float = Field(default=CHAT.min_p, ge=0, le=1, allow_inf_nan=False, strict=True)
    ignore_eos: bool = Field(default=CHAT.ignore_eos, strict=True)  # llama-server's, vLLM's
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1)

    @field_validator("stop")
    @classmethod
    def _few_short_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        """OpenAI's bound (4 stop strings); 1,000 of 1,000 characters took 64 s."""
        many = [stop] if isinstance(stop, str) else stop or []
        if len(many) > MAX_STOPS or any(len(x) > MAX_STOP_CHARS for x in many):
            raise ValueError(
                f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters"
            )
        return stop

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=0, le=MAX_TOKENS)  # 0: read only
    echo: bool = False
    logprobs: int | None = None


class ContentPart(BaseModel):
    """One part of a message's content: text parts are read, others (images) skipped;
    a text part's ``text`` must be a string (a nested object was a 500, issue 23)."""

    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content if part.type == "text")


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)  # 0: read only
    max_completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS)
    logprobs: bool | None = None


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(stats: KVStats) -> dict[str, Any]:
    """OpenAI's ``usage``: every prompt token, of which ``cached_tokens`` were not read
    again (a saved read of the same text reused, as llama-server reports its prompt
    cache)."""
    prompt = stats.prompt_tokens + stats.cached_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": prompt + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def kv_report(stats: KVStats) -> dict[str, Any]:
    """kvtrim's figures, returned beside OpenAI's ``usage``."""
    return {
        "policy": stats.policy,
        "budget_tokens": stats.budget_tokens,
        "tokens_seen": stats.tokens_seen,
        "cells_kept": stats.cells_used,
        "evicted_tokens": stats.evicted_tokens,
        "kv_bytes_held": stats.kv_bytes,
        "kv_bytes_llama_default": stats.kv_bytes_llama_default,
        "kv_bytes_full": stats.kv_bytes_full,
        "kv_type": stats.kv_type,
        "prefill_tokens_per_s": round(stats.prefill_tokens_per_s, 1),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 1),
    }


class Reply:
    """Builds the response and stream-chunk objects of one request."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, reason: str, stats: KVStats) -> dict[str, Any]:
        finish = FINISH.get(reason, "stop")
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
            body = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            body = self._base("text_completion")
        return {**body, "choices": [choice], "usage": usage(stats), "kvtrim": kv_report(stats)}

    def chunk(
        self, text: str | None, finish: str | None = None, stats: KVStats | None = None
    ) -> dict[str, Any]:
        """One server-sent event; the first chat chunk carries the role."""
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if text == "" and finish is None:
                delta = {"role": "assistant", "content": ""}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            body = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            body = self._base("text_completion")
        body["choices"] = [choice]
        if stats is not None:
            body["usage"] = usage(stats)
            body["kvtrim"] = kv_report(stats)
        return body
