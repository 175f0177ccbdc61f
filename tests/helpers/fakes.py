"""Fake engines for the app's worker and the conversation rule: no model, no threads
of their own. ``FakeEngine`` answers "forty-two" after a few progress events."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from app.worker import Job
from engine import Cancelled, Done, KVStats, Progress, Token
from engine.runtime.spec import RequestSpec


def fake_stats() -> KVStats:
    return KVStats(policy="fake", budget_tokens=64, n_ctx=128, kv_bytes_per_cell=1)


class FakeSession:
    """Records what it was asked; answers "forty-two" after ``steps`` progress events."""

    def __init__(self, steps: int, delay: float) -> None:
        self.steps, self.delay = steps, delay
        self.stop = threading.Event()
        self.calls: list[tuple[str, str]] = []  # (method, text read)
        self.gen: list[dict] = []  # the options of each call
        self.prompts: list = []  # the prompts of each run
        self.closed = False
        self.read = False  # a first read finished: follow-ups continue it

    @property
    def can_follow_up(self) -> bool:
        return self.read

    def cancel(self) -> None:
        self.stop.set()

    def close(self) -> None:
        self.closed = True

    def _answer(self):
        for i in range(self.steps):
            if self.stop.is_set():
                raise Cancelled("cancelled")
            time.sleep(self.delay)
            yield Progress(i + 1, self.steps, fake_stats())
        yield Token(1, "forty-two", fake_stats())
        self.read = True
        yield Done("forty-two", "stop", fake_stats())

    def ask(self, document, question, **gen):
        self.stop.clear()  # as Session.run: a cancel is cleared as the run starts
        self.calls.append(("ask", document + "|" + question))
        self.gen.append(gen)
        return self._answer()

    def summarize(self, document, **gen):
        self.stop.clear()
        self.calls.append(("summarize", document))
        self.gen.append(gen)
        return self._answer()

    # what a summary part by part uses (engine/runtime/summary.py)
    model = SimpleNamespace(
        tokenize=str.split, info=SimpleNamespace(chat_template=None), add_bos=True
    )
    capacity = 1280  # cells: a short document is one part

    def run(self, prompt, **gen):
        self.calls.append(("run", prompt.document))
        self.prompts.append(prompt)
        self.gen.append(gen)
        return self._answer()

    def follow_up(self, question, **gen):
        self.stop.clear()
        self.calls.append(("follow_up", question))
        self.gen.append(gen)
        return self._answer()


class FakeEngine:
    model_name = "Fake 1B"

    def __init__(self, steps: int = 3, delay: float = 0.0) -> None:
        self.steps, self.delay, self.closed = steps, delay, False

        self.sessions: list[FakeSession] = []
        self.kwargs: list[dict] = []  # the keyword arguments of each session() call

    def session(self, policy, budget, **settings):
        self.kwargs.append(settings)
        self.sessions.append(FakeSession(self.steps, self.delay))
        return self.sessions[-1]

    def close(self) -> None:
        self.closed = True


class RecordingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__(steps=4)
        self.policies: list[str] = []

    def session(self, policy, budget, **settings):
        self.policies.append(policy)
        return super().session(policy, budget)


JOB = Job(
    "ask",
    "a document",
    "a question?",
    RequestSpec(policy="snapkv", budget_tokens=256, max_tokens=8),
)
