"""The second model family, first class (issue 34): SmolLM2-135M-Instruct, a
Llama-architecture instruction model (grouped-query attention, every layer global,
8K trained context, a ChatML template), through the core paths: a read with
eviction under each policy, follow-ups with recall, a saved cache round trip, the
pool and the server. Short documents: the model reads about 200 tokens/s here."""

from __future__ import annotations

import httpx
import pytest
from helpers.docs_for_tests import passkey_document
from helpers.together import run_together

from engine import Engine, Session
from engine.native.embedded import EMBEDDED, resolve
from engine.policies import make_policy
from engine.pool.kvpool import KVPool
from engine.serve.api import create_app
from engine.serve.background import BackgroundServer
from engine.serve.config import ServerConfig
from engine.session.config import SessionConfig, default_threads
from engine.session.prompts import ask_prompt
from engine.session.state import SavedState

pytestmark = pytest.mark.slow

NAME = "smollm2-135m"
KEY = 58316
DOC = passkey_document(60, 0.4, KEY)  # llama.cpp's passkey haystack, 1,466 tokens
QUESTION = "What is the pass key? Give the number."
FOLLOW_UP = "What is the pass key again?"


@pytest.fixture(scope="module")
def smol():
    eng = Engine(NAME)
    yield eng
    eng.close()


def test_it_is_found_by_its_short_name_and_is_the_other_family(smol):
    info = smol.model.info
    assert resolve(NAME).name == resolve(" SmolLM2-135M ").name == EMBEDDED[NAME].file_name
    assert info.arch == "llama" and info.n_ctx_train == 8192 and info.n_swa == 0
    assert info.n_head_kv < info.n_head  # grouped-query attention
    assert tuple(info.global_layers) == tuple(range(info.n_layer))  # every layer is global
    assert info.chat_template and "<|im_start|>" in info.chat_template


def _ask(s: Session, doc: str = DOC, question: str = QUESTION) -> str:
    return s.collect(s.ask(doc, question, max_tokens=12)).text


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "tova"])
def test_each_attention_policy_evicts_and_keeps_the_key(smol, policy):
    with smol.session(policy, 256) as s:
        answer = _ask(s)
        assert s.stats.evicted_tokens > 0 and s.stats.cells_peak <= s.n_ctx_max
    assert str(KEY) in answer, answer


def test_streaming_evicts_by_recency_and_the_full_cache_reads_everything(smol):
    with smol.session("streaming", 256) as s:
        _ask(s)
        assert s.stats.evicted_tokens > 0
    with smol.session("full", 2048) as s:
        assert str(KEY) in _ask(s) and s.stats.evicted_tokens == 0


def test_a_follow_up_brings_back_what_the_first_read_evicted(smol):
    keeper = "The lighthouse keeper is called Ingrid Halvorsen."
    doc = DOC.replace(". ", f". {keeper} ", 1)  # near the start, far from the key
    with smol.session("snapkv", 256) as s:
        assert str(KEY) in _ask(s, doc)
        out = s.collect(s.follow_up("What is the lighthouse keeper called?", max_tokens=16))
        assert s.stats.recalled_tokens > 0
    assert "Halvorsen" in out.text, out.text


def test_a_saved_cache_continues_token_for_token(smol, tmp_path):
    def answer(s: Session) -> list[int]:
        return [e.token for e in s.follow_up(FOLLOW_UP, max_tokens=12) if hasattr(e, "token")]

    with smol.session("snapkv", 256) as live:
        _ask(live)
        saved = live.snapshot()
        saved.write(tmp_path / "s.kvstate")
        live.restore(saved)
        want = answer(live)
    with smol.session("snapkv", 256) as back:
        back.restore(SavedState.read(tmp_path / "s.kvstate"))
        assert answer(back) == want and want


def test_two_sequences_of_one_pool_each_find_their_own_key(smol):
    docs = [DOC, DOC.replace(str(KEY), "90127")]
    got: list[str] = ["", ""]
    pool = KVPool(smol.model, cells=1024, max_seqs=2, n_threads=default_threads())

    def job(i: int) -> None:
        prompt = ask_prompt(smol.model, docs[i], QUESTION)
        n = len(smol.model.tokenize(prompt.prefix + prompt.document + prompt.suffix)) + 12
        with pool.open(make_policy("snapkv"), SessionConfig(256), n) as s:
            got[i] = _ask(s, docs[i])

    run_together(job, range(2), pool)
    assert str(KEY) in got[0] and "90127" in got[1], got


def test_the_server_answers_with_its_chat_template(smol):
    config = ServerConfig(policy="snapkv", budget_tokens=256, kv_cells=1024, parallel=1)
    with BackgroundServer(create_app(smol, config)) as url:
        body = {
            "model": NAME,
            "messages": [  # the document in the system message, the question after it
                {"role": "system", "content": f"Answer from this document.\n\n{DOC}"},
                {"role": "user", "content": QUESTION},
            ],
            "max_tokens": 12,
            "temperature": 0,
        }
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
    assert "choices" in reply, reply
    assert str(KEY) in reply["choices"][0]["message"]["content"], reply
    assert reply["usage"]["prompt_tokens"] > 256  # read through a bounded cache
