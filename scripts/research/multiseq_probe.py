"""Issue 14 groundwork: several sequences in one llama.cpp context.

    .venv/bin/python scripts/research/multiseq_probe.py            # probe, both kv_unified
    .venv/bin/python scripts/research/multiseq_probe.py --bench    # plus decode throughput
    .venv/bin/python scripts/research/multiseq_probe.py --json out.json

The probe decodes batches that hold three sequences of different lengths, reads
``kq_soft_max-<layer>`` of a global layer through the eval callback (every ubatch
of every decode), and checks, row by row, that each sequence's query rows give
probability > 0 only to the cells that llama.cpp's own cell table
(``LLAMA_KV_CACHE_DEBUG=3``) says hold that sequence, before and after a
``seq_rm`` and a ``seq_add`` in one sequence. It does that for
``kv_unified=False`` (one KV stream per sequence) and ``kv_unified=True`` (one
shared cache). The bench decodes 1, 4 or 8 sequences one token each per
``llama_decode``. See docs/multiseq.md for what it found.

Research code: not part of the engine; it uses only llama-cpp-python's low-level
API and engine._ggml's tensor readers.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import _internals

from engine.native import _ggml
from engine.native.model import Model
from engine.native.model import log as llama_log
from engine.native.ubatch import split_equal

GLOBAL_LAYER = 5  # Gemma 3 270M: 5, 11, 17 are global; the others slide over 512
SWA_LAYER = 0
TEXT = (
    "The lighthouse keeper wrote in his log every evening, noting the wind, the colour "
    "of the sea and the ships that passed the point before the lamp was lit. "
)

# one find_slot line per sequence of each ubatch (llama_kv_cache::find_slot)
_HEADER = re.compile(
    r"find_slot: stream\[(\d+)\], n = +(\d+), used = +(\d+), head = +(\d+), "
    r"size = +(\d+), n_swa = +(\d+)"
)


# ---------------------------------------------------------------- llama.cpp's log


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _grid_fields(grid: str, width: int) -> list[str]:
    """Split one of find_slot's grids into per-cell fields (``" *"`` marks 256)."""
    out: list[str] = []
    for row in grid.splitlines():
        row = row.rstrip()
        row = row[:-2] if row.endswith(" *") else row
        out += [row[k : k + width].strip() for k in range(0, len(row), width)]
    return out


def kv_tables(lines: Sequence[str]) -> list[tuple[int, dict[int, tuple[str, int]]]]:
    """Every full-cache (n_swa = 0) table llama.cpp logged, in order:
    ``(stream, {cell: (seq, pos)})``; ``seq`` is the digit or ``M`` it prints."""
    out = []
    i = 0
    while i < len(lines):
        m = _HEADER.search(lines[i])
        if m and m.group(6) == "0" and i + 2 < len(lines):
            seqs = [c for c in lines[i + 1].replace(" *", "") if c not in "\n "]
            poss = _grid_fields(lines[i + 2], 5)
            table = {
                c: (s, int(p))
                for c, (s, p) in enumerate(zip(seqs, poss, strict=False))
                if s != "." and p not in ("", ".")
            }
            out.append((int(m.group(1)), table))
            i += 3
        else:
            i += 1
    return out


# ---------------------------------------------------------------- the context


@dataclass
class Grab:
    """One ``kq_soft_max`` the callback saw (one layer of one ubatch)."""

    layer: int
    ne: tuple[int, int, int, int]  # ggml order: n_kv, rows per stream, heads, streams
    probs: np.ndarray  # (streams, heads, rows, n_kv)


