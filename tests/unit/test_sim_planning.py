"""The fleet a recorded workload needs: the planner's (llmfleet.sim.planning, `llmfleet sim plan`) and the fewest
static replicas by simulation (llmfleet.sim.oracle.fewest_static, `--simulate`, `sim hindsight`'s start)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.plan.capacity import TrafficShape, replicas_needed
from llmfleet.plan.hardware import get_gpu
from llmfleet.plan.models import get_model
from llmfleet.sim.oracle import attainment, fewest_static
from llmfleet.sim.planning import minute_rates, over_slo_alone, plan_with_reuse, plan_workload
from llmfleet.sim.report import finite_cache_hit_bound
from llmfleet.sim.types import PoolSpec, SimResult
from llmfleet.sim.workload import Request, Workload

M, G = get_model("llama-3.1-8b"), get_gpu("H200")


def _w(arrivals_prompts: list[tuple[float, int]], output: int = 200) -> Workload:
    return Workload("t", [Request(i, t, p, output) for i, (t, p) in enumerate(arrivals_prompts)], block_size=16)


def test_minute_rates_count_whole_minutes_only() -> None:
    w = _w([(0.0, 100), (30.0, 100), (61.0, 100), (62.0, 100), (63.0, 100), (130.0, 100)])
    assert minute_rates(w) == [2 / 60, 3 / 60]  # minute 2 holds one request of a partial minute: not a rate
    assert minute_rates(_w([(0.0, 100), (10.0, 100)])) == [2 / 10]  # shorter than a minute: over its span
    assert minute_rates(_w([(5.0, 100)])) == [1.0]  # one request: one second
    short = plan_workload(_w([(0.0, 100), (10.0, 100)]), M, G, ttft_slo_s=1.0, tpot_slo_s=0.1)
    assert short.rate_rps == short.mean_rate_rps == pytest.approx(0.2)  # one span, one rate


def test_the_busiest_minute_and_each_prompt_are_planned_for() -> None:
    quiet = [(float(t), 2000) for t in range(0, 60, 6)]  # 10 requests in minute 0
    busy = [(60.0 + t / 20, 2000) for t in range(1200)]  # 1,200 in minute 1
    tail = [(200.0, 2000)]  # minute 3, partial
    found = plan_workload(_w(quiet + busy + tail), M, G, ttft_slo_s=1.0, tpot_slo_s=0.1)
    assert found.rate_rps == pytest.approx(20.0) and found.minutes == 3
    expected = replicas_needed(M, G, TrafficShape(2000, 200, 20.0, ttft_slo_s=1.0, tpot_slo_s=0.1), prompts=[2000] * 1211)
    assert found.plan.replicas == expected.replicas > 1
    first = plan_workload(_w(quiet + busy + tail), M, G, ttft_slo_s=1.0, tpot_slo_s=0.1, first_minute=True)
    assert first.rate_rps == pytest.approx(10 / 60) and first.requests == 10 and first.plan.replicas == 1
    # the same mean prompt, spread over short and long prompts, costs more: attention grows faster than length
    spread = [(60.0 + t / 20, 500 if t % 2 else 3500) for t in range(1200)]
    assert plan_workload(_w(quiet + spread + tail), M, G, ttft_slo_s=1.0, tpot_slo_s=0.1).plan.capacity.prefill_s > \
        found.plan.capacity.prefill_s


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no requests"):
        plan_workload(Workload("empty", [], 16), M, G, ttft_slo_s=1.0, tpot_slo_s=0.1)
    with pytest.raises(ValueError, match="hit rate"):
        plan_workload(_w([(0.0, 100)]), M, G, ttft_slo_s=1.0, tpot_slo_s=0.1, hit_rate=1.5)


def test_cli_prints_and_writes_the_plan(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:{m:02d}:{s:02d}.0000000,{1000 + 10 * s},{100}" for m in range(3) for s in range(60)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["sim", "plan", "--trace", str(trace), "--model", "llama-3.1-8b"])
    assert r.exit_code == 0, r.output
    assert "busiest minute 1.00 req/s" in r.output and ": 1 replica\n" in r.output
    r = CliRunner().invoke(app, ["sim", "plan", "--trace", str(trace), "--model", "llama-3.1-8b", "--time-scale", "30",
                                 "--json", "-"])
    doc = json.loads(r.output)
    assert doc["rateRps"] == pytest.approx(30.0, rel=0.02) and doc["replicas"] > 1 and doc["reasoning"]
    for args, msg in ((["--trace", str(tmp_path / "none.csv")], "none.csv"), (["--hit-rate", "2"], "hit rate"),
                      (["--reuse", "--hit-rate", "0.2"], "--reuse"),
                      (["--ttft-ms", "0"], "--ttft-ms"), (["--model", "nope"], "nope"),
                      (["--max-model-len", "1"], "--max-model-len")):
        r = CliRunner().invoke(app, ["sim", "plan", "--duration", "30", "--rate", "1", *args])
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("llmfleet sim: ") and msg in r.output and r.output.count("\n") == 1, r.output


def test_reuse_plans_the_smallest_fleet_consistent_with_its_own_cache() -> None:
    """Requests sharing 7 of their 8 prompt blocks: the pooled cache serves most prompt tokens, so fewer replicas."""
    shared = tuple(range(7))
    reqs = [Request(i, 60.0 + i / 40, 8 * 512, 100, keys=(*shared, 1000 + i)) for i in range(2400)]
    ends = [Request(9998, 0.0, 4096, 100, keys=(*shared, 98)), Request(9999, 200.0, 4096, 100, keys=(*shared, 99))]
    w = Workload("shared", [ends[0], *reqs, ends[1]], block_size=512)  # minute 1 holds 2,400: 40 req/s
    cold = plan_workload(w, M, G, ttft_slo_s=1.0, tpot_slo_s=0.1)
    warm = plan_with_reuse(w, M, G, ttft_slo_s=1.0, tpot_slo_s=0.1)
    assert warm.shape.prefix_hit_rate == pytest.approx(7 / 8, abs=0.01)
    assert warm.cache_blocks is not None and warm.cache_blocks % warm.plan.replicas == 0
    assert 1 <= warm.plan.replicas < cold.plan.replicas
    # minimal: one replica fewer, at the hit rate its own cache gives, would not be enough
    n = warm.plan.replicas
    if n > 1:
        fewer_blocks = warm.cache_blocks // n * (n - 1)
        hits = finite_cache_hit_bound(w, fewer_blocks, "lru")
        assert plan_workload(w, M, G, ttft_slo_s=1.0, tpot_slo_s=0.1, hit_rate=hits).plan.replicas > n - 1
    # no prefix contents: nothing to reuse, the plan is the plain one
    plain = _w([(60.0 + t / 40, 4096) for t in range(2400)] + [(200.0, 4096)])
    assert plan_with_reuse(plain, M, G, ttft_slo_s=1.0, tpot_slo_s=0.1).plan.replicas == \
        plan_workload(plain, M, G, ttft_slo_s=1.0, tpot_slo_s=0.1).plan.replicas


def _fake_run(needed: int, calls: list[int], stops: list[float | None] | None = None
              ) -> Callable[[int, float | None], SimResult]:
    """A fleet of n replicas serves n of `needed` requests' worth within the SLO (attainment n / needed, capped)."""

    def run(n: int, stop_below: float | None) -> SimResult:
        calls.append(n)
        if stops is not None:
            stops.append(stop_below)
        ok = min(n, needed)
        records = [{"ttft": 0.1 if i < ok * 100 else 5.0, "rejected": None} for i in range(needed * 100)]
        return SimResult("w", "r", records, [], [], {}, {})

    return run


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 8, 13, 40])
def test_fewest_static_finds_the_smallest_fleet_meeting_the_target(needed: int) -> None:
    calls: list[int] = []
    n, res = fewest_static(_fake_run(needed, calls), 1.0, target=1.0, upper=64)
    assert n == needed and attainment(res, 1.0) == 1.0
    assert len(calls) <= 2 * needed.bit_length() + 1  # galloping, then bisection: logarithmic
    assert all(c <= 2 * needed for c in calls)  # never replays a fleet much larger than needed


