"""Student-pool fallback: a pure, deterministic policy (time is passed in) shared with the simulator.

Per request `FallbackPolicy.decide` picks the primary pool or a student pool from:
  * availability: no routable primary replica -> a student pool (not capped: better than a 503), unless the
    primary scales from zero (minReplicas 0): then the rules below decide, and a request they keep on the
    primary waits for its cold start (llmfleet.router.held). With `maxQueueDelayMs` set, the predicted delay
    of a pool at zero is infinite, so requests go to a student up to the tenant's cap;
  * explicit model: a client asking for a student's served name simply gets that pool (not degraded);
  * request class in `sheddable_classes` -> a student (not capped);
  * prompt longer than `long_context_tokens` -> a student (capped);
  * SLO burn rate of the primary above `slo_burn_rate` (capped);
  * predicted primary queueing delay above `max_queue_delay_ms` (capped; `predicted_queue_delay_ms`).
"Capped": only while degrading this request keeps the tenant's degraded fraction over the window at or
below its cap (0 disables; a tenant's first request in an empty window is not held back).
Where the load rules want more of a tenant's window degraded than its cap allows, they degrade its longest prompts
and keep the rest on the primary (reason `shorter:<why>`; `TenantWindow.load_rank`): a prompt is degraded only if
at least 1 - cap of the window's prompts are no longer than it. The cap bounds how many requests the student
answers; which ones is free, and each one degraded takes its own prefill off the primary, so degrading the longest
leaves the primary the least work for the share it must keep (taken in arrival order, the requests the cap
holds back in a burst are as long as any).
The student pool is the one with the lowest predicted queueing delay (config order breaks ties), each pool's
delay from its own queue, prefill queue (at the pool's own speed: `pool_prefill_wait_ms`) and recent end-to-end
latency (`observe_student`). For the load rules
(SLO burn, queue delay) a request degrades only when that student's predicted delay is not above the primary's:
a student whose own queue is longer would answer later, and worse (reason `student-busier:<why>`; equal
delays degrade: an SLO burn with both queues empty is not a queueing problem the primary would solve).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from llmfleet.router.config import FallbackConfig, SLOConfig

P95_BUDGET = 0.05  # a p95 objective allows 5% of requests over target
# Rules that degrade because the primary is loaded: they help only if the student answers sooner.
LOAD_REASONS = ("slo-burn", "queue-delay")


@dataclass
class FallbackSignals:
    """What the policy needs to know about one pool right now."""

    name: str
    routable_replicas: int
    # requests at the pool's replicas still waiting for their first token (sum of ReplicaState.queued: the engines'
    # queues, or the router's streamed requests without a first byte when more: in prefill counts as queued)
    waiting: float = 0.0
    running: float = 0.0  # requests at the pool's replicas past their first token (sum of ReplicaState.generating)
    mean_e2e_ms: float | None = None  # recent mean end-to-end latency of the pool
    # when the least-loaded replica is through the prefill work the router has sent it, at the pool's own speed
    # (`pool_prefill_wait_ms`)
    prefill_wait_ms: float = 0.0
    scales_from_zero: bool = False  # no routable replica means a cold start, not an outage


@dataclass
class FallbackDecision:
    pool: str
    degraded: bool
    # primary | requested | unavailable | sheddable | long-context | slo-burn | queue-delay | capped:<why>
    # | student-busier:<why> | shorter:<why>
    reason: str

    @property
    def load_rule(self) -> bool:
        """A load rule (LOAD_REASONS) wanted this request degraded, whether or not it was."""
        return self.reason.rsplit(":", 1)[-1] in LOAD_REASONS


class SLOTracker:
    """Sliding window of (t, ttft_ms, tpot_ms, e2e_ms) per pool; burn rate against p95 objectives."""

    def __init__(self, slo: SLOConfig) -> None:
        self.slo = slo
        self.samples: deque[tuple[float, bool, float]] = deque()  # (t, violated, e2e_ms)

    def observe(self, now: float, ttft_ms: float | None, tpot_ms: float | None, e2e_ms: float) -> None:
        bad = (ttft_ms is not None and ttft_ms > self.slo.ttft_p95_ms) or (
            tpot_ms is not None and tpot_ms > self.slo.tpot_p95_ms
        )
        if self.slo.e2e_p99_ms is not None and e2e_ms > self.slo.e2e_p99_ms:
            bad = True
        self.samples.append((now, bad, e2e_ms))
        self._trim(now)

    def _trim(self, now: float) -> None:
        cutoff = now - self.slo.window_seconds
        while self.samples and self.samples[0][0] < cutoff:
            self.samples.popleft()

    def count(self, now: float) -> int:
        self._trim(now)
        return len(self.samples)

    def burn_rate(self, now: float) -> float:
        """Fraction of requests over objective divided by the 5% budget (1.0 = exactly on budget)."""
        self._trim(now)
        if not self.samples:
            return 0.0
        bad = sum(1 for _, b, _ in self.samples if b)
        return bad / len(self.samples) / P95_BUDGET

    def mean_e2e_ms(self, now: float) -> float | None:
        self._trim(now)
        if not self.samples:
            return None
        return sum(e for _, _, e in self.samples) / len(self.samples)


class WindowEvent(NamedTuple):
    """One request of a tenant's window."""

    t: float
    degraded: bool
    input_tokens: int
    load_rule: bool  # a load rule wanted it degraded (FallbackDecision.load_rule)


