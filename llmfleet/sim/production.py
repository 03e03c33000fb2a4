"""An InferenceService as a simulated fleet, run by the production router, fallback and autoscaler.

    from llmfleet.sim.production import simulate_service, make_service
    isvc = make_service(policy="slo", ttft_slo_ms=2000, replicas=2, student="llama-3.2-1b")
    res, hook = simulate_service(workload, isvc)

Each pool of the service becomes a `PoolSpec` (model preset from the annotation `llmfleet.io/model-preset[.<pool>]`,
or a shape given for a pool no preset names, GPU, replicas and bounds, engine settings); the router is
`LlmfleetRouter` with the service's routing weights and the production mapping of `spec.fallback`; the autoscaler
hook calls `llmfleet.autoscaler.policy.decide` with `PolicyConfig.from_service` and the planner's capacity seeds,
every `spec.autoscaling.intervalSeconds` of simulated time (none for `static`). The same code that runs against a cluster decides here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from llmfleet.api import InferenceService, parse_resource
from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
from llmfleet.api.inferenceservice import PoolView
from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.controller import wakes_on_burst
from llmfleet.autoscaler.policy import PolicyConfig, PolicyState, decide
from llmfleet.autoscaler.seeds import seeds_for_service
from llmfleet.plan.models import kv_dtype_for, weight_dtype_for
from llmfleet.plan.pool_presets import pool_preset
from llmfleet.router.config import router_config_from_service
from llmfleet.sim.engine import simulate
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.types import PoolSpec, SimConfig, SimPoolSignals, SimResult
from llmfleet.sim.workload import Workload

# Simulated start time of a replica when neither the caller nor spec.autoscaling.coldStartSeconds sets one:
# a primary's model load + engine start (60 s, the autoscaler's own default) and a small student's (20 s).
DEFAULT_COLD_START_S: Mapping[str, float] = {"primary": 60.0, "student": 20.0}


class PolicyHook:
    """The simulator's autoscaler hook running the production policy; records every decision."""

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


def pool_model(isvc: InferenceService, pool: PoolView, shapes: Mapping[str, ModelShape] | None = None) -> str | ModelShape:
    """The model a pool serves, as the planner knows it: its preset (annotation `llmfleet.io/model-preset[.<pool>]`,
    else its Hub repository's: `plan.pool_presets.pool_preset`), else its shape in `shapes` (what its replicas would
    report from the model's config.json: the serving wrapper's llmfleet:model_shape); the simulator needs one."""
    model: str | ModelShape | None = pool_preset(isvc, pool) or (shapes or {}).get(pool.name)
    if not model:
        raise ValueError(f"pool {pool.name}: no model preset to simulate (annotation "
                         f"{MODEL_PRESET_ANNOTATION}{'' if pool.role == 'primary' else '.' + pool.name}, or an hf:// "
                         "model the planner knows) and no shape given for it")
    return model


def pool_specs(isvc: InferenceService, cold_start_s: Mapping[str, float] | None = None,
               calibration: str | None = None, shapes: Mapping[str, ModelShape] | None = None) -> list[PoolSpec]:
    """One PoolSpec per pool of the service. `cold_start_s`: simulated start time per pool name (else the spec's
    coldStartSeconds, else DEFAULT_COLD_START_S by role); `calibration`: the primary's step-time calibration
    (PoolSpec.calibration); `shapes`: the model of a pool no preset names (`pool_model`)."""
    out = []
    for p in isvc.pools():
        cold = (cold_start_s or {}).get(p.name) or isvc.spec.autoscaling.cold_start_seconds or DEFAULT_COLD_START_S[p.role]
        v = p.vllm
        out.append(PoolSpec(
            name=p.name, role=p.role, model=pool_model(isvc, p, shapes), gpu=p.resources.gpu_type or "H200",
            mig=p.resources.mig_profile,
            replicas=p.replicas, min_replicas=p.min_replicas, max_replicas=p.max_replicas,
            weight_dtype=weight_dtype_for(p.model.quantization),
            kv_dtype=kv_dtype_for(v.kv_cache_dtype), tensor_parallel=v.tensor_parallel_size,
            gpu_memory_utilization=v.gpu_memory_utilization, max_num_seqs=v.max_num_seqs or 256,
            max_batched_tokens=v.max_num_batched_tokens or 8192,
            chunked_prefill=True if v.enable_chunked_prefill is None else v.enable_chunked_prefill,
            max_model_len=p.model.max_model_len, host_kv_gib=v.kv_offload_gib or 0.0, cold_start_s=cold,
            calibration=calibration if p.role == "primary" else None))
    return out


