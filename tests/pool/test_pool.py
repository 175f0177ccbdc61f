"""Several sessions as sequences of one shared context (engine/pool/): the
needle each finds is the one it finds alone, eviction in one never touches
another's cells (checked against llama.cpp's own cell table), shares follow the
rule, and a cancelled or finished sequence frees its cells at once."""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.docs_for_tests import prose
from helpers.margins import check
from helpers.together import run_together

from engine.errors import Cancelled, ConfigError, ContextOverflowError, EngineError
from engine.native.context import NativeContext
from engine.native.model import log as llama_log
from engine.policies import Needs, make_policy
from engine.pool import scheduler as scheduler_module
from engine.pool.kvpool import MIN_SHARE, QUESTION_ROOM, SLACK, KVPool
from engine.pool.plan import decodes
from engine.pool.scheduler import Scheduler
from engine.session.config import default_threads
from engine.session.core import Session, SessionConfig
from engine.session.prompts import ask_prompt

Q = "What is the pass key? Give the number."
THREADS = default_threads()  # what this test run may use (conftest pins xdist workers)
PREFIX = "The pass key is"
KEYS = [48213, 90127, 31416]


def _doc(words: int, key: int, seed: int) -> str:
    return f"{prose(words // 2, seed=seed)} The pass key is {key}. Remember it. " + prose(
        words // 2, seed=seed + 1
    )


def _n_tokens(model, doc: str, answer: int) -> int:
    p = ask_prompt(model, doc, Q, PREFIX)
    return len(model.tokenize(p.prefix + p.document + p.suffix)) + answer


@pytest.fixture(scope="module")
def pool(engine):
    with KVPool(engine.model, cells=1536, max_seqs=3, n_threads=THREADS) as p:
        yield p


def _answers_alone(engine, policy: str, docs: list[str]) -> list[str]:
    """Each document's answer from a session of its own (budget 512)."""
    alone = []
    for doc in docs:
        with engine.session(policy, 512) as s:
            alone.append(s.collect(s.ask(doc, Q, answer_prefix=PREFIX, max_tokens=10)).text)
    return alone


def _count_rounds(monkeypatch, calls: list[int] | None = None) -> list[int]:
    """The steps of each of the scheduler's rounds, as they run, and into ``calls``
    the ``llama_decode`` calls each round asks for (``plan.decodes``)."""
    rounds: list[int] = []
    run = Scheduler._run

    def counted(self, steps):
        rounds.append(len(steps))
        if calls is not None:
            waiting = [s.waiting() for s in steps]
            calls.append(len(decodes(waiting, self.answers_apart, self.shared.ctx.n_ubatch)))
        return run(self, steps)

    monkeypatch.setattr(Scheduler, "_run", counted)
    return rounds


@pytest.mark.parametrize("layout", ["shared", "streams"])
def test_needles_found_together_are_the_ones_found_alone(engine, monkeypatch, layout):
    """SnapKV reads attention in every step (which cells each row sees; an eviction's
    window rows too); with one stream per sequence llama.cpp splits a round that
    holds a prompt chunk into ubatches, and the capture follows them: one
    ``llama_decode`` a round in both layouts, but where the shared pool's attention
    is tiled (a CPU, flash attention) it decodes a round's answers apart from a
    prompt chunk beside them (``plan.decodes``): two calls for such a round."""
    calls: list[int] = []
    rounds = _count_rounds(monkeypatch, calls)
    made: list[int] = []  # the pool's llama_decode calls, counted at its context
    decode_batch = NativeContext.decode_batch

    def counted(self, *args, **kwargs):
        made.append(id(self))
        return decode_batch(self, *args, **kwargs)

    monkeypatch.setattr(NativeContext, "decode_batch", counted)
    # the second document is longer than its share: it evicts while the others run
    docs = [_doc(60, KEYS[0], 1), _doc(260, KEYS[1], 3), _doc(30, KEYS[2], 5)]
    alone = _answers_alone(engine, "snapkv", docs)
    together: list[str | None] = [None] * 3
    evicted = [0] * 3
    pool = KVPool(engine.model, cells=1536, max_seqs=3, n_threads=THREADS, layout=layout)

    def job(i: int) -> None:
        s = pool.open(
            make_policy("snapkv"), SessionConfig(512), _n_tokens(engine.model, docs[i], 10)
        )
        with s:
            together[i] = s.collect(s.ask(docs[i], Q, answer_prefix=PREFIX, max_tokens=10)).text
            evicted[i] = s.stats.evicted_tokens
            assert s.stats.cells_peak <= s.ctx.n_ctx  # inside its share

    run_together(job, range(3), pool)
    for key, one, many in zip(KEYS, alone, together, strict=True):
        assert str(key) in one and str(key) in many, (key, one, many)
    assert evicted[1] > 0 and evicted[2] == 0  # the long one evicts, the shortest fits
    # the answers were written in shared steps: fewer decodes than tokens
    snap = pool.snapshot()
    check("tokens per decode step", snap["tokens"] / snap["steps"], ">", 1.5)
    assert snap["active"] == 0 and snap["reserved_cells"] == 0 and snap["peak_seqs"] >= 2
    assert pool.scheduler.answers_apart == (layout == "shared")  # no GPU layers here
    made_by_pool = made.count(id(pool.ctx))
    assert snap["steps"] == sum(calls) == made_by_pool and max(rounds) == 3  # as rounds asked
    assert len(calls) == len(rounds) and set(calls) <= {1, 2}
    if layout == "streams":
        assert sum(calls) == len(rounds)  # one call a round


