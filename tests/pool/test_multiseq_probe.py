"""Issue 14 groundwork: several sequences in one llama.cpp context.

Runs scripts/research/multiseq_probe.py's probe on the real model (a few tiny
decodes, a few seconds): with one KV stream per sequence and with one shared
cache, every query row of a global layer's ``kq_soft_max`` gives probability > 0
exactly to its own sequence's cells as llama.cpp's cell table
(LLAMA_KV_CACHE_DEBUG) records them, through a seq_rm, a seq_add and batches
split into several ubatches; a per-sequence cell map learnt from visibility
equals llama.cpp's table.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "research" / "multiseq_probe.py"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("multiseq_probe", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["multiseq_probe"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("multiseq_probe", None)


def test_split_rows_mirrors_llama_cpp_split_equal(probe):
    # one stream per sequence: consecutive ids, equal slices, rows grouped by sequence
    seqs = [0] * 7 + [1] * 4 + [2] * 2
    assert probe.split_rows(seqs, False, 64) == [
        [[0, 1], [7, 8], [11, 12]],
        [[2, 3], [9, 10]],
        [[4, 5, 6]],
    ]
    # ids must rise by one from the first one seen: 2 then 0 are two ubatches
    assert probe.split_rows([2, 0], False, 64) == [[[0]], [[1]]]
    # a shared cache keeps the batch order in one stream
    assert probe.split_rows([2, 0, 0], True, 64) == [[[0, 1, 2]]]


@pytest.mark.parametrize("unified", [False, True], ids=["per-seq-streams", "unified"])
def test_rows_see_only_their_sequence(engine, probe, unified):
    lines: list[str] = []
    info = probe.run_probe(engine.model, unified, lines)
    report = "\n".join(lines)
    assert info["ok"], report
    assert not info["map_problems"], report
    steps = {s["name"]: s for s in info["steps"]}
    prefill = steps["prefill 7+4+2 tokens"]["ubatches"]
    n_head = engine.model.info.n_head
    if unified:
        assert info["n_ctx_seq"] == info["n_ctx"] == 768
        assert [u["ne"] for u in prefill] == [[256, 13, n_head, 1]]
        # a removed cell of sequence 0 is reused by sequence 1 in the shared pool
        assert info["cell_maps"][1][14] == 3
        assert info["state"]["one_seq_ctx_as_seq0"] > 0
    else:
        assert info["n_ctx_seq"] == 256 and info["n_ctx"] == 768
        assert [u["ne"] for u in prefill] == [
            [256, 2, n_head, 3],
            [256, 2, n_head, 2],
            [256, 3, n_head, 1],
        ]
        # every stream numbers its cells from 0; seq 0 refills its own holes
        assert info["cell_maps"][1] == {10: 0, 11: 1, 12: 2, 13: 3, 14: 4, 15: 5}
        assert info["cell_maps"][0][7] == 2 and info["cell_maps"][0][8] == 3
        # a sequence saved from a 3-stream context does not load into a 1-stream one
        assert info["state"]["one_seq_ctx_as_seq0"] == 0
    assert info["state"]["same_layout_as_seq2"] == info["state"]["bytes"]
    for s in info["logits_vs_alone"].values():
        assert s["same_argmax"]
