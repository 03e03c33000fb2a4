"""Simulator input checks: context length as the engine enforces it, clear errors for impossible fleets and
traces (one line, exit 2 from the CLI), and a fuzz test of the trace loaders (valid workload or WorkloadError)."""

from __future__ import annotations

import gzip
import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.sim.engine import simulate
from llmfleet.sim.oracle import attainment
from llmfleet.sim.traces import load_azure, load_mooncake, load_trace
from llmfleet.sim.types import PoolSpec, SimConfig
from llmfleet.sim.workload import Request, Workload, WorkloadError

HEAD300 = Path(__file__).parent / "sim_data" / "mooncake_head300.jsonl"


def _w(*reqs: Request) -> Workload:
    return Workload("t", list(reqs), block_size=16)


def test_requests_longer_than_the_context_are_rejected_and_counted() -> None:
    w = _w(Request(0, 0.0, 100, 10), Request(1, 0.1, 8000, 300), Request(2, 0.2, 50, 5))
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1)]))  # llama-3-8b: 8,192 tokens
    assert res.summary["rejected"] == 1 and res.summary["rejectedContext"] == 1
    assert res.summary["completed"] == 2
    assert [r["rejected"] for r in res.records] == [None, "context", None]
    # not servable by any fleet: not a miss of the fleet's attainment
    assert attainment(res, 10.0) == 1.0
    # a larger context (an explicit max_model_len) serves it
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, max_model_len=16384)]))
    assert res.summary["rejected"] == 0 and res.summary["completed"] == 3