def test_a_shared_round_of_several_ubatches_finds_what_each_finds_alone(engine, monkeypatch):
    """A round is one ``llama_decode`` of up to ``ROUND_TOKENS``, which llama.cpp
    computes in ubatches of a step's most (here 64): the prompt chunks of three
    sequences whose jobs fit go together, the capture of the cells each row sees
    follows each step across the ubatch boundaries, and each sequence finds its
    needle as it does alone."""
    tokens: list[int] = []  # of each llama_decode
    decode = Scheduler._decode

    def counted(self, steps):
        tokens.append(sum(len(s.tokens) for s in steps))
        return decode(self, steps)

    monkeypatch.setattr(Scheduler, "_decode", counted)
    docs = [_doc(40, KEYS[0], 1), _doc(30, KEYS[1], 3), _doc(30, KEYS[2], 5)]
    alone = _answers_alone(engine, "snapkv", docs)
    together: list[str] = [""] * 3
    pool = KVPool(engine.model, cells=3072, max_seqs=3, n_threads=THREADS, n_batch=64)

    def job(i: int) -> None:
        n = _n_tokens(engine.model, docs[i], 10)
        with pool.open(make_policy("snapkv"), SessionConfig(512), n) as s:
            together[i] = s.collect(s.ask(docs[i], Q, answer_prefix=PREFIX, max_tokens=10)).text

    run_together(job, range(3), pool)
    assert max(tokens) > 64, tokens  # some decode held several ubatches
    for key, one, many in zip(KEYS, alone, together, strict=True):
        assert str(key) in one and str(key) in many, (key, one, many)


