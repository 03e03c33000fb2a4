"""The autoscaling benchmark's workload selection (benchmarks/autoscale_setup.py, benchmarks/autoscale_eval.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmfleet.sim.workload import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import autoscale_setup  # noqa: E402

HEAD300 = ROOT / "tests/unit/sim_data/mooncake_head300.jsonl"
SCRIPT = ROOT / "benchmarks/autoscale_eval.py"


def _azure_csv(path: Path, seconds: int) -> Path:
    rows = [f"2023-11-16 18:{m:02d}:{s:02d}.0000000,2048,100" for t in range(seconds) for m, s in [divmod(t, 60)]]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_long_trace_is_cut_to_its_first_seconds(tmp_path: Path) -> None:
    """--trace-seconds: a week-long trace is hours of simulation per policy run; its first S seconds are the workload."""
    trace = _azure_csv(tmp_path / "azure_day.csv", 600)  # one request a second for 10 minutes
    whole = autoscale_setup.workloads([trace], quick=False, spike_factor=None)["azure_day"]
    head = autoscale_setup.workloads([trace], quick=False, spike_factor=None, trace_seconds=120)["azure_day"]
    assert len(whole.requests) == 600
    assert len(head.requests) == 121  # arrivals 0..120 s after the first
    assert max(r.arrival for r in head.requests) - min(r.arrival for r in head.requests) <= 120
    with pytest.raises(WorkloadError, match="must be > 0"):
        autoscale_setup.workloads([trace], quick=False, spike_factor=None, trace_seconds=0)


def test_kv_block_size_merges_the_finer_traces_or_stops_in_one_line(tmp_path: Path) -> None:
    fine = tmp_path / "fine64.jsonl"
    recs = [json.loads(line) for line in HEAD300.read_text().splitlines() if line.strip()]
    fine.write_text("".join(json.dumps({**r, "hash_ids": [h * 8 + j for h in r["hash_ids"] for j in range(8)][
        : -(-r["input_length"] // 64)]}) + "\n" for r in recs))
    got = autoscale_setup.workloads([fine, HEAD300], quick=False, spike_factor=None, kv_block_size=256)
    assert got["fine64"].block_size == 256 and got["mooncake_head300"].block_size == 512
    r = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(fine), "--kv-block-size", "96", "--workload",
                        "fine64", "--out", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "KV block size 96 is not a multiple of the workload's 64-token blocks" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_benchmark_rejects_an_empty_trace_window_in_one_line() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--trace-seconds", "-5"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == "autoscale_eval.py: error: --trace-seconds -5: it must be > 0"


@pytest.mark.parametrize("mode", [["--slo-only"], ["--render"], ["--hindsight", "60"], ["--fleets", "2+0"],
                                  ["--queue-sweep", "1"]])
def test_a_mode_that_reads_recorded_results_names_a_missing_out_file(tmp_path: Path, mode: list[str]) -> None:
    missing = tmp_path / "none.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), *mode, "--out", str(missing)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        f"autoscale_eval.py: error: {mode[0]} reads the recorded results in --out, and {missing} does not exist: "
        "run the benchmark without it first")


def test_a_trace_of_its_own_never_takes_a_shared_traces_name(tmp_path: Path) -> None:
    """The shared traces keep their recorded short names; another file named like one (the Mooncake release's
    `mooncake_conversation_trace.jsonl`) is its own workload, so its run cannot replace the recorded `mooncake` row
    and plot of the same --out."""
    own = _azure_csv(tmp_path / "azure_llm_code_2023.csv", 60)  # the shared Azure trace's file name, elsewhere
    assert autoscale_setup.trace_name(own) == "azure_llm_code_2023"
    assert list(autoscale_setup.workloads([own], quick=False, spike_factor=None)) == ["azure_llm_code_2023"]
    for shared in sorted(autoscale_setup.TRACES.glob("*.*")) if autoscale_setup.TRACES.exists() else []:
        if shared.suffix in (".jsonl", ".csv"):
            assert autoscale_setup.trace_name(shared) == shared.stem.split("_")[0]  # mooncake, azure


def test_shared_traces_that_share_a_short_name_both_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every trace in the shared directory runs: a second file whose name starts like the first's keeps its whole
    name instead of replacing the first (a conversation trace beside the synthetic Mooncake one)."""
    shared = tmp_path / "traces"
    shared.mkdir()
    for name in ("azure_llm_code_2023.csv", "azure_llm_conv_2023.csv"):
        _azure_csv(shared / name, 10)
    monkeypatch.setattr(autoscale_setup, "TRACES", shared)
    assert list(autoscale_setup.workloads(None, quick=False, spike_factor=None)) == ["azure", "azure_llm_conv_2023"]