def test_clipping_is_explicit_and_keeps_the_prompt_head() -> None:
    keys = tuple(range(600))  # 600 blocks of 16 tokens
    w = _w(Request(0, 0.0, 9600, 400, keys))
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1)], context_overflow="clip"))
    assert res.summary["rejected"] == 0 and res.summary["clippedContext"] == 1
    rec = res.records[0]
    assert rec["prompt"] + rec["output"] == 8192 and rec["output"] == 400
    assert w.requests[0].prompt_len == 9600  # the workload itself is untouched
    with pytest.raises(ValueError, match="context_overflow"):
        simulate(w, SimConfig(pools=[PoolSpec(replicas=1)], context_overflow="drop"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("pools", "match"), [
    ([PoolSpec(replicas=0)], "replicas must be >= 1"),
    ([PoolSpec(replicas=-2)], "replicas must be >= 1"),
    ([PoolSpec(replicas=2, min_replicas=3, max_replicas=2)], "min_replicas"),
    ([PoolSpec(replicas=1), PoolSpec(replicas=1)], "unique"),
    ([], "no pools"),
])
def test_impossible_fleets_are_refused(pools: list[PoolSpec], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        simulate(_w(Request(0, 0.0, 10, 1)), SimConfig(pools=pools))


def test_a_student_pool_may_start_at_zero() -> None:
    pools = [PoolSpec(replicas=1), PoolSpec(name="s", role="student", model="llama-3.2-1b", replicas=0, min_replicas=0)]
    assert simulate(_w(Request(0, 0.0, 10, 1)), SimConfig(pools=pools)).summary["completed"] == 1


@pytest.mark.parametrize(("req", "match"), [
    (Request(0, -1.0, 10, 1), "arrival time"),
    (Request(0, float("nan"), 10, 1), "arrival time"),
    (Request(0, 0.0, 0, 1), "lengths must be >= 1"),
    (Request(0, 0.0, 10, 0), "lengths must be >= 1"),
])
def test_bad_requests_are_refused_not_dropped(req: Request, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        simulate(_w(req), SimConfig(pools=[PoolSpec(replicas=1)]))


@pytest.mark.parametrize(("line", "match"), [
    ({"timestamp": -5, "input_length": 10, "output_length": 2}, "timestamp must be"),
    ({"timestamp": 0, "input_length": -3, "output_length": 2}, "prompt length"),
    ({"timestamp": 0, "input_length": 10, "output_length": -1}, "output length"),
    ({"timestamp": 0, "input_length": 10.5, "output_length": 1}, "whole number"),
    ({"timestamp": "x", "input_length": 10, "output_length": 1}, "timestamp must be a number"),
    ({"timestamp": 0, "input_length": 10}, "no 'output_length'"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "a"]}, "hash_ids"),
])
def test_mooncake_loader_names_the_bad_line(tmp_path: Path, line: dict[str, object], match: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 1}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(WorkloadError, match=match) as e:
        load_mooncake(p)
    assert f"{p}:2" in str(e.value)


def test_azure_loader_skips_zero_lengths_and_refuses_bad_ones(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,0,10\n")
    with pytest.raises(WorkloadError,
                       match=r"a.csv: no requests \(1 with a 0-token prompt or output in the trace, not replayed\)"):
        load_azure(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,2.5,10\n")
    with pytest.raises(WorkloadError, match=r"a.csv:2: prompt length"):
        load_azure(p)


def test_azure_loader_reads_both_releases_timestamps_as_utc(tmp_path: Path) -> None:
    """2023: 7 fractional digits, no zone; 2024 (the week-long release): 6 digits and `+00:00`. Zoneless times are
    UTC on any machine: read as local time, a DST change inside a trace would open (or fold) an hour."""
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,5,10\n"
                 "2023-11-16 18:17:05.0000000,6,10\n")
    assert [r.arrival for r in load_azure(p).requests] == pytest.approx([0.0, 1.02004])
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,5,10\n"
                 "2024-05-10 02:00:01.5+02:00,6,10\n2024-05-10 00:00:02+00:00,7,1\n")
    w = load_azure(p)
    assert [(r.arrival, r.prompt_len) for r in w.requests] == [(pytest.approx(0.0), 5), (pytest.approx(1.49007), 6),
                                                               (pytest.approx(1.99007), 7)]
    import os
    import time
    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"  # there 02:00-03:00 of 2024-03-10 does not exist: read as local time,
    time.tzset()  # the hour between these two rows would vanish
    try:
        p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-03-10 01:59:59.0,5,10\n2024-03-10 03:00:01.0,6,10\n")
        assert [r.arrival for r in load_azure(p).requests] == pytest.approx([0.0, 3602.0])
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,10\n")
    with pytest.raises(WorkloadError, match=r"a.csv:2: bad row"):
        load_azure(p)


def test_rate_scaled_variant_is_a_new_workload_with_the_same_requests_denser_or_sparser() -> None:
    w = load_mooncake(HEAD300)
    before = [(r.arrival, r.prompt_len, r.output_len, r.keys) for r in w.requests]
    for k in (2.0, 0.5):
        v = w.scaled(k)
        assert v.name == f"{w.name}x{k:g}" and v.block_size == w.block_size and len(v.requests) == len(w.requests)
        for a, b in zip(w.requests, v.requests, strict=True):
            assert b.arrival == pytest.approx(a.arrival / k)  # 0.5: arrivals twice as far apart, half the rate
            assert (b.rid, b.prompt_len, b.output_len, b.keys) == (a.rid, a.prompt_len, a.output_len, a.keys)
        assert v.duration == pytest.approx(w.duration / k)
    assert [(r.arrival, r.prompt_len, r.output_len, r.keys) for r in w.requests] == before  # pure
    turn = Workload("conv", [Request(0, 1.0, 8, 2), Request(1, 0.0, 8, 2, after=0, think=4.0)], 16).scaled(2)
    assert turn.requests[1].think == 2.0 and turn.requests[1].after == 0  # closed-loop clients think faster too


@pytest.mark.parametrize("k", [0, -1.0, float("nan"), float("inf")])
def test_a_rate_scale_that_is_not_a_finite_positive_number_is_refused(k: float) -> None:
    with pytest.raises(WorkloadError, match="rate scale must be a finite number > 0"):
        load_mooncake(HEAD300).scaled(k)


def test_cli_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "neg.jsonl"
    bad.write_text(json.dumps({"timestamp": -1000, "input_length": 10, "output_length": 1}) + "\n")
    for args in (["--replicas", "0"], ["--trace", str(bad)], ["--autoscaler", "magic"],
                 ["--student", "llama-3.2-1b:x"], ["--max-model-len", "1"], ["--time-scale", "0"],
                 ["--time-scale", "nan"], ["--trace", str(HEAD300), "--time-scale", "-2"],
                 ["--decision-phase", "3"], ["--autoscaler", "slo", "--decision-phase", "15"],
                 ["--min-replicas", "2"], ["--max-replicas", "4"],
                 ["--autoscaler", "slo", "--decision-phase", "-1"]):
        r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--rate", "2", *args])
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("llmfleet sim: ") and r.output.count("\n") == 1, r.output
    r = CliRunner().invoke(app, ["sim", "hindsight", "--start-replicas", "0"])
    assert r.exit_code == 2 and "--start-replicas" in r.output
    r = CliRunner().invoke(app, ["sim", "hindsight", "--start-replicas", "1", "--time-scale", "0"])
    assert r.exit_code == 2 and "--time-scale must be a finite number > 0" in r.output


@pytest.mark.parametrize(("command", "flag", "value"), [
    ("run", "--ttft-slo-ms", "0"), ("run", "--tpot-slo-ms", "nan"), ("run", "--tp", "0"), ("run", "--seed", "-1"),
    ("run", "--duration", "nan"), ("run", "--tenants", "0"),
    ("hindsight", "--window-s", "0"), ("hindsight", "--ttft-slo-ms", "-1"), ("hindsight", "--cold-start-s", "inf"),
    ("hindsight", "--seed", "-3"), ("plan", "--ttft-ms", "nan"), ("plan", "--tpot-ms", "0"), ("plan", "--tp", "0"),
])
def test_cli_numeric_flags_out_of_range_name_the_flag(command: str, flag: str, value: str) -> None:
    """Each gives one line naming the flag and exit 2 (before: a pydantic or numpy message that named neither the
    flag nor the value, a ZeroDivisionError traceback for --window-s 0, or nan accepted as an SLO)."""
    extra = ["--start-replicas", "1"] if command == "hindsight" else []
    r = CliRunner().invoke(app, ["sim", command, "--duration", "20", "--rate", "2", *extra, flag, value])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"llmfleet sim: {flag} must be a finite number") and r.output.count("\n") == 1, r.output