def test_streams_decode_a_round_in_one_call_where_nothing_is_captured(engine, monkeypatch):
    """One KV stream per sequence and a policy that reads no attention: each round of
    the scheduler is one ``llama_decode`` (llama.cpp splits it into ubatches), as
    llama-server's are, and each sequence finds its key as it does alone."""
    rounds = _count_rounds(monkeypatch)
    docs = [_doc(60, KEYS[0], 1), _doc(260, KEYS[1], 3), _doc(30, KEYS[2], 5)]
    alone = _answers_alone(engine, "streaming", docs)
    together: list[str] = [""] * 3
    pool = KVPool(
        engine.model, cells=1536, max_seqs=3, n_threads=THREADS, layout="streams", needs=Needs()
    )

    def job(i: int) -> None:
        n = _n_tokens(engine.model, docs[i], 10)
        with pool.open(make_policy("streaming"), SessionConfig(512), n) as s:
            together[i] = s.collect(s.ask(docs[i], Q, answer_prefix=PREFIX, max_tokens=10)).text

    run_together(job, range(3), pool)
    snap = pool.snapshot()
    assert snap["steps"] == len(rounds), (snap["steps"], rounds)  # one call a round
    assert max(rounds) == 3  # the three sequences' steps went together
    for key, one, many in zip(KEYS, alone, together, strict=True):
        assert (str(key) in one) == (str(key) in many), (key, one, many)
    assert str(KEYS[0]) in together[0] and str(KEYS[2]) in together[2]


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _probe_module():
    path = Path(__file__).resolve().parents[2] / "scripts" / "research" / "multiseq_probe.py"
    spec = importlib.util.spec_from_file_location("multiseq_probe_for_pool", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layout", ["shared", "streams"])
def test_each_sequence_cell_map_matches_llama_cpp(engine, monkeypatch, layout):
    """Two evicting sessions read in turns (in the shared pool one's tokens fill the
    other's freed cells); each learnt map must equal llama.cpp's table for its
    sequence (in its own stream with ``streams``)."""
    probe = _probe_module()
    monkeypatch.setenv("LLAMA_KV_CACHE_DEBUG", "3")
    handler, level = _Log(), llama_log.level
    llama_log.setLevel(logging.DEBUG)
    llama_log.addHandler(handler)
    try:
        cells = 768 if layout == "shared" else 1024  # streams: 512 each
        with KVPool(
            engine.model, cells=cells, max_seqs=2, n_threads=THREADS, layout=layout
        ) as small:
            config = SessionConfig(256, chunk_tokens=48, question_aware=False)
            a = small.open(make_policy("snapkv"), config, 10_000)
            b = small.open(make_policy("h2o"), config, 10_000)
            texts = [engine.model.tokenize(prose(90, seed=s), add_bos=True) for s in (7, 8)]
            parts = [[t[k : k + 100] for k in range(0, len(t), 100)] for t in texts]
            for pa, pb in zip(*parts, strict=False):
                list(a.feed(pa, logits=False))
                list(b.feed(pb, logits=False))
            want = {"0": a.cache.cells.snapshot(), "1": b.cache.cells.snapshot()}
            handler.lines.clear()
            list(a.feed(texts[0][:1], logits=False))  # llama.cpp logs the table first
            list(b.feed(texts[1][:1], logits=False))  # (each stream's, with streams)
            assert a.stats.evictions >= 3 and b.stats.evictions >= 3
            a.close()
            b.close()
    finally:
        llama_log.removeHandler(handler)
        llama_log.setLevel(level)
    tables = probe.kv_tables(handler.lines)
    assert len(tables) >= 2, "llama.cpp logged no cell table"
    got: dict[str, dict[int, int]] = {"0": {}, "1": {}}
    if layout == "shared":
        for cell, (seq, pos) in tables[0][1].items():
            got[seq][pos] = cell
    else:
        assert [stream for stream, _ in tables[:2]] == [0, 1]
        for stream, table in tables[:2]:
            for cell, (seq, pos) in table.items():
                assert seq == str(stream)  # a stream holds its own sequence only
                got[seq][pos] = cell
    assert got == want
    cells_a, cells_b = set(want["0"].values()), set(want["1"].values())
    if layout == "shared":
        assert not cells_a & cells_b
        # the two sequences' cells interleave: one took the other's freed cells
        assert min(cells_b) < max(cells_a) and min(cells_a) < max(cells_b)


def test_a_prompt_its_share_holds_is_one_decode_though_the_share_may_shrink(engine, monkeypatch):
    """A job longer than ``MIN_SHARE`` may see its share shrink when others come, so
    ``keeps`` does not vouch for it; where its share holds the prompt now and one
    decode holds it, the prompt is still one decode, not its text and then its
    question a round later, and the answer is the one found alone."""
    steps: list[int] = []
    submit = Scheduler.submit

    def counted(self, seq, cancel, tokens, *args, **kwargs):
        steps.append(len(tokens))
        return submit(self, seq, cancel, tokens, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "submit", counted)
    doc = _doc(44, KEYS[1], 3)
    n = _n_tokens(engine.model, doc, 10)
    assert MIN_SHARE < n <= 512, n  # over the floor, inside the budget and a batch
    alone = _answers_alone(engine, "snapkv", [doc])
    pool = KVPool(engine.model, cells=1536, max_seqs=3, n_threads=THREADS)
    with pool, pool.open(make_policy("snapkv"), SessionConfig(512), n) as s:
        assert not s.reader.sizing.keeps(n)
        text = s.collect(s.ask(doc, Q, answer_prefix=PREFIX, max_tokens=10)).text
        assert s.stats.evicted_tokens == 0
    assert steps[0] >= n - 10 and set(steps[1:]) == {1}, steps  # the prompt, then answer tokens
    assert str(KEYS[1]) in alone[0] and str(KEYS[1]) in text, (alone, text)


def test_shares_by_length_and_even(engine):
    model = engine.model
    stream = make_policy("streaming")
    with KVPool(model, cells=1200, max_seqs=4, n_threads=1, needs=Needs()) as p:
        short = p.open(stream, SessionConfig(512), 100)
        fits = 100 + SLACK  # it never evicts: no room for a question's observation
        assert short.ctx.n_ctx == fits  # a job that fits takes what it needs
        long = p.open(make_policy("streaming"), SessionConfig(512), 5000)
        assert long.ctx.n_ctx == 512 + 128 + QUESTION_ROOM  # a whole session's room
        assert long.budget == 512
        third = p.open(make_policy("streaming"), SessionConfig(512), 5000)
        # max-min fair: the short one keeps what it needs, the two long ones split the rest
        half = (1200 - fits) // 2
        assert short.ctx.n_ctx == fits and long.ctx.n_ctx == third.ctx.n_ctx == half
        assert long.budget == half - 128  # it evicts down to its new share
        assert third.budget + third.config.chunk() == half
        assert half >= MIN_SHARE
        with pytest.raises(ContextOverflowError):
            p.open(make_policy("full"), SessionConfig(2048), 2000)  # can never fit
        third.close()
        assert long.ctx.n_ctx == 704  # it grows back when the other leaves
        short.close()
        long.close()
        assert p.snapshot()["reserved_cells"] == 0
    with KVPool(model, cells=1024, max_seqs=4, n_threads=1, share="even") as p:
        a = p.open(stream, SessionConfig(512), 100)
        assert a.ctx.n_ctx == 1024  # alone: the whole pool
        b = p.open(make_policy("streaming"), SessionConfig(512), 5000)
        assert a.ctx.n_ctx == b.ctx.n_ctx == 512  # even, whatever each needs
        a.close()
        b.close()


def test_a_sequence_waits_for_cells_and_a_cancel_frees_them(engine):
    model = engine.model
    with KVPool(model, cells=600, max_seqs=2, n_threads=1, needs=Needs()) as p:
        first = p.open(make_policy("streaming"), SessionConfig(512), 5000)
        assert first.ctx.n_ctx == 600
        got: list[Session] = []
        gave_up = threading.Event()

        def second() -> None:
            got.append(p.open(make_policy("streaming"), SessionConfig(512), 5000))

        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.3)
        assert not got  # two shares of 300 would be under MIN_SHARE: it waits in line
        first.close()
        waiter.join(5)
        assert got and got[0].ctx.n_ctx == 600
        # a cancel while waiting in line raises at once
        cancel = threading.Event()

        def third() -> None:
            try:
                p.open(make_policy("streaming"), SessionConfig(512), 5000, cancel=cancel)
            except Cancelled:
                gave_up.set()

        t = threading.Thread(target=third)
        t.start()
        cancel.set()
        t.join(5)
        assert gave_up.is_set()
        # a running sequence stopped by its cancel frees its cells for the next one
        s = got[0]
        long_text = model.tokenize(prose(200, seed=2), add_bos=True)
        events = s.run_tokens(long_text, [1, 2], max_tokens=4)
        next(events)
        s.cancel()
        with pytest.raises(Cancelled):
            for _ in events:
                pass
        s.close()
        assert p.snapshot()["active"] == 0
        again = p.open(make_policy("streaming"), SessionConfig(512), 50)
        hello = model.tokenize("Hello", add_bos=True)
        result = again.collect(again.run_tokens(hello, [3], max_tokens=4))
        assert result.stats.generated_tokens > 0
        again.close()


