"""Arrival bursts, seen by the router seconds after they start: the autoscaler's second wake-up call.

The autoscaler decides every `spec.autoscaling.intervalSeconds` (15 s by default) from rates over its last
interval. A level shift in the arrival rate just after a decision waits up to a whole interval to be seen, and
then a cold start: on a 10x step that is the difference between meeting the TTFT SLO and missing it for every
request of those seconds. The router sees every arrival at once. `ArrivalBurst` counts them per second and
compares the last `window_s` seconds with the `baseline_s` seconds before them; a count that is both
`BURST_RATIO` times the baseline's expectation and improbable under Poisson arrivals at the baseline rate
(`false_alarms_per_hour` over a test per second) opens a burst episode, which wakes the autoscaler
(llmfleet.router.held: the `/admin/held` long poll returns) so it decides now, over the seconds since its last
decision. One episode per `rearm_s` (an autoscaling interval): the decision it triggers has seen the burst, or, where
it measured the burst diluted by the seconds before it, the decision it asks for one window later (`follow_up_s`).

Pure (time is passed in), so the simulator runs the same detector as the router.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Protocol

# A rate is a burst when it is at least this multiple of the level it is compared with (the autoscaler's own
# burst rule in llmfleet.autoscaler.policy uses the same ratio): smaller steps are absorbed by the headroom the
# policy plans (TTFT target at 0.7 of the SLO, utilization at most 0.85) until the next regular decision.
BURST_RATIO = 1.5
# How many false wake-ups an hour of steady Poisson traffic may cause, at any rate. A false wake-up costs one
# decision over a few seconds' counts; the policy's own burst test then sees them too (docs/autoscaler.md).
FALSE_ALARMS_PER_HOUR = 0.25
# Seconds of arrivals the test compares with the baseline; also the least time a decision brought forward by a
# wake-up measures over (a burst that opened in those seconds is in its counts).
WINDOW_S = 3


def follow_up_s(measured_s: float | None, measured_rate: float | None, burst_rate: float) -> float | None:
    """After a decision a burst wake-up brought forward: seconds until one more decision, or None (the interval).

    The woken decision measures its rates over the seconds since the decision before it (`measured_s`, at least
    `WINDOW_S`). Long after that one, most of those seconds precede the burst: 13 s of the old rate and 1 s of a 10x
    step read as about 1.6x, which plans a fraction of the step, and the detector's rearm then keeps it quiet for an
    interval. When the rate the detector counted over its window (`burst_rate`) is `BURST_RATIO` times the rate the
    decision measured, the decision saw the burst diluted below the ratio its own burst test asks for: the next
    decision comes one detection window later, over the burst's own seconds. A rise the decision's window already
    holds at the detector's strength (a ramp; a burst soon after a decision) asks for none: an extra sample of a ramp
    only moves the smoothed level, and with it the point where the ramp reads as a level shift."""
    if measured_s is None or measured_rate is None or measured_s <= WINDOW_S:
        return None
    return float(WINDOW_S) if burst_rate >= BURST_RATIO * measured_rate else None


class MeasuredPool(Protocol):
    """What `follow_up_after` reads of one pool's signals (llmfleet.autoscaler's PoolSignals)."""

    @property
    def role(self) -> str: ...

    @property
    def window_s(self) -> float | None: ...

    @property
    def arrival_rate(self) -> float | None: ...


def follow_up_after(signals: Iterable[MeasuredPool], burst_rate: float) -> float | None:
    """`follow_up_s` of the woken decision whose signals these are: the primary's arrival rate is the service's
    demand. The one rule for `controller.autoscale_step` and the simulator's engine."""
    primary = next((s for s in signals if s.role == "primary"), None)
    return None if primary is None else follow_up_s(primary.window_s, primary.arrival_rate, burst_rate)


def poisson_sf(k: int, lam: float) -> float:
    """P(X >= k) for X ~ Poisson(lam)."""
    if k <= 0:
        return 1.0
    if lam <= 0:
        return 0.0
    log_lam = math.log(lam)

    def log_pmf(i: int) -> float:
        return i * log_lam - lam - math.lgamma(i + 1)

    if k <= lam:  # the complement's terms (i < k) rise towards the mode: sum them
        return max(1.0 - sum(math.exp(log_pmf(i)) for i in range(k)), 0.0)
    # above the mode each term is lam / i of the one before: sum the upper tail until the terms vanish
    total, log_term, i = 0.0, log_pmf(k), k
    while True:
        term = math.exp(log_term)
        total += term
        if term <= 1e-16 * total or term == 0.0:
            return min(total, 1.0)
        i += 1
        log_term += log_lam - math.log(i)


class ArrivalBurst:
    """Per-second arrival counts and the burst test over them (see the module docstring)."""

    def __init__(self, window_s: int = WINDOW_S, baseline_s: int = 60, rearm_s: float = 15.0,
                 false_alarms_per_hour: float = FALSE_ALARMS_PER_HOUR) -> None:
        if window_s < 1 or baseline_s < 1:
            raise ValueError("window_s and baseline_s must be at least 1 second")
        self.window_s, self.baseline_s, self.rearm_s = int(window_s), int(baseline_s), float(rearm_s)
        self.alpha = false_alarms_per_hour / 3600.0  # one test per second
        self.counts: deque[int] = deque(maxlen=self.window_s + self.baseline_s)  # complete seconds, oldest first
        self.second: int | None = None  # the second being counted
        self.current = 0
        self.quiet_until = -math.inf
        self.episodes = 0
        self.rate = 0.0  # arrivals per second over the window when the last episode opened

    def observe(self, now: float) -> bool:
        """Count one arrival at `now` (seconds, non-decreasing); True when it opens a burst episode."""
        sec = math.floor(now)
        fired = False
        if self.second is None:
            self.second = sec
        elif sec > self.second:
            # close the seconds that ended (empty ones included, at most a full history's worth), then test
            self.counts.append(self.current)
            for _ in range(min(sec - self.second - 1, self.counts.maxlen or 0)):
                self.counts.append(0)
            self.second, self.current = sec, 0
            fired = now >= self.quiet_until and self._test()
            if fired:
                self.quiet_until = now + self.rearm_s
                self.episodes += 1
        self.current += 1
        return fired

    def _test(self) -> bool:
        if len(self.counts) < self.window_s + self.baseline_s:
            return False  # no baseline yet: the autoscaler's first decisions come from its own interval
        counts = list(self.counts)
        recent = sum(counts[self.baseline_s:])
        # at least one request in the baseline: after a silent minute a handful of requests is a burst, one is not
        level = max(sum(counts[:self.baseline_s]), 1) / self.baseline_s
        expected = level * self.window_s
        if recent >= BURST_RATIO * expected and poisson_sf(recent, expected) < self.alpha:
            self.rate = recent / self.window_s
            return True
        return False