def simulate_service(w: Workload, isvc: InferenceService, *, seed: int = 0,
                     cold_start_s: Mapping[str, float] | None = None,
                     scale_in: Literal["cache-aware", "least-loaded"] = "cache-aware",
                     context_overflow: Literal["reject", "clip"] = "reject",
                     stop_below_attainment: float | None = None,
                     decision_phase_s: float = 0.0,
                     calibration: str | None = None,
                     shapes: Mapping[str, ModelShape] | None = None,
                     reported: bool = True) -> tuple[SimResult, PolicyHook | None]:
    """Replay `w` on the service's pools with the production router, fallback and (unless the policy is `static`)
    the production autoscaler. `seed` breaks the router's ties; `stop_below_attainment` as in SimConfig;
    `decision_phase_s` shifts the autoscaler's regular decisions (SimConfig.autoscale_phase_s); `calibration` is the
    primary's step-time calibration file (docs/simulator.md); `shapes`: pool -> the model of a pool no preset
    names, which its replicas report (llmfleet's serving wrapper: `reported`) and the production autoscaler then
    seeds it from; unreported (an engine run without the wrapper), the default seed. The
    router, finding no preset, measures such a pool. Returns the result and the policy hook (its timeline of
    decisions), None for `static`."""
    auto = isvc.spec.autoscaling
    hook = None
    if auto.policy != "static":
        hook = PolicyHook(PolicyConfig.from_service(isvc, seeds=seeds_for_service(isvc, shapes if reported else None)))
    cfg = SimConfig(pools=pool_specs(isvc, cold_start_s, calibration, shapes),
                    ttft_slo_s=isvc.spec.slo.ttft_p95_ms / 1e3,
                    tpot_slo_s=isvc.spec.slo.tpot_p95_ms / 1e3, autoscale_interval_s=auto.interval_seconds,
                    autoscale_on_burst=wakes_on_burst(isvc),
                    scale_in=scale_in, seed=seed, context_overflow=context_overflow,
                    stop_below_attainment=stop_below_attainment, autoscale_phase_s=decision_phase_s)
    rc = router_config_from_service(isvc, endpoints={})  # the production mapping of spec.router and spec.fallback
    router = LlmfleetRouter(weights=dict(isvc.spec.router.scorers), fallback=rc.fallback, seed=seed,
                            measure_prefill_rate=rc.measure_prefill_rate, sole_holder_discount=rc.sole_holder_discount,
                            eviction_cost=rc.eviction_cost,
                            pool_prefill_rates={p.name: p.prefill_tokens_per_s for p in rc.pools if p.prefill_tokens_per_s},
                            pool_prefill_speedups={p.name: p.prefill_speedup for p in rc.pools})
    return simulate(w, cfg, router=router, autoscaler=hook), hook


@dataclass(frozen=True)
class Fallback:
    """Router fallback thresholds of `make_service` (spec.fallback): degrade to the student when the predicted
    primary queueing delay exceeds `queue_delay_fraction` of the TTFT SLO or the primary burns its SLO budget
    faster than `burn_rate`, up to `max_degraded` of a tenant's requests per window."""

    queue_delay_fraction: float = 0.5
    max_degraded: float = 0.65
    burn_rate: float = 2.0


def make_service(*, policy: str = "slo", ttft_slo_ms: float = 2000.0, tpot_slo_ms: float = 100.0, replicas: int = 1,
                 model: str | None = "llama-3-8b", gpu: str = "H200", min_replicas: int = 1, max_replicas: int = 64,
                 max_model_len: int | None = None, quantization: str | None = None, tensor_parallel: int = 1,
                 kv_cache_dtype: str = "auto",
                 kv_offload_gib: float | None = None, student: str | ModelShape | None = None, student_min: int = 0,
                 student_max: int = 8, student_max_model_len: int | None = None, student_mig: str | None = None,
                 fallback: Fallback | None = Fallback(),
                 target_queue_depth: float | None = None, name: str = "sim") -> InferenceService:
    """An InferenceService for the simulator: the primary serves preset `model` (None: a model no preset names,
    from /models/primary; `simulate_service`'s `shapes` gives its shape) (its weights quantized by
    `quantization`, model.quantization) on `tensor_parallel` GPUs per replica (its vllm.kvCacheDtype and
    kvOffloadGiB as given); `student` adds a one-GPU burst-capacity student pool `small` of that preset (a shape:
    a model no preset names, which `shapes` gives too) (`student_min` kept warm; 0 = scale to zero), with
    `fallback`'s router thresholds, each student replica on one MIG instance of profile `student_mig` when given.
    Validated like any InferenceService (a bad value is a ValueError)."""
    ann = {MODEL_PRESET_ANNOTATION: model} if model else {}
    fb: dict[str, Any] = {}
    if student:
        if isinstance(student, str):  # a preset; a shape (a model no preset names) is simulate_service's `shapes`
            ann[f"{MODEL_PRESET_ANNOTATION}.small"] = student
        smodel: dict[str, Any] = {"path": f"/models/{student if isinstance(student, str) else 'student'}"} | (
            {"maxModelLen": student_max_model_len} if student_max_model_len else {})
        # its own engine arguments (the defaults): the primary's tensor parallelism and KV tier are not the student's
        pool: dict[str, Any] = {"name": "small", "model": smodel, "vllm": {}, "replicas": student_min,
                                "minReplicas": student_min, "maxReplicas": student_max,
                                "resources": {"gpus": 1, "gpuType": gpu} | (
                                    {"migProfile": student_mig} if student_mig else {})}
        fb["pools"] = [pool]
        if fallback is not None:
            fb |= {"maxQueueDelayMs": ttft_slo_ms * fallback.queue_delay_fraction,
                   "maxDegradedFraction": fallback.max_degraded, "sloBurnRate": fallback.burn_rate}
    spec: dict[str, Any] = {
        "model": {"path": f"/models/{model or 'primary'}"} | ({"maxModelLen": max_model_len} if max_model_len else {})
        | ({"quantization": quantization} if quantization else {}),
        "replicas": replicas, "minReplicas": min_replicas,
        "maxReplicas": max_replicas, "resources": {"gpus": tensor_parallel, "gpuType": gpu},
        "vllm": {"tensorParallelSize": tensor_parallel, "kvCacheDtype": kv_cache_dtype}
        | ({"kvOffloadGiB": kv_offload_gib} if kv_offload_gib else {}),
        "slo": {"ttftP95Ms": ttft_slo_ms, "tpotP95Ms": tpot_slo_ms},
        "autoscaling": {"policy": policy} | ({"targetQueueDepth": target_queue_depth}
                                              if target_queue_depth is not None else {}),
        "fallback": fb,
    }
    isvc = parse_resource({"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
                           "metadata": {"name": name, "annotations": ann}, "spec": spec})
    if not isinstance(isvc, InferenceService):
        raise TypeError("expected an InferenceService")
    return isvc