def test_cli_table_shows_rejected_requests() -> None:
    r = CliRunner().invoke(app, ["sim", "run", "--trace", str(HEAD300), "--max-requests", "40", "--replicas", "2",
                                 "--router", "least-request"])
    assert r.exit_code == 0, r.output
    n = sum(1 for x in load_mooncake(HEAD300).head(40).requests if x.prompt_len + x.output_len > 8192)
    assert n > 0 and f"{n} ({n} > context)" in r.output


def test_cli_runs_the_production_autoscaler(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "120", "--rate", "4", "--replicas", "1",
                                 "--autoscaler", "slo", "--student", "llama-3.2-1b:0", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "llmfleet + slo" in r.output and "autoscaler: peak replicas primary" in r.output
    doc = json.loads((tmp_path / "result.json").read_text())
    assert doc["autoscalerTimeline"] and {"primary", "small"} <= set(doc["autoscalerTimeline"][0])


def test_cli_decision_phase_moves_the_autoscalers_decisions(tmp_path: Path) -> None:
    """--decision-phase places the regular decisions at first arrival + phase + k x interval (15 s)."""
    times = {}
    for phase in ("0", "6"):
        out = tmp_path / phase
        r = CliRunner().invoke(app, ["sim", "run", "--duration", "120", "--rate", "4", "--replicas", "1",
                                     "--autoscaler", "slo", "--decision-phase", phase, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert ("decisions at phase 6 s" in r.output) == (phase == "6")
        times[phase] = [x["t"] for x in json.loads((out / "result.json").read_text())["autoscalerTimeline"]]
    first = times["0"][0] - 15.0  # the first arrival
    assert times["6"][:3] == pytest.approx([first + 6 + 15 * k for k in (1, 2, 3)], abs=1e-6), times


def test_cli_hindsight(tmp_path: Path) -> None:
    out = tmp_path / "h.json"
    r = CliRunner().invoke(app, ["sim", "hindsight", "--trace", str(HEAD300), "--max-requests", "60",
                                 "--max-model-len", "131072", "--start-replicas", "2", "--window-s", "30",
                                 "--ttft-slo-ms", "20000", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["attainment"] >= 0.99 and all(1 <= n <= 2 for n in doc["replicas"])


# ---- fuzz: any file gives a valid workload or a WorkloadError (a ValueError), never another exception ----

_num = st.one_of(st.integers(-10, 10**7), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                 st.none(), st.booleans())
_record = st.dictionaries(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "chat_id",
                                           "parent_chat_id", "x"]),
                          st.one_of(_num, st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=2)), max_size=4)),
                          max_size=5)