@dataclass
class TenantEvents:
    """One tenant's window: its requests in arrival order, with running counts and its prompt lengths kept sorted, so
    each question below costs a lookup (a bisection) instead of a pass over the window: under overload every request
    asks, and a window of a minute at hundreds of requests a second holds tens of thousands."""

    events: deque[WindowEvent] = field(default_factory=deque)
    degraded: int = 0
    load_rule: int = 0
    lengths: list[int] = field(default_factory=list)  # the window's prompt lengths, ascending

    def append(self, e: WindowEvent) -> None:
        self.events.append(e)
        self.degraded += e.degraded
        self.load_rule += e.load_rule
        insort(self.lengths, e.input_tokens)

    def drop_before(self, cutoff: float) -> None:
        q = self.events
        while q and q[0].t < cutoff:
            e = q.popleft()
            self.degraded -= e.degraded
            self.load_rule -= e.load_rule
            del self.lengths[bisect_left(self.lengths, e.input_tokens)]


@dataclass
class TenantWindow:
    """Per tenant: sliding window of its requests to enforce the degraded-fraction cap."""

    window_seconds: float = 60.0
    tenants: dict[str, TenantEvents] = field(default_factory=dict)

    def record(self, tenant: str, now: float, degraded: bool, input_tokens: int, load_rule: bool = False) -> None:
        self._trim(tenant, now).append(WindowEvent(now, degraded, input_tokens, load_rule))

    def _trim(self, tenant: str, now: float) -> TenantEvents:
        w = self.tenants.setdefault(tenant, TenantEvents())
        w.drop_before(now - self.window_seconds)
        return w

    def fraction(self, tenant: str, now: float) -> float:
        """Degraded fraction of the tenant's requests in the window (0 when none)."""
        w = self._trim(tenant, now)
        return w.degraded / len(w.events) if w.events else 0.0

    def fraction_if_degraded(self, tenant: str, now: float) -> float:
        """The fraction the window would hold if this request were degraded too (0 for an empty window: a
        tenant's first request may always be degraded). Checking this, not the current fraction, keeps every
        window at or below the cap once it holds requests."""
        w = self._trim(tenant, now)
        return (w.degraded + 1) / (len(w.events) + 1) if w.events else 0.0

    def load_rank(self, tenant: str, now: float, input_tokens: int) -> tuple[int, float, float]:
        """For a request a load rule wants degraded: how many requests the window holds, the share of them a load rule
        wanted degraded with this one counted, and the share whose prompts are no longer than `input_tokens` (ties
        count as shorter: a window of equal prompts ranks every one at the top)."""
        w = self._trim(tenant, now)
        n = len(w.events)
        if not n:
            return 0, 1.0, 1.0
        return n, (w.load_rule + 1) / (n + 1), bisect_right(w.lengths, input_tokens) / n


def pool_prefill_wait_ms(waits_s: Iterable[float], speedup: float = 1.0) -> float:
    """`FallbackSignals.prefill_wait_ms` of a pool: its least-loaded replica's wait (`ReplicaState.prefill_wait_s`:
    the prefill queued there at the pool's price, corrected by first bytes), over the pool's `prefill_speedup`, so
    the primary's and a student's queues compare at their own speeds."""
    return min(waits_s, default=0.0) * 1e3 / speedup


def predicted_queue_delay_ms(p: FallbackSignals) -> float:
    """The longer of two estimates, one per bottleneck: Little's law for the engine's batch slots (queued requests
    drain at `running / mean_e2e` per ms across the pool) and the router's prefill queue for its compute (the
    least-loaded replica's pending prefill work at its prefill rate; prompt-heavy bursts wait there while the batch
    has free slots)."""
    if p.routable_replicas == 0:
        return float("inf")
    if p.waiting <= 0 or p.mean_e2e_ms is None:
        return p.prefill_wait_ms
    return max(p.waiting * p.mean_e2e_ms / max(p.running, float(p.routable_replicas)), p.prefill_wait_ms)


