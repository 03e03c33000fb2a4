"""The decision-phase benchmark (benchmarks/autoscale_phase.py): the autoscalers at several phases of their timer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmfleet.sim.traces import load_mooncake

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import autoscale_phase  # noqa: E402
import autoscale_setup  # noqa: E402

SCRIPT = ROOT / "benchmarks/autoscale_phase.py"
HEAD300 = ROOT / "tests/unit/sim_data/mooncake_head300.jsonl"


def test_the_policys_decisions_move_by_the_phase() -> None:
    w = load_mooncake(HEAD300)
    t0 = min(r.arrival for r in w.requests)
    _, base = autoscale_setup.run_policy(w, "slo", 3.5, 1)
    _, shifted = autoscale_setup.run_policy(w, "slo", 3.5, 1, phase_s=7.0)
    assert base.timeline[0]["t"] == pytest.approx(t0 + 15.0)
    assert shifted.timeline[0]["t"] == pytest.approx(t0 + 22.0)


def test_the_summary_takes_the_worst_phase_of_each_policy() -> None:
    runs = [{"workload": "w", "policy": "slo", "phaseS": p, "attainment": a, "gpuSeconds": g}
            for p, a, g in ((0.0, 0.995, 100.0), (5.0, 0.97, 130.0), (10.0, 0.99, 90.0))]
    [s] = autoscale_phase.summarize(runs)
    assert (s["worstAttainment"], s["bestAttainment"], s["phasesAtLeast99"]) == (0.97, 0.995, 2)
    assert (s["gpuSecondsMin"], s["gpuSecondsMax"]) == (90.0, 130.0)
    table = autoscale_phase.render({"runs": runs, "summary": [s]})
    assert "| w | slo | 99.50% / 100 | 97.00% / 130 | 99.00% / 90 | 97.00% |" in table


def test_the_script_replays_a_recorded_workload_at_each_phase(tmp_path: Path) -> None:
    out = tmp_path / "phase.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--workload", "azure", "--phases", "0", "3", "--jobs", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert [(r["policy"], r["phaseS"]) for r in doc["runs"]] == [("slo", 0.0), ("slo", 3.0), ("queue", 0.0),
                                                                 ("queue", 3.0)]
    recorded = next(r for r in json.loads((ROOT / "benchmarks/results/autoscale_eval.json").read_text())["results"]
                    if r["workload"] == "azure")
    assert doc["runs"][0]["gpuSeconds"] == recorded["policies"]["slo"]["gpuSeconds"]  # phase 0: autoscale_eval's run
    assert {s["policy"] for s in doc["summary"]} == {"slo", "queue"} and doc["command"].startswith("python ")


@pytest.mark.parametrize("args,message", [(["--phases", "15"], "below the 15 s interval"),
                                          (["--workload", "nope"], "unknown workload 'nope'")])
def test_bad_arguments_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps({"results": [{"workload": "nope", "ttftSloS": 1.0, "initialReplicas": 1}]}))
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--recorded", str(recorded), "--out",
                           str(tmp_path / "o.json")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


def test_recorded_workload_names_resolve_to_their_workload_and_rate() -> None:
    assert autoscale_phase.split_rate("azure-rate3x") == ("azure", 3.0)
    assert autoscale_phase.split_rate("mooncake-rate0.5x") == ("mooncake", 0.5)
    assert autoscale_phase.split_rate("shape-periodic") == ("shape-periodic", 1.0)
    assert autoscale_phase.split_rate("azure-ratex") == ("azure-ratex", 1.0)
    shape_names = {"shape-periodic"}
    assert all(autoscale_phase.known(n, shape_names) for n in ("azure", "bursty-10x", "azure-rate2x",
                                                                "shape-periodic", "shape-periodic-rate2x"))
    assert not any(autoscale_phase.known(n, shape_names) for n in ("nope", "shape-nope", "bursty-x", "nope-rate2x"))
    w = autoscale_setup.workloads(None, quick=False, spike_factor=None)["azure"]
    scaled = autoscale_phase.workload("azure-rate2x")
    assert len(scaled.requests) == len(w.requests)
    assert scaled.requests[-1].arrival - scaled.requests[0].arrival == pytest.approx(
        (w.requests[-1].arrival - w.requests[0].arrival) / 2)


def test_trace_files_replace_the_shared_traces(tmp_path: Path) -> None:
    """`--trace FILE`, as autoscale_eval.py's: a trace outside ../shared/data/traces, by the name autoscale_eval.py
    records it under, and its rate variants; a missing file is a one-line error."""
    [name] = autoscale_setup.trace_names([HEAD300])
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps({"results": [{"workload": f"{name}-rate2x", "ttftSloS": 3.5, "initialReplicas": 1}]}))
    out = tmp_path / "phase.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(HEAD300), "--workload", f"{name}-rate2x",
                           "--phases", "0", "--jobs", "1", "--recorded", str(recorded), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [(r["workload"], r["policy"]) for r in runs] == [(f"{name}-rate2x", "slo"), (f"{name}-rate2x", "queue")]
    res, _ = autoscale_setup.run_policy(load_mooncake(HEAD300).scaled(2.0), "slo", 3.5, 1)
    assert runs[0]["gpuSeconds"] == round(res.summary["gpuSeconds"], 1)  # the file's requests, at twice their rate
    missing = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(tmp_path / "none.jsonl"), "--workload", name,
                              "--recorded", str(recorded), "--out", str(out)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode != 0 and "no trace file" in missing.stderr and "Traceback" not in missing.stderr