_line = st.one_of(_record.map(json.dumps), st.text(string.printable, max_size=30))
_csv_cell = st.one_of(st.integers(-3, 10**6).map(str), st.text(string.printable.replace("\n", ""), max_size=12),
                      st.sampled_from(["2023-11-16 18:17:03.9799600", "2023-11-16T18:17:04", "9999-99-99", ""]))
_csv = st.lists(st.lists(_csv_cell, min_size=0, max_size=4).map(",".join), max_size=6)


def _valid(w: Workload) -> None:
    assert w.requests
    assert all(r.arrival >= 0 and r.prompt_len >= 1 and r.output_len >= 1 for r in w.requests)
    assert [r.arrival for r in w.requests] == sorted(r.arrival for r in w.requests)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, max_size=6), raw=st.binary(max_size=20))
def test_fuzz_jsonl_loaders(tmp_path: Path, lines: list[str], raw: bytes) -> None:
    """Mooncake's and Qwen-Bailian's (a first record with `parent_chat_id`) loaders, whole and cut."""
    p = tmp_path / "f.jsonl"
    p.write_bytes("\n".join(lines).encode() + raw)
    for cut in ({}, {"seconds": 1.0}, {"requests": 2}):
        try:
            w = load_trace(p, **cut)
        except WorkloadError:
            continue
        _valid(w)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, max_size=6), raw=st.binary(max_size=20), cut_at=st.integers(0, 200))
def test_fuzz_compressed_traces(tmp_path: Path, lines: list[str], raw: bytes, cut_at: int) -> None:
    """A gzip trace, whole, cut short or with junk after it: a valid workload or a WorkloadError."""
    packed = gzip.compress("\n".join(lines).encode() + raw)
    p = tmp_path / "f.jsonl.gz"
    p.write_bytes(packed[: max(cut_at, 1)] if cut_at < len(packed) else packed + raw)
    try:
        w = load_trace(p)
    except WorkloadError:
        return
    _valid(w)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", "TIMESTAMP,ContextTokens", ""]),
       rows=_csv, raw=st.binary(max_size=12))
def test_fuzz_azure_loader(tmp_path: Path, header: str, rows: list[str], raw: bytes) -> None:
    p = tmp_path / "f.csv"
    p.write_bytes(("\n".join([header, *rows])).encode() + raw)
    try:
        w = load_trace(p)
    except WorkloadError:
        return
    _valid(w)