def test_prompts_of_requests_on_their_way_are_read_in_one_decode(engine, monkeypatch):
    """Issue 37: two requests a server holds (``expect``) have their prompts read in
    one decode, however late the second asks for its sequence; there is no key for a
    request no sequence is free for, and one that will not come holds nothing."""
    monkeypatch.setattr(scheduler_module, "OWED_LIMIT_S", 60.0)  # a hold would show
    model = engine.model
    with KVPool(model, cells=1536, max_seqs=2, n_threads=THREADS, needs=Needs()) as p:
        batches: list[list[int]] = []
        decode = p.ctx.decode_batch

        def recorded(entries, *args, **kwargs):
            batches.append(sorted({seq for seq, *_ in entries}))
            return decode(entries, *args, **kwargs)

        monkeypatch.setattr(p.ctx, "decode_batch", recorded)
        keys = [p.expect(), p.expect()]
        assert None not in keys and p.expect() is None  # two sequences, two on the way
        texts = [model.tokenize(prose(60, seed=seed), add_bos=True) for seed in (5, 6)]

        def read(i: int, key: object) -> None:
            with p.open(make_policy("streaming"), SessionConfig(512), 200, arrival=key) as s:
                s.collect(s.run_tokens(texts[i], [3], max_tokens=2))

        first = threading.Thread(target=read, args=(0, keys[0]))
        first.start()
        time.sleep(0.3)
        assert batches == []  # the first prompt waits for the second request
        second = threading.Thread(target=read, args=(1, keys[1]))
        second.start()
        first.join(30)
        second.join(30)
        assert batches[0] == [0, 1], batches
        gone = p.expect()
        p.unexpect(gone)  # its client left before its prompt was parsed
        p.unexpect(gone)
        start = time.monotonic()
        read(0, p.expect())
        read(1, None)  # the other key was handed over: nothing waits for it
        assert time.monotonic() - start < 20  # nothing waited for a key


