"""What one generated token costs in Python beside ``llama_decode`` (issue 37): the
sampler over the default model's real logits under several settings, then a session
answering with the time of each step of the generation loop (timers wrapped around
the functions, so the figures include the timers' own small cost).

    .venv/bin/python scripts/research/token_costs.py --policy full --tokens 200

Run it alone on the machine (llama.cpp's threads spin while they wait).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from engine import Engine
from engine.native import context as native_context
from engine.native.embedded import default_model_path
from engine.native.model import Model
from engine.session import generate, reader, sampling
from engine.session.prompts import Prompt
from engine.session.sampling import CHAT, WHOLE, Sampler, Sampling

DOC = Path(__file__).resolve().parents[2] / "docs" / "design.md"
SETTINGS = {
    "greedy": Sampling(),
    "T 1, top-p 0.95 alone": Sampling(1.0, **{**WHOLE, "top_p": 0.95}),
    "T 1, llama-server's cuts": Sampling(1.0),
    "CHAT (T 0.8)": CHAT,
}


def sampler_costs(rows: int) -> None:
    """ms a token of each setting over the logits of ``rows`` tokens of a document."""
    llm = llama_cpp.Llama(
        str(default_model_path()), n_ctx=1024, n_threads=2, logits_all=True, verbose=False
    )
    tokens = llm.tokenize(DOC.read_text().encode())[:rows]
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    print(f"sampler, {logits.shape[1]:,} logits a token, {len(tokens)} tokens of {DOC.name}:")
    for name, setting in SETTINGS.items():
        draw = Sampler(setting)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for row in logits:
                draw(row)
            best = min(best, (time.perf_counter() - start) / len(logits))
        print(f"  {name:28s} {best * 1e3:.3f} ms")
    llm.close()


def _timed(owner: Any, name: str, label: str, spent: collections.Counter) -> None:
    f: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def loop_costs(policy: str, tokens: int, seed: int) -> None:
    """ms a token of each step of a session's generation loop, ``CHAT`` sampling."""
    spent: collections.Counter = collections.Counter()
    _timed(native_context.llama_cpp, "llama_decode", "llama_decode", spent)
    _timed(native_context.NativeContext, "decode_batch", "decode_batch", spent)
    _timed(native_context.NativeContext, "last_logits", "logits copy", spent)
    _timed(reader.Reader, "decode", "Reader.decode", spent)
    _timed(sampling.Sampler, "__call__", "sampler", spent)
    _timed(sampling.LoopGuard, "__call__", "loop guard", spent)
    _timed(sampling.StopMatcher, "feed", "stop strings", spent)
    _timed(generate, "_ends_before", "end checks", spent)
    _timed(Model, "piece", "token text", spent)
    engine, chat = Engine(), dataclasses.replace(CHAT, seed=seed)
    prompt = Prompt("", DOC.read_text()[:600], "\n\nOnce upon a time", (), True)
    for _ in range(2):  # the first warms up
        with engine.session(policy, 1024) as s:
            events = s.run(prompt, max_tokens=tokens, sampling=chat, stops=())
            next(events)
            spent.clear()
            start = time.perf_counter()
            n = sum(1 for _ in events)
            wall = time.perf_counter() - start
    engine.close()
    steps = max(n - 1, 1)
    print(f"generation loop, policy {policy}, {steps} tokens, per token:")
    print(f"  {'wall':28s} {wall / steps * 1e3:.3f} ms")
    print(f"  {'outside llama_decode':28s} {(wall - spent['llama_decode']) / steps * 1e3:.3f} ms")
    nested = {"Reader.decode": ("decode_batch", "logits copy"), "decode_batch": ("llama_decode",)}
    for label, seconds in spent.most_common():
        own = seconds - sum(spent[inner] for inner in nested.get(label, ()))
        if label != "llama_decode":
            print(f"  {label:28s} {own / steps * 1e3:.3f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="full")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=1, help="of the answer's sampling")
    p.add_argument("--rows", type=int, default=300, help="tokens whose logits the sampler draws")
    args = p.parse_args()
    sampler_costs(args.rows)
    loop_costs(args.policy, args.tokens, args.seed)


if __name__ == "__main__":
    main()
