"""The seed-source benchmark (benchmarks/autoscale_seed_source.py): a primary no preset names, seeded from the shape
its replicas report, from the default seed, or by its preset."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmfleet.sim.traces import load_mooncake

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import autoscale_seed_source  # noqa: E402

HEAD300 = ROOT / "tests/unit/sim_data/mooncake_head300.jsonl"


def test_each_variant_runs_and_the_default_seed_plans_more_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    w = load_mooncake(HEAD300)
    monkeypatch.setattr(autoscale_seed_source, "workload", lambda name: w)
    runs = [autoscale_seed_source.run_one(("head", v, 3.5, 1)) for v in autoscale_seed_source.VARIANTS]
    preset, reported, default = runs
    # the default seed (8,000 prefill tokens/s) is a fifth of Llama-3.1-8B's on an H200: it asks for more primaries
    assert default["peakPrimaries"] > reported["peakPrimaries"] and default["gpuSeconds"] > reported["gpuSeconds"]
    # the reported shape is the preset's own: the same plan (only the router's price differs: measured, not planned)
    assert reported["peakPrimaries"] == preset["peakPrimaries"]
    table = autoscale_seed_source.render({"runs": runs})
    assert f"| head | default | {100 * default['attainment']:.2f}% |" in table
    assert f"{default['gpuSeconds'] / preset['gpuSeconds']:.2f}x" in table
