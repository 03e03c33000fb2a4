"""Per-replica capacity and replicas needed at an SLO, with the reasoning spelled out.

`replica_capacity` is the function the autoscaler uses to seed its per-replica throughput; the simulator
uses the same StepCostModel for every engine step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.hardware import GPUProfile
from llmfleet.plan.roofline import StepCostModel, kv_capacity


@dataclass(frozen=True)
class TrafficShape:
    """Mean request shape and arrival rate."""

    input_tokens: int = 2048
    output_tokens: int = 256
    rate_rps: float = 10.0
    prefix_hit_rate: float = 0.0  # fraction of prompt tokens served from the prefix cache
    ttft_slo_s: float = 1.0  # p95 target
    tpot_slo_s: float = 0.1  # p95 target
    # Sequences one replica's KV cache holds when full, as measured on running engines (the autoscaler's
    # PoolSignals.kv_full_sequences); None: the cache's tokens over a sequence's final context (input + output).
    kv_sequences: float | None = None


@dataclass(frozen=True)
class ReplicaCapacity:
    max_batch: int  # decode batch that meets the TPOT SLO and fits the KV cache
    batch_limited_by: str
    prefill_s: float  # one request's (uncached) prefill time on an idle replica: its latency
    prefill_batched_s: float  # what that prefill adds to the engine step of the running decodes: its throughput cost
    decode_step_s: float  # step time at max_batch
    requests_per_s: float  # sustained throughput at full utilization
    max_utilization: float  # utilization that keeps queueing within the TTFT SLO
    slo_requests_per_s: float  # requests_per_s * max_utilization
    kv_tokens: int
    reasoning: list[str] = field(default_factory=list)


def replica_capacity(m: ModelShape, gpu: GPUProfile, w: TrafficShape, *, weight_dtype: str = "bf16",
                     kv_dtype: str = "bf16", tensor_parallel: int = 1, max_num_seqs: int = 256,
                     cost: StepCostModel | None = None, prompts: Sequence[int] = ()) -> ReplicaCapacity:
    """Throughput of one replica for this workload, and the utilization at which it still meets the TTFT SLO.

    1. Decode batch B: the largest B <= max_num_seqs with step_time(B, ctx) <= TPOT SLO whose KV fits: the cache's
       tokens over a sequence's final context I + O, or `w.kv_sequences` where that was measured on running engines.
       A running sequence holds its prompt and the tokens generated so far, and concurrent requests share cached
       prompt blocks (a tenant's system prompt, a conversation's history where its turns overlap), so a full cache
       holds more sequences than its tokens over the final context. The measured figure is kept within what this
       mix allows: at least the cache's tokens over I + O/2 (a sequence sharing nothing, half-way through its
       answer), at most over (1-h)·I + O/2 (it shares every prompt token it found cached, and none it computed or
       generated). The measurement describes the sequences running now, so after a change of mix the bounds hold
       it to the arriving requests until the running ones are of the new kind.
    2. Per request the replica spends the prefill of (1-h)·I tokens once and O decode steps shared by B sequences:
       throughput = 1 / (batched prefill + O · step(B) / B). Continuous batching runs a prefill in the step of
       the running decodes, so it adds only its own FLOPs (StepCostModel.prefill_batched_time), not the overhead
       and weight read of a step of its own: a 300-token prefill alone costs ~2x that on H200.
    3. Prefill waits in an M/D/1-like queue: p95 wait ~ 3 x mean = 3·rho·P/(2(1-rho)); the largest rho with
       P + wait <= TTFT SLO (capped at 0.85) is the usable utilization.

    `prompts`: the prompt lengths of a sample of the workload's requests (a request log, a trace's first minute).
    Then P is their mean prefill, each prompt priced on its own, instead of the mean prompt's: attention makes a
    prompt's prefill grow faster than its length, so a varied mix costs more than its mean prompt (about 1.3x on
    the Mooncake traces, whose prompt lengths have a squared coefficient of variation of 1.4-1.7).
    """
    cost = cost or StepCostModel.build(m, gpu, kv_dtype=kv_dtype, weight_dtype=weight_dtype,
                                       tensor_parallel=tensor_parallel)
    ctx_tokens = w.input_tokens + w.output_tokens
    cap = kv_capacity(m, gpu, weight_dtype=weight_dtype, kv_dtype=kv_dtype, tensor_parallel=tensor_parallel,
                      tokens_per_sequence=max(1, ctx_tokens))
    mean_ctx = w.input_tokens + w.output_tokens / 2
    why: list[str] = []
    if w.kv_sequences is not None and w.kv_sequences > 0:
        own = _uncached(w.input_tokens, w.prefix_hit_rate) + w.output_tokens / 2  # not shared with any other sequence
        kv_batch = max(1, min(max(int(w.kv_sequences), int(cap.tokens // mean_ctx)), int(cap.tokens // own)))
        kv_what = f"sequences at their measured footprint ({w.kv_sequences:.0f} measured)"
    else:
        kv_batch, kv_what = max(1, cap.tokens // max(1, ctx_tokens)), f"sequences of {ctx_tokens} tokens"
    limit, limited_by = min(max_num_seqs, kv_batch), ("KV cache" if kv_batch < max_num_seqs else "max_num_seqs")
    batch = 1
    lo, hi = 1, limit
    while lo <= hi:  # step time grows with B: binary search the largest B within the TPOT SLO
        mid = (lo + hi) // 2
        if cost.decode_step_time(mid, mean_ctx) <= w.tpot_slo_s:
            batch, lo = mid, mid + 1
        else:
            hi = mid - 1
    if batch < limit:
        limited_by = "TPOT SLO"
    step = cost.decode_step_time(batch, mean_ctx)
    why.append(f"KV cache holds {cap.tokens:,} tokens = {kv_batch} {kv_what}; "
               f"decode batch {batch} (limited by {limited_by}), step {step * 1e3:.1f} ms at {mean_ctx:.0f} context")
    new_tokens = _uncached(w.input_tokens, w.prefix_hit_rate)
    prefill = cost.prefill_time(new_tokens, w.input_tokens - new_tokens)
    batched = cost.prefill_batched_time(new_tokens, w.input_tokens - new_tokens)
    why.append(f"prefill of {new_tokens} uncached tokens ({w.prefix_hit_rate:.0%} prefix hits) takes "
               f"{prefill * 1e3:.1f} ms alone, {batched * 1e3:.1f} ms in a step with the running decodes")
    if prompts:
        mean_prompt = prefill
        computed = [(_uncached(p, w.prefix_hit_rate), p) for p in prompts]
        prefill = sum(cost.prefill_time(n, max(p - n, 0)) for n, p in computed) / len(prompts)
        batched = sum(cost.prefill_batched_time(n, max(p - n, 0)) for n, p in computed) / len(prompts)
        why.append(f"the {len(prompts)} sampled prompts' prefills take {prefill * 1e3:.1f} ms on average "
                   f"({prefill / mean_prompt:.2f}x the mean prompt's), {batched * 1e3:.1f} ms batched: planned "
                   "with those")
    per_req = batched + w.output_tokens * step / batch
    rps = 1.0 / per_req
    why.append(f"GPU time per request = batched prefill + {w.output_tokens} x step/B = {per_req * 1e3:.1f} ms "
               f"-> {rps:.2f} req/s per replica at 100% busy")
    slack = w.ttft_slo_s - prefill
    if slack <= 0:
        rho = 0.05
        why.append(f"prefill alone ({prefill:.2f} s) exceeds the TTFT SLO ({w.ttft_slo_s} s): no utilization "
                   "meets it; planning at 5% (use more tensor parallelism or a shorter prompt)")
    else:
        x = 2.0 * slack / (3.0 * prefill)
        rho = min(0.85, x / (1.0 + x))
        why.append(f"TTFT budget {w.ttft_slo_s * 1e3:.0f} ms - prefill leaves {slack * 1e3:.0f} ms of queueing; "
                   f"p95 wait 3·rho·P/(2(1-rho)) fits up to rho = {rho:.2f}")
    return ReplicaCapacity(batch, limited_by, prefill, batched, step, rps, rho, rps * rho, cap.tokens, why)


def _uncached(prompt: int, hit_rate: float) -> int:
    """Tokens of a prompt the replica computes when `hit_rate` of them come from the prefix cache (at least one)."""
    return max(1, round(max(prompt, 1) * (1 - hit_rate)))


@dataclass(frozen=True)
class ReplicaPlan:
    replicas: int
    capacity: ReplicaCapacity
    reasoning: list[str]


def replicas_needed(m: ModelShape, gpu: GPUProfile, w: TrafficShape, **kwargs: object) -> ReplicaPlan:
    cap = replica_capacity(m, gpu, w, **kwargs)  # type: ignore[arg-type]
    n = max(1, math.ceil(w.rate_rps / cap.slo_requests_per_s))
    why = [*cap.reasoning,
           f"{w.rate_rps:g} req/s / ({cap.requests_per_s:.2f} x {cap.max_utilization:.2f}) per replica "
           f"= {w.rate_rps / cap.slo_requests_per_s:.2f} -> {n} replicas"]
    return ReplicaPlan(n, cap, why)