def test_fewest_static_stops_at_its_upper_bound_and_refuses_bad_input() -> None:
    calls: list[int] = []
    stops: list[float | None] = []
    n, res = fewest_static(_fake_run(100, calls, stops), 1.0, target=1.0, upper=10)
    assert n == 10 and attainment(res, 1.0) == pytest.approx(0.1)
    # Every run may stop once it cannot meet the target, but the one at the bound, returned whole as it misses.
    assert [s for c, s in zip(calls, stops, strict=True) if c < 10] == [1.0] * (len(calls) - 1)
    assert stops[calls.index(10)] is None
    with pytest.raises(ValueError, match="upper"):
        fewest_static(_fake_run(1, []), 1.0, upper=0)
    with pytest.raises(ValueError, match="target"):
        fewest_static(_fake_run(1, []), 1.0, target=1.5)


def test_cli_sizes_the_fleet_by_simulation(tmp_path: Path) -> None:
    trace = Path(__file__).parent / "sim_data" / "mooncake_head300.jsonl"
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(app, ["sim", "plan", "--trace", str(trace), "--max-requests", "80", "--model", "llama-3.1-8b",
                                 "--ttft-ms", "20000", "--simulate", "--json", str(out)])
    assert r.exit_code == 0, r.output
    sim = json.loads(out.read_text())["simulated"]
    assert sim["replicas"] >= 1 and sim["attainment"] >= 0.99 and f"simulated: {sim['replicas']} static" in r.output
    h = tmp_path / "h.json"
    r = CliRunner().invoke(app, ["sim", "hindsight", "--trace", str(trace), "--max-requests", "80", "--model",
                                 "llama-3.1-8b", "--ttft-slo-ms", "20000", "--window-s", "30", "--out", str(h)])
    assert r.exit_code == 0, r.output
    assert f"start: {sim['replicas']} static replicas" in r.output  # the same search, the same pool
    assert json.loads(h.read_text())["startReplicas"] == sim["replicas"]