def test_a_file_in_the_shared_directory_that_is_no_trace_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A trace in a format the loaders do not read (a JSON array, Parquet) is named on stderr instead of passed over in
    silence; the directory's README is no trace."""
    shared = tmp_path / "traces"
    shared.mkdir()
    _azure_csv(shared / "azure_llm_code_2023.csv", 10)
    for name in ("README.md", "trace.json", "week.parquet"):
        (shared / name).write_text("x")
    monkeypatch.setattr(autoscale_setup, "TRACES", shared)
    assert list(autoscale_setup.workloads(None, quick=False, spike_factor=None)) == ["azure"]
    err = capsys.readouterr().err
    assert "not read: trace.json (a trace is .jsonl or .csv" in err and "not read: week.parquet" in err
    assert "README" not in err


def test_two_traces_with_one_name_are_a_one_line_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    traces = [_azure_csv(a / "day.csv", 10), _azure_csv(b / "day.csv", 10)]
    with pytest.raises(WorkloadError, match="both named 'day'"):
        autoscale_setup.workloads(traces, quick=False, spike_factor=None)
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--trace", str(traces[0]),
                          "--trace", str(traces[1]), "--render"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].endswith("are both named 'day': rename one")


def test_a_run_with_its_own_results_file_keeps_its_plots_beside_it(tmp_path: Path) -> None:
    """Plots go to docs/img only for the recorded results in benchmarks/results; a run on one's own trace with
    `--out elsewhere.json` writes them beside that file and leaves the documented plots alone."""
    import autoscale_eval

    assert autoscale_eval.plot_dir(ROOT / "benchmarks" / "results" / "autoscale_eval_public.json") == ROOT / "docs" / "img"
    assert autoscale_eval.plot_dir(tmp_path / "mine.json") == tmp_path.resolve()
    trace = _azure_csv(tmp_path / "plotcheck_trace.csv", 30)
    out = tmp_path / "results" / "mine.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--trace", str(trace),
                          "--workload", "plotcheck_trace", "--seeds", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (out.parent / "autoscale_eval_plotcheck_trace.png").stat().st_size > 0
    assert not (ROOT / "docs" / "img" / "autoscale_eval_plotcheck_trace.png").exists()
    result = json.loads(out.read_text())["results"][0]
    assert result["plot"] == str(out.parent.resolve() / "autoscale_eval_plotcheck_trace.png")
    assert (result["unavoidableMisses"], result["servableRequests"]) == (0, 30)  # a full run records them too


def test_hindsight_comparisons_follow_the_current_slo_rows() -> None:
    """A search is not repeated when `slo` is rerun; the comparison it stores must not keep the old `slo` row."""
    import autoscale_eval

    def entry(workload: str, slo_gpu: float) -> dict[str, object]:
        found = {"gpuSeconds": 1000.0, "sloVsHindsight": round(slo_gpu / 1000.0 - 1, 4),
                 "sloWithin15PctOfHindsight": slo_gpu <= 1150.0}
        return {"workload": workload, "slo": {"gpuSeconds": slo_gpu, "attainment": 0.99}, "withColdStart": found,
                "instant": dict(found)}

    doc = {"results": [{"workload": "a", "policies": {"slo": {"gpuSeconds": 1100.0, "attainment": 0.995}}}],
           "hindsight": {"results": [entry("a", 1300.0), entry("gone", 1300.0)]}}
    out = autoscale_eval.compare_hindsight(doc)
    a, gone = out["hindsight"]["results"]
    assert a["slo"] == {"gpuSeconds": 1100.0, "attainment": 0.995}
    for label in ("withColdStart", "instant"):
        assert a[label]["sloVsHindsight"] == 0.1 and a[label]["sloWithin15PctOfHindsight"] is True
        assert a[label]["gpuSeconds"] == 1000.0
    assert gone == entry("gone", 1300.0)


def test_a_rerun_keeps_the_recorded_order() -> None:
    import autoscale_eval

    prior = [{"workload": w, "v": 0} for w in ("mooncake", "azure", "steady-0.3", "bursty-10x")]
    fresh = [{"workload": "azure", "v": 1}, {"workload": "new", "v": 1}, {"workload": "mooncake", "v": 1}]
    merged = autoscale_eval.merge_results(prior, fresh)
    assert [r["workload"] for r in merged] == ["mooncake", "azure", "steady-0.3", "bursty-10x", "new"]
    assert [r["v"] for r in merged] == [1, 1, 0, 0, 1]


