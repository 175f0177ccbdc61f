"""Issue 36, item 8: the next round of attacks on what is new since round three. Two
processes racing on one saved read; kvtrim chat after its file changed; the server's
reuse of a read with concurrent clients and prompts that share a prefix but differ
after it; ``usage`` under every path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from helpers.docs_for_tests import passkey_document, prose

from engine.serve.api import create_app
from engine.serve.background import BackgroundServer
from engine.serve.config import ServerConfig

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the pass key? Give the number."


def _kvtrim(*args: str, states: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVTRIM_STATES": str(states)}
    cmd = [sys.executable, "-m", "app.main", *args]
    return subprocess.run(
        cmd, env=env, input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=600
    )


def test_two_processes_racing_on_one_saved_read_both_answer_and_leave_one_file(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(passkey_document(60, 0.4, 68142))
    states = tmp_path / "states"
    ask = ("ask", str(doc), "--question", QUESTION, "--answer-prefix", "The pass key is",
           "--budget", "256")  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "app.main", *ask, "--threads", "1"],  # a core each
            env={**os.environ, "KVTRIM_STATES": str(states)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "68142" in out, err[-2000:]
    assert len(list(states.glob("*.kvstate"))) == 1  # one write won, whole
    assert not list(states.glob("*.partial"))
    third = _kvtrim(*ask, states=states)
    assert "from the saved read of this document" in third.stderr and "68142" in third.stdout


def test_kvtrim_chat_does_not_resume_a_conversation_about_text_that_changed(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text(prose(40, seed=1) + " The locker code is 4417. " + prose(40, seed=2))
    states = tmp_path / "states"
    script = tmp_path / "q.jsonl"
    script.write_text(json.dumps({"question": "What is the locker code?",
                                  "answer_prefix": "The locker code is"}) + "\n")  # fmt: skip
    first = _kvtrim("chat", str(doc), "--script", str(script), states=states)
    assert first.returncode == 0 and json.loads(first.stdout)["resumed"] is False
    again = _kvtrim("chat", str(doc), "--script", str(script), states=states)
    assert json.loads(again.stdout)["resumed"] is True
    doc.write_text(doc.read_text().replace("4417", "9052"))  # the file's text changed
    changed = _kvtrim("chat", str(doc), "--script", str(script), states=states)
    turn = json.loads(changed.stdout)
    assert turn["resumed"] is False and "9052" in turn["answer"], turn


@pytest.fixture(scope="module")
def parallel_server(engine):
    config = ServerConfig(policy="snapkv", budget_tokens=256, parallel=2, kv_cells=1024)
    with BackgroundServer(create_app(engine, config)) as url:
        yield url


def _chat(url: str, doc: str, question: str, **extra) -> dict:
    body = {
        "messages": [
            {"role": "system", "content": f"Answer from this document.\n\n{doc}"},
            {"role": "user", "content": question},
        ],
        "max_tokens": 12,
        "temperature": 0,
        **extra,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()


def test_concurrent_clients_and_prompts_that_differ_after_a_shared_prefix(parallel_server):
    """The same document twice at once, then one that differs only in its last
    sentence: the first two answer right, the third never takes their read."""
    doc = prose(60, seed=31) + " The ferry leaves from pier 14. " + prose(30, seed=32)
    other = doc.replace("pier 14", "pier 27")
    q = "From which pier does the ferry leave? Answer with the number."
    replies: list[dict] = [{}, {}]

    def ask(i: int) -> None:
        replies[i] = _chat(parallel_server, doc, q)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in replies:
        assert "choices" in r and "14" in r["choices"][0]["message"]["content"], r
    third = _chat(parallel_server, other, q)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, third["usage"]
    assert "27" in third["choices"][0]["message"]["content"], third


def _checked(usage: dict) -> dict:
    """OpenAI's convention on every path: the prompt counts every token, the cached
    among them, and the total is prompt plus completion."""
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert 0 <= cached <= usage["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def test_usage_means_the_same_on_every_path(parallel_server):
    doc = prose(80, seed=41) + " The locker code is 4417. " + prose(40, seed=42)
    first = _checked(_chat(parallel_server, doc, "Who repaired the bicycle?")["usage"])
    again = _checked(_chat(parallel_server, doc, "What is the locker code?")["usage"])
    assert again["prompt_tokens_details"]["cached_tokens"] > 1000  # the read reused
    assert abs(again["prompt_tokens"] - first["prompt_tokens"]) < 200  # the whole prompt
    warm = _checked(_chat(parallel_server, doc + " Extra.", "Hi?", max_tokens=0)["usage"])
    assert warm["completion_tokens"] == 0 and warm["prompt_tokens"] > 1000
    body = {"prompt": doc + "\nThe locker code is", "max_tokens": 6, "temperature": 0}
    plain = httpx.post(f"{parallel_server}/v1/completions", json=body, timeout=300).json()
    _checked(plain["usage"])
    with httpx.stream(
        "POST", f"{parallel_server}/v1/completions", json={**body, "stream": True}, timeout=300
    ) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines()
                  if line.startswith("data:") and "[DONE]" not in line]  # fmt: skip
    streamed = _checked(events[-1]["usage"])
    assert streamed["prompt_tokens"] == plain["usage"]["prompt_tokens"]