def test_a_request_on_its_way_that_waits_for_room_holds_no_round(engine, monkeypatch):
    """A request expected by the pool but whose share does not fit yet waits for the
    running sequences to finish, which takes rounds: it must not hold them."""
    monkeypatch.setattr(scheduler_module, "OWED_LIMIT_S", 60.0)  # a hold would show
    model = engine.model
    with KVPool(model, cells=600, max_seqs=2, n_threads=THREADS, needs=Needs()) as p:
        first = p.open(make_policy("streaming"), SessionConfig(512), 5000)
        key = p.expect()
        got: list[Session] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                p.open(make_policy("streaming"), SessionConfig(512), 5000, arrival=key)
            )
        )
        waiter.start()
        start = time.monotonic()
        hello = model.tokenize("Hello", add_bos=True)
        first.collect(first.run_tokens(hello, [3], max_tokens=4))
        assert time.monotonic() - start < 20
        assert not got  # still waiting for room
        first.close()
        waiter.join(10)
        assert got
        got[0].close()


def test_a_bad_sequence_id_is_an_error_not_an_abort(engine, pool):
    with pytest.raises(EngineError, match="outside"):
        pool.ctx.seq_rm(0, -1, seq=pool.max_seqs)
    with pytest.raises(EngineError, match="outside"):
        pool.ctx.decode([1], 0, logits=False, seq=-1)


def test_summarize_parallel_writes_every_file_and_skips_a_bad_one(engine, tmp_path):
    from engine.runtime.batch import Source, default_parallel, summarize_many
    from engine.runtime.spec import RequestSpec

    docs = []
    for i, words in enumerate((30, 120, 60)):
        path = tmp_path / f"d{i}.txt"
        path.write_text(prose(words, seed=40 + i))
        docs.append(Source(path, Path(path.name)))
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.4 not really")
    docs.insert(1, Source(bad, Path(bad.name)))
    spec = RequestSpec(budget_tokens=512, max_tokens=8)
    assert default_parallel(engine, spec, 8) == 1  # a CPU: one by one (see batch.py)
    pools: list[KVPool] = []
    results = summarize_many(engine, docs, tmp_path / "out", spec, parallel=3, pools=pools)
    assert [r.path.name for r in results] == ["d0.txt", "bad.pdf", "d1.txt", "d2.txt"]
    assert results[1].error and results[1].out is None
    for r in (results[0], results[2], results[3]):
        assert r.error is None and r.out.read_text().startswith(f"# {r.path.name}")
        assert r.stats.generated_tokens > 0
    snap = pools[0].snapshot()
    assert snap["peak_seqs"] >= 2 and snap["cells"] == 768  # one session's cells, shared


