"""``kvtrim serve`` on a free loopback port with the real model, called with the
openai client and with raw HTTP."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers.docs_for_tests import prose

from engine.serve.api import ServerConfig, create_app
from engine.serve.background import BackgroundServer

KEY = "sk-kvtrim-test"


@pytest.fixture(scope="module", params=[1, 4], ids=["one-at-a-time", "parallel"])
def server(engine, request):
    config = ServerConfig(
        policy="snapkv", budget_tokens=256, api_key=KEY, parallel=request.param, kv_cells=1024
    )
    started = time.perf_counter()
    with BackgroundServer(create_app(engine, config)) as url:
        yield Url(url, request.param, started)


class Url(str):
    """The server's address, and how many requests it decodes together."""

    def __new__(cls, url: str, parallel: int, started: float = 0.0) -> Url:
        self = super().__new__(cls, url)
        self.parallel = parallel
        self.started = started  # time.perf_counter() before it started
        return self


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_models_and_completion_shapes(client):
    models = client.models.list()
    model = models.data[0].id
    assert model.startswith("gemma-3-270m")
    out = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert out.object == "text_completion" and out.choices[0].text.strip()
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens == 8 or out.choices[0].finish_reason == "stop"
    assert out.model_extra["kvtrim"]["policy"] == "snapkv"


def test_streaming_chat_matches_the_non_streaming_answer(client):
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Who repaired the bicycle? " + prose(20, seed=3)},
    ]
    whole = client.chat.completions.create(
        model="any", messages=messages, max_tokens=16, temperature=0
    )
    pieces, finish = [], None
    for chunk in client.chat.completions.create(
        model="any", messages=messages, max_tokens=16, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason


def test_policy_override_per_request_evicts_in_its_own_budget(client):
    prompt = prose(120, seed=4) + "\nIn short,"
    out = client.completions.create(
        model="any",
        prompt=prompt,
        max_tokens=4,
        temperature=0,
        extra_body={"kv_policy": "streaming", "kv_budget": 128},
    )
    report = out.model_extra["kvtrim"]
    assert report["policy"] == "streaming" and report["budget_tokens"] == 128
    assert report["evicted_tokens"] > 0 and report["cells_kept"] <= 128 + 64
    default = client.completions.create(model="any", prompt=prompt, max_tokens=4, temperature=0)
    assert default.model_extra["kvtrim"]["policy"] == "snapkv"


def test_concurrent_requests_match_what_each_gets_alone(server, client):
    keys = [48213, 90127, 31416, 77305]
    prompts = [
        f"{prose(30 + 10 * i, seed=10 + i)} The pass key is {key}. Remember it. "
        f"{prose(20, seed=20 + i)}\nWhat is the pass key? The pass key is"
        for i, key in enumerate(keys)
    ]

    def ask(prompt: str) -> str:
        out = client.completions.create(model="any", prompt=prompt, max_tokens=12, temperature=0)
        return out.choices[0].text

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, prompts))
    for key, one, many in zip(keys, alone, together, strict=True):
        assert str(key) in one and str(key) in many, (key, one, many)
    if server.parallel == 1:
        assert together == alone  # one at a time: the same computation


