"""Simulator: a hand-computed tiny trace, invariants (nothing lost, blocks conserved, determinism), hooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec, SimConfig, SimPoolSignals, simulate
from llmfleet.sim.replica import SimReplica
from llmfleet.sim.report import oracle_hit_rate
from llmfleet.sim.traces import load_azure, load_mooncake
from llmfleet.sim.workload import NO_BLOCKS, Request, SyntheticSpec, Workload, WorkloadError, synthetic

# the first 300 lines of the Mooncake FAST'25 synthetic trace (Apache-2.0), so CI needs no shared folder
HEAD300 = Path(__file__).parent / "sim_data" / "mooncake_head300.jsonl"
TRACE = Path(__file__).resolve().parents[3] / "shared/data/traces/mooncake_synthetic_trace.jsonl"
# step time = tokens / 1000 s: no overhead, no memory term, no attention term
UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


def _tiny() -> Workload:
    a = (1, 2, 3, 4)
    return Workload("tiny", [
        Request(0, 0.0, 16, 3, a),  # cold: 16 tokens
        Request(1, 10.0, 16, 3, (1, 2, 5, 6)),  # shares the first 2 blocks (8 tokens)
        Request(2, 20.0, 16, 1, a),  # full match, capped at 3 blocks: the last token is recomputed
    ], block_size=4)


def test_tiny_trace_by_hand() -> None:
    w = _tiny()
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, kv_blocks=100, cost=UNIT)], check_invariants=True))
    rec = {r["rid"]: r for r in res.records}
    assert [rec[i]["hitTokens"] for i in range(3)] == [0, 8, 12]
    assert res.summary["prefixHitRate"] == pytest.approx(20 / 48)
    assert oracle_hit_rate(w) == pytest.approx(20 / 48)
    # TTFT = uncached prompt tokens / 1000 tokens/s; then 2 decode steps of 1 token
    assert rec[0]["ttft"] == pytest.approx(0.016) and rec[1]["ttft"] == pytest.approx(0.008)
    assert rec[2]["ttft"] == pytest.approx(0.004) and rec[2]["e2e"] == pytest.approx(0.004)
    assert rec[0]["e2e"] == pytest.approx(0.018) and rec[1]["e2e"] == pytest.approx(0.010)
    assert res.summary["completed"] == 3 and res.summary["preemptions"] == 0


def test_batched_prefill_and_decode_run_truncation() -> None:
    # r0 decodes 100 tokens; r1 arrives mid-run and must be admitted at the next step boundary
    w = Workload("t", [Request(0, 0.0, 8, 101), Request(1, 0.0505, 8, 1)], block_size=4)
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, kv_blocks=100, cost=UNIT)], check_invariants=True))
    rec = {r["rid"]: r for r in res.records}
    # r0: prefill 8 ms, then 1 ms decode steps; r1 arrives at 50.5 ms, joins the step starting at 51 ms:
    # that step computes 8 prefill + 1 decode tokens = 9 ms -> r1's first token at 60 ms
    assert rec[1]["ttft"] == pytest.approx(0.060 - 0.0505)
    assert rec[0]["e2e"] == pytest.approx(0.008 + 100 * 0.001 + 0.008)


def test_decode_run_time_matches_step_sum() -> None:
    from llmfleet.plan.hardware import get_gpu
    from llmfleet.plan.models import get_model

    cost = StepCostModel.build(get_model("llama-3-8b"), get_gpu("H200"))
    rep = SimReplica(0, "primary", 10_000, 16, cost)
    reqs = [Request(i, 0.0, 1000 + 300 * i, 400) for i in range(40)]
    for r in reqs:
        r.replica = 0
        rep.waiting.append(r)
    t = rep.schedule(0.0)
    while rep.run is None and t is not None:  # prefill steps until a pure decode run is planned
        rep.complete(t)
        t = rep.schedule(t)
    assert rep.run is not None
    k = rep.run[1]
    b = len(rep.running)
    ctx = sum(r.tokens for r in rep.running)
    expected = sum(cost.step_time(b, ctx + b + j * b, ctx + j * b) for j in range(k))
    assert rep.run_time(k) == pytest.approx(expected, rel=1e-9)


def test_mooncake_invariants_under_preemption() -> None:
    w = load_mooncake(HEAD300).scaled(4)
    cfg = SimConfig(pools=[PoolSpec(replicas=2, kv_blocks=300, max_model_len=131072)], check_invariants=True)
    for router in ("least-request", "sglang", "llmfleet"):
        res = simulate(w, cfg, router=router)
        s = res.summary
        assert s["completed"] + s["rejected"] == 300 and s["pending"] == 0
        assert s["preemptions"] > 0
        assert all(r["ttft"] is not None and r["e2e"] >= r["ttft"] > 0 for r in res.records if r["e2e"] is not None)
    # the one empty list requests without cached blocks share stays empty; every finished request lets go of its own
    assert NO_BLOCKS == []
    assert all(r.shared is NO_BLOCKS for r in w.requests if r.finish >= 0)


def test_decode_run_after_truncation_fits_small_cache() -> None:
    # A truncated decode run leaves its requests holding blocks for steps they never took; the next run's
    # block check must count only growth (it used to net those surplus blocks off and then take too many:
    # IndexError popping the empty LRU on this workload).
    w = synthetic(SyntheticSpec(duration_s=30, rate_rps=10, tenants=4, seed=3))
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, kv_blocks=300)], check_invariants=True),
                   router="least-request")
    assert res.summary["completed"] + res.summary["rejected"] == len(w.requests)
    assert res.summary["preemptions"] > 0


def test_unchunked_prefill_needs_a_budget_that_holds_the_longest_sequence() -> None:
    # Without chunked prefill a prompt beyond the step budget could never be scheduled (it used to end in
    # "simulation lost N requests"): refused up front, as vLLM refuses max_num_batched_tokens < max_model_len.
    w = _tiny()  # longest sequence: 16 + 3 tokens
    with pytest.raises(ValueError, match="chunked prefill is off"):
        simulate(w, SimConfig(pools=[PoolSpec(replicas=1, chunked_prefill=False, max_batched_tokens=18)]))
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, chunked_prefill=False, max_batched_tokens=19)]))
    assert res.summary["completed"] == 3


def test_deterministic_under_seed() -> None:
    w = synthetic(SyntheticSpec(duration_s=60, rate_rps=15, seed=3))
    w2 = synthetic(SyntheticSpec(duration_s=60, rate_rps=15, seed=3))
    assert [(r.arrival, r.prompt_len, r.keys) for r in w.requests] == [(r.arrival, r.prompt_len, r.keys) for r in w2.requests]
    cfg = SimConfig(pools=[PoolSpec(replicas=3)], seed=7)
    for router in ("power-of-two", "llm-d", "llmfleet"):
        a, b = simulate(w, cfg, router=router), simulate(w2, cfg, router=router)
        assert a.records == b.records and a.summary == b.summary


def test_cache_aware_routing_beats_round_robin_on_hit_rate() -> None:
    w = synthetic(SyntheticSpec(duration_s=120, rate_rps=10, tenants=6, seed=1))
    cfg = SimConfig(pools=[PoolSpec(replicas=4, kv_blocks=3000)])
    rr = simulate(w, cfg, router="round-robin").summary["prefixHitRate"]
    sg = simulate(w, cfg, router="sglang").summary["prefixHitRate"]
    lf = simulate(w, cfg, router="llmfleet").summary["prefixHitRate"]
    assert sg > rr and lf > rr and lf <= oracle_hit_rate(w) + 1e-9


def test_autoscaler_hook_cold_start_and_drain() -> None:
    w = synthetic(SyntheticSpec(duration_s=300, rate_rps=5, seed=2))
    seen: list[SimPoolSignals] = []

    def scaler(now: float, sigs: list[SimPoolSignals]) -> dict[str, int]:
        seen.extend(sigs)
        return {"primary": 3 if now < 150 else 1}

    cfg = SimConfig(pools=[PoolSpec(replicas=1, min_replicas=1, max_replicas=3, cold_start_s=30, max_model_len=131072)],
                    autoscale_interval_s=15, series_interval_s=5)
    res = simulate(w, cfg, router="least-request", autoscaler=scaler)
    ready = [(s["t"], s["primary"]["ready"]) for s in res.series]
    assert max(r for _, r in ready) == 3
    assert all(r == 1 for t, r in ready if t < 15 + 30 - 1e-9)  # nothing ready before the cold start ends
    assert ready[-1][1] == 1  # drained back down
    assert seen and seen[0].pool == "primary" and seen[0].arrival_rate is not None
    # the interval's prompt-length moments, as the router's power sums give them in production
    first = [r.prompt_len for r in w.requests if seen[0].now - (seen[0].window_s or 15) <= r.arrival < seen[0].now]
    assert seen[0].mean_input_tokens == pytest.approx(sum(first) / len(first))
    assert seen[0].input_tokens_moments == pytest.approx(tuple(sum(float(p) ** k for p in first) / len(first)
                                                               for k in (2, 3, 4)))
    # the engines' queue time (arrival to the first scheduled prefill chunk): within TTFT wherever both are measured
    timed = [s for s in seen if s.queue_time_p95_ms is not None and s.ttft_p95_ms is not None]
    assert timed and all(0 <= s.queue_time_p95_ms <= s.ttft_p95_ms for s in timed)  # type: ignore[operator]
    # sequences per full cache: the running requests over the KV in use, both summed over the pool (as the gauges)
    busy = [s for s in seen if s.running and s.kv_utilization]
    assert busy and all(s.kv_full_sequences == pytest.approx(s.running / (s.kv_utilization * s.replicas))
                        for s in busy)  # type: ignore[operator]
    assert all(s.kv_full_sequences is None for s in seen if not s.kv_utilization)
    assert res.summary["completed"] == len(w.requests)
    assert res.summary["gpuSeconds"] > res.summary["durationS"]  # the extra replicas cost GPU time


@pytest.mark.parametrize("phase", [0.0, 6.5])
def test_the_autoscalers_decisions_can_be_shifted_against_the_traffic(phase: float) -> None:
    """SimConfig.autoscale_phase_s: regular decisions at phase + k x interval from the first arrival (autoscale_phase.py
    replays a workload at several phases); a shift of a whole interval or more is refused."""
    w = synthetic(SyntheticSpec(duration_s=120, rate_rps=2, seed=2))
    times: list[float] = []

    def scaler(now: float, sigs: list[SimPoolSignals]) -> dict[str, int]:
        times.append(now)
        return {"primary": 1}

    pool = PoolSpec(replicas=1, min_replicas=1, max_replicas=2, max_model_len=131072)
    simulate(w, SimConfig(pools=[pool], autoscale_interval_s=15, autoscale_phase_s=phase), autoscaler=scaler)
    t0 = min(r.arrival for r in w.requests)
    assert len(times) >= 5
    assert times[:5] == pytest.approx([t0 + phase + 15 * k for k in range(1, 6)])
    with pytest.raises(ValueError, match="autoscale_phase_s must be >= 0 and below the interval"):
        simulate(w, SimConfig(pools=[pool], autoscale_interval_s=15, autoscale_phase_s=15), autoscaler=scaler)


def test_student_pool_fallback_runs_router_code() -> None:
    w = synthetic(SyntheticSpec(duration_s=120, rate_rps=30, seed=4))
    cfg = SimConfig(pools=[PoolSpec(replicas=1, max_model_len=131072), PoolSpec(name="student", role="student", model="llama-3.2-1b",
                                                           replicas=1, max_model_len=131072)], ttft_slo_s=0.2)
    res = simulate(w, cfg, router="llmfleet")
    pools = {r["pool"] for r in res.records}
    assert pools == {"primary", "student"}
    assert 0 < res.summary["degradedFraction"] <= 0.5


def test_loaders(tmp_path: Path) -> None:
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:47.1805900,100,5\n")
    w = load_azure(p)
    assert [r.prompt_len for r in w.requests] == [374, 100] and w.requests[1].arrival == pytest.approx(0.5)
    assert w.scaled(2).requests[1].arrival == pytest.approx(0.25)
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="missing columns"):
        load_azure(tmp_path / "bad.csv")
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 1}\n')
    with pytest.raises(WorkloadError, match="bad.jsonl:1"):
        load_mooncake(tmp_path / "bad.jsonl")
    m = load_mooncake(HEAD300)
    assert len(m.requests) == 300 and m.block_size == 512
    r0 = m.requests[0]
    assert r0.prompt_len == 40160 and len(r0.keys) == 40160 // 512 and r0.arrival == 0.0
    if TRACE.exists():  # the full shared trace, where present
        assert len(load_mooncake(TRACE).requests) == 3993


def test_cli(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["sim", "run", "--duration", "30", "--rate", "5", "--replicas", "2",
                                 "--router", "round-robin", "--router", "llmfleet", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "result.json").read_text())
    assert [x["router"] for x in data["results"]] == ["round-robin", "llmfleet"]
    assert (tmp_path / "ttft_cdf.png").stat().st_size > 1000
    r = CliRunner().invoke(app, ["sim", "run", "--trace", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 2 and "missing.jsonl" in r.output
    r = CliRunner().invoke(app, ["sim", "run", "--router", "magic"])
    assert r.exit_code == 2 and "unknown router" in r.output


def test_cli_writes_result_json_and_png_plots(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmfleet.cli.main import app

    trace = Path(__file__).resolve().parent / "sim_data" / "mooncake_head300.jsonl"
    out = tmp_path / "sim"
    result = CliRunner().invoke(app, ["sim", "run", "--trace", str(trace), "--max-requests", "60",
                                      "--replicas", "2", "--router", "round-robin", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "result.json").exists()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"ttft_cdf.png", "queue.png"} <= set(pngs), pngs
    for name in ("ttft_cdf.png", "queue.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_closed_loop_turn_is_sent_its_think_time_after_the_previous_one_ends() -> None:
    """A conversation's next turn (Request.after) leaves the client its think time after the previous turn's
    answer: a slower replica sends it later. A rejected turn releases the next one too; an `after` that is not
    an earlier request is refused."""
    reqs = [Request(0, 1.0, 16, 3, (1, 2, 3, 4)),
            Request(1, 0.0, 16, 1, (1, 2, 3, 4), after=0, think=0.5),  # its arrival field is not used
            Request(2, 0.0, 400, 1, after=1, think=0.25)]  # longer than the context: rejected
    reqs.append(Request(3, 0.0, 8, 1, after=2, think=1.0))
    cost = UNIT
    pool = PoolSpec(replicas=1, kv_blocks=200, cost=cost, max_model_len=64)
    res = simulate(Workload("conv", reqs, block_size=4), SimConfig(pools=[pool], check_invariants=True))
    rec = {r["rid"]: r for r in res.records}
    end0 = rec[0]["arrival"] + rec[0]["e2e"]
    assert rec[0]["arrival"] == 1.0 and rec[0]["e2e"] > 0.016  # a 16-token prefill at 1 ms/token, then 2 steps
    assert rec[1]["arrival"] == pytest.approx(end0 + 0.5)
    assert rec[1]["hitTokens"] == 12  # the previous turn's prompt is still cached
    end1 = rec[1]["arrival"] + rec[1]["e2e"]
    assert rec[2]["rejected"] == "context" and rec[2]["arrival"] == pytest.approx(end1 + 0.25)
    assert rec[3]["arrival"] == pytest.approx(rec[2]["arrival"] + 1.0) and rec[3]["e2e"] is not None
    slow = PoolSpec(replicas=1, kv_blocks=200, cost=StepCostModel(**{**cost.__dict__, "peak_flops": 100.0}),
                    max_model_len=64)
    res_slow = simulate(Workload("conv", reqs, block_size=4), SimConfig(pools=[slow]))
    assert res_slow.records[1]["arrival"] > rec[1]["arrival"]  # 10x slower steps: the next turn leaves later
    bad = [Request(0, 0.0, 8, 1), Request(1, 0.0, 8, 1, after=1)]
    with pytest.raises(ValueError, match="earlier request"):
        simulate(Workload("bad", bad, block_size=4), SimConfig(pools=[pool]))


def test_a_run_stops_once_it_cannot_reach_the_attainment_it_was_asked_for() -> None:
    """stop_below_attainment: a fleet too small stops at its first misses past the budget (its attainment stays
    below the target, unfinished requests counted as misses); a fleet that meets the target runs exactly as
    without it."""
    from llmfleet.sim.oracle import attainment

    w = synthetic(SyntheticSpec(duration_s=300, rate_rps=20, seed=5))
    small, big = SimConfig(pools=[PoolSpec(replicas=1)], ttft_slo_s=1.0), SimConfig(pools=[PoolSpec(replicas=8)],
                                                                                     ttft_slo_s=1.0)
    whole = simulate(w, small, router="llmfleet")
    assert attainment(whole, 1.0) < 0.99 and "stopped" not in whole.summary
    cut = simulate(w, SimConfig(pools=[PoolSpec(replicas=1)], ttft_slo_s=1.0, stop_below_attainment=0.99),
                   router="llmfleet")
    assert cut.summary["stopped"] and attainment(cut, 1.0) < 0.99
    finished = sum(1 for r in cut.records if r["e2e"] is not None)
    assert finished < sum(1 for r in whole.records if r["e2e"] is not None)  # it stopped before the end
    missed = sum(1 for r in cut.records if r["ttft"] is None or r["ttft"] > 1.0)
    assert missed > 0.01 * len(w.requests) and len(cut.records) == len(w.requests)  # nothing lost
    full = simulate(w, big, router="llmfleet")
    asked = simulate(w, SimConfig(pools=[PoolSpec(replicas=8)], ttft_slo_s=1.0, stop_below_attainment=0.99),
                     router="llmfleet")
    assert attainment(full, 1.0) >= 0.99 and asked.records == full.records and asked.summary == full.summary


def test_synthetic_arrival_cv_clumps_session_starts_at_the_same_mean_rate() -> None:
    """arrival_cv 3: the gaps between single-request sessions have a coefficient of variation near 3 (gamma renewal)
    and the same mean rate as Poisson arrivals; a CV of 0 or less is refused."""
    import numpy as np

    def gaps(cv: float) -> np.ndarray:
        spec = SyntheticSpec(duration_s=4000.0, rate_rps=2.0, diurnal_amplitude=0.0, turns_mean=1.0, arrival_cv=cv,
                             seed=3)
        return np.diff([r.arrival for r in synthetic(spec).requests])

    poisson, clumped = gaps(1.0), gaps(3.0)
    assert 0.9 < poisson.std() / poisson.mean() < 1.1
    assert 2.5 < clumped.std() / clumped.mean() < 3.5
    assert abs(1.0 / clumped.mean() - 2.0) < 0.3 and abs(1.0 / poisson.mean() - 2.0) < 0.2
    with pytest.raises(ValueError, match="arrival_cv"):
        SyntheticSpec(arrival_cv=0.0)
