"""The simulated fleet, service and policy hook shared by the autoscaler benchmark's runs (autoscale_eval.py).

The primary pool (llama-3-8b on H200, 60 s cold start) and the student pool (llama-3.2-1b, 20 s, burst capacity),
the InferenceService the policies read their configuration from, and one run of a policy or a static fleet.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from llmfleet.api import InferenceService, parse_resource
from llmfleet.autoscaler.policy import PolicyConfig, PolicyState, decide
from llmfleet.autoscaler.seeds import seeds_for_service
from llmfleet.router.config import router_config_from_service
from llmfleet.sim.engine import PoolSpec, SimConfig, SimPoolSignals, SimResult, simulate
from llmfleet.sim.oracle import attainment as ttft_attainment  # requests within the TTFT SLO / all
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.workload import SyntheticSpec, Workload, load_mooncake, synthetic

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "data" / "traces" / "mooncake_synthetic_trace.jsonl"
PRIMARY_MODEL, STUDENT_MODEL, GPU = "llama-3-8b", "llama-3.2-1b", "H200"
PRIMARY_COLD_S, STUDENT_COLD_S, MAX_REPLICAS = 60.0, 20.0, 64
# Router fallback thresholds of the burst configuration (see service()). The degraded-fraction cap: during
# the first primary cold start after a 4-10x jump the ready primary replicas carry about a third of the demand,
# so a tenant's traffic must be allowed onto the student up to about two thirds over the 60 s window (swept
# 0.5-0.7 on both workloads and a 5x spike; docs/benchmarks/autoscale_eval.md).
FALLBACK_QUEUE_DELAY_FRACTION, FALLBACK_MAX_DEGRADED, FALLBACK_BURN_RATE = 0.5, 0.65, 2.0
STUDENT_WARM = 1  # student replicas kept warm (minReplicas of the student pool)
# Router seeds per policy run. The seed only breaks routing ties, yet on the Mooncake trace it moves `slo`'s
# misses between 18 and 50 (a different replica per request changes what the policy sees next): one seed is
# one sample, so the results carry all of them.
ROUTER_SEEDS = 5


def service(policy: str, ttft_slo_s: float, replicas: int, burst: bool = True,
            target_queue_depth: float | None = None) -> InferenceService:
    """The InferenceService the autoscaler reads its configuration from (spec defaults for autoscaling).

    `burst`: the student pool is burst capacity: one replica kept warm, and the router falls back to it as
    soon as the predicted primary queueing delay exceeds half the TTFT SLO or the primary burns its SLO
    budget (up to FALLBACK_MAX_DEGRADED of a tenant's traffic per window).
    """
    fallback: dict[str, Any] = {"pools": [{"name": "small", "model": {"path": "/models/small"}, "replicas": 0,
                                           "minReplicas": STUDENT_WARM if burst else 0, "maxReplicas": 8,
                                           "resources": {"gpus": 1, "gpuType": GPU}}]}
    if burst:
        fallback |= {"maxQueueDelayMs": ttft_slo_s * 1000.0 * FALLBACK_QUEUE_DELAY_FRACTION,
                     "maxDegradedFraction": FALLBACK_MAX_DEGRADED, "sloBurnRate": FALLBACK_BURN_RATE}
    doc = {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "bench", "annotations": {"llmfleet.io/model-preset": PRIMARY_MODEL,
                                                      "llmfleet.io/model-preset.small": STUDENT_MODEL}},
        "spec": {
            "model": {"path": "/models/primary"}, "replicas": replicas, "minReplicas": 1, "maxReplicas": MAX_REPLICAS,
            "resources": {"gpus": 1, "gpuType": GPU},
            "slo": {"ttftP95Ms": ttft_slo_s * 1000.0, "tpotP95Ms": 100.0},
            "autoscaling": {"policy": policy} | ({"targetQueueDepth": target_queue_depth}
                                                  if target_queue_depth is not None else {}),
            "fallback": fallback,
        },
    }
    isvc = parse_resource(doc)
    if not isinstance(isvc, InferenceService):
        raise TypeError("expected an InferenceService")
    return isvc


class PolicyHook:
    """Adapter from the simulator's autoscaler hook to the pure policy; records every decision."""

    def __init__(self, cfg: PolicyConfig) -> None:
        self.cfg, self.state = cfg, PolicyState()
        self.timeline: list[dict[str, Any]] = []
        self.actions = 0

    def __call__(self, now: float, sigs: list[SimPoolSignals]) -> dict[str, int]:
        d = decide(self.cfg, sigs, self.state)
        self.state = d.state
        self.actions += sum(1 for p in d.pools.values() if p.desired != p.current)
        self.timeline.append({"t": now, **{n: p.desired for n, p in d.pools.items()},
                              "why": {n: "; ".join(p.reasons) for n, p in d.pools.items()}})
        return d.desired()


def pools(primary_replicas: int, with_student: bool, student_min: int = 0) -> list[PoolSpec]:
    out = [PoolSpec(name="primary", role="primary", model=PRIMARY_MODEL, gpu=GPU, replicas=primary_replicas,
                    min_replicas=1, max_replicas=MAX_REPLICAS, cold_start_s=PRIMARY_COLD_S)]
    if with_student:
        out.append(PoolSpec(name="small", role="student", model=STUDENT_MODEL, gpu=GPU, replicas=student_min,
                            min_replicas=student_min,
                            max_replicas=8, cold_start_s=STUDENT_COLD_S))
    return out


def run_static(w: Workload, n: int, slo_s: float) -> SimResult:
    cfg = SimConfig(pools=pools(n, with_student=False), ttft_slo_s=slo_s)
    return simulate(w, cfg, router=LlmfleetRouter())


def run_policy(w: Workload, policy: str, slo_s: float, initial: int, burst: bool = True,
               target_queue_depth: float | None = None, seed: int = 0,
               scale_in: Literal["cache-aware", "least-loaded"] = "cache-aware") -> tuple[SimResult, PolicyHook]:
    """`seed`: the router's tie-breaking seed (the only randomness: a different seed is another run of the
    same system; the policies' outcomes on a trace depend on it, see ROUTER_SEEDS)."""
    isvc = service(policy, slo_s, initial, burst, target_queue_depth)
    hook = PolicyHook(PolicyConfig.from_service(isvc, seeds=seeds_for_service(isvc)))
    cfg = SimConfig(pools=pools(initial, with_student=True, student_min=isvc.spec.fallback.pools[0].min_replicas),
                    ttft_slo_s=slo_s, autoscale_interval_s=isvc.spec.autoscaling.interval_seconds, scale_in=scale_in,
                    seed=seed)
    fb = router_config_from_service(isvc, endpoints={}).fallback  # the production mapping of spec.fallback
    return simulate(w, cfg, router=LlmfleetRouter(fallback=fb, seed=seed), autoscaler=hook), hook


def summary_row(res: SimResult, slo_s: float, *, actions: int, replicas: int) -> dict[str, Any]:
    att = ttft_attainment(res, slo_s)
    return {"attainment": round(att, 5), "misses": sum(1 for r in res.records if r["ttft"] is None or r["ttft"] > slo_s),
            "gpuSeconds": round(res.summary["gpuSeconds"], 1),
            "degradedFraction": round(res.summary["degradedFraction"], 4), "scalingActions": actions,
            "peakPrimaryReplicas": replicas, "ttftP95S": res.summary["ttft"]["p95"],
            "ttftP99S": res.summary["ttft"]["p99"]}


def workloads(trace: Path | None, quick: bool, spike_factor: float = 10.0) -> dict[str, Workload]:
    """The spike workload, preceded by the trace unless `trace` is None (not asked for)."""
    spike = SyntheticSpec(duration_s=1200.0 if quick else 2400.0, rate_rps=12.0, diurnal_amplitude=0.0,
                          bursts=[(600.0, 300.0, spike_factor)], seed=1)
    out = {f"bursty-{spike_factor:g}x": synthetic(spike)}
    if trace is not None and trace.exists():
        out = {"mooncake": load_mooncake(trace), **out}
    elif trace is not None:
        print(f"trace {trace} not found: skipping it", file=sys.stderr)
    return out
