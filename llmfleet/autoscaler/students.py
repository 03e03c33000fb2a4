"""Student pools of the `slo` policy: how many replicas each needs, and how many primary replicas the ready ones can
stand in for.

Split out of `policy.py` (`decide` calls both); pure, mutates only the pool states it is given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from llmfleet.autoscaler.capacity import replicas_for_ttft
from llmfleet.autoscaler.pricing import replica_rps, request_cost, track_prefill_spread, ttft_wait_budget
from llmfleet.autoscaler.stabilize import cold_start_seconds
from llmfleet.autoscaler.state import PolicyState, PoolState
from llmfleet.autoscaler.types import PolicyConfig, PoolBounds, PoolSignals


def insured_from_start(st: PoolState, now: float) -> bool:
    """A student pool within the start-up insurance a service's first decision gave it (`decide`)."""
    return st.startup_until is not None and now <= st.startup_until


def size_students(
    cfg: PolicyConfig,
    students: Sequence[PoolBounds],
    signals: Mapping[str, PoolSignals],
    state: PolicyState,
    overflow: float,
    primary_sig: PoolSignals | None = None,
    ahead: Callable[[float], float] | None = None,
    primary_headroom: bool = False,
    warm_for: str | None = None,
) -> dict[str, tuple[int, list[str]]]:
    """Size student pools for the overflow, in order of preference, and for the traffic they already get.

    The overflow is primary traffic: it is costed at the primary's request mix (a student that has not
    served anything yet has no mix of its own), the student's own traffic at its own mix. `ahead(horizon)`: the
    overflow the primary's forecast predicts `horizon` seconds ahead; a student is warmed for it one of its own
    (measured) cold starts ahead, so it is ready when the burst arrives. With neither overflow nor traffic of its
    own a student pool is sized 0: it costs nothing while the primary has headroom. `warm_for`: why the first
    student pool keeps one replica warm as burst insurance (None: it does not).
    """
    out: dict[str, tuple[int, list[str]]] = {}
    remaining = overflow
    for pool in students:
        sig = signals[pool.name]
        st = state.pool(pool.name)
        if not sig.usable:
            out[pool.name] = (sig.replicas, ["metrics stale or missing: hold"])
            continue
        track_prefill_spread(cfg, pool, st, sig)
        mu = replica_rps(pool, st, sig)
        mix = sig
        if primary_sig is not None and primary_sig.mean_input_tokens is not None:
            mix = replace(sig, mean_input_tokens=primary_sig.mean_input_tokens,
                          mean_output_tokens=primary_sig.mean_output_tokens)
        mu_overflow = mu if mix is sig else replica_rps(pool, st, mix)
        own = float(sig.arrival_rate or 0.0)
        budget = ttft_wait_budget(cfg, pool, st, mix)
        predicted = ahead(cold_start_seconds(cfg, pool, st) + cfg.interval_s) if ahead is not None else 0.0
        want = max(remaining, predicted - (overflow - remaining))  # what earlier students absorb, absorbed
        need_overflow = replicas_for_ttft(want, request_cost(pool, st, mix, mu_overflow), budget, cfg.max_utilization,
                                          pool.max_replicas)
        need_own = 0 if primary_headroom else replicas_for_ttft(own, request_cost(pool, st, sig, mu), budget,
                                                                cfg.max_utilization, pool.max_replicas)
        warm = 1 if warm_for and pool is students[0] else 0
        n = min(max(need_overflow, need_own, warm), pool.max_replicas)
        absorbed = n * mu_overflow * cfg.max_utilization
        remaining = max(remaining - absorbed, 0.0)
        reason = (f"overflow {overflow:.2f}/s (forecast one student cold start ahead {predicted:.2f}/s) at "
                  f"{mu_overflow:.2f} req/s per replica, own traffic {own:.2f}/s at {mu:.2f} -> {n}")
        if warm and n == warm > max(need_overflow, need_own):
            reason += f" (kept warm {warm_for})"
        out[pool.name] = (n, [reason])
    return out


def covered_by_students(cfg: PolicyConfig, primary: PoolBounds, students: Sequence[PoolBounds],
                         signals: Mapping[str, PoolSignals], state: PolicyState, mu_primary: float,
                         recommended: Mapping[str, int]) -> int:
    """How many primary replicas the student replicas that are ready now can stand in for (stabilize's fast release):
    their spare capacity at the primary's request mix (capacity at max_utilization less the traffic they serve
    already) in primary replicas, less one. The one kept back is for the burst that may come while a released
    replica starts again: the students were warmed for overflow, and a stand-in that uses all of it leaves a
    burst right after the release to the shrunken primary alone. A student pool whose measured TTFT p95 is past the
    planned fraction of the SLO counts nothing, and so does a start-up student (policy.decide) during its insurance, or
    after it while it has served no overflow and nothing recommends it (`recommended`, this decision's raw sizes): a
    stand-in about to go would license releases it cannot cover. 0 without ready students or usable signals."""
    psig = signals[primary.name]
    if not psig.usable or mu_primary <= 0:
        return 0
    spare = 0.0
    for pool in students:
        sig = signals[pool.name]
        if not sig.usable or sig.ready_replicas <= 0:
            continue
        if sig.ttft_p95_ms is not None and sig.ttft_p95_ms > cfg.ttft_target_fraction * cfg.ttft_slo_ms:
            continue  # its own measured TTFT is past the plan: no spare capacity, whatever its model says
        st = state.pool(pool.name)
        if insured_from_start(st, sig.now) or (st.startup_until is not None and st.last_served_at is None
                                                and recommended.get(pool.name, 0) == 0):
            continue
        mix = replace(sig, mean_input_tokens=psig.mean_input_tokens, mean_output_tokens=psig.mean_output_tokens)
        spare += sig.ready_replicas * replica_rps(pool, st, mix) * cfg.max_utilization
        spare -= float(sig.arrival_rate or 0.0)
    return max(math.floor(spare / (mu_primary * cfg.max_utilization)) - 1, 0)
