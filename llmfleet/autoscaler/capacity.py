"""Capacity and queueing math of the scaling policy: pure functions, no I/O.

A replica is modelled by two throughputs, measured in the tokens the engine actually computes:
prefill tokens/s (prompt tokens not served from the prefix cache) and decode tokens/s (summed over
the running batch). A request of `i` input and `o` output tokens with prefix hit rate `h` costs
`i*(1-h)/P + o/D` replica-seconds, so one replica completes `mu = 1 / that` requests per second at
the observed mix. The seed comes from the planner's roofline estimate; `learn_efficiency` corrects
it online from the tokens the replicas computed while every one of them had requests waiting all interval.

The TTFT estimate is the prefill of a mean request plus the 95th percentile of its wait for the prefills ahead
of it: a G/G/c queue with one server per replica whose service time is a request's prefill. Continuous batching
adds a new request to the next engine step beside the running decodes, so it waits for prefill work, not for whole
requests. Decode steps are memory-bound: a prefill batched into them runs on compute the decodes leave idle, so
the decodes slow the prefill server only by the time their FLOPs hold the compute units
(`rate * decode_compute_s / replicas`), not by their whole step time. The wait is M/M/c's (Erlang C), whose p95 is
`ln(C / 0.05) / (c*mu - lambda)` when the probability of waiting C exceeds 5 %, else 0, scaled by the
Allen-Cunneen factor `(1 + SCV) / 2` for prefill times whose squared coefficient of variation is SCV (Poisson
arrivals): equal prompts (SCV 0) wait half as long as M/M/c says, a heavy-tailed prompt mix (Mooncake: SCV ~4,
since attention makes a prefill grow faster than its prompt) more than twice as long. Utilization (prefill plus
decode replica-seconds per second) is capped separately (`replicas_for_ttft`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CapacitySeed:
    """Per-replica throughput before anything is learned (from the planner's roofline, or configured)."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    # The seed at another request mix (mean input tokens, mean output tokens, prefix hit rate): the planner's roofline
    # evaluated there (seeds.py). A replica's throughput depends on the mix (every decode step reads the KV of its
    # batch's whole context; a prompt's attention grows with its length), so one fixed shape mis-seeds every workload
    # whose requests are longer or shorter. None: these throughputs at any mix.
    # With a fourth argument, the sequences a full KV cache holds as measured (PoolSignals.kv_full_sequences; None: the
    # planner's own figure).
    at_mix: Callable[[float, float, float, float | None], CapacitySeed] | None = field(default=None, compare=False,
                                                                                       repr=False)
    # Decode tokens/s if the decodes' FLOPs alone held the replica (the compute they take from a prefill batched into
    # their steps; module docstring). None: decode_tokens_per_s (the whole step, as if decoding were compute-bound).
    decode_compute_tokens_per_s: float | None = None
    # r in "a prefill of L uncached tokens costs in proportion to L + r*L^2" (its causal attention): how much more a
    # long prompt's prefill costs than its length says, for the spread of prefill times (prefill_time_scv).
    prefill_attention_ratio: float = 0.0

    def for_mix(self, mean_in: float | None, mean_out: float | None, hit_rate: float | None,
                kv_sequences: float | None = None) -> CapacitySeed:
        """The seed at an observed mix (and measured KV sequences); this one where there is no mix function or the mix is
        not measured."""
        if self.at_mix is None or mean_in is None or mean_out is None:
            return self
        return self.at_mix(mean_in, mean_out, hit_rate or 0.0, kv_sequences)


DEFAULT_SEED = CapacitySeed(prefill_tokens_per_s=8000.0, decode_tokens_per_s=1500.0)


def service_seconds(seed: CapacitySeed, efficiency: float, mean_in: float, mean_out: float, hit_rate: float) -> float:
    """Replica-seconds one request of the observed mix costs (at full batch)."""
    uncached = max(mean_in, 0.0) * (1.0 - min(max(hit_rate, 0.0), 1.0))
    eff = max(efficiency, 1e-3)
    return uncached / (seed.prefill_tokens_per_s * eff) + max(mean_out, 0.0) / (seed.decode_tokens_per_s * eff)


def decode_compute_seconds(seed: CapacitySeed, efficiency: float, mean_out: float) -> float:
    """Replica-seconds the FLOPs of one request's decode hold the compute units (at full batch)."""
    tps = seed.decode_compute_tokens_per_s or seed.decode_tokens_per_s
    return max(mean_out, 0.0) / (tps * max(efficiency, 1e-3))


def prompt_length_moments(lengths: Sequence[float]) -> tuple[float, float, float, float] | None:
    """E[L], E[L^2], E[L^3], E[L^4] of prompt lengths (what `prefill_time_scv` reads; the router sums the same
    powers per request); None for no prompts."""
    if not lengths:
        return None
    m1, m2, m3, m4 = (sum(float(x) ** k for x in lengths) / len(lengths) for k in (1, 2, 3, 4))
    return m1, m2, m3, m4


def prefill_time_scv(moments: tuple[float, float, float, float] | None, attention_ratio: float,
                     hit_rate: float = 0.0) -> float:
    """Squared coefficient of variation of prefill times, from the raw moments E[L^k] (k = 1..4) of prompt lengths.

    A prompt of L tokens of which the share h is cached computes (1-h)L tokens that attend (1-h)(1+h)L^2/2
    positions: its time is proportional to L + r(1+h)L^2 (r: `CapacitySeed.prefill_attention_ratio`), whose first
    two moments follow from E[L]..E[L^4]. 1.0 (M/M/c's exponential) where the moments are not measured."""
    if moments is None:
        return 1.0
    m1, m2, m3, m4 = moments
    r = max(attention_ratio, 0.0) * (1.0 + min(max(hit_rate, 0.0), 1.0))
    mean = m1 + r * m2
    if not mean > 0:
        return 1.0
    second = m2 + 2 * r * m3 + r * r * m4
    return max(second / (mean * mean) - 1.0, 0.0)


@dataclass(frozen=True)
class RequestCost:
    """Replica-seconds of a mean request of the observed mix, as the queueing estimate reads them."""

    prefill_s: float  # its prefill: the prefill server's mean service time
    decode_s: float  # its decode at full batch
    # Of decode_s, the time its FLOPs hold the compute units (decode_compute_seconds). None: all of decode_s.
    decode_compute_s: float | None = None
    prefill_scv: float = 1.0  # squared coefficient of variation of prefill times (1: exponential, M/M/c)


def prefill_seconds(seed: CapacitySeed, efficiency: float, tokens: float, hit_rate: float) -> float:
    """Time to compute one prompt's uncached tokens on an otherwise idle replica."""
    uncached = max(tokens, 0.0) * (1.0 - min(max(hit_rate, 0.0), 1.0))
    return uncached / (seed.prefill_tokens_per_s * max(efficiency, 1e-3))


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in M/M/c with `servers` servers and offered load `offered` Erlang."""
    if servers <= 0:
        return 1.0
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    # Erlang B by the stable recurrence, then C from B.
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1.0 - b))


def wait_p95_seconds(replicas: int, rate: float, cost: RequestCost) -> float:
    """95th percentile of the wait before a request's prefill runs, for `rate` req/s on `replicas` replicas (module
    docstring); inf if overloaded."""
    if rate <= 0 or cost.prefill_s <= 0:
        return 0.0
    if replicas <= 0:
        return math.inf
    decode_compute = cost.decode_s if cost.decode_compute_s is None else cost.decode_compute_s
    share = rate * max(decode_compute, 0.0) / replicas
    if share >= 1.0:
        return math.inf
    mu_server = (1.0 - share) / cost.prefill_s
    offered = rate / mu_server
    if offered >= replicas:
        return math.inf
    c = erlang_c(replicas, offered)
    if c <= 0.05:
        return 0.0
    return (1.0 + max(cost.prefill_scv, 0.0)) / 2.0 * math.log(c / 0.05) / (replicas * mu_server - rate)


def replicas_for_ttft(rate: float, cost: RequestCost, wait_budget_s: float, max_utilization: float, upper: int) -> int:
    """Fewest replicas (<= upper) whose p95 prefill wait fits `wait_budget_s` at utilization <= max_utilization."""
    if rate <= 0:
        return 0
    total = max(cost.prefill_s, 0.0) + max(cost.decode_s, 0.0)
    if total <= 0:
        return 1
    start = max(1, math.ceil(rate * total / max_utilization))
    for n in range(start, max(upper, start) + 1):
        if wait_p95_seconds(n, rate, cost) <= wait_budget_s:
            return n
    return max(upper, start)


# Capacity learning (docs/autoscaler.md, "Capacity learning", says why each value generalizes):
# weight of one saturated interval's measurement; a few saturated intervals (~1 minute) make a measurement
LEARN_ALPHA = 0.3
# most the estimate moves in one interval, either way: a run of misread intervals cannot collapse it
MAX_STEP = 0.1
# the learned factor stays within 4x of the planner's seed either way: farther off is a wrong preset or GPU
EFFICIENCY_BOUNDS = (0.25, 4.0)
# with no saturation and TTFT headroom, a lowered estimate returns half-way to the seed per this many seconds
RECOVERY_HALF_LIFE_S = 600.0


def work_per_replica(prefill_tps: float | None, decode_tps: float | None, ready: int, seed: CapacitySeed) -> float | None:
    """Token-level work one ready replica did per second, in seed units (1.0 = exactly the seed's capacity)."""
    if ready <= 0 or prefill_tps is None or decode_tps is None:
        return None
    return (prefill_tps / seed.prefill_tokens_per_s + decode_tps / seed.decode_tokens_per_s) / ready


def learn_efficiency(
    current: float,
    work: float | None,
    *,
    saturated: bool,
    headroom: bool,
    interval_s: float,
    alpha: float = LEARN_ALPHA,
) -> float:
    """Update the capacity correction factor (learned capacity / seeded capacity) from one interval.

    `work`: token-level work per ready replica in seed units (`work_per_replica`). `saturated`: every replica
    ready for the whole interval had requests waiting all along, so the work it did IS its capacity (EWMA towards
    it). Otherwise the work is only a lower bound: the estimate rises to it when the replicas did more than
    estimated, and never falls. `headroom`: the measured TTFT left the planned headroom; then, without saturation,
    an estimate below the seed recovers towards it (half-way per RECOVERY_HALF_LIFE_S): a lowered estimate keeps
    the fleet large enough that no saturation can show it wrong, so without this it could never come back.
    Each interval moves the factor by at most MAX_STEP, within EFFICIENCY_BOUNDS.
    """
    target = current
    if work is not None and work > 0:
        if saturated:
            target = (1 - alpha) * current + alpha * work
        elif work > current:
            target = work
    if target == current and not saturated and headroom and current < 1.0:
        target = 1.0 - (1.0 - current) * 0.5 ** (max(interval_s, 0.0) / RECOVERY_HALF_LIFE_S)
    target = min(max(target, current * (1 - MAX_STEP)), current * (1 + MAX_STEP))
    return min(max(target, EFFICIENCY_BOUNDS[0]), EFFICIENCY_BOUNDS[1])


# Holt's level weight per regular sample. The smoothed level of Poisson counts has sqrt(alpha / (2 - alpha)) of
# one sample's standard deviation (the variance of an exponentially weighted mean).
LEVEL_ALPHA = 0.4
LEVEL_NOISE = math.sqrt(LEVEL_ALPHA / (2 - LEVEL_ALPHA))


@dataclass
class Holt:
    """Holt's linear (level + trend) smoothing of the arrival rate, for a short-horizon forecast."""

    level: float | None = None
    trend: float = 0.0
    last_t: float | None = None

    def update(self, t: float, value: float, alpha: float = LEVEL_ALPHA, beta: float = 0.1, weight: float = 1.0) -> None:
        """Fold in `value` measured at `t`. `weight`: how many regular samples' worth of time it was measured over
        (a decision brought forward measures over a fraction of an interval); `alpha` and `beta` are per regular
        sample and are compounded to the weight, so a sample over a third of an interval moves the level about a
        third as far, and the trend, a difference over a short time, is not read from noise."""
        if self.level is None or self.last_t is None:
            self.level, self.trend, self.last_t = value, 0.0, t
            return
        if weight != 1.0:
            w = min(max(weight, 0.0), 1.0)
            alpha, beta = 1.0 - (1.0 - alpha) ** w, 1.0 - (1.0 - beta) ** w
        dt = max(t - self.last_t, 1e-6)
        predicted = self.level + self.trend * dt
        level = alpha * value + (1 - alpha) * predicted
        self.trend = beta * (level - self.level) / dt + (1 - beta) * self.trend
        self.level, self.last_t = level, t

    def forecast(self, horizon_s: float) -> float | None:
        if self.level is None:
            return None
        return max(self.level + self.trend * max(horizon_s, 0.0), 0.0)