def test_default_parallel_with_gpu_layers_follows_free_memory(engine):
    from types import SimpleNamespace

    from engine.native.model import Model
    from engine.runtime.batch import default_parallel
    from engine.runtime.spec import RequestSpec

    def engine_with(gpu_offload: bool) -> SimpleNamespace:
        model = object.__new__(Model)  # the real Model.on_gpu, no file loaded
        model.n_gpu_layers, model.gpu_offload, model.info = -1, gpu_offload, engine.model.info
        return SimpleNamespace(model=model)

    gpu = engine_with(gpu_offload=True)
    assert default_parallel(gpu, RequestSpec(), 8) == 4
    assert default_parallel(gpu, RequestSpec(), 2) == 2
    asked_no_gpu = engine_with(gpu_offload=False)
    assert default_parallel(asked_no_gpu, RequestSpec(), 8) == 1  # a CPU-only build


def test_sequences_that_never_evict_wait_instead_of_overfilling_the_pool(engine):
    with KVPool(engine.model, cells=1000, max_seqs=3, n_threads=1, needs=Needs()) as p:
        first = p.open(make_policy("full"), SessionConfig(2048), 584)  # 600 cells
        got: list[Session] = []
        t = threading.Thread(
            target=lambda: got.append(p.open(make_policy("full"), SessionConfig(2048), 584))
        )
        t.start()
        time.sleep(0.3)
        assert not got  # 1,200 cells promised to two that never evict: it waits
        first.close()
        t.join(5)
        assert got and got[0].ctx.n_ctx == 600
        got[0].close()


def test_a_batch_that_finds_no_free_cells_is_retried_not_failed(engine):
    from engine.errors import CacheFullError

    with KVPool(engine.model, cells=1024, max_seqs=2, n_threads=1, needs=Needs()) as p:
        real, fails = p.ctx.decode_batch, [3]

        def flaky(*args, **kwargs):
            if fails[0]:
                fails[0] -= 1
                raise CacheFullError("no free KV cell for the batch (the cache is full)")
            return real(*args, **kwargs)

        p.ctx.decode_batch = flaky
        s = p.open(make_policy("streaming"), SessionConfig(512), 40)
        hello = engine.model.tokenize("Hello there", add_bos=True)
        result = s.collect(s.run_tokens(hello[:-1], hello[-1:], max_tokens=3))
        assert result.stats.generated_tokens == 3 and fails[0] == 0
        s.close()


def test_a_scheduler_that_fails_answers_every_caller(engine):
    with KVPool(engine.model, cells=1024, max_seqs=2, n_threads=1, needs=Needs()) as p:
        s = p.open(make_policy("streaming"), SessionConfig(512), 40)

        def broken() -> list:
            raise RuntimeError("scheduler bug")

        p.scheduler._choose = broken  # type: ignore[method-assign]
        hello = engine.model.tokenize("Hello", add_bos=True)
        with pytest.raises(EngineError, match="scheduler stopped"):
            s.collect(s.run_tokens(hello, [1], max_tokens=2))
        with pytest.raises(Cancelled):  # the pool refuses new work instead of hanging
            p.open(make_policy("streaming"), SessionConfig(512), 40)
        s.close()


def test_a_scheduler_that_fails_mid_batch_answers_the_batch(engine):
    """A fault after a batch was taken from the queue (its steps are no longer
    waiting) still answers that batch's callers instead of leaving them waiting."""
    with KVPool(engine.model, cells=1024, max_seqs=2, n_threads=1, needs=Needs()) as p:
        s = p.open(make_policy("streaming"), SessionConfig(512), 40)

        def broken(steps: list) -> None:
            raise RuntimeError("scheduler bug")

        p.scheduler._decode = broken  # type: ignore[method-assign]
        hello = engine.model.tokenize("Hello", add_bos=True)
        raised: list[BaseException] = []

        def ask() -> None:
            try:
                s.collect(s.run_tokens(hello, [1], max_tokens=2))
            except BaseException as exc:
                raised.append(exc)

        caller = threading.Thread(target=ask, daemon=True)
        caller.start()
        caller.join(60)
        assert not caller.is_alive(), "the caller was left waiting"
        assert len(raised) == 1 and "scheduler stopped" in str(raised[0]), raised
        s.close()


def test_closing_the_pool_first_leaves_open_sessions_safe(engine):
    p = KVPool(engine.model, cells=1024, max_seqs=2, n_threads=1, needs=Needs())
    s = p.open(make_policy("streaming"), SessionConfig(512), 40)
    hello = engine.model.tokenize("Hello", add_bos=True)
    s.collect(s.run_tokens(hello, [1], max_tokens=2))
    p.close()  # Ctrl+C in summarize --parallel: the pool goes while a session is open
    with pytest.raises(Cancelled):
        s.collect(s.run_tokens(hello, [1], max_tokens=2))
    s.close()  # returns its id only: no llama.cpp call on the freed context