class FallbackPolicy:
    def __init__(self, cfg: FallbackConfig, slo: SLOConfig, tenant_caps: dict[str, float] | None = None) -> None:
        self.cfg = cfg
        self.slo_tracker = SLOTracker(slo)
        self.student_trackers: dict[str, SLOTracker] = {}  # per student pool: its recent end-to-end latencies
        self.tenants = TenantWindow(slo.window_seconds)
        self.tenant_caps = tenant_caps or {}

    def predicted_delay_ms(self, now: float, pool: FallbackSignals, tracker: SLOTracker | None) -> float:
        """`predicted_queue_delay_ms` of `pool`, its mean end-to-end latency from `tracker` when the signals
        carry none."""
        if pool.mean_e2e_ms is None and tracker is not None:
            pool = replace(pool, mean_e2e_ms=tracker.mean_e2e_ms(now))
        return predicted_queue_delay_ms(pool)

    def _student(self, now: float, students: list[FallbackSignals]) -> tuple[FallbackSignals, float] | None:
        """The routable student pool with the lowest predicted delay (the first in config order on ties)."""
        best: tuple[FallbackSignals, float] | None = None
        for s in students:
            if s.routable_replicas > 0:
                ms = self.predicted_delay_ms(now, s, self.student_trackers.get(s.name))
                if best is None or ms < best[1]:
                    best = (s, ms)
        return best

    def decide(
        self,
        now: float,
        primary: FallbackSignals,
        students: list[FallbackSignals],
        tenant: str = "default",
        input_tokens: int = 0,
        request_class: str | None = None,
        requested_pool: str | None = None,
    ) -> FallbackDecision:
        """Pure given the tracker state; call `record` with the outcome so the caps see it."""
        if requested_pool is not None and requested_pool != primary.name:
            return FallbackDecision(requested_pool, False, "requested")
        best = self._student(now, students) if self.cfg.enabled else None
        if best is None:
            return FallbackDecision(primary.name, False, "primary")
        student, student_ms = best
        if primary.routable_replicas == 0 and not primary.scales_from_zero:
            return FallbackDecision(student.name, True, "unavailable")
        if request_class is not None and request_class in self.cfg.sheddable_classes:
            return FallbackDecision(student.name, True, "sheddable")
        why = self._capped_reason(now, primary, input_tokens)
        if why is None:
            # At zero replicas of a pool that scales from zero: the router holds the request for the cold start.
            return FallbackDecision(primary.name, False, "cold-start" if primary.routable_replicas == 0 else "primary")
        cap = self.tenant_caps.get(tenant, self.cfg.max_degraded_fraction)
        if cap <= 0 or self.tenants.fraction_if_degraded(tenant, now) > cap:
            return FallbackDecision(primary.name, False, f"capped:{why}")  # at zero replicas: held
        if why in LOAD_REASONS and student_ms > self.predicted_delay_ms(now, primary, self.slo_tracker):
            return FallbackDecision(primary.name, False, f"student-busier:{why}")
        if why in LOAD_REASONS and self._keep_shorter(now, tenant, input_tokens, cap):
            return FallbackDecision(primary.name, False, f"shorter:{why}")
        return FallbackDecision(student.name, True, why)

    def _keep_shorter(self, now: float, tenant: str, input_tokens: int, cap: float) -> bool:
        """The load rules want more of the tenant's window degraded than `cap` allows, and this prompt is not among
        the longest `cap` of it (module docstring). Only once the window holds `min_requests_for_burn` requests,
        the count the burn rate also waits for: a rank among fewer is noise."""
        n, wanted, no_longer = self.tenants.load_rank(tenant, now, input_tokens)
        return n >= self.cfg.min_requests_for_burn and wanted > cap and no_longer < 1 - cap

    def _capped_reason(self, now: float, primary: FallbackSignals, input_tokens: int) -> str | None:
        if self.cfg.long_context_tokens is not None and input_tokens > self.cfg.long_context_tokens:
            return "long-context"
        if (
            self.slo_tracker.count(now) >= self.cfg.min_requests_for_burn
            and self.slo_tracker.burn_rate(now) > self.cfg.slo_burn_rate
        ):
            return "slo-burn"
        if self.cfg.max_queue_delay_ms is not None:
            if self.predicted_delay_ms(now, primary, self.slo_tracker) > self.cfg.max_queue_delay_ms:
                return "queue-delay"
        return None

    def record(self, now: float, tenant: str, decision: FallbackDecision, *, input_tokens: int) -> None:
        # input_tokens has no default: a caller that left it out would rank every prompt as the shortest, silently
        self.tenants.record(tenant, now, decision.degraded, input_tokens, decision.load_rule)

    def observe_primary(self, now: float, ttft_ms: float | None, tpot_ms: float | None, e2e_ms: float) -> None:
        self.slo_tracker.observe(now, ttft_ms, tpot_ms, e2e_ms)

    def observe_student(self, pool: str, now: float, ttft_ms: float | None, tpot_ms: float | None,
                        e2e_ms: float) -> None:
        """A request student pool `pool` served ended: its latency prices that pool's queue (not the burn rate,
        which is the primary's)."""
        self.student_trackers.setdefault(pool, SLOTracker(self.slo_tracker.slo)).observe(now, ttft_ms, tpot_ms, e2e_ms)
