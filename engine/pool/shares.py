"""How a pool's KV cells are split between its sequences, and whether one more fits.

Pure arithmetic over plain numbers (no threads, no llama.cpp); sizes in cells
(= tokens). The pool holds ``cells`` (the global KV budget); a sequence is admitted
with a *share* of it and its policy evicts to stay inside the share. Shares are
given by length (``share="length"``): a request that fits whole takes only the cells
it needs, a long one takes up to a full session's budget or what is free (at least
``MIN_SHARE``); ``share="even"`` gives every sequence ``cells / max_seqs`` (the
baseline it is measured against, docs/benchmarks/history.md, issue 14). Split streams
(``kv_unified=false``) were rejected as the default: each stream is a fixed
``cells/N`` that a 150-token request would hold whole, and a stream cannot grow
(``layout="streams"`` keeps them as an option).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

MIN_SHARE = 320  # cells: a 256-token budget and a 64-token chunk
QUESTION_ROOM = 64  # cells a share keeps for the question's observation window
SLACK = 16  # cells beyond a job's estimated length (a BOS, a template's extra token)
SHARES = ("length", "even")
LAYOUTS = ("shared", "streams")
MAX_SEQS = 64  # sequences one pool runs at most
NEW = -1  # the id of a sequence asking in (running ones have 0..MAX_SEQS-1)


def check_settings(cells: int, max_seqs: int, share: str, layout: str) -> None:
    """Raise ``ConfigError`` for a pool that cannot work (``cells``: the KV budget)."""
    if not 1 <= max_seqs <= MAX_SEQS:
        raise ConfigError(f"parallel sequences must be 1..{MAX_SEQS}, got {max_seqs}")
    if share not in SHARES:
        raise ConfigError(f"share must be one of {', '.join(SHARES)}")
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}")
    if cells < MIN_SHARE:
        raise ConfigError(f"a pool needs at least {MIN_SHARE} cells, got {cells}")


def job_wants(n_tokens: int, whole: int, evicts: bool) -> tuple[int, int]:
    """Cells a job of ``n_tokens`` (prompt and answer) wants, and needs at least, in a
    session of ``whole`` = budget + chunk cells. It wants the job whole when that fits
    (it never evicts then, so needs no room for the question's observation), else
    ``whole`` and the question's room; one that never evicts needs all it wants."""
    n_tokens += SLACK
    if not evicts:
        return n_tokens, n_tokens
    want = n_tokens if n_tokens <= whole else whole + QUESTION_ROOM
    return want, min(want, MIN_SHARE)


def chunk_in_share(share: int, chunk: int) -> int:
    """Tokens per chunk in a ``share`` smaller than a session wants: at most a fifth
    of what the question's room leaves, and at least 32."""
    return max(32, min(chunk, (share - QUESTION_ROOM) // 5))


@dataclass(frozen=True)
class Want:
    """One sequence's claim: ``cells`` it wants, whether it ``evicts`` (to stay in a
    smaller share), and ``least`` cells its session needs to read on."""

    cells: int
    evicts: bool
    least: int = 0

    @property
    def floor(self) -> int:
        """Cells a running sequence's share may not fall under: what it needs to read
        on and ``MIN_SHARE`` (or all it wants, if less); all it wants if it never
        evicts."""
        if not self.evicts:
            return self.cells
        return max(min(self.cells, MIN_SHARE), self.least)


@dataclass(frozen=True)
class ShareRule:
    """Shares of a pool of ``cells`` cells (``share``: ``SHARES``; ``layout``:
    ``LAYOUTS``); ``stream_cells``: a sequence's cells at most (its stream's with
    ``streams``, the context's with ``shared``)."""

    cells: int
    share: str = "length"
    layout: str = "shared"
    stream_cells: int = 0

    @property
    def most(self) -> int:
        """Cells one sequence may ever get."""
        return self.cells if self.layout == "shared" else self.stream_cells

    def never_fits(self, least: int, evicts: bool) -> bool:
        """Whether a sequence needing ``least`` cells could never be admitted (with
        ``streams`` one that evicts reads on in whatever its stream holds)."""
        return least > self.most and not (evicts and self.layout == "streams")

    def shares(self, wants: Mapping[int, Want]) -> dict[int, int]:
        """Cells for each sequence (by id; ties in length go to the lower id first).

        A sequence that never evicts gets what it wants. The rest are split by
        ``share``: ``length`` is max-min fair (water-filling): a sequence that
        needs less than an equal part takes only what it needs and the others
        split what it leaves; ``even`` gives each an equal part whatever it needs.
        """
        if self.layout == "streams":  # each its own stream: no cells to share
            return {k: min(w.cells, self.stream_cells) for k, w in wants.items()}
        out = {k: w.cells for k, w in wants.items() if not w.evicts}
        left = self.cells - sum(out.values())
        flex = sorted((w.cells, k) for k, w in wants.items() if w.evicts)
        if self.share == "even":
            return out | {k: left // len(flex) for _, k in flex} if flex else out
        for i, (want, key) in enumerate(flex):
            level = left // (len(flex) - i)
            out[key] = min(want, level)
            left -= out[key]
        return out

    def admit(self, running: Mapping[int, Want], new: Want) -> tuple[int, dict[int, int]] | None:
        """The new sequence's share and the running ones' (by id) if it came in, or
        None if it must wait: a share would fall under its floor (the new one's:
        its ``least``), or sequences that never evict would hold more than the pool."""
        shares = self.shares({**running, NEW: new})
        floors = {seq: w.floor for seq, w in running.items()} | {NEW: new.least}
        if self.layout == "streams":
            floors = {k: min(f, self.stream_cells) for k, f in floors.items()}
        if any(shares[k] < floors[k] for k in shares):
            return None
        if self.layout == "shared" and sum(shares.values()) > self.cells:
            return None
        return shares.pop(NEW), shares