def test_production_adapter_maps_the_service_to_pools() -> None:
    from llmfleet.api import parse_resource
    from llmfleet.sim.production import make_service, pool_specs

    isvc = make_service(policy="queue", replicas=2, model="llama-3.1-8b", max_model_len=65536,
                        student="llama-3.2-1b", student_min=0, student_max=3)
    primary, student = pool_specs(isvc, cold_start_s={"small": 15.0})
    assert (primary.model, primary.replicas, primary.max_model_len, primary.cold_start_s) == ("llama-3.1-8b", 2,
                                                                                              65536, 60.0)
    assert (student.role, student.model, student.min_replicas, student.max_replicas, student.cold_start_s) == (
        "student", "llama-3.2-1b", 0, 3, 15.0)
    doc = isvc.model_dump(by_alias=True, exclude_none=True)
    doc["metadata"]["annotations"] = {}
    with pytest.raises(ValueError, match="no model preset"):
        pool_specs(parse_resource(doc))  # type: ignore[arg-type]


def _record_simulations(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[SimConfig]:
    """The SimConfig of every `simulate` call made through `module`'s name for it (each still runs)."""
    seen: list[SimConfig] = []
    real = module.simulate

    def recording(w: Any, cfg: SimConfig, **kw: Any) -> Any:
        seen.append(cfg)
        return real(w, cfg, **kw)

    monkeypatch.setattr(module, "simulate", recording)
    return seen


def test_cli_autoscaler_runs_the_fleet_the_engine_flags_describe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--tp, --kv-dtype, --host-kv-gib and --calibration reach the simulated fleet with --autoscaler too (they
    were dropped there: a 70B run at --tp 2 failed as if on one GPU). A KV dtype the engine has not is refused."""
    from llmfleet.sim import production

    seen = _record_simulations(monkeypatch, production)
    calibration = tmp_path / "cal.json"
    calibration.write_text(json.dumps({"overhead_s": 0.004}))
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "30", "--rate", "2", "--replicas", "1", "--autoscaler",
                                 "slo", "--model", "llama-3-70b", "--tp", "2", "--kv-dtype", "fp8", "--host-kv-gib",
                                 "100", "--calibration", str(calibration), "--student", "llama-3.2-1b:0",
                                 "--quantization", "fp8", "--max-replicas", "3"])
    assert r.exit_code == 0, r.output
    primary, student = seen[0].pools
    assert (primary.min_replicas, primary.max_replicas) == (1, 3)
    assert (primary.tensor_parallel, primary.kv_dtype, primary.host_kv_gib) == (2, "fp8", 100.0)
    assert (primary.weight_dtype, student.weight_dtype) == ("fp8", "bf16")
    assert primary.calibration == str(calibration) and primary.cost_model().overhead_s == 0.004
    assert (student.tensor_parallel, student.kv_dtype, student.host_kv_gib, student.calibration) == (1, "bf16", 0.0, None)
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--rate", "2", "--autoscaler", "slo",
                                 "--kv-dtype", "int4"])
    assert r.exit_code == 2 and r.output.startswith("llmfleet sim: --kv-dtype int4 with --autoscaler"), r.output


def test_cli_quantization_reaches_the_routers_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfleet.sim import engine

    seen = _record_simulations(monkeypatch, engine)
    for q, dtype in (("fp8", "fp8"), ("awq", "bf16")):
        r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--rate", "2", "--replicas", "1", "--router",
                                     "least-request", "--model", "llama-3-70b", "--tp", "2", "--quantization", q])
        assert r.exit_code == 0, r.output
        assert (seen[-1].pools[0].weight_dtype, seen[-1].pools[0].tensor_parallel) == (dtype, 2)
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "20", "--rate", "2", "--quantization", "int3"])
    assert r.exit_code == 2 and r.output.startswith("llmfleet sim: unknown --quantization 'int3'; known: awq"), r.output


@pytest.mark.parametrize("command", ["sim run", "sim plan", "plan"])
def test_a_tensor_parallelism_vllm_would_refuse_is_named(command: str) -> None:
    r = CliRunner().invoke(app, [*command.split(), "--tp", "3", *(["--duration", "5"] if command != "plan" else [])])
    assert r.exit_code == 2 and "--tp: 32 attention heads do not split over tensor parallelism 3" in r.output, r.output
