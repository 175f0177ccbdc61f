"""``kvtrim bench --quick`` as a smoke test: structure and sanity of its output."""

from __future__ import annotations

import io
import json

import pytest

from engine.bench import report
from engine.cli.main import main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    out = io.StringIO()
    # one passkey depth, not --quick's two: the report and its targets are the same code
    argv = ["bench", "--quick", "--depths", "1", "--out", str(out_dir)]
    assert main(argv, out=out, err=io.StringIO()) == 0
    return out_dir, json.loads((out_dir / "results.json").read_text()), out.getvalue()


def test_outputs_exist(quick):
    out_dir, result, printed = quick
    assert "report.md" in printed
    for name in (
        "results.json",
        "report.md",
        "accuracy_vs_budget.png",
        "kv_memory_vs_length.png",
        "decode_speed_vs_length.png",
        "memory_maps.png",
    ):
        assert (out_dir / name).stat().st_size > 500, name
    md = (out_dir / "report.md").read_text()
    assert "## Quality at 1024 tokens" in md and "## Targets" in md
    assert "pydoc_data" in md, "the report names its real text"
    assert {"config", "model", "machine", "records", "elapsed_s"} <= set(result)


def test_every_record_has_its_figures(quick):
    _, result, _ = quick
    tasks = {r["task"] for r in result["records"]}
    assert {"passkey_filler", "passkey_real", "fidelity", "summary", "reference"} <= tasks
    for r in result["records"]:
        assert r["prompt_tokens"] > 0 and r["prefill_tokens_per_s"] > 0
        if r["task"] != "reference":
            assert r["kv_bytes_peak"] > 0 and r["kv_bytes_full"] > 0
            assert r["rss_peak_bytes"] > 0


def test_the_full_cache_is_its_own_reference(quick):
    _, result, _ = quick
    rows = {(r["policy"], r["budget_tokens"]): r for r in report.quality_rows(result["records"])}
    full = next(r for (p, _), r in rows.items() if p == "full")
    assert full["kl_mean"] == pytest.approx(0.0, abs=1e-6)
    assert full["top1_agreement"] == 1.0 and full["rouge_l"] == pytest.approx(1.0)
    assert full["passkey_filler"] == 1.0
    snap = rows[("snapkv", 256)]
    assert snap["kl_mean"] > 0 and 0 < snap["top1_agreement"] <= 1


def test_memory_full_grows_bounded_stays_flat(quick):
    _, result, _ = quick
    scaling = report.scaling_rows(result["records"])
    by = {}
    for r in scaling:
        if "kv_bytes_peak" in r:
            by.setdefault(r["policy"], []).append(
                (r["length"], r["kv_bytes_peak"], r["kv_bytes_full"])
            )
    full = sorted(by["full"])
    assert full[-1][1] > full[0][1], "the full cache grows with the document"
    assert full[-1][2] > full[0][2]
    for policy in ("streaming", "snapkv"):
        held = {b for _, b, _ in by[policy]}
        assert len(held) == 1, f"{policy} memory must not grow with length"
        per_cell = result["model"]["kv_bytes_per_cell"]
        assert held.pop() <= 512 * per_cell  # budget 256 + chunk, padded to 256 cells
    assert any(t[0].startswith("KV memory flat") and t[2] for t in report.targets(result))


def test_targets_are_judged_from_the_records():
    rec = {
        "experiment": "quality",
        "length": 1024,
        "kv_ratio": 0.3,
        "prefill_tokens_per_s": 1.0,
        "capture_score_share": 0.05,
    }
    records = []
    for policy, hit in (("snapkv", True), ("streaming", False)):
        for task in ("passkey_filler", "passkey_real"):
            records.append(
                {**rec, "policy": policy, "budget_tokens": 128, "task": task, "hit": hit}
            )
    records.append(
        {
            **rec,
            "policy": "snapkv",
            "budget_tokens": 256,
            "task": "fidelity",
            "kl_mean": 0.01,
            "top1_agreement": 0.97,
        }
    )
    result = {"config": {"length": 1024}, "records": records}
    judged = {name.split(":")[0]: ok for name, _, ok in report.targets(result)}
    assert judged["budget 1/8"] is True
    assert judged["budget 1/4"] is True


def test_needle_maps_per_policy(quick):
    out_dir, result, _ = quick
    maps = {m["policy"]: m for m in result["maps"]}
    assert set(maps) == {"full", "streaming", "snapkv"}
    assert maps["full"]["retention"] == 1.0 and maps["full"]["needle_kept"]
    assert not maps["streaming"]["needle_kept"], "the key is far from streaming's window"
    for m in maps.values():
        assert len(m["kept"]) == len(m["top"]) and 0 <= min(m["kept"]) <= max(m["kept"]) <= 1
    assert "## What each policy keeps" in (out_dir / "report.md").read_text()
