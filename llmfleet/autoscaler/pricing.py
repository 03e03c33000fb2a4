"""A pool's requests priced by the capacity model at the interval's measured mix: the seed there, a request's
replica-seconds split into prefill and decode (`capacity.RequestCost`), a replica's requests per second, the TTFT
wait budget, and the smoothed spread of prefill times. Pure functions of the policy's inputs and state, shared by
`policy.py`'s primary and student sizing; no I/O.
"""

from __future__ import annotations

import math

from llmfleet.autoscaler.capacity import (
    CapacitySeed,
    RequestCost,
    decode_compute_seconds,
    prefill_seconds,
    prefill_time_scv,
    service_seconds,
)
from llmfleet.autoscaler.state import PoolState
from llmfleet.autoscaler.types import PolicyConfig, PoolBounds, PoolSignals


def seed_at_mix(pool: PoolBounds, sig: PoolSignals) -> CapacitySeed:
    """The pool's capacity seed at the interval's measured request mix (the planner's roofline there), or its
    configured seed where the mix is not measured. The learned efficiency corrects whatever the roofline misses at
    that mix, not the gap between the mix and a fixed reference shape."""
    return pool.seed.for_mix(sig.mean_input_tokens, sig.mean_output_tokens, sig.prefix_hit_rate, sig.kv_full_sequences)


def window_seconds(cfg: PolicyConfig, sig: PoolSignals) -> float:
    """Seconds the interval's rates were measured over."""
    return sig.window_s if sig.window_s is not None and sig.window_s > 0 else cfg.interval_s


def request_cost(pool: PoolBounds, st: PoolState, sig: PoolSignals, mu: float) -> RequestCost:
    """A request's replica-seconds at `mu` requests/s per replica (inf: at the interval's mix and the learned
    efficiency), split into prefill and decode at the interval's mix (the planned cost is smoothed; its split is
    the measured mix's), with its decode's compute-only time scaled alike and the pool's smoothed spread of prefill
    times (capacity.RequestCost). Without a measured mix: 512 tokens in, 128 out."""
    seed = seed_at_mix(pool, sig)
    mean_in = sig.mean_input_tokens if sig.mean_input_tokens is not None else 512.0
    mean_out = sig.mean_output_tokens if sig.mean_output_tokens is not None else 128.0
    sp = prefill_seconds(seed, st.efficiency, mean_in, sig.prefix_hit_rate or 0.0)
    sd = service_seconds(seed, st.efficiency, mean_in, mean_out, sig.prefix_hit_rate or 0.0) - sp
    dc = decode_compute_seconds(seed, st.efficiency, mean_out)
    cost = 1.0 / mu if mu > 0 and math.isfinite(mu) else sp + sd
    scale = cost / (sp + sd) if sp + sd > 0 else 1.0
    scv = st.prefill_scv.level if st.prefill_scv.level is not None else 1.0
    if sp + sd <= 0:
        return RequestCost(cost, 0.0, 0.0, scv)
    return RequestCost(sp * scale, sd * scale, dc * scale, scv)


def replica_rps(pool: PoolBounds, st: PoolState, sig: PoolSignals) -> float:
    """Requests per second one replica completes at the interval's mix."""
    c = request_cost(pool, st, sig, math.inf)
    cost = c.prefill_s + c.decode_s
    return 1.0 / cost if cost > 0 else math.inf


def planned_replica_rps(pool: PoolBounds, st: PoolState, sig: PoolSignals, *, release: bool = False,
                        evidence: bool = False) -> float:
    """A primary's capacity per replica for planning: at the smoothed cost of its request mix (`st.service`, seed
    replica-seconds per request, smoothed like the arrival rate's level), else at this interval's mix. One interval's
    mean of a heavy-tailed prompt length swings by tens of percent (Mooncake: 8k-26k tokens per 15 s); planning each
    swing would keep a replica the down-window then holds for minutes. The smoother averages about four intervals,
    the one-minute window the production signals are read over (signals.py). `release`: for a scale-down, at the
    heavier of that cost and its average over the down-window (`st.service_slow`; policy._slo_primary). `evidence`:
    for reading a burst as past the ready replicas (policy.decide), at the lighter of the two."""
    cost = st.service.level
    if (release or evidence) and cost is not None and st.service_slow.level is not None:
        cost = max(cost, st.service_slow.level) if release else min(cost, st.service_slow.level)
    if cost is None or cost <= 0:
        return replica_rps(pool, st, sig)
    return max(st.efficiency, 1e-3) / cost


def ttft_wait_budget(cfg: PolicyConfig, pool: PoolBounds, st: PoolState, sig: PoolSignals) -> float:
    """Seconds a request may wait for the prefills ahead of it: the planned fraction of the TTFT SLO less its own
    prefill at the interval's mix (at least 5 % of the SLO)."""
    slo_s = cfg.ttft_slo_ms / 1000.0
    return max(cfg.ttft_target_fraction * slo_s - request_cost(pool, st, sig, math.inf).prefill_s, 0.05 * slo_s)


def track_prefill_spread(cfg: PolicyConfig, pool: PoolBounds, st: PoolState, sig: PoolSignals) -> None:
    """Fold the interval's spread of prefill times (from its prompt-length moments) into the pool's smoothed one."""
    if sig.mean_input_tokens is None or sig.input_tokens_moments is None:
        return
    scv = prefill_time_scv((sig.mean_input_tokens, *sig.input_tokens_moments),
                           seed_at_mix(pool, sig).prefill_attention_ratio, sig.prefix_hit_rate or 0.0)
    st.prefill_scv.update(sig.now, scv, beta=0.0, weight=window_seconds(cfg, sig) / cfg.interval_s)
