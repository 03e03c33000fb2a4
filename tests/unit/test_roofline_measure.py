"""The prefill section of benchmarks/roofline_measure.py: it runs (tiny, on CPU) and the step-cost model's columns
are added to stored GPU timings (`--only prefill-model`, where the GPU image lacks the planner)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import roofline_measure  # noqa: E402


def test_the_prefill_section_times_each_point_on_cpu() -> None:
    out = roofline_measure.prefill(torch, tiny=True)
    assert out["device"] == "cpu" and out["layers"] == 2
    assert [(r["tokens"], r["cachedPrefix"]) for r in out["rows"]] == [(64, 0), (128, 0), (64, 128)]
    for r in out["rows"]:
        assert r["ms"] > 0 and r["attentionMs"] > 0
        assert r["tokensPerS"] == pytest.approx(r["tokens"] / (r["ms"] / 1e3))


def test_the_model_columns_price_a_cached_prefix_and_long_prompts() -> None:
    rows = [{"tokens": t, "cachedPrefix": c, "ms": 10.0, "attentionMs": 1.0} for t, c in
            ((2048, 0), (2048, 16384), (16384, 0))]
    meta = roofline_measure.prefill_model(rows)
    assert meta["model"]["peakTflops"] > 0
    short, cached, long = rows
    assert cached["modelMs"] > short["modelMs"]  # the new tokens attend to the cached prefix too
    assert long["modelMs"] > 8 * short["modelMs"]  # 8x the tokens, and attention grows with the context
    for r in rows:
        assert r["measuredOverModel"] == pytest.approx(r["ms"] / r["modelMs"])
        assert 0 < r["stepEff"] and 0 < r["attentionEff"]


def test_only_prefill_model_adds_the_columns_to_stored_gpu_timings(tmp_path: Path) -> None:
    stored = {"benchmark": "roofline_measure", "other": {"kept": True},
              "prefill": {"device": "NVIDIA H200", "rows": [{"tokens": 4096, "cachedPrefix": 0, "ms": 60.0,
                                                            "attentionMs": 5.0}]}}
    src, dst = tmp_path / "stored.json", tmp_path / "out.json"
    src.write_text(json.dumps(stored))
    subprocess.run([sys.executable, str(ROOT / "benchmarks/roofline_measure.py"), "--only", "prefill-model",
                    "--merge-into", str(src), "--out", str(dst)], check=True, capture_output=True, timeout=300)
    got = json.loads(dst.read_text())
    assert got["other"] == {"kept": True}  # the sections not run are kept
    row = got["prefill"]["rows"][0]
    assert row["modelMs"] > 0 and row["measuredOverModel"] == pytest.approx(60.0 / row["modelMs"])
    assert got["prefill"]["model"]["computeEff"] > 0


def test_the_mixed_section_times_a_prefill_batched_into_a_decode_step_on_cpu() -> None:
    """Section 6 runs (tiny, on CPU): every decode batch with every prefill, and what the prefill adds to the step
    is the mixed step less the decode step alone, set against the prefill alone and against its FLOPs."""
    out = roofline_measure.mixed(torch, tiny=True)
    assert out["device"] == "cpu" and out["largestPrefillTflops"] > 0
    assert [(r["decodeBatch"], r["prefillTokens"]) for r in out["rows"]] == [(8, 16), (8, 64)]
    for r in out["rows"]:
        assert r["mixedMs"] > 0 and r["prefillAloneMs"] > 0 and r["decodeAloneMs"] > 0
        assert r["prefillAddsMs"] == pytest.approx(r["mixedMs"] - r["decodeAloneMs"])
        assert r["addsOverAlone"] == pytest.approx(r["prefillAddsMs"] / r["prefillAloneMs"])
        assert r["addsOverFlops"] == pytest.approx(r["prefillAddsMs"] / r["prefillFlopsMs"])
