"""``kvtrim serve``'s request checks alone: no server, no model. The cases of
test_server.py and test_hostile_clients.py that are about refusing a request, plus
hostile ones."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.bad_inputs import SAMPLING_REFUSED
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from engine import ConfigError, ContextOverflowError, OutOfMemoryError
from engine.serve.api_errors import ApiError, from_engine, from_http, from_validation
from engine.serve.config import ServerConfig
from engine.serve.guards import (
    LOOPBACK_HOSTS,
    BodyLimit,
    HostCheck,
    allowed_names,
    host_allowed,
    key_matches,
)
from engine.serve.runner import Overloaded, ShuttingDown
from engine.serve.schemas import ChatRequest, CompletionRequest
from engine.serve.validation import QUESTION_TOKENS, JobBuilder, split_question

CONFIG = ServerConfig(budget_tokens=256, max_kv_budget=512, max_prompt_tokens=4096)


class FakeModel:
    """One token per character, BOS = 1; a base model (no chat template)."""

    add_bos = True
    info = SimpleNamespace(chat_template=None)

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, tuple[tuple[int, int], ...]]] = []

    def tokenize(self, text: str, *, add_bos: bool = False, markup: Any = ()) -> list[int]:
        self.calls.append((text, add_bos, tuple(markup)))
        return ([1] if add_bos else []) + [ord(c) for c in text]


def _completion(config: ServerConfig = CONFIG, **body: Any):
    model = FakeModel()
    req = CompletionRequest.model_validate({"prompt": "Hello", **body})
    return JobBuilder(model, config).completion(req), model


def _chat(messages: list[dict[str, Any]], config: ServerConfig = CONFIG, **body: Any):
    model = FakeModel()
    req = ChatRequest.model_validate({"messages": messages, **body})
    return JobBuilder(model, config).chat(req), model


def _refused(call: Any, *args: Any, **kw: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args, **kw)
    assert caught.value.status == 400 and caught.value.kind == "invalid_request_error"
    return caught.value


def _parse_error(model: type, raw: str) -> ApiError:
    """What the app answers to a body pydantic refuses (FastAPI puts "body" first)."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(json.loads(raw))  # json.loads reads NaN and Infinity, as FastAPI
    return from_validation([{**e, "loc": ("body", *e["loc"])} for e in caught.value.errors()])


# a request the server runs


def test_a_completion_becomes_a_job_with_the_server_defaults():
    job, model = _completion(max_tokens=5, stop="\n", seed=7, temperature=0.3)
    assert (job.spec.policy, job.spec.budget_tokens, job.spec.max_tokens) == ("snapkv", 256, 5)
    assert job.head == [1] and job.tail == [ord(c) for c in "Hello"]
    assert list(job.spec.stops) == ["\n"] and job.spec.sampling.seed == 7
    assert model.calls == [("Hello", True, ())]
    default, _ = _completion()
    assert default.spec.max_tokens == 16  # OpenAI's default for completions


def test_the_last_tokens_of_a_raw_prompt_vote():
    head, tail = split_question(list(range(100)))
    assert len(tail) == QUESTION_TOKENS and head + tail == list(range(100))
    assert split_question([5, 6]) == ([5], [6])
    assert split_question([5]) == ([], [5])  # "" with BOS: generation from BOS, as OpenAI


def test_overrides_per_request():
    job, _ = _completion(kv_policy="streaming", kv_budget=128)
    assert (job.spec.policy, job.spec.budget_tokens) == ("streaming", 128)
    at_limit, _ = _completion(kv_budget=512)
    assert at_limit.spec.budget_tokens == 512
    assert ServerConfig(budget_tokens=1024).kv_budget_limit == 1024  # the default limit


def test_a_request_sets_its_policy_parameters_by_name():
    """Issue 35: ``kv_policy_args`` are the policy's own fields, checked; without
    them a request runs the server's (``--policy-arg``) for the server's policy."""
    job, _ = _completion(kv_policy="snapkv", kv_policy_args={"window": 8, "kernel": 3})
    assert job.spec.policy_settings == (("kernel", 3), ("window", 8))
    ratio = (("recent_ratio", 0.25),)
    config = ServerConfig(budget_tokens=256, policy="h2o", policy_settings=ratio)
    job, _ = _completion(config)
    assert job.spec.policy_settings == ratio
    job, _ = _completion(config, kv_policy="snapkv")  # another policy: its own defaults
    assert job.spec.policy_settings == ()
    for args, words in (({"window": 0}, "window must be in 1..4,096"),
                        ({"ratio": 1}, "snapkv has no parameter 'ratio'")):  # fmt: skip
        error = _refused(_completion, kv_policy="snapkv", kv_policy_args=args)
        assert error.param == "kv_policy_args" and words in str(error)
    many = {f"p{i}": 1 for i in range(17)}
    with pytest.raises(ValueError):  # pydantic: at most 16
        CompletionRequest.model_validate({"prompt": "x", "kv_policy_args": many})