def test_misses_no_fleet_avoids_are_prefills_longer_than_the_slo_alone() -> None:
    """A prompt whose prefill alone (idle replica) exceeds the SLO is a miss on any fleet; the same prompt again,
    its blocks cached, is not; a request longer than the context is not servable, so not counted at all."""
    from llmfleet.sim.workload import Request, Workload

    keys = tuple(range(1, 100_000 // 64 + 1))
    reqs = [Request(0, 0.0, 100_000, 10, keys), Request(1, 1.0, 100_000, 10, keys), Request(2, 2.0, 500, 10),
            Request(3, 3.0, autoscale_setup.CONTEXT, 10)]
    w = Workload("long", reqs, 64)
    assert autoscale_setup.unavoidable_misses(w, 1.0) == {"unavoidableMisses": 1, "servableRequests": 3}
    assert autoscale_setup.unavoidable_misses(w, 1e6) == {"unavoidableMisses": 0, "servableRequests": 3}


def test_the_unavoidable_mode_records_them_for_the_recorded_workloads(tmp_path: Path) -> None:
    import autoscale_eval

    trace = tmp_path / "unav_trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{s:02d}.0000000,{100_000 if s % 5 == 0 else 800},20\n" for s in range(20)))
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"results": [{"workload": "unav_trace", "ttftSloS": 1.0, "kept": True}]}))
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--unavoidable", "--quick",
                          "--trace", str(trace), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (r,) = json.loads(out.read_text())["results"]
    assert r == {"workload": "unav_trace", "ttftSloS": 1.0, "kept": True, "unavoidableMisses": 4, "servableRequests": 20}
    row = {"attainment": 0.99, "misses": 5, "gpuSeconds": 10.0, "degradedFraction": 0.0, "peakPrimaryReplicas": 1}
    doc = {"results": [r | {"staticAtPeakReplicas": 1, "plannerPeakReplicas": 1, "policies": {"static-at-peak": row, "slo": row}, "targets": {}}]}
    assert ("Misses no fleet avoids (unav_trace): 4 of the 0 that 99 % of 20 servable requests allows"
            in autoscale_eval.render(doc))


def test_other_router_seeds_run_in_other_processes_with_the_same_results(tmp_path: Path) -> None:
    """`--jobs`: the runs of router seeds 1.. go to forked processes while this one searches and runs seed 0; the
    results are those of one process running everything in turn."""
    import autoscale_eval

    w = autoscale_setup.workloads([HEAD300], quick=False, spike_factor=None)["mooncake_head300"].head(120)
    one = autoscale_eval.evaluate("x", w, seeds=3, plot_it=False, jobs=0)
    two = autoscale_eval.evaluate("x", w, seeds=3, plot_it=False, jobs=2)
    assert one["policies"] == two["policies"] and one["targets"] == two["targets"]
    assert len(one["policies"]["slo"]["seeds"]["gpuSeconds"]) == 3
    assert autoscale_setup._FORKED_WORKLOAD is None  # nothing of the run outlives it
    bad = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "-1", "--no-trace"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--jobs -1: it must be >= 0" in bad.stderr


