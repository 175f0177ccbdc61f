"""The learnt cell map against llama.cpp's own record of its cells.

With LLAMA_KV_CACHE_DEBUG=3 llama.cpp logs, before each decode, the position
held by every cell of each cache. The map kvtrim learnt from attention must
equal the non-sliding-window cache's table before every decode, across many
evictions, holes, refills and (in compact mode) position shifts.
"""

from __future__ import annotations

import logging
import re

import pytest
from helpers.docs_for_tests import prose

from engine import Evicted
from engine.native.model import log as llama_log

HEADER = re.compile(r"find_slot: stream\[0\], n = .*n_swa = +(\d+)")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _tables(lines: list[str]) -> list[dict[int, int]]:
    """``{position: cell}`` of the full (non-SWA) cache, one per decode."""
    out, i = [], 0
    while i < len(lines):
        m = HEADER.search(lines[i])
        if m and m.group(1) == "0":
            grid = lines[i + 2]
            fields: list[str] = []
            for row in grid.splitlines():
                row = row.rstrip()
                row = row[:-2] if row.endswith(" *") else row
                fields += [row[k : k + 5].strip() for k in range(0, len(row), 5)]
            out.append({int(f): c for c, f in enumerate(fields) if f not in ("", ".")})
            i += 3
        else:
            i += 1
    return out


@pytest.mark.parametrize(
    ("positions", "swa_cache"), [("compact", "window"), ("original", "window"), ("compact", "full")]
)
def test_cell_map_matches_llama_cpp_after_many_evictions(engine, monkeypatch, positions, swa_cache):
    monkeypatch.setenv("LLAMA_KV_CACHE_DEBUG", "3")
    handler = _Records()
    old_level = llama_log.level
    llama_log.setLevel(logging.DEBUG)
    llama_log.addHandler(handler)
    try:
        session = engine.session(
            "snapkv",
            300,
            chunk_tokens=56,
            positions=positions,
            question_aware=False,
            swa_cache=swa_cache,
        )
        tokens = engine.model.tokenize(prose(200, seed=3), add_bos=True)
        assert len(tokens) > 1400
        expected: list[dict[int, int]] = [{}]
        # a short first part: the cache starts small and grows (a state copy into a
        # new context) when the rest comes
        for part in (tokens[:40], tokens[40:]):
            n_ctx = session.ctx.n_ctx
            for event in session.feed(part, logits=False):
                if session.ctx.n_ctx != n_ctx:  # llama.cpp logged the restore's slot search
                    expected[-1:] = [{}, expected[-1]]
                    n_ctx = session.ctx.n_ctx
                # state before the next decode: after this decode, or after the eviction
                # that follows it
                if isinstance(event, Evicted):
                    expected[-1] = session.cache.cells.snapshot()
                else:
                    expected.append(session.cache.cells.snapshot())
        # one more decode so llama.cpp logs the state after the last event
        list(session.feed(tokens[:1], logits=False))
        session.close()
    finally:
        llama_log.removeHandler(handler)
        llama_log.setLevel(old_level)
    actual = _tables(handler.lines)
    evictions = session.stats.evictions
    assert evictions >= 20, "the test must exercise many evictions"
    decodes = len(actual)
    assert decodes == len(expected)
    for k, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert want == got, f"cell map differs from llama.cpp before decode {k}"
    # the cache really had holes that were refilled out of order, and it grew once
    assert any(set(t.values()) != set(range(len(t))) for t in actual)
    assert session.ctx.n_ctx == 512 and expected.count({}) == 2