def test_summarize_parallel_keeps_the_policy_settings(tmp_path):
    """A pooled summary opens its sequence with the request's policy settings (issue
    21: ``batch._summarize`` once built the policy from its name alone)."""
    from types import SimpleNamespace

    from engine.runtime import batch
    from engine.runtime.spec import RequestSpec

    class _Stop(Exception):
        pass

    opened = []

    class _Pool:
        def open(self, policy, config, n_tokens, *, cancel=None, label="", arrival=None):
            opened.append(policy)
            raise _Stop

    model = SimpleNamespace(tokenize=lambda text: text.split())
    engine = SimpleNamespace(model=model, config=lambda budget, **options: (budget, options))
    doc = tmp_path / "a.txt"
    doc.write_text("one two three four")
    spec = RequestSpec(policy="h2o", policy_settings=(("recent_ratio", 0.25),))
    with pytest.raises(_Stop):
        batch._summarize(engine, doc, spec, None, pool=_Pool())  # type: ignore[arg-type]
    assert opened[0].name == "h2o" and opened[0].recent_ratio == 0.25


def test_cache_settings_are_decided_once():
    from engine.native.kvmemory import KV_TYPES, CacheSettings

    q8, f16 = KV_TYPES["q8_0"], KV_TYPES["f16"]
    plain = CacheSettings.decide(reads_attention=False, kv_type="q8_0")
    assert (plain.flash_attn, plain.type_k, plain.type_v) == (True, q8, q8)
    reads = CacheSettings.decide(reads_attention=True, kv_type="q8_0")
    assert (reads.flash_attn, reads.type_k, reads.type_v) == (False, q8, f16)
    assert CacheSettings.decide(reads_attention=False, window_layers_unknown=True).swa_full
    with pytest.raises(ConfigError, match="q8_0 K cache needs flash attention off"):
        CacheSettings.decide(reads_attention=True, kv_type="q8_0", flash_attn="on")
    # over an f16 cache attention is read with flash attention on or off (capture.py)
    assert CacheSettings.decide(reads_attention=True).flash_attn is None
    assert CacheSettings.decide(reads_attention=True, flash_attn="on").flash_attn is True
    # a pool that reads attention runs sessions that do not, unless their cache differs
    pool = CacheSettings.decide(reads_attention=True)
    assert pool.refusal(CacheSettings.decide(reads_attention=False)) is None
    assert "V q8_0" in pool.refusal(plain).split(";")[0]
    assert "whole" in pool.refusal(CacheSettings.decide(reads_attention=False, swa_cache="full"))
    assert "attention read" in CacheSettings.decide(reads_attention=False).refusal(pool)


def test_a_pooled_request_gets_the_cache_a_lone_session_gets(engine):
    """Issue 21: for a policy that reads no attention with q8_0 and flash attention
    auto, a lone session quantized V (flash attention on) while the pool kept V at
    f16; and a pool silently ran a request whose cache it could not hold."""
    from engine.runtime.batch import make_pool
    from engine.runtime.spec import RequestSpec

    spec = RequestSpec(policy="streaming", budget_tokens=512, kv_type="q8_0")
    with spec.open(engine) as alone:
        assert alone.stats.kv_type == "q8_0"
        with make_pool(engine, spec, 2) as pool, spec.open_in(engine, pool, 600) as pooled:
            assert pooled.stats.kv_type == alone.stats.kv_type == "q8_0"  # V quantized too
            assert pool.cache.type_v == pool.cache.type_k
            assert pooled.reader.kv_layout == alone.reader.kv_layout
    reading = RequestSpec(policy="snapkv", budget_tokens=512, kv_type="q8_0")
    with make_pool(engine, reading, 2) as pool:
        with pytest.raises(
            ConfigError, match="cannot run in the shared KV pool: it needs K q8_0, V q8_0"
        ):
            spec.open_in(engine, pool, 600)
        with reading.open_in(engine, pool, 600) as s:
            assert s.stats.kv_type == "q8_0/f16"
