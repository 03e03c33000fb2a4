"""The long-trace cost benchmark (benchmarks/sim_long_trace.py): the trace it writes and the figures it records."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sim_long_trace  # noqa: E402

from llmfleet.sim.traces import load_trace  # noqa: E402


def _lengths_csv(tmp_path: Path) -> Path:
    """A small Azure-format trace to draw lengths from (the tests need no shared trace directory)."""
    p = tmp_path / "lengths.csv"
    rows = [f"2023-11-16 18:17:{i:02d}.0000000,{300 + 97 * i},{5 + 3 * i}" for i in range(40)]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return p


def test_the_trace_is_poisson_at_the_rate_in_the_2024_format_with_real_lengths(tmp_path: Path) -> None:
    p, lengths = tmp_path / "t.csv", _lengths_csv(tmp_path)
    n = sim_long_trace.write_trace(p, rate=20.0, seconds=300.0, seed=3, lengths_from=lengths)
    assert 5400 < n < 6600  # 6,000 expected, +-4 sigma of a Poisson count is +-310
    w = load_trace(p)
    assert len(w.requests) == n and w.skipped_empty == 0
    assert w.duration < 300.0
    gaps = [b.arrival - a.arrival for a, b in zip(w.requests, w.requests[1:], strict=False)]
    assert 0.04 < sum(gaps) / len(gaps) < 0.06  # exponential gaps of mean 1/20 s
    with lengths.open(newline="") as f:
        real = {(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)}
    assert {(r.prompt_len, r.output_len) for r in w.requests} <= real
    assert sim_long_trace.write_trace(tmp_path / "u.csv", 20.0, 300.0, 3, lengths) == n  # the seed fixes the trace
    assert (tmp_path / "u.csv").read_bytes() == p.read_bytes()


def test_a_short_run_records_each_step_and_the_bytes_a_request_holds(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "benchmarks/sim_long_trace.py", "--seconds", "20", "--rate", "5",
                        "--lengths", str(_lengths_csv(tmp_path)), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["trace"]["requests"] == res["heldPerRequest"]["requests"] > 50
    assert [s["step"] for s in res["steps"]] == ["sim run --autoscaler slo", "autoscale_eval.py"]
    for s in res["steps"]:
        assert s["wallS"] > 0 and s["maxRssMiB"] > 30  # a child's own peak: a Python process with llmfleet loaded
    assert 100 < res["heldPerRequest"]["workloadBytesPerRequest"] < 5000
    assert 100 < res["heldPerRequest"]["recordsBytesPerRequest"] < 5000
    assert "azure_code_poisson: slo" in r.stderr  # autoscale_eval ran on the generated trace, not the spike only
    assert "bursty" not in r.stderr


def test_bad_flags_and_an_empty_trace_are_one_line_errors(tmp_path: Path) -> None:
    lengths = _lengths_csv(tmp_path)

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "benchmarks/sim_long_trace.py", "--lengths", str(lengths), *flags,
                               "--out", str(tmp_path / "r.json")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)

    for flags, message in ((["--rate", "0"], "--rate 0: it must be a finite number > 0"),
                           (["--seconds", "nan"], "--seconds nan: it must be a finite number > 0"),
                           (["--replicas", "0"], "--replicas 0: it must be >= 1"),
                           (["--lengths", str(tmp_path / "none.csv")], "none.csv: no such file")):
        r = run(*flags)
        assert r.returncode == 2 and message in r.stderr.strip().splitlines()[-1]
    r = run("--seconds", "0.001", "--rate", "1")
    assert r.returncode == 1 and r.stderr.strip().endswith("no request arrives within 0.001 s at 1 req/s: give a "
                                                           "longer --seconds")
    assert not (tmp_path / "r.json").exists()
