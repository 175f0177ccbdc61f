"""How llama.cpp splits one ``llama_decode`` into ubatches when each sequence has a
KV stream of its own (``kv_unified`` off): ``llama_batch_allocr::split_equal`` with
``sequential`` set, which the capture must know to read the right rows of each
ubatch's graph. A function of the batch's shape only, tested without a model
(tests/native/test_ubatch.py) and checked against llama.cpp's own split by the
capture (a ubatch of another shape is an error, not a wrong read).

The rule: each ubatch takes the first run of consecutive sequence ids that still
have tokens (in batch order) and gives every one of them the same number of
tokens, as many as the shortest has left and ``n_ubatch`` allows. A round of one
token per sequence and one prompt is two ubatches: every sequence's first token,
then the rest of the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Slice:
    """``count`` tokens of sequence ``seq`` from its ``first`` token on, in KV stream
    ``stream`` of the ubatch (its place in the ubatch's run of sequences)."""

    seq: int
    first: int
    count: int
    stream: int


def split_equal(runs: Sequence[tuple[int, int]], n_ubatch: int) -> list[list[Slice]]:
    """The ubatches of a batch whose ``runs`` are ``(seq, tokens)`` in batch order,
    each sequence's tokens together and each sequence once."""
    if n_ubatch < 1:
        raise ValueError("n_ubatch must be at least 1")
    if len({seq for seq, _ in runs}) != len(runs) or any(n < 1 for _, n in runs):
        raise ValueError("each sequence once, with at least one token")
    used = [0] * len(runs)
    out: list[list[Slice]] = []
    while any(u < n for u, (_, n) in zip(used, runs, strict=True)):
        chosen: list[int] = []
        for i, (seq, n) in enumerate(runs):
            if used[i] < n and (not chosen or seq == runs[chosen[-1]][0] + 1):
                chosen.append(i)
        left = min(runs[i][1] - used[i] for i in chosen)
        count = min(left, max(1, n_ubatch // len(chosen)))
        out.append([Slice(runs[i][0], used[i], count, k) for k, i in enumerate(chosen)])
        for i in chosen:
            used[i] += count
    return out