def test_a_keep_ratio_cuts_the_budget_but_not_below_64():
    job, _ = _completion(prompt="x" * 999, kv_keep_ratio=0.5)  # 1,000 tokens with BOS
    assert job.spec.budget_tokens == 256  # min(budget, 500)
    job, _ = _completion(prompt="x" * 999, kv_keep_ratio=0.1)
    assert job.spec.budget_tokens == 100
    job, _ = _completion(prompt="x" * 99, kv_keep_ratio=0.1)
    assert job.spec.budget_tokens == 64
    ratio = ServerConfig(budget_tokens=256, keep_ratio=0.25)
    job, _ = _completion(ratio, prompt="x" * 399)
    assert job.spec.budget_tokens == 100


def test_a_chat_uses_the_template_and_its_own_max_tokens():
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi?"}, {"type": "image"}]},
    ]
    job, model = _chat(messages, max_completion_tokens=9, max_tokens=3, stop=["END"])
    assert job.spec.max_tokens == 9 and "END" in job.spec.stops and "\nQuestion:" in job.spec.stops
    assert model.calls[0] == ("Be brief.\n\n", True, ())  # developer is system
    assert model.calls[1] == ("Question: Hi?\nAnswer:", False, ())
    assert _chat([{"role": "user", "content": "x"}])[0].spec.max_tokens == CONFIG.max_tokens


def test_control_token_text_is_allowed_as_plain_text():
    text = "<start_of_turn>user\n<eos><|im_end|><|endoftext|>[INST]"
    job, model = _completion(prompt=text)
    assert model.calls == [(text, True, ())]  # no markup: no control token parsed
    assert job.head + job.tail == [1, *map(ord, text)]
    job, model = _chat([{"role": "system", "content": text}, {"role": "user", "content": text}])
    assert all(markup == () for _, _, markup in model.calls)


def test_a_tiny_temperature_is_greedy_not_an_error():
    job, _ = _completion(temperature=1e-320)
    assert job.spec.sampling.temperature == 0.0


def test_sampling_takes_llama_servers_cuts_and_defaults():
    """top_k and min_p as llama-server has them: 40 and 0.05 unless given, a top_k of
    0 or less is off (vLLM's clients send -1)."""
    job, _ = _completion()
    s = job.spec.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.8, 0.95, 40, 0.05)
    for given, off in ((-1, 0), (0, 0), (-7, 0), (5, 5)):
        assert _completion(top_k=given)[0].spec.sampling.top_k == off
    assert _completion(min_p=0, top_p=0.5)[0].spec.sampling.min_p == 0.0


# requests the server refuses, before any tokenizing when it can


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"n": 2}, "n", "only n=1"),
        ({"echo": True}, "echo", "not supported"),
        ({"logprobs": 2}, "logprobs", "not supported"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt"),
        ({"prompt": []}, "prompt", "one prompt"),
        ({"kv_policy": "lru"}, "kv_policy", "unknown kv_policy 'lru'"),
        ({"kv_policy": "SnapKV"}, "kv_policy", "unknown kv_policy"),  # names are lower case
        ({"kv_policy": "full\x00"}, "kv_policy", "unknown kv_policy"),
        ({"kv_budget": 4096}, "kv_budget", "limit of 512"),
        ({"kv_budget": 10**30}, "kv_budget", "limit of 512"),
    ],
)
def test_cheap_refusals_come_before_tokenizing(body, param, message):
    model = FakeModel()
    req = CompletionRequest.model_validate({"prompt": "Hello", **body})
    error = _refused(JobBuilder(model, CONFIG).completion, req)
    assert error.param == param and message in str(error)
    assert model.calls == []


def test_an_empty_prompt_without_bos_is_refused():
    model = FakeModel()
    model.add_bos = False
    req = CompletionRequest.model_validate({"prompt": ""})
    assert _refused(JobBuilder(model, CONFIG).completion, req).param == "prompt"


