"""The pool's scheduling step as a function (issue 37): which waiting steps go into
the next ``llama_decode``, and which wait. No clock, no thread, no llama.cpp: the
scheduler thread (scheduler.py) only moves data in and out of it, and the tests
check its rules without a model (tests/pool/test_plan.py).

The rules, after llama-server's one batch per step of every running slot's token
plus prompt chunks up to ``n_batch``:

- the tokens of answers being written go first (one each: their users wait on
  every one), then prompt chunks, oldest first;
- a step left out of ``MAX_SKIPS`` batches goes before everything that came after
  it, answers included, so no step waits for ever behind newer ones;
- a batch holds at most ``n_batch`` tokens and, in one shared pool, at most the
  free cells (each sequence has already evicted down to its share before it asked:
  ``PoolShare.limits``); with one KV stream per sequence each has its own cells;
- a step that cannot fit an empty batch on its own is refused (``too_big``);
- where attention runs on the CPU with flash attention in one shared pool, a batch
  that reaches its tiled kernel decodes its answer tokens apart from its prompt
  chunks (``decodes``), as llama-server's stream per slot does.

Sizes in tokens (= KV cells).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

MAX_SKIPS = 2  # batches a step may be left out of before it goes first
TILE_ROWS = 64  # query rows of a tile of ggml-cpu's flash attention (ggml_fa_tile_config::Q)


@dataclass(frozen=True)
class Waiting:
    """One sequence's step waiting for a batch: ``tokens`` to decode (1: a token of an
    answer; more: a chunk of a prompt), its place in arrival ``order`` and the
    batches it was left out of (``skipped``)."""

    seq: int
    tokens: int
    order: int
    skipped: int = 0

    @property
    def answer(self) -> bool:
        return self.tokens == 1


@dataclass(frozen=True)
class Room:
    """What the next batch may hold: ``n_batch`` tokens, and ``free`` cells of the
    shared pool (None: one stream per sequence, each with cells of its own)."""

    n_batch: int
    free: int | None


@dataclass(frozen=True)
class Plan:
    """The next batch (in batch order), the steps left to wait (``skipped`` counted
    up) and those no batch can ever hold (``too_big``)."""

    batch: tuple[Waiting, ...]
    left: tuple[Waiting, ...]
    too_big: tuple[Waiting, ...] = ()


def priority(step: Waiting) -> tuple[bool, bool, int]:
    """Sort key: steps left out ``MAX_SKIPS`` times first, then answers, then by age."""
    return (step.skipped < MAX_SKIPS, not step.answer, step.order)


def plan(waiting: Sequence[Waiting], room: Room) -> Plan:
    """The next batch of ``waiting`` within ``room`` (see the module's rules)."""
    batch: list[Waiting] = []
    left: list[Waiting] = []
    too_big: list[Waiting] = []
    tokens = 0
    for step in sorted(waiting, key=priority):
        if step.tokens > room.n_batch or step.tokens < 1:
            too_big.append(step)
            continue
        fits = tokens + step.tokens <= room.n_batch
        if room.free is not None:
            fits = fits and tokens + step.tokens <= room.free
        if fits:
            batch.append(step)
            tokens += step.tokens
        else:
            left.append(replace(step, skipped=step.skipped + 1))
    if not batch:  # nothing ran: being left out of no batch is no reason to go first
        left = [replace(s, skipped=s.skipped - 1) for s in left]
    return Plan(tuple(batch), tuple(left), tuple(too_big))


def decodes(batch: Sequence[Waiting], apart: bool, n_ubatch: int) -> list[tuple[Waiting, ...]]:
    """The ``llama_decode`` calls of ``batch`` (in batch order): one, or with ``apart``
    the answers' tokens first and the prompt chunks after, where the batch holds both
    and the ubatch of ``n_ubatch`` rows at most that holds the answers (the last one:
    logits rows go last, ``scheduler.batch_rows``) has ``TILE_ROWS`` rows or more.

    ggml-cpu computes flash attention over such a ubatch in tiles of ``TILE_ROWS``
    query rows x 64 cells, and computes every cell tile that any row of a query tile
    sees: answer tokens of several sequences beside a prompt put each of those
    sequences' whole cache in their tile. That costs more than the weights read again
    for the answers alone, where fewer than ``TILE_ROWS`` rows take the kernel that
    reads only the cells each row sees: 3 sequences holding 1,500 cells, answering
    beside a 161-token chunk, 0.80x the time (Gemma 3 270M) and 0.70x (SmolLM2 135M);
    holding 300, 0.94x (history.md, issue 37: answers apart from prompt chunks).
    ``apart`` is the caller's: one shared pool (a stream per sequence splits a round
    so already), attention on the CPU and flash attention on."""
    answers = tuple(w for w in batch if w.answer)
    prompts = tuple(w for w in batch if not w.answer)
    rows = sum(w.tokens for w in batch)
    last = (rows - 1) % n_ubatch + 1 if rows else 0  # rows in the last ubatch
    if not apart or not answers or not prompts or last < TILE_ROWS:
        return [tuple(batch)] if batch else []
    return [answers, prompts]