def test_student_mig_runs_the_student_on_slices_and_names_its_plots_apart(tmp_path: Path) -> None:
    """`--student-mig`: every service of the run puts its student replicas on that profile (counted at the slice's
    share of GPU-seconds, twice the replicas allowed per GPU's worth), the results say so and the plots carry the
    profile; a profile the GPU lacks is a one-line error."""
    try:
        autoscale_setup.use_student_mig("3g.71gb")
        student = autoscale_setup.service("slo", 1.0, 1).spec.fallback.pools[0]
        assert student.resources.mig_profile == "3g.71gb"
        assert student.max_replicas == 2 * autoscale_setup.STUDENT_MAX_GPUS
        assert autoscale_setup.student_hardware() == "H200 MIG 3g.71gb"
        with pytest.raises(ValueError, match="H200 has no MIG profile '1g.10gb'"):
            autoscale_setup.use_student_mig("1g.10gb")
    finally:
        autoscale_setup.use_student_mig(None)
    assert autoscale_setup.service("slo", 1.0, 1).spec.fallback.pools[0].resources.mig_profile is None
    w = autoscale_setup.workloads([HEAD300], quick=False, spike_factor=None)["mooncake_head300"].head(60)
    whole = autoscale_setup.summary_row(autoscale_setup.run_static(w, 1, 5.0, students=1), 5.0, actions=0, replicas=1)
    try:
        autoscale_setup.use_student_mig("3g.71gb")
        sliced = autoscale_setup.summary_row(autoscale_setup.run_static(w, 1, 5.0, students=1), 5.0, actions=0,
                                             replicas=1)
    finally:
        autoscale_setup.use_student_mig(None)
    # half a GPU for the student's lifetime (the run ends when its last request does: a few seconds apart)
    assert sliced["gpuSecondsByPool"]["small"] == pytest.approx(whole["gpuSecondsByPool"]["small"] / 2, rel=0.05)
    # the breakdown counts at the slice's share as well: within one 10 s sample of half a GPU (30 unscaled)
    parts = sliced["gpuSecondsBreakdown"]["small"]
    assert parts["starting"] + parts["readyBusy"] + parts["readyIdle"] == pytest.approx(
        sliced["gpuSecondsByPool"]["small"], abs=10 * 0.5)
    trace = _azure_csv(tmp_path / "migcheck.csv", 30)
    out = tmp_path / "mine.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(trace), "--workload", "migcheck", "--seeds", "1",
                          "--student-mig", "2g.35gb", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["simulated"]["student"] == "llama-3.2-1b on H200 MIG 2g.35gb"
    assert doc["results"][0]["plot"].endswith("autoscale_eval_migcheck_mig-2g.35gb.png")
    bad = subprocess.run([sys.executable, str(SCRIPT), "--no-trace", "--student-mig", "3g.40gb"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "H200 has no MIG profile '3g.40gb'" in bad.stderr


def test_the_evaluation_holds_no_two_runs_records_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run is reduced to its table row and its plot's lines when it ends: a week-long trace's runs hold gigabytes
    of per-request records each, and holding every run's (the reference fleet, the static search, the planner's
    fleet, each policy) exceeded the dev VM's memory. When a run starts, at most one earlier run (the static search's
    best so far) may still be alive."""
    import gc
    import weakref

    import autoscale_eval

    from llmfleet.sim.types import SimResult

    alive: list[weakref.ref[SimResult]] = []
    held_at_start: list[int] = []

    def tracked(run: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            gc.collect()
            held_at_start.append(sum(1 for ref in alive if ref() is not None))
            out = run(*args, **kwargs)
            alive.append(weakref.ref(out[0] if isinstance(out, tuple) else out))
            return out
        return wrapper

    monkeypatch.setattr(autoscale_eval, "run_static", tracked(autoscale_setup.run_static))
    monkeypatch.setattr(autoscale_eval, "run_policy", tracked(autoscale_setup.run_policy))
    w = autoscale_setup.workloads([_azure_csv(tmp_path / "held.csv", 60)], quick=False, spike_factor=None)["held"]
    result = autoscale_eval.evaluate("held", w, seeds=1, img_dir=tmp_path)
    assert len(held_at_start) >= 5  # the reference fleet, the static search, the planner's fleet, slo, queue
    assert max(held_at_start) <= 1, held_at_start
    assert set(result["policies"]) == {"static-at-peak", "static-planner-peak", "slo", "queue"}
    assert (tmp_path / "autoscale_eval_held.png").stat().st_size > 0


def test_forked_seed_runs_are_as_many_as_the_free_memory_holds(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Each forked run of a week-long trace holds gigabytes: by default the processes are the CPUs but one, and no
    more than fit in the free memory beside this process's own two runs; an explicit --jobs is kept."""
    monkeypatch.setattr(autoscale_setup.os, "cpu_count", lambda: 64)
    per_run = 16_800_000 * autoscale_setup.FORK_BYTES_PER_REQUEST  # a week of Azure's 2024 code release
    assert autoscale_setup.default_jobs() == 63 and autoscale_setup.default_jobs(16_800_000, None) == 63
    assert autoscale_setup.default_jobs(16_800_000, 5 * per_run) == 3  # two runs here, three forked
    assert autoscale_setup.default_jobs(16_800_000, per_run) == 0
    assert autoscale_setup.default_jobs(1000, 64 * 2**30) == 63
    assert isinstance(autoscale_setup.available_memory(), int)  # Linux: /proc/meminfo

    w = autoscale_setup.workloads([HEAD300], quick=False, spike_factor=None)["mooncake_head300"]
    monkeypatch.setattr(autoscale_setup, "available_memory", lambda: 4 * 300 * autoscale_setup.FORK_BYTES_PER_REQUEST)
    assert autoscale_setup.SeedRuns(w, None).jobs == 2
    assert "2 process(es) for the other router seeds instead of 63" in capsys.readouterr().err
    assert autoscale_setup.SeedRuns(w, 5).jobs == 5


def test_a_rerun_section_keeps_its_recorded_order(tmp_path: Path) -> None:
    """Rerunning one workload's hindsight search (or fixed fleets) replaces its result in place: the rendered
    tables keep their order, the result carries the new command, and new keys go last."""
    import autoscale_eval

    out = tmp_path / "r.json"
    rows = [{"workload": w, "windowS": 60.0, "v": 0} for w in ("a", "b", "c")]
    out.write_text(json.dumps({"hindsight": {"results": rows}}))
    autoscale_eval.merge_section(out, "hindsight", [{"workload": "b", "windowS": 60.0, "v": 1},
                                                   {"workload": "d", "windowS": 60.0, "v": 1}],
                                 lambda r: (r["workload"], r["windowS"]))
    got = json.loads(out.read_text())["hindsight"]["results"]
    assert [(r["workload"], r["v"]) for r in got] == [("a", 0), ("b", 1), ("c", 0), ("d", 1)]
    assert "command" in got[1] and "command" not in got[0]
