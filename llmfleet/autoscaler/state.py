"""The autoscaler's memory across decisions, and what of it survives a restart (an annotation).

Split out of `policy.py` (which re-exports both classes); pure data, no I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmfleet.autoscaler.capacity import Holt

Action = Literal["up", "down", "hold"]


@dataclass
class PoolState:
    """Memory of one pool across decisions."""

    history: list[tuple[float, int]] = field(default_factory=list)  # (time, raw recommendation)
    ttft_history: list[tuple[float, float]] = field(default_factory=list)  # (time, measured TTFT p95 ms)
    last_action_at: float | None = None
    last_action: Action = "hold"
    efficiency: float = 1.0  # learned capacity / seeded capacity
    arrival: Holt = field(default_factory=Holt)
    service: Holt = field(default_factory=Holt)
    service_slow: Holt = field(default_factory=Holt)  # `service` over the down-window: what a release is judged at
    prefill_scv: Holt = field(default_factory=Holt)  # smoothed like `service`: one interval's tail is a few prompts
    cold_start_s: float | None = None  # measured
    pending: tuple[float, int] | None = None  # (since, target) of a scale-up not ready yet
    first_seen: float | None = None
    # The previous sample: capacity is learned only from intervals with the same replicas ready at both ends
    # (policy._saturated); the rate's last jump sizes burst capacity.
    prev_ready: int | None = None
    prev_rate: float | None = None
    burst_until: float | None = None  # a level shift was detected: plan for the burst rate until then
    last_burst_at: float | None = None  # the last level shift (bursty traffic keeps a student warm for a while)
    # a primary: the last decision within the clearly-idle horizon of a level shift that its ready replicas did not
    # absorb; a level shift warms a student only within a down-window of it (policy.decide)
    burst_beyond_ready_at: float | None = None
    # a primary, within its latest level shift's horizon: the burst rate (extrapolated) went past the ready replicas;
    # something measured did (overflow, backlog, a TTFT miss with waiting, the measured rate)
    shift_extrapolated_past: bool = False
    shift_measured_past: bool = False
    # a primary: the last level shift that went past the ready replicas did so only as extrapolated (a clump, not a
    # burst): the extrapolation alone records nothing until one shows measured evidence (policy.decide)
    extrapolation_unconfirmed: bool = False
    violated_before: bool = False  # the SLO was violated in the previous interval too
    # A student pool scaled up during a detected burst since it was last at zero: its first replica is insurance for
    # the burst coming back and keeps the whole down-window (stabilize.py); a student started on a slow rise is not.
    burst_insured: bool = False
    # a student pool: the last decision that saw traffic routed to it while demand exceeded the ready primaries
    last_served_at: float | None = None
    # a student pool: warmed as burst insurance at the service's first decision, held until this time (policy.decide)
    startup_until: float | None = None
    # slo: the service's first decision found no state (a new service; a restarted controller restores its state from
    # the annotation): the pool's size is the start's (the planner's or the spec's), which no recommendation asked
    # for, and its first scale-down waits the idle horizon instead of a full down-window (stabilize.py). Not persisted.
    new_service: bool = False
    # a primary: its last scale-up became ready after the demand it was asked for had gone (the replicas ready before it
    # meet the TTFT plan at the rate measured then): a rise shorter than a cold start (stabilize.py: released at break-even)
    late: bool = False
    # a primary: the highest arrival rate measured from the last scale-up judged on arrival until it was ready, when it
    # arrived late, else 0 (kept after its release): the next rise to no more than BURST_RATIO times that rate waits
    # while the ready replicas carry it, TTFT p95 and backlog within the plan (stabilize.py)
    short_rise: float = 0.0
    pending_ready: int = 0  # ready replicas when the pending scale-up was asked for
    pending_peak: float = 0.0  # a primary: the highest arrival rate measured since the pending scale-up was asked for
    # a primary: (planned rate, replicas) of the last scale-up the TTFT feedback made (policy._slo_primary): that many
    # are kept while the planned rate stays at that rate
    feedback_floor: tuple[float, int] | None = None
    # until when the feedback floor holds, and how many floors the feedback has set since the rate last fell away
    # from one (policy._slo_primary: each hold is twice the last)
    feedback_floor_until: float | None = None
    feedback_floors: int = 0
    # the last model shape the pool's replicas agreed on (plan.models.shape_dims: field -> number): seeds a pool that
    # names no preset while none reports (scaled to zero, restarting) or they disagree (a rollout), so its seed, and the
    # efficiency learned against it, do not fall back to the default and return (seeds.known_shapes)
    model_shape: dict[str, float] | None = None


@dataclass
class PolicyState:
    """Memory of all pools. `to_json`/`from_json` persist what must survive a restart (annotation)."""

    pools: dict[str, PoolState] = field(default_factory=dict)

    def pool(self, name: str) -> PoolState:
        return self.pools.setdefault(name, PoolState())

    def to_json(self, wall_offset: float = 0.0) -> str:
        """The annotation. `wall_offset` is added to every time (the caller's clock to Unix seconds: the operator
        decides on `time.monotonic()`, which starts again with each process and differs between nodes, so a
        restarted operator could not read its own times back; `controller.wall_clock_offset()`)."""

        def at(t: float | None) -> float | None:
            return None if t is None else round(t + wall_offset, 3)

        out = {}
        for name, s in sorted(self.pools.items()):
            item: dict[str, object] = {
                "lastActionAt": at(s.last_action_at),
                "lastAction": s.last_action,
                "efficiency": round(s.efficiency, 4),
                "coldStartSeconds": s.cold_start_s,
            }
            # what a burst left behind: a restart within it keeps its plan and its insurance student
            for key, value in (("lastBurstAt", at(s.last_burst_at)), ("burstUntil", at(s.burst_until)),
                               ("burstBeyondReadyAt", at(s.burst_beyond_ready_at)),
                               ("lastServedAt", at(s.last_served_at)), ("startupUntil", at(s.startup_until))):
                if value is not None:
                    item[key] = value
            if s.burst_insured:
                item["burstInsured"] = True
            for key, flag in (("shiftExtrapolatedPast", s.shift_extrapolated_past),
                              ("shiftMeasuredPast", s.shift_measured_past),
                              ("extrapolationUnconfirmed", s.extrapolation_unconfirmed)):
                if flag:
                    item[key] = True
            # a scale-up in flight and whether the last one arrived late: a restart during a cold start still measures
            # it and still judges it on arrival (policy._arrived_late), and a late one still goes at the break-even
            if s.pending is not None:
                item["pendingScaleUp"] = {"since": at(s.pending[0]), "target": s.pending[1], "readyBefore": s.pending_ready,
                                          "peakRate": round(s.pending_peak, 3)}
            if s.late:
                item["lateScaleUp"] = True
            if s.short_rise:
                item["shortRise"] = round(s.short_rise, 3)
            # measured evidence the model is optimistic at this rate: a restart must not forget it
            if s.feedback_floor is not None:
                floor: dict[str, object] = {"rate": round(s.feedback_floor[0], 4), "replicas": s.feedback_floor[1]}
                if s.feedback_floor_until is not None:
                    floor["until"] = at(s.feedback_floor_until)
                item["feedbackFloor"] = floor
            if s.feedback_floors:
                item["feedbackFloors"] = s.feedback_floors
            if s.model_shape:
                item["modelShape"] = dict(sorted(s.model_shape.items()))
            out[name] = item
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None, wall_offset: float = 0.0, now: float | None = None) -> PolicyState:
        """Restore from an annotation; anything unreadable starts fresh (which never scales down early).
        `wall_offset`: subtracted from every time (`to_json`'s, for this process's clock). `now`: no past event
        is restored later than this (clocks of two nodes differ a little; a last action in the future would hold
        the cooldown until the clock caught up)."""
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return cls()
        return cls.from_mapping(data, wall_offset, now) if isinstance(data, dict) else cls()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], wall_offset: float = 0.0, now: float | None = None) -> PolicyState:
        """Restore from the annotation's parsed JSON object (`from_json`'s arguments); entries that are not what
        `to_json` writes are skipped."""
        state = cls()

        def at(value: object, past: bool = True) -> float | None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                return None
            t = float(value) - wall_offset
            return min(t, now) if past and now is not None else t

        for name, item in data.items():
            if not isinstance(item, dict):
                continue
            s = state.pool(str(name))
            s.last_action_at = at(item.get("lastActionAt"))
            if item.get("lastAction") in ("up", "down", "hold"):
                s.last_action = item["lastAction"]
            if isinstance(item.get("efficiency"), int | float) and item["efficiency"] > 0:
                s.efficiency = float(item["efficiency"])
            if isinstance(item.get("coldStartSeconds"), int | float) and item["coldStartSeconds"] > 0:
                s.cold_start_s = float(item["coldStartSeconds"])
            s.last_burst_at = at(item.get("lastBurstAt"))
            s.burst_until = at(item.get("burstUntil"), past=False)
            s.burst_beyond_ready_at = at(item.get("burstBeyondReadyAt"))
            s.last_served_at = at(item.get("lastServedAt"))
            s.startup_until = at(item.get("startupUntil"), past=False)
            s.burst_insured = item.get("burstInsured") is True
            s.shift_extrapolated_past = item.get("shiftExtrapolatedPast") is True
            s.shift_measured_past = item.get("shiftMeasuredPast") is True
            s.extrapolation_unconfirmed = item.get("extrapolationUnconfirmed") is True
            s.late = item.get("lateScaleUp") is True
            s.short_rise = _rate(item.get("shortRise")) or 0.0
            floor = item.get("feedbackFloor")
            if isinstance(floor, dict):
                rate, replicas = _rate(floor.get("rate")), _count(floor.get("replicas"))
                if rate is not None and replicas:
                    s.feedback_floor = (rate, replicas)
                    s.feedback_floor_until = at(floor.get("until"), past=False)
            s.feedback_floors = _count(item.get("feedbackFloors")) or 0
            shape = item.get("modelShape")
            if isinstance(shape, dict) and shape and all(_rate(v) is not None for v in shape.values()):
                s.model_shape = {str(k): float(v) for k, v in shape.items()}
            pending = item.get("pendingScaleUp")
            if isinstance(pending, dict):
                since, target, ready = at(pending.get("since")), _count(pending.get("target")), _count(pending.get("readyBefore"))
                if since is not None and target is not None and ready is not None:
                    s.pending, s.pending_ready = (since, target), ready
                    s.pending_peak = _rate(pending.get("peakRate")) or 0.0
        return state


def _count(value: object) -> int | None:
    """A replica count read back from the annotation (JSON: a non-negative int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _rate(value: object) -> float | None:
    """An arrival rate read back from the annotation (JSON: a finite non-negative number, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)