def test_errors_come_back_in_openai_shape_and_the_server_stays_up(server, client):
    bad = httpx.post(
        f"{server}/v1/completions",
        content=b"{not json",
        headers={**_auth(), "Content-Type": "application/json"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "json_invalid"
    missing = httpx.post(f"{server}/v1/chat/completions", json={"model": "x"}, headers=_auth())
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(
            model="any",
            prompt=prose(60),
            max_tokens=8,
            extra_body={"kv_policy": "full", "kv_budget": 64},
        )
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="unknown kv_policy"):
        client.completions.create(model="any", prompt="x", extra_body={"kv_policy": "lru"})
    wrong = openai.OpenAI(base_url=f"{server}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert httpx.get(f"{server}/metrics").status_code == 401  # the key guards every path
    ok = client.completions.create(model="any", prompt="Hello", max_tokens=2, temperature=0)
    assert ok.choices[0].text is not None


def test_a_client_that_goes_away_cancels_its_stream(server, client):
    # greedy counting runs on for all 400 tokens; sampled prose may stop at an
    # end-of-turn after a few tokens, and then there is nothing left to cancel
    count = "Count: " + ", ".join(str(i) for i in range(1, 41)) + ","
    body = {"prompt": count, "max_tokens": 400, "temperature": 0, "stream": True, "kv_budget": 128}
    start = time.perf_counter()
    with httpx.stream(
        "POST", f"{server}/v1/completions", json=body, headers=_auth(), timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                assert json.loads(line[6:])["object"] == "text_completion"
                break  # the first token arrived; leave
    left = time.perf_counter()
    ok = client.completions.create(model="any", prompt="Hi", max_tokens=1, temperature=0)
    assert ok.usage.completion_tokens == 1
    # 400 tokens take about 12 s here; the cancelled stream frees the engine at once
    assert time.perf_counter() - left < 3, time.perf_counter() - left
    # the server hears of the disconnect asynchronously; in parallel the short request
    # need not wait for it, so wait (3 s at most) for the cancel and the freed sequence
    want = ['kvtrim_errors_total{kind="cancelled"} 1.0']
    if server.parallel > 1:
        want.append("kvtrim_pool_active_sequences 0.0")
    while True:
        metrics = httpx.get(f"{server}/metrics", headers=_auth()).text
        if all(w in metrics for w in want) or time.perf_counter() - left > 3:
            break
        time.sleep(0.05)
    for w in want:
        assert w in metrics
    assert time.perf_counter() - start < 60


def test_metrics_count_what_happened(server, client):
    client.completions.create(
        model="any",
        prompt=prose(80, seed=8),
        max_tokens=2,
        temperature=0,
        extra_body={"kv_policy": "h2o", "kv_budget": 128},
    )
    text = httpx.get(f"{server}/metrics", headers=_auth()).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    assert values['kvtrim_requests_total{endpoint="/v1/completions",status="200"}'] >= 5
    assert values["kvtrim_completion_tokens_total"] > 0 and values["kvtrim_evictions_total"] > 0
    assert 0 < values["kvtrim_retention_ratio_mean"] < 1
    assert values["kvtrim_kv_bytes_held"] > 0 and values["kvtrim_kv_bytes_full"] > 0
    assert values["kvtrim_prefill_tokens_per_second_count"] >= 5
    assert values['kvtrim_errors_total{kind="authentication"}'] >= 2
    assert values['kvtrim_errors_total{kind="context_length_exceeded"}'] >= 1
    assert values['kvtrim_errors_total{kind="invalid_request"}'] >= 2


def test_a_full_queue_refuses_instead_of_growing():
    from engine.runtime.spec import RequestSpec
    from engine.serve.runner import EngineRunner, Job, Overloaded

    release = threading.Event()

    class SlowSession:
        def run_tokens(self, head, tail, **gen):
            release.wait(10)
            return iter(())

        def close(self):
            pass

    class SlowEngine:
        model_name = "slow"

        def session(self, policy, budget, **settings):
            return SlowSession()

    runner = EngineRunner(SlowEngine(), max_queue=1)
    job = Job([1], [2], RequestSpec(policy="snapkv", budget_tokens=64, max_tokens=4))
    first = runner.submit(job)
    with pytest.raises(Overloaded, match="retry later"):
        runner.submit(job)
    release.set()
    with pytest.raises(Exception, match="without an answer"):
        first.result(10)
    assert runner.waiting == 0
    runner.close()


def test_chat_prompt_for_a_base_model(engine):
    from engine.session.prompts import chat_prompt

    p = chat_prompt(
        engine.model,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi?"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Who?"},
        ],
    )
    assert p.prefix == "Be brief.\n\nQuestion: Hi?\nAnswer: Hello.\n\n"
    assert p.suffix == "Question: Who?\nAnswer:" and "\nQuestion:" in p.stops
    with pytest.raises(ValueError, match="last message"):
        chat_prompt(engine.model, [{"role": "assistant", "content": "x"}])


def test_metrics_show_each_running_request_in_the_pool(server, client):
    if server.parallel == 1:
        pytest.skip("one request at a time: no pool")
    # evicting prose, then counting: greedy decoding runs on past the metrics read
    count = "\n\nCount: " + ", ".join(str(i) for i in range(1, 21)) + ","
    prompt = prose(300, seed=9) + count
    body = {"prompt": prompt, "max_tokens": 60, "temperature": 0, "stream": True, "kv_budget": 128}
    seen = ""
    with httpx.stream(
        "POST", f"{server}/v1/completions", json=body, headers=_auth(), timeout=60
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen = httpx.get(f"{server}/metrics", headers=_auth()).text
                break
    assert 'kvtrim_sequence_share_cells{seq="' in seen
    assert 'kvtrim_sequence_evictions{seq="' in seen and "kvtrim_pool_active_sequences 1.0" in seen
    time.sleep(0.5)
    after = httpx.get(f"{server}/metrics", headers=_auth()).text
    assert "kvtrim_sequence_share_cells{" not in after  # it left: no longer running
    assert "kvtrim_pool_active_sequences 0.0" in after
    kept = [ln for ln in after.splitlines() if ln.startswith("kvtrim_pool_kept_sequences ")]
    assert kept and float(kept[0].split()[1]) >= 1  # kept with its text for a next request
    assert "kvtrim_request_share_ratio_count" in after
    decode_s = [ln for ln in after.splitlines() if ln.startswith("kvtrim_pool_decode_seconds ")]
    # llama_decode's own time, in seconds: within the server's life (a fixed bound
    # failed on a machine loaded beside the suite)
    alive_s = time.perf_counter() - server.started
    assert decode_s and 0 < float(decode_s[0].split()[1]) < alive_s
    owed_s = [ln for ln in after.splitlines() if ln.startswith("kvtrim_pool_owed_seconds ")]
    assert owed_s and 0 <= float(owed_s[0].split()[1]) < alive_s


def test_a_document_asked_about_twice_is_read_once(server, client):
    """Issue 24: a second request with the same system prompt and document (a new
    question) continues the cache of the first (a saved read one at a time, a parked
    sequence in parallel): ``usage.prompt_tokens_details.cached_tokens`` says how many
    prompt tokens were not read again, and the answer is still right."""
    doc = prose(60, seed=31) + " The ferry leaves from pier 14. " + prose(60, seed=32)

    def ask(question: str, prefix: str):
        messages = [  # the document in the system message: the text both requests share
            {"role": "system", "content": f"Answer from this document.\n\n{doc}"},
            {"role": "user", "content": f"Question: {question}\nAnswer: {prefix}"},
        ]
        return client.chat.completions.create(
            model="any", messages=messages, max_tokens=8, temperature=0
        )

    first = ask("Who repaired the bicycle?", "")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = ask("From which pier does the ferry leave?", "The ferry leaves from pier")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 1024, second.usage
    assert second.usage.prompt_tokens > cached  # every prompt token, the cached among them
    assert second.model_extra["kvtrim"]["tokens_seen"] > 0
    assert "14" in second.choices[0].message.content


def test_max_tokens_zero_reads_only_and_health_needs_no_key(server, client):
    """Issue 24, item 4: ``max_tokens: 0`` is prompt processing only (to warm a cache),
    as llama-server accepts it; /health answers without the API key."""
    out = client.completions.create(model="any", prompt=prose(5, seed=2), max_tokens=0)
    assert out.choices[0].text == "" and out.usage.completion_tokens == 0
    assert out.usage.prompt_tokens > 10
    health = httpx.get(f"{server}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert httpx.get(f"{server}/v1/models", timeout=10).status_code == 401


def test_parked_sequences_give_way_to_new_requests(engine):
    """A pool whose sequences are all parked with their texts still admits a request
    about another text: the least recently parked is freed (``KVPool.reclaim``)."""
    config = ServerConfig(policy="snapkv", budget_tokens=256, parallel=2, kv_cells=1024)
    with BackgroundServer(create_app(engine, config)) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        for seed in (41, 42, 43):  # three texts for two sequences
            messages = [
                {"role": "system", "content": prose(120, seed=seed)},
                {"role": "user", "content": "Who repaired the bicycle?"},
            ]
            out = c.chat.completions.create(
                model="any", messages=messages, max_tokens=4, temperature=0
            )
            assert out.usage.completion_tokens > 0


def test_requests_leave_no_wait_behind_in_the_pool(engine):
    """Each request is expected by the pool's rounds from its arrival (issue 37:
    prompts that arrive together are read together); refused, answered or dropped
    by its client, it leaves nothing for a round to wait for."""
    config = ServerConfig(policy="snapkv", budget_tokens=256, parallel=2, kv_cells=1024)
    app = create_app(engine, config)
    with BackgroundServer(app) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError, match="unknown kv_policy"):
            c.completions.create(
                model="any", prompt="Hello", max_tokens=4, extra_body={"kv_policy": "nope"}
            )
        out = c.completions.create(model="any", prompt="Once upon a time", max_tokens=4)
        assert out.usage.completion_tokens > 0
        body = {"prompt": prose(80, seed=3), "max_tokens": 64, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            next(r.iter_lines())  # the first event, then the client goes away
        pool = app.state.runner.pool
        deadline = time.monotonic() + 30
        while pool.snapshot()["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pool._expected
        assert all(isinstance(key, int) for key in pool.scheduler._owed)


def test_ignore_eos_runs_an_answer_to_its_length(server, client):
    """llama-server's and vLLM's ``ignore_eos`` (benchmarks send it so that every
    server writes the same number of tokens): the loop guard and end tokens give way."""
    loop = "1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"
    cut = client.completions.create(model="any", prompt=loop, max_tokens=40, temperature=0)
    whole = client.completions.create(
        model="any", prompt=loop, max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    assert cut.usage.completion_tokens < 40 and cut.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == 40 and whole.choices[0].finish_reason == "length"


def test_only_a_request_that_fits_a_round_holds_the_pool_while_it_is_parsed():
    """A document larger than a round is read over several rounds anyway: the others'
    answers do not wait for its parse (``ROUND_TOKENS`` bytes of text, by the bytes,
    not the characters, and ``MESSAGE_BYTES`` for each message's template: a request
    of many empty messages takes long to render)."""
    from engine.pool.kvpool import ROUND_TOKENS
    from engine.serve.api import MESSAGE_BYTES, _fits_a_round
    from engine.serve.schemas import ChatRequest, CompletionRequest

    def chat(*texts: str | None) -> ChatRequest:
        return ChatRequest(messages=[{"role": "user", "content": t} for t in texts])

    room = ROUND_TOKENS - MESSAGE_BYTES
    assert _fits_a_round(CompletionRequest(prompt="x" * room))
    assert not _fits_a_round(CompletionRequest(prompt="x" * (room + 1)))
    assert not _fits_a_round(CompletionRequest(prompt=["x" * (room - MESSAGE_BYTES), "y"]))
    assert _fits_a_round(chat("x" * (room // 2 - 8), "y" * (room // 2 - 8)))
    assert not _fits_a_round(chat("\U0001f600" * (ROUND_TOKENS // 4)))  # 4 bytes each
    assert not _fits_a_round(chat(*[None] * (ROUND_TOKENS // MESSAGE_BYTES + 1)))


def test_a_request_that_would_wait_for_an_engine_thread_holds_no_round(engine):
    """The pool's rounds wait for a request on its way only while no more are on their
    way than engine threads; a job that queues for one lets go."""
    import contextlib

    from engine.serve.runner import EngineRunner, Job

    runner = EngineRunner(engine, parallel=2, kv_cells=1024)
    pool = runner.pool
    try:
        with runner.arriving() as first:
            runner._building += 1  # a third request on its way: more than the threads
            with runner.arriving() as second:  # the pool has a sequence free for it
                assert first.key is not None and second.key is None
                second.built()
                second.built()  # once only
            runner._building -= 1
            first.built()
            assert runner._building == 0
            runner._waiting = 2  # both engine threads busy: this job queues
            job = Job(head=[1], tail=[], spec=None, arrival=first.key)  # type: ignore[arg-type]
            job.cancel()
            future = runner.submit(job)
            assert first.key not in pool._expected
            with contextlib.suppress(BaseException):
                future.result(30)
        with contextlib.suppress(ValueError), runner.arriving() as third:
            assert third.key in pool._expected
            raise ValueError("its job failed to build")
        assert runner._building == 0 and third.key not in pool._expected
    finally:
        runner.close()
