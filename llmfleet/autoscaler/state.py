"""The autoscaler's memory across decisions, and what of it survives a restart (an annotation).

Split out of `policy.py` (which re-exports both classes); pure data, no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

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
    cold_start_s: float | None = None  # measured
    pending: tuple[float, int] | None = None  # (since, target) of a scale-up not ready yet
    first_seen: float | None = None
    # The previous sample: capacity is learned only from intervals with the same replicas ready at both ends
    # (policy._saturated); the rate's last jump sizes burst capacity.
    prev_ready: int | None = None
    prev_rate: float | None = None
    burst_until: float | None = None  # a level shift was detected: plan for the burst rate until then
    last_burst_at: float | None = None  # the last level shift (bursty traffic keeps a student warm for a while)
    violated_before: bool = False  # the SLO was violated in the previous interval too
    # A student pool scaled up during a detected burst since it was last at zero: its first replica is insurance for
    # the burst coming back and keeps the whole down-window (stabilize.py); a student started on a slow rise is not.
    burst_insured: bool = False
    # a student pool: the last decision that saw traffic routed to it while demand exceeded the ready primaries
    last_served_at: float | None = None


@dataclass
class PolicyState:
    """Memory of all pools. `to_json`/`from_json` persist what must survive a restart (annotation)."""

    pools: dict[str, PoolState] = field(default_factory=dict)

    def pool(self, name: str) -> PoolState:
        return self.pools.setdefault(name, PoolState())

    def to_json(self) -> str:
        out = {
            name: {
                "lastActionAt": s.last_action_at,
                "lastAction": s.last_action,
                "efficiency": round(s.efficiency, 4),
                "coldStartSeconds": s.cold_start_s,
            }
            for name, s in sorted(self.pools.items())
        }
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> PolicyState:
        """Restore from an annotation; anything unreadable starts fresh (which never scales down early)."""
        state = cls()
        if not text:
            return state
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return state
        if not isinstance(data, dict):
            return state
        for name, item in data.items():
            if not isinstance(item, dict):
                continue
            s = state.pool(str(name))
            if isinstance(item.get("lastActionAt"), int | float):
                s.last_action_at = float(item["lastActionAt"])
            if item.get("lastAction") in ("up", "down", "hold"):
                s.last_action = item["lastAction"]
            if isinstance(item.get("efficiency"), int | float) and item["efficiency"] > 0:
                s.efficiency = float(item["efficiency"])
            if isinstance(item.get("coldStartSeconds"), int | float) and item["coldStartSeconds"] > 0:
                s.cold_start_s = float(item["coldStartSeconds"])
        return state