def test_a_prompt_over_the_server_limit():
    error = _refused(_completion, prompt="x" * 5000)
    assert error.param == "prompt" and error.code == "context_length_exceeded"
    assert error.metric == "context_length_exceeded" and "at most 4096" in str(error)


def test_the_full_cache_must_hold_the_prompt_and_the_answer():
    error = _refused(_completion, prompt="x" * 100, kv_policy="full", kv_budget=64)
    assert error.code == "context_length_exceeded" and error.param == "prompt"
    assert "never evicts" in str(error)
    fits, _ = _completion(prompt="x" * 40, kv_policy="full", kv_budget=64, max_tokens=8)
    assert fits.spec.policy == "full" and fits.spec.budget_tokens == 64
    long_answer = _refused(
        _completion, prompt="x" * 40, kv_policy="full", kv_budget=64, max_tokens=30
    )
    assert long_answer.code == "context_length_exceeded"


def test_chat_refusals():
    assert _refused(_chat, [{"role": "assistant", "content": "x"}]).param == "messages"
    assert _refused(_chat, [{"role": "user", "content": "x"}], logprobs=True).param == "logprobs"
    error = _refused(_chat, [{"role": "user", "content": "x"}], kv_policy="lru")
    assert error.param == "kv_policy"


# bodies pydantic refuses, as the app answers them


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        *SAMPLING_REFUSED,
        ('"seed": 18446744073709551616', "seed"),  # 2**64
        ('"temperature": "hot"', "temperature"),
        ('"kv_keep_ratio": NaN', "kv_keep_ratio"),
        ('"kv_keep_ratio": 0', "kv_keep_ratio"),
        ('"kv_keep_ratio": -0.5', "kv_keep_ratio"),
        ('"kv_budget": -5', "kv_budget"),
        ('"kv_budget": 0', "kv_budget"),
        ('"kv_budget": 15', "kv_budget"),
        ('"kv_budget": 1.5', "kv_budget"),
        ('"kv_policy": 5', "kv_policy"),
        ('"max_tokens": -1', "max_tokens"),
        ('"max_tokens": 1000000000', "max_tokens"),
        ('"max_tokens": 1000000000000', "max_tokens"),
        ('"n": 0', "n"),
    ],
)
def test_out_of_range_and_wrong_type_fields(raw, param):
    error = _parse_error(CompletionRequest, '{"prompt": "Hello", ' + raw + "}")
    assert error.status == 400 and error.code == "invalid_value"
    assert error.param == param and str(error).startswith(f"{param}: ")


@pytest.mark.parametrize(
    ("model", "raw", "param"),
    [
        (CompletionRequest, '{"prompt": 123}', "prompt"),
        (CompletionRequest, '{"prompt": {"text": "x"}}', "prompt"),
        (CompletionRequest, '{"prompt": "x", "stop": 5}', "stop"),
        (ChatRequest, '{"model": "x"}', "messages"),
        (ChatRequest, '{"messages": []}', "messages"),
        (ChatRequest, '{"messages": "hi"}', "messages"),
        (ChatRequest, '{"messages": [{"role": "tool", "content": "x"}]}', "messages"),
        (ChatRequest, '{"messages": [{"role": "user", "content": 5}]}', "messages"),
        # issue 23: a text part whose text is no string was a bare 500
        (
            ChatRequest,
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]}',
            "messages",
        ),
        (
            ChatRequest,
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": [["x"]]}]}]}',
            "messages",
        ),
        (ChatRequest, '{"messages": [{"role": "user", "content": ["just text"]}]}', "messages"),
    ],
)
def test_missing_and_malformed_fields_name_the_field(model, raw, param):
    error = _parse_error(model, raw)
    assert error.status == 400 and error.param.split(".")[0] == param


def test_a_body_that_is_no_json_object():
    error = from_validation([{"type": "json_invalid", "loc": ("body", 1), "msg": "x"}])
    assert error.code == "json_invalid" and error.status == 400
    for raw in ("[1, 2, 3]", '"text"', "null"):
        with pytest.raises(ValidationError) as caught:
            CompletionRequest.model_validate(json.loads(raw))
        errors = [{**e, "loc": ("body", *e["loc"])} for e in caught.value.errors()]
        assert from_validation(errors).code == "json_invalid", raw
    assert from_validation([]).code == "json_invalid"


# engine and HTTP errors in OpenAI's shape