def test_requests_over_the_slo_on_any_fleet_are_prefills_longer_than_it_alone() -> None:
    """A prompt whose prefill alone on an idle replica exceeds the SLO misses on any fleet; the same prompt again
    (its blocks cached) does not; a request longer than the context is not servable and not counted at all."""
    keys = tuple(range(1, 60_000 // 16 + 1))
    w = Workload("long", [Request(0, 0.0, 60_000, 10, keys), Request(1, 1.0, 60_000, 10, keys),
                          Request(2, 2.0, 500, 10), Request(3, 3.0, 9_000, 10)], block_size=16)
    pool = PoolSpec(model="llama-3.1-8b", gpu="H200", max_model_len=65_536)
    assert over_slo_alone(w, pool, 1.0) == (1, 4)
    assert over_slo_alone(w, pool, 1e6) == (0, 4)
    assert over_slo_alone(w, PoolSpec(model="llama-3.1-8b", gpu="H200", max_model_len=8_192), 1.0) == (0, 1)


def test_cli_says_how_many_requests_no_fleet_serves_in_time(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:00:{s:02d}.0000000,{60_000 if s < 3 else 1000},{100}" for s in range(60)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    r = CliRunner().invoke(app, ["sim", "plan", "--trace", str(trace), "--model", "llama-3.1-8b", "--ttft-ms", "1000"])
    assert r.exit_code == 0, r.output
    assert "over the TTFT SLO on any fleet: 3 of 60 servable requests (5.00%)" in r.output
    r = CliRunner().invoke(app, ["sim", "plan", "--trace", str(trace), "--model", "llama-3.1-8b", "--max-model-len",
                                 "8192", "--json", "-"])
    assert json.loads(r.output)["overSloAlone"] == {"requests": 0, "servable": 57}
