"""History (SQLite) and settings (atomic JSON) of the desktop app, without Qt."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

from app.settings import Settings, load, save
from app.store import Store


def test_conversations_messages_documents_roundtrip(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    a = store.new_conversation("Notes")
    b = store.new_conversation()
    store.add_message(a.id, "user", "What is the pass key?")
    reply = store.add_message(a.id, "assistant", "The pass")
    store.update_message(reply.id, "The pass key is 4242.")
    store.add_document(a.id, tmp_path / "notes.pdf", tokens=9000)
    assert [c.id for c in store.conversations()] == [a.id, b.id]  # newest activity first
    assert [m.content for m in store.messages(a.id)] == [
        "What is the pass key?",
        "The pass key is 4242.",
    ]
    store.rename(a.id, "Pass key")
    md = store.export_markdown(a.id)
    assert md.startswith("# Pass key") and "Documents: notes.pdf" in md
    assert "**You:**" in md and "The pass key is 4242." in md
    store.delete(a.id)
    assert store.messages(a.id) == [] and store.documents(a.id) == []
    store.close()
    reopened = Store(tmp_path / "h.sqlite3")
    assert [c.id for c in reopened.conversations()] == [b.id]


def test_database_uses_wal(tmp_path):
    Store(tmp_path / "h.sqlite3").close()
    db = sqlite3.connect(tmp_path / "h.sqlite3")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_sigkill_while_writing_loses_no_sent_message(tmp_path):
    """A writer process reports each message after add_message returns; we kill it
    mid-stream; every reported message must be in the database, which must open."""
    path = tmp_path / "h.sqlite3"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(os.getcwd())!r})
        from app.store import Store
        s = Store({str(path)!r})
        c = s.new_conversation("crash")
        for i in range(100000):
            s.add_message(c.id, "user", "message %d " % i + "x" * 500)
            print(i, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    shown = -1
    deadline = time.time() + 30
    while shown < 200 and time.time() < deadline:
        shown = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = Store(path)
    conv = store.conversations()[0]
    contents = [m.content for m in store.messages(conv.id)]
    assert len(contents) >= shown + 1
    assert contents[shown].startswith(f"message {shown} ")


def test_settings_roundtrip_and_atomic_write(tmp_path):
    path = tmp_path / "cfg" / "settings.json"
    assert load(path) == Settings()
    s = Settings(
        policy="h2o", budget_tokens=2048, kv_type="q8_0", theme="dark", system_prompt="Be brief."
    )
    save(s, path)
    assert load(path) == s
    assert json.loads(path.read_text())["schema"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temp left


def test_bad_settings_files_fall_back_to_defaults(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{ truncated")
    assert load(path) == Settings()
    path.write_text(
        json.dumps({"schema": 1, "policy": "lru", "budget_tokens": "many", "theme": "dark"})
    )
    s = load(path)
    assert s.policy == "snapkv" and s.budget_tokens == 1024 and s.theme == "dark"
    path.write_text(json.dumps({"schema": 99, "policy": "h2o"}))
    assert load(path) == Settings()


def test_kv_type_setting_validated_and_old_files_load(tmp_path):
    path = tmp_path / "settings.json"
    for name in ("f16", "q8_0", "q4_0"):
        save(Settings(kv_type=name), path)
        assert load(path).kv_type == name
    for bad in ("q2_k", 8, None):
        path.write_text(json.dumps({"schema": 1, "kv_type": bad, "policy": "h2o"}))
        s = load(path)
        assert s.kv_type == "f16" and s.policy == "h2o"
    assert Settings(kv_type="bf16").validated().kv_type == "f16"
    # a file written before the setting existed: same schema, no key, the default
    path.write_text(json.dumps({"schema": 1, "policy": "tova", "budget_tokens": 512}))
    s = load(path)
    assert (s.kv_type, s.policy, s.budget_tokens) == ("f16", "tova", 512)


def test_hostile_policy_parameters_in_settings_fall_back_to_the_papers():
    """Issue 36, round four: a settings file with parameters a policy does not take,
    out of range, of the wrong type, or together impossible (an even SnapKV kernel)."""
    from app.settings import Settings

    s = Settings(policy_params={"snapkv": {"kernel": 4, "window": "x"},
                                "h2o": {"recent_ratio": 5, "bogus": 1},
                                "tova": {"recent": 3}, "nope": {"a": 1}}).validated()  # fmt: skip
    assert s.policy_params == {"snapkv": {}, "h2o": {}, "tova": {"recent": 3}}
