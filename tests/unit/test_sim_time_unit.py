"""A hash-block trace's timestamp unit: Mooncake's schema written in seconds (time.time() floats, as conversions keep
them) is read in seconds, told by sub-unit gaps between its stamps (before: as milliseconds, the whole trace replayed
1,000x compressed, silently); any unit can be named; arrivals start at 0 whatever the first stamp (epoch stamps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.sim.report import oracle_hit_rate
from llmfleet.sim.traces import TimeUnitError, infer_time_unit, load_mooncake, load_trace
from llmfleet.sim.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
HEAD300 = ROOT / "tests/unit/sim_data/mooncake_head300.jsonl"
EPOCH_S = 1_733_300_000.0  # 2024-12-04, a time.time() stamp


def _records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in HEAD300.read_text().splitlines() if line.strip()]


def _write(p: Path, records: list[dict[str, Any]], stamp: Any) -> Path:
    p.write_text("".join(json.dumps({**r, "timestamp": stamp(r["timestamp"], i)}) + "\n"
                         for i, r in enumerate(records)))
    return p


def _arrivals(w: Workload) -> list[float]:
    return [r.arrival for r in w.requests]


def test_whole_number_stamps_keep_the_documented_unit_and_sub_unit_gaps_tell_seconds() -> None:
    assert infer_time_unit([0, 0, 40, 277, 471, 1000], "ms") == "ms"  # Mooncake's own: whole milliseconds
    assert infer_time_unit([0.0, 0.04, 0.277, 0.471, 1.0], "ms") == "s"  # the same arrivals in seconds
    assert infer_time_unit([5.0, 5.0, 5.0, 6.0, 7.0], "ms") == "ms"  # gaps of one unit: no evidence either way
    assert infer_time_unit([0.0, 3.5, 9.25, 20.0], "ms") == "ms"  # seconds slower than 1/s: not told (documented)
    assert infer_time_unit([0.0, 0.5, 0.7], "s") == "s"  # Qwen-Bailian's seconds stay seconds
    assert infer_time_unit([], "ms") == infer_time_unit([3.0, 3.0], "ms") == "ms"  # no gap: the default
    # order in the file does not matter, nor do a few long pauses among the many short gaps
    assert infer_time_unit([0.9, 0.1, 0.3, 100.0, 0.2, 0.5, 250.0], "ms") == "s"


def test_a_mooncake_schema_trace_in_epoch_seconds_reads_like_the_millisecond_original(tmp_path: Path) -> None:
    recs = _records()
    original = load_mooncake(HEAD300)
    # a conversion that kept time.time(): seconds since the epoch, with sub-millisecond digits
    secs = _write(tmp_path / "secs.jsonl", recs, lambda ms, i: EPOCH_S + ms / 1000 + i * 1e-6)
    w = load_trace(secs)
    assert _arrivals(w) == pytest.approx(_arrivals(original), abs=1e-3)
    assert w.duration == pytest.approx(original.duration, abs=1e-3) and original.duration > 60
    assert [r.keys for r in w.requests] == [r.keys for r in original.requests]
    assert oracle_hit_rate(w) == oracle_hit_rate(original)
    # before: read as milliseconds, the same file was one 1,000th of its length
    assert load_trace(secs, time_unit="ms").duration == pytest.approx(original.duration / 1000, abs=1e-5)


def test_arrivals_start_at_zero_and_a_named_unit_wins(tmp_path: Path) -> None:
    recs = _records()
    original = load_mooncake(HEAD300)
    # epoch milliseconds (whole numbers): milliseconds, replayed from the first request instead of 55 years later
    epoch_ms = load_trace(_write(tmp_path / "epoch_ms.jsonl", recs, lambda ms, i: int(EPOCH_S * 1000) + ms))
    assert epoch_ms.requests[0].arrival == 0.0 and _arrivals(epoch_ms) == pytest.approx(_arrivals(original))
    # whole seconds slower than one a second are not told from milliseconds: naming the unit reads them right
    slow = _write(tmp_path / "slow_s.jsonl", recs[:20], lambda ms, i: 10 * i)
    assert load_trace(slow).duration == pytest.approx(0.19)
    assert load_trace(slow, time_unit="s").duration == pytest.approx(190.0)
    assert load_mooncake(slow, time_unit="s").duration == pytest.approx(190.0)


def test_a_bad_or_misplaced_time_unit_is_an_error_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(TimeUnitError, match="unknown time unit 'us'; known: ms, s"):
        load_trace(HEAD300, time_unit="us")
    with pytest.raises(TimeUnitError, match="unknown time unit 'min'"):
        load_mooncake(HEAD300, time_unit="min")
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0000000,100,10\n")
    with pytest.raises(TimeUnitError, match="a time unit is for JSONL traces; this azure CSV's timestamps are dates"):
        load_trace(azure, time_unit="s")


def test_cli_names_the_unit_and_shows_the_span(tmp_path: Path) -> None:
    slow = _write(tmp_path / "slow_s.jsonl", _records()[:20], lambda ms, i: 10 * i)
    args = ["sim", "run", "--trace", str(slow), "--replicas", "1", "--router", "round-robin"]
    res = CliRunner().invoke(app, [*args, "--time-unit", "s", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert "slow_s: 20 requests over 190.0 s" in " ".join(res.output.split())
    res = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "ms")])
    assert res.exit_code == 0 and "20 requests over 0.2 s" in " ".join(res.output.split())
    res = CliRunner().invoke(app, [*args, "--time-unit", "h"])
    assert res.exit_code == 2 and "unknown time unit 'h'; known: ms, s" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["sim", "run", "--time-unit", "s", "--replicas", "1"])
    assert res.exit_code == 2 and "--time-unit reads a trace's timestamps: give --trace" in res.output


def test_the_benchmarks_pass_the_unit_on_and_stop_on_a_csv_given_one(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import autoscale_setup
    import routing_eval

    slow = _write(tmp_path / "slow_s.jsonl", _records()[:20], lambda ms, i: 10 * i)
    assert autoscale_setup.workloads([slow], quick=False, spike_factor=None, time_unit="s")["slow_s"].duration == 190
    got = routing_eval.scenarios(False, [slow], (2,), only_traces=True, time_unit="s")
    assert got[0][2].duration == 190  # type: ignore[attr-defined]
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0000000,100,10\n")
    with pytest.raises(TimeUnitError):  # an option wrong for the run, not a trace to skip
        autoscale_setup.workloads([slow, azure], quick=False, spike_factor=None, time_unit="s")
    # the autoscaling benchmark names each workload's span before simulating it
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--trace", str(slow),
                        "--time-unit", "s", "--workload", "slow_s", "--seeds", "1", "--out", str(tmp_path / "a.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "slow_s: 20 requests over 190 s, 512-token blocks" in r.stderr
    for script in ("autoscale_eval.py", "routing_eval.py"):
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--trace", str(slow), "--time-unit",
                            "us"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "argument --time-unit: invalid choice: 'us'" in r.stderr