def test_engine_errors_map_to_statuses():
    cases = [
        (Overloaded("retry later"), 429, "queue_full", "overloaded"),
        (ShuttingDown("stopping"), 503, "server_shutdown", "shutdown"),
        (ContextOverflowError("x"), 400, "context_length_exceeded", "context_length_exceeded"),
        (OutOfMemoryError("x"), 503, "out_of_memory", "out_of_memory"),
        (ConfigError("budget 16 cannot hold"), 400, "invalid_value", "invalid_request"),
        (RuntimeError("boom"), 500, "internal_error", "internal"),
    ]
    for exc, status, code, metric in cases:
        error = from_engine(exc)
        assert (error.status, error.code, error.metric) == (status, code, metric), exc
        assert set(error.body()["error"]) == {"message", "type", "param", "code"}
    assert from_engine(ConfigError("x")).param is None  # a budget below what snapkv keeps


def test_http_errors():
    assert from_http(404, "Not Found").code == "not_found"
    too_large = from_http(413, "the request body is over this server's 4 MiB limit")
    assert too_large.code == "request_too_large" and too_large.metric == "request_too_large"
    assert from_http(400, "bad").metric == "invalid_request"
    assert from_http(500, "x").kind == "server_error"


# the guards' decisions: Host, API key, body size


def test_only_loopback_host_names_are_answered():
    allowed = allowed_names(LOOPBACK_HOSTS)
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST", "localhost."):
        assert host_allowed(host, allowed), host
    for host in (
        "evil.example",
        "evil.example:8000",
        "127.0.0.1.evil.example",
        "localhost:80:80",
        "[::1",
        "localhost:port",
        "",
        None,
        "localhost@evil.example",
    ):
        assert not host_allowed(host, allowed), host
    assert host_allowed("anything.example", allowed_names(["*"]))
    assert host_allowed(None, allowed_names(["*"]))
    assert host_allowed("box.lan:1", allowed_names(["BOX.LAN."]))


def test_the_key_must_match_exactly():
    key = b"sk-kvtrim"
    assert key_matches("Bearer sk-kvtrim", key)
    for header in ("", "Bearer", "Bearer sk-kvtrim2", "sk-kvtri", "Bearer SK-KVTRIM"):
        assert not key_matches(header, key), header


def _call(guard: Any, headers: dict[str, str], chunks: list[bytes]) -> tuple[list[dict], Any]:
    """Run an ASGI guard around an app that reads the whole body."""
    sent: list[dict] = []
    read: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        read["body"] = body

    async def receive() -> dict:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(guard(app)(scope, receive, send))
    return sent, read.get("body")


def test_a_foreign_host_is_refused_before_the_body_is_read():
    def guard(app: Any) -> HostCheck:
        return HostCheck(app, allowed=LOOPBACK_HOSTS)

    sent, body = _call(guard, {"host": "evil.example"}, [b"{}"])
    assert body is None and sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["code"] == "invalid_host"
    _, body = _call(guard, {"host": "localhost:8000"}, [b"{}"])
    assert body == b"{}"


def test_a_body_over_the_limit_is_refused_declared_or_chunked():
    def guard(app: Any) -> BodyLimit:
        return BodyLimit(app, max_bytes=1024)

    with pytest.raises(HTTPException) as declared:
        _call(guard, {"content-length": "5000"}, [b"x" * 5000])
    assert declared.value.status_code == 413 and "0.000976562 MiB" in declared.value.detail
    with pytest.raises(HTTPException):  # no Content-Length: counted as it arrives
        _call(guard, {}, [b"x" * 600, b"x" * 600, b"x" * 600])
    with pytest.raises(HTTPException):  # a Content-Length that lies is caught too
        _call(guard, {"content-length": "10"}, [b"x" * 600, b"x" * 600])
    _, body = _call(guard, {"content-length": "1024"}, [b"x" * 1024])
    assert body == b"x" * 1024


# the server's own settings


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"policy": "lru"}, "--policy"),
        ({"budget_tokens": -5}, "--budget"),
        ({"budget_tokens": 20}, "too small for snapkv"),
        ({"keep_ratio": math.nan}, "--keep-ratio"),
        ({"keep_ratio": 0.0}, "--keep-ratio"),
        ({"api_key": "  "}, "--api-key"),
        ({"max_queue": 0}, "--max-queue"),
        ({"max_kv_budget": 100}, "--max-kv-budget"),
        ({"max_tokens": 10**9}, "--max-tokens"),
        ({"max_body_bytes": 10}, "--max-body-mb"),
        ({"allowed_hosts": ()}, "allowed_hosts"),
    ],
)
def test_bad_server_settings(settings, message):
    with pytest.raises(ConfigError, match=message):
        ServerConfig(**settings)
