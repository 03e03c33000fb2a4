"""The autoscaling benchmark's workload selection (benchmarks/autoscale_setup.py, benchmarks/autoscale_eval.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.sim.workload import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import autoscale_setup  # noqa: E402


def _azure_csv(path: Path, seconds: int) -> Path:
    rows = [f"2023-11-16 18:{m:02d}:{s:02d}.0000000,2048,100" for t in range(seconds) for m, s in [divmod(t, 60)]]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_long_trace_is_cut_to_its_first_seconds(tmp_path: Path) -> None:
    """--trace-seconds: a week-long trace is hours of simulation per policy run; its first S seconds are the workload."""
    trace = _azure_csv(tmp_path / "azure_day.csv", 600)  # one request a second for 10 minutes
    whole = autoscale_setup.workloads([trace], quick=False, spike_factor=None)["azure"]
    head = autoscale_setup.workloads([trace], quick=False, spike_factor=None, trace_seconds=120)["azure"]
    assert len(whole.requests) == 600
    assert len(head.requests) == 121  # arrivals 0..120 s after the first
    assert max(r.arrival for r in head.requests) - min(r.arrival for r in head.requests) <= 120
    with pytest.raises(WorkloadError, match="must be > 0"):
        autoscale_setup.workloads([trace], quick=False, spike_factor=None, trace_seconds=0)


def test_the_benchmark_rejects_an_empty_trace_window_in_one_line() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--trace-seconds", "-5"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == "autoscale_eval.py: error: --trace-seconds -5: it must be > 0"