@dataclass
class MultiCtx:
    """A llama.cpp context for ``n_seq_max`` sequences with a capturing callback."""

    model: Model
    n_seq_max: int
    n_ctx: int
    unified: bool
    n_batch: int = 64
    n_threads: int = 1
    layers: tuple[int, ...] = (GLOBAL_LAYER, SWA_LAYER)
    swa_full: bool = True
    grabs: list[Grab] = field(default_factory=list)
    armed: bool = True
    keep_probs: bool = True
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._names = {f"kq_soft_max-{layer}".encode() for layer in self.layers}
        self._cb = _ggml.make_eval_callback(self._on_tensor)
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = self.n_ctx
        p.n_batch = self.n_batch
        p.n_ubatch = self.n_batch
        p.n_seq_max = self.n_seq_max
        p.kv_unified = self.unified
        p.swa_full = self.swa_full
        p.n_threads = self.n_threads
        p.n_threads_batch = self.n_threads
        p.no_perf = True
        p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.cb_eval = self._cb
        p.cb_eval_user_data = None
        self.ctx = _internals.LlamaContext(model=self.model.native, params=p, verbose=False)
        self.mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, self.n_seq_max)

    @property
    def n_ctx_total(self) -> int:
        return int(llama_cpp.llama_n_ctx(self.ctx.ctx))

    @property
    def n_ctx_seq(self) -> int:
        return int(llama_cpp.llama_n_ctx_seq(self.ctx.ctx))

    def set_threads(self, n: int) -> None:
        llama_cpp.llama_set_n_threads(self.ctx.ctx, n, n)

    def _on_tensor(self, tensor: int, ask: bool, _ud: int | None) -> bool:
        if not self.armed or not tensor:
            return not ask
        name = _ggml.tensor_name_bytes(tensor)
        if name not in self._names:
            return not ask
        if ask:
            return True
        try:
            ne = _ggml.tensor_shape(tensor)
            n_kv, n_rows, n_head, n_stream = ne
            probs = _ggml.read_rows(tensor, 0, n_rows)  # (streams * heads, rows, n_kv)
            probs = probs.reshape(n_stream, n_head, n_rows, n_kv)
            layer = int(name.rsplit(b"-", 1)[1])
            self.grabs.append(Grab(layer, ne, probs if self.keep_probs else probs[:0]))
        except BaseException as exc:  # never raise into C
            self.error = exc
        return True

    def decode(self, items: Sequence[tuple[int, int, int]]) -> list[Grab]:
        """Decode ``(seq, pos, token)`` in this order (logits for each sequence's
        last token); return what the callback captured, every ubatch."""
        b = self.batch
        last = {seq: i for i, (seq, _, _) in enumerate(items)}
        for i, (seq, pos, tok) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = last[seq] == i
        b.n_tokens = len(items)
        self.grabs = []
        self.error = None
        rc = llama_cpp.llama_decode(self.ctx.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        if self.error is not None:
            raise self.error
        return self.grabs

    def logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch entry ``i`` of the last decode (llama.cpp puts outputs
        back in batch order whatever the ubatch split did)."""
        n_vocab = self.model.info.n_vocab
        ptr = llama_cpp.llama_get_logits_ith(self.ctx.ctx, i)
        buf = (ctypes.c_float * n_vocab).from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(buf, dtype=np.float32, count=n_vocab).copy()

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        llama_cpp.llama_memory_seq_add(self.mem, seq, p0, p1, delta)

    def pos_range(self, seq: int) -> tuple[int, int]:
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq)),
            int(llama_cpp.llama_memory_seq_pos_max(self.mem, seq)),
        )

    def save_seq(self, seq: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self.ctx.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(self.ctx.ctx, buf, size, seq)
        return ctypes.string_at(buf, got)

    def load_seq(self, data: bytes, seq: int) -> int:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return int(llama_cpp.llama_state_seq_set_data(self.ctx.ctx, buf, len(data), seq))

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        self.ctx.close()


# ---------------------------------------------------------------- ubatch layout


def split_rows(seqs: Sequence[int], unified: bool, n_ubatch: int) -> list[list[list[int]]]:
    """Which batch index each row of each stream of each ubatch holds.

    ``seqs``: the sequence of each batch entry, in batch order, each sequence's
    entries together. Returns one entry per ubatch: a list per stream of batch
    indices. A unified cache takes ``split_simple`` (batch order, one stream); one
    stream per sequence takes ``split_equal(n_ubatch, sequential=true)``, which
    the engine predicts (engine/native/ubatch.py).
    """
    n = len(seqs)
    if unified:
        return [[list(range(a, min(a + n_ubatch, n)))] for a in range(0, n, n_ubatch)]
    at: dict[int, list[int]] = {}
    for i, seq in enumerate(seqs):
        at.setdefault(seq, []).append(i)
    if any(idx != list(range(idx[0], idx[0] + len(idx))) for idx in at.values()):
        raise ValueError("each sequence's entries must be together")
    runs = [(seq, len(idx)) for seq, idx in at.items()]
    return [
        [at[s.seq][s.first : s.first + s.count] for s in ubatch]
        for ubatch in split_equal(runs, n_ubatch)
    ]


# ---------------------------------------------------------------- the checks


def _ranges(cols: np.ndarray) -> str:
    """``[0 1 2 5]`` -> ``"0-2,5"``."""
    if len(cols) == 0:
        return "-"
    parts, start, prev = [], int(cols[0]), int(cols[0])
    for c in cols[1:]:
        c = int(c)
        if c != prev + 1:
            parts.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = c
        prev = c
    parts.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(parts)


@dataclass
class StepReport:
    name: str
    ubatches: list[dict]
    ok: bool
    problems: list[str]
    pos_ranges: dict[int, tuple[int, int]]


def check_step(
    mc: MultiCtx,
    name: str,
    items: Sequence[tuple[int, int, int]],
    grabs: Sequence[Grab],
    before: dict[int, dict[int, tuple[str, int]]],
    known: dict[int, dict[int, int]],
    out: list[str],
) -> StepReport:
    """Check every row of the global layer against llama.cpp's table before the
    decode (``before``: stream -> {cell: (seq, pos)}) and learn the batch's cells
    into ``known`` (seq -> {pos: cell}), the cell map as kvtrim would keep it."""
    seqs = [s for s, _, _ in items]
    layout = split_rows(seqs, mc.unified, mc.n_batch)
    glob = [g for g in grabs if g.layer == GLOBAL_LAYER]
    swa = [g for g in grabs if g.layer == SWA_LAYER]
    problems: list[str] = []
    ubatches = []
    out.append(f"  {name}: batch (seq,pos) = {[(s, p) for s, p, _ in items]}")
    if len(glob) != len(layout):
        problems.append(f"{len(glob)} global-layer tensors, {len(layout)} ubatches expected")
    for u, (g, streams) in enumerate(zip(glob, layout, strict=False)):
        n_kv, n_rows, _, n_stream = g.ne
        swa_ne = swa[u].ne if u < len(swa) else None
        ub_seqs = [seqs[rows[0]] for rows in streams]
        where = (
            "one stream, rows in batch order"
            if mc.unified
            else f"stream slots 0..{len(streams) - 1} = seqs {ub_seqs}"
        )
        out.append(
            f"    ubatch {u}: kq_soft_max-{GLOBAL_LAYER} ne={list(g.ne)} "
            f"(n_kv, rows/stream, heads, streams); kq_soft_max-{SWA_LAYER} "
            f"ne={list(swa_ne) if swa_ne else None}; {where}"
        )
        ubatches.append({"ne": list(g.ne), "swa_ne": list(swa_ne or ()), "seqs": ub_seqs})
        if n_stream != len(streams) or any(len(r) != n_rows for r in streams):
            problems.append(f"ubatch {u}: shape {g.ne} does not match layout {streams}")
            continue
        vis_all = (g.probs > 0).any(axis=1)  # (streams, rows, n_kv)
        for s_i, rows in enumerate(streams):
            for r_i, b_i in enumerate(rows):
                seq, pos, _ = items[b_i]
                stream = 0 if mc.unified else seq
                table = before.get(stream, {})
                vis = np.flatnonzero(vis_all[s_i, r_i])
                probs = g.probs[s_i, :, r_i, :]
                row_sum = probs.sum(axis=1)
                # cells the row may see: its sequence's cells at positions <= pos that
                # were there before the decode, plus the batch's own cells so far
                own = {c for c, (sq, p) in table.items() if sq == str(seq) and p <= pos}
                batch_cells = {known[seq][p] for p in known[seq] if p <= pos}
                other = {c for c, (sq, _) in table.items() if sq != str(seq)}
                new = set(vis.tolist()) - own - batch_cells
                if len(new) != 1:
                    problems.append(f"seq {seq} pos {pos}: {len(new)} new cells {sorted(new)}")
                else:
                    known[seq][pos] = new.pop()
                want = own | {known[seq][p] for p in known[seq] if p <= pos}
                if set(vis.tolist()) != want:
                    problems.append(
                        f"seq {seq} pos {pos}: visible {_ranges(vis)} != expected "
                        f"{_ranges(np.array(sorted(want)))}"
                    )
                if other & set(vis.tolist()):
                    problems.append(f"seq {seq} pos {pos}: sees another sequence's cells")
                if not np.allclose(row_sum, 1.0, atol=1e-3):
                    problems.append(f"seq {seq} pos {pos}: row sums {row_sum}")
                hidden = np.setdiff1d(np.arange(n_kv), vis)
                out.append(
                    f"      slot {s_i} row {r_i}: seq {seq} pos {pos:3d} -> "
                    f"p>0 on cells {_ranges(vis)} (cell {known[seq].get(pos)} is new); "
                    f"mass on the other {len(hidden)} columns {probs[:, hidden].sum():.1f}"
                )
    ranges = {s: mc.pos_range(s) for s in sorted(set(seqs) | set(known))}
    for prob in problems:
        out.append(f"    PROBLEM: {prob}")
    return StepReport(name, ubatches, not problems, problems, ranges)


def _first_tables(lines: Sequence[str]) -> dict[int, dict[int, tuple[str, int]]]:
    """The first full-cache table logged per stream during one decode: the state
    before that decode (prepare() logs each ubatch's simulated state in order)."""
    out: dict[int, dict[int, tuple[str, int]]] = {}
    for stream, table in kv_tables(lines):
        out.setdefault(stream, table)
    return out


def _map_matches(
    known: dict[int, dict[int, int]], tables: dict[int, dict[int, tuple[str, int]]], unified: bool
) -> list[str]:
    """kvtrim's per-sequence cell maps against llama.cpp's tables (state before a
    decode); returns the differences."""
    bad = []
    for seq, pos_cell in known.items():
        stream = 0 if unified else seq
        if stream not in tables:  # llama.cpp logs only the streams a ubatch touches
            continue
        table = tables[stream]
        theirs = {p: c for c, (sq, p) in table.items() if sq == str(seq)}
        if theirs != pos_cell:
            bad.append(
                f"seq {seq}: map {sorted(pos_cell.items())} != llama.cpp {sorted(theirs.items())}"
            )
    return bad


def run_probe(model: Model, unified: bool, out: list[str]) -> dict:
    """Three sequences of 7, 4 and 2 tokens, then seq_rm, seq_add, mixed batches."""
    toks = model.tokenize(TEXT * 2, add_bos=True)
    os.environ["LLAMA_KV_CACHE_DEBUG"] = "3"  # read when the cache is built
    handler = _Lines()
    old = llama_log.level
    llama_log.setLevel(logging.DEBUG)
    llama_log.addHandler(handler)
    try:
        mc = MultiCtx(model, n_seq_max=3, n_ctx=768, unified=unified)
    finally:
        del os.environ["LLAMA_KV_CACHE_DEBUG"]
    steps: list[StepReport] = []
    known: dict[int, dict[int, int]] = {0: {}, 1: {}, 2: {}}
    map_problems: list[str] = []
    info = {
        "kv_unified": unified,
        "n_ctx_asked": 768,
        "n_ctx": mc.n_ctx_total,
        "n_ctx_seq": mc.n_ctx_seq,
        "kv_log": [
            ln for ln in handler.lines if "llama_kv_cache: size" in ln or "KV cache, size" in ln
        ],
    }
    out.append(f"kv_unified={unified}: n_ctx={mc.n_ctx_total} n_ctx_seq={mc.n_ctx_seq}")
    for ln in info["kv_log"]:
        out.append(f"  llama.cpp: {ln.strip()}")

    def step(name: str, items: list[tuple[int, int, int]]) -> None:
        handler.lines.clear()
        grabs = mc.decode(items)
        tables = _first_tables(handler.lines)
        # tables are the state before this decode: compare the map learnt so far
        map_problems.extend(f"before {name}: {p}" for p in _map_matches(known, tables, unified))
        steps.append(check_step(mc, name, items, grabs, tables, known, out))

    def forget(seq: int, p0: int, p1: int) -> None:
        for p in [p for p in known[seq] if p0 <= p < p1]:
            del known[seq][p]

    try:
        # 1: prefill, sequences of different lengths in one batch, seq ids ascending
        lens = {0: 7, 1: 4, 2: 2}
        items = [(s, p, toks[p]) for s in (0, 1, 2) for p in range(lens[s])]
        step("prefill 7+4+2 tokens", items)
        last_idx = {s: max(i for i, it in enumerate(items) if it[0] == s) for s in lens}
        batched = {s: mc.logits_ith(i) for s, i in last_idx.items()}
        info["logits_vs_alone"] = _logits_vs_alone(model, toks, lens, batched, out)
        # 2: remove positions 2..3 of seq 0, then one token for each sequence
        ok_rm = mc.seq_rm(0, 2, 4)
        forget(0, 2, 4)
        out.append(f"  seq_rm(0, 2, 4) -> {ok_rm}; pos range seq 0 = {mc.pos_range(0)}")
        step(
            "after seq_rm(0,2,4): one token each", [(s, lens[s], toks[lens[s]]) for s in (0, 1, 2)]
        )
        # 3: shift seq 1 by +10 (positions 0..4 -> 10..14), then decode seq 0 and 1
        mc.seq_add(1, 0, -1, 10)
        known[1] = {p + 10: c for p, c in known[1].items()}
        out.append(f"  seq_add(1, 0, -1, +10); pos range seq 1 = {mc.pos_range(1)}")
        step("after seq_add(1,+10): seqs 0,1", [(0, 8, toks[8]), (1, 15, toks[5])])
        # 4: non-consecutive seq ids (0 and 2) and reversed batch order
        step("seqs 2,0 (reversed, not consecutive)", [(2, 3, toks[3]), (0, 9, toks[9])])
        # 5: one sequence alone refills its hole (cells of removed positions 2, 3)
        step("seq 0 alone, 2 tokens", [(0, 10, toks[10]), (0, 11, toks[11])])
        # the state after the last step, as llama.cpp logs it at the next decode
        handler.lines.clear()
        mc.decode([(0, 12, toks[12]), (1, 16, toks[6]), (2, 4, toks[4])])  # logs every stream
        tables = _first_tables(handler.lines)
        map_problems.extend(f"at the end: {p}" for p in _map_matches(known, tables, unified))
        final = {s: {c: v for c, v in sorted(t.items())} for s, t in tables.items()}
        out.append("  llama.cpp's full-cache tables at the end (stream: {cell: (seq, pos)}):")
        for s, t in final.items():
            out.append(f"    stream {s}: {t}")
        for p in map_problems:
            out.append(f"  MAP PROBLEM: {p}")
        out.append(f"  cell maps kvtrim-style (seq: {{pos: cell}}): {known}")
        state = _state_probe(model, mc, unified, out)
    finally:
        llama_log.removeHandler(handler)
        llama_log.setLevel(old)
        mc.close()
    info.update(
        steps=[s.__dict__ for s in steps],
        map_problems=map_problems,
        cell_maps={s: dict(m) for s, m in known.items()},
        final_tables={s: {c: list(v) for c, v in t.items()} for s, t in final.items()},
        state=state,
        ok=all(s.ok for s in steps) and not map_problems,
    )
    return info


def _logits_vs_alone(
    model: Model,
    toks: Sequence[int],
    lens: dict[int, int],
    batched: dict[int, np.ndarray],
    out: list[str],
) -> dict:
    """Each sequence's prompt decoded alone in a 1-sequence context: its last
    logits against those from the mixed batch."""
    alone = MultiCtx(model, n_seq_max=1, n_ctx=256, unified=False, layers=())
    res = {}
    try:
        for s, n in lens.items():
            llama_cpp.llama_memory_clear(alone.mem, True)
            alone.decode([(0, p, toks[p]) for p in range(n)])
            ref = alone.logits_ith(n - 1)
            res[s] = {
                "max_abs_diff": float(np.abs(ref - batched[s]).max()),
                "same_argmax": bool(ref.argmax() == batched[s].argmax()),
            }
    finally:
        alone.close()
    out.append(f"  last logits of each sequence, mixed batch vs decoded alone: {res}")
    return res


def _state_probe(model: Model, mc: MultiCtx, unified: bool, out: list[str]) -> dict:
    """Save seq 1 and restore it into other contexts (same layout, 1 sequence)."""
    data = mc.save_seq(1)
    res = {"bytes": len(data)}
    same = MultiCtx(model, n_seq_max=3, n_ctx=768, unified=unified, layers=())
    try:
        res["same_layout_as_seq2"] = same.load_seq(data, 2)
        res["same_layout_pos_range"] = same.pos_range(2)
    finally:
        same.close()
    single = MultiCtx(model, n_seq_max=1, n_ctx=256, unified=False, layers=())
    try:
        res["one_seq_ctx_as_seq0"] = single.load_seq(data, 0)
    finally:
        single.close()
    out.append(
        f"  state: seq 1 saved ({len(data)} bytes); restored as seq 2 into the same layout -> "
        f"{res['same_layout_as_seq2']} bytes read, pos range {res['same_layout_pos_range']}; "
        f"into a 1-sequence context -> {res['one_seq_ctx_as_seq0']} bytes read"
    )
    return res


def seq_rm_out_of_range(unified: bool) -> dict:
    """``llama_memory_seq_rm`` with seq_id == n_seq_max, in a child process (it may
    abort the process)."""
    code = (
        "from engine.native.model import Model\n"
        "from scripts_probe import MultiCtx\n"
        f"mc = MultiCtx(Model(), n_seq_max=2, n_ctx=512, unified={unified}, layers=())\n"
        "print('seq_rm ->', mc.seq_rm(2, 0, -1), flush=True)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    code = code.replace("scripts_probe", Path(__file__).stem)
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    text = (r.stdout + r.stderr).splitlines()
    said = [ln.strip() for ln in text if "GGML_ASSERT" in ln or ln.startswith("seq_rm ->")]
    return {"returncode": r.returncode, "said": said[:1]}


# ---------------------------------------------------------------- throughput


def bench(
    model: Model,
    unified: bool,
    prompt_len: int,
    steps: int,
    threads: Sequence[int],
    ns: Sequence[int],
    out: list[str],
) -> list[dict]:
    """Tokens/s of decode steps (one token for each of N sequences per llama_decode)
    with ``prompt_len`` tokens already cached per sequence; also N sequential
    one-token decodes for comparison, and the same steps with capture armed."""
    n_max = max(ns)
    toks = model.tokenize(TEXT * (prompt_len // 20 + 2), add_bos=True)[:prompt_len]
    n_ctx = n_max * (prompt_len + steps + 64)
    mc = MultiCtx(
        model,
        n_seq_max=n_max,
        n_ctx=n_ctx,
        unified=unified,
        n_batch=max(64, n_max),
        n_threads=max(threads),
        layers=(5, 11, 17),
    )
    mc.armed = False
    mc.keep_probs = False
    rows = []
    try:
        t0 = time.perf_counter()
        for s in range(n_max):
            for a in range(0, prompt_len, 64):
                mc.decode([(s, p, toks[p]) for p in range(a, min(a + 64, prompt_len))])
        prefill = time.perf_counter() - t0
        out.append(
            f"kv_unified={unified}: n_ctx={mc.n_ctx_total} n_ctx_seq={mc.n_ctx_seq}, "
            f"{n_max} x {prompt_len} prompt tokens in {prefill:.1f} s"
        )
        for nt in threads:
            mc.set_threads(nt)
            for n in ns:
                for mode in ("batched", "sequential", "batched+capture"):
                    mc.armed = mode == "batched+capture"
                    t0 = time.perf_counter()
                    for k in range(steps):
                        pos = prompt_len + k
                        if mode == "sequential":
                            for s in range(n):
                                mc.decode([(s, pos, toks[k % prompt_len])])
                        else:
                            mc.decode([(s, pos, toks[k % prompt_len]) for s in range(n)])
                    dt = time.perf_counter() - t0
                    mc.armed = False
                    for s in range(n):
                        mc.seq_rm(s, prompt_len, -1)
                    row = {
                        "kv_unified": unified,
                        "threads": nt,
                        "n_seqs": n,
                        "mode": mode,
                        "tokens": n * steps,
                        "seconds": round(dt, 3),
                        "tok_s": round(n * steps / dt, 1),
                        "ms_per_step": round(1000 * dt / steps, 1),
                    }
                    rows.append(row)
                    out.append(
                        f"  threads={nt} N={n} {mode:16s}: {row['tok_s']:7.1f} tok/s "
                        f"({row['ms_per_step']:.1f} ms per step of {n} tokens)"
                    )
    finally:
        mc.close()
    return rows


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="store_true", help="also measure decode throughput")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--prompt", type=int, default=192, help="cached tokens per sequence (bench)")
    ap.add_argument("--steps", type=int, default=12, help="decode steps per measurement")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seqs", default="1,4,8")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    model = Model()
    lines: list[str] = []
    result: dict = {"probe": {}, "bench": []}
    ok = True
    if not args.bench_only:
        for unified in (False, True):
            info = run_probe(model, unified, lines)
            result["probe"][str(unified)] = info
            ok = ok and info["ok"]
            lines.append(f"  => {'all rows match' if info['ok'] else 'MISMATCH'}")
            info["seq_rm_seq_id_out_of_range"] = seq_rm_out_of_range(unified)
            lines.append(f"  seq_rm(seq_id = n_seq_max): {info['seq_rm_seq_id_out_of_range']}")
            print("\n".join(lines), flush=True)
            lines.clear()
    if args.bench or args.bench_only:
        threads = [int(x) for x in args.threads.split(",")]
        ns = [int(x) for x in args.seqs.split(",")]
        for unified in (False, True):
            result["bench"] += bench(model, unified, args.prompt, args.steps, threads, ns, lines)
            print("\n".join(lines), flush=True)
            lines.clear()
        result["loadavg"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    model.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
