"""Outlier ejection: passive health from the requests themselves (like Envoy's outlier detection).

Health checks see a replica that answers `/health` but hangs or crawls on completions as healthy. This
detector watches each finished attempt instead and takes a replica out of rotation for a while when

* it failed `consecutive_failures` times in a row (timeouts, HTTP 5xx, streams broken mid-response; an HTTP
  429 is back-pressure, not a failure, and a refused connection marks the replica down until a health check
  passes, which is the health checks' business), or
* it is far slower than its peers: its moving average of seconds per output token (attempt time divided by
  1 + output tokens) is above `slow_factor` x the median of the other replicas' averages, and above
  `slow_min_seconds_per_token` (fast replicas differ by noise). Judged every `interval_seconds`, on replicas
  with `min_requests` samples.

An ejection lasts `base_ejection_seconds` x the number of times the replica was ejected (bounded by
`max_ejection_seconds`; the count drops by one for every `max_ejection_seconds` the replica stays in rotation
afterwards). At most `max_ejection_percent` of a pool is out at once, and never its last replica.

Pure and deterministic: time comes in as `now` (any monotonic clock), so the router (`server.py`) and the
simulator run the same decisions; `dispatch.pick_replica` leaves ejected replicas out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmfleet.router.config import OutlierConfig


@dataclass(slots=True)
class _Replica:
    failures: int = 0  # consecutive
    samples: int = 0  # since it was last (re)admitted
    per_token: float = 0.0  # moving average, seconds per output token
    ejections: int = 0  # the back-off multiplier
    returned_at: float = -math.inf  # when it last came back from an ejection


@dataclass(frozen=True, slots=True)
class Ejection:
    """A replica taken out of rotation until `until`; `reason` is "failures" or "slow"."""

    replica: str
    reason: str
    until: float
    detail: str


class OutlierDetector:
    """The outlier state of one pool's replicas."""

    def __init__(self, cfg: OutlierConfig, pool_size: int = 0) -> None:
        self.cfg = cfg
        self.enabled = cfg.enabled
        self.pool_size = pool_size  # replicas in the pool (the owner keeps it current): bounds ejections
        self.ejected: dict[str, float] = {}  # replica -> back in rotation at (empty in the common case)
        self._replicas: dict[str, _Replica] = {}
        self._alpha = 2.0 / (cfg.window_requests + 1)
        self._next_sweep = -math.inf
        self._next_release = math.inf

    def record(self, replica: str, now: float, *, failed: bool, seconds: float = 0.0,
               output_tokens: int = 0) -> Sequence[Ejection]:
        """One finished attempt on `replica`: failed, or served `output_tokens` in `seconds`. Returns the
        ejections it causes (on the request path: a few attribute updates unless a judgement is due)."""
        if not self.enabled:
            return ()
        s = self._replicas.get(replica)
        if s is None:
            s = self._replicas[replica] = _Replica()
        out: list[Ejection] = []
        if failed:
            s.failures += 1
            if s.failures >= self.cfg.consecutive_failures and replica not in self.ejected:
                e = self._eject(replica, s, now, "failures", f"{s.failures} failures in a row")
                if e is not None:
                    out.append(e)
        else:
            s.failures = 0
            x = seconds / (1 + output_tokens) if output_tokens > 0 else seconds
            s.per_token = x if s.samples == 0 else s.per_token + self._alpha * (x - s.per_token)
            s.samples += 1
        if now >= self._next_sweep:
            self._next_sweep = now + self.cfg.interval_seconds
            out += self._sweep_slow(now)
        return out or ()

    def _sweep_slow(self, now: float) -> list[Ejection]:
        cfg = self.cfg
        judged = sorted((s.per_token, r) for r, s in self._replicas.items()
                        if s.samples >= cfg.min_requests and r not in self.ejected)
        n = len(judged)
        if n < 2:
            return []
        values = [v for v, _ in judged]

        def peer(k: int, i: int) -> float:  # the k-th smallest value of the others than judged[i]
            return values[k] if k < i else values[k + 1]

        out = []
        for i in range(n - 1, -1, -1):  # the slowest first: the ejection cap may stop the sweep
            per_token, replica = judged[i]
            m = n - 1  # peers
            median = peer(m // 2, i) if m % 2 else (peer(m // 2 - 1, i) + peer(m // 2, i)) / 2
            if per_token > cfg.slow_factor * median and per_token > cfg.slow_min_seconds_per_token:
                e = self._eject(replica, self._replicas[replica], now, "slow",
                                f"{per_token * 1000:.1f} ms per token, peers' median {median * 1000:.1f} ms")
                if e is not None:
                    out.append(e)
        return out

    def _eject(self, replica: str, s: _Replica, now: float, reason: str, detail: str) -> Ejection | None:
        cfg = self.cfg
        n = self.pool_size
        allowed = min(n - 1, math.floor(n * cfg.max_ejection_percent / 100))
        if len(self.ejected) >= allowed:
            return None
        # Back in rotation long enough: the multiplier decays by one per max_ejection_seconds.
        calm = int((now - s.returned_at) // cfg.max_ejection_seconds) if s.returned_at > -math.inf else 0
        s.ejections = max(0, s.ejections - calm) + 1
        until = now + min(cfg.base_ejection_seconds * s.ejections, cfg.max_ejection_seconds)
        self.ejected[replica] = until
        self._next_release = min(self._next_release, until)
        return Ejection(replica, reason, until, detail)

    def release_due(self, now: float) -> list[str]:
        """Replicas whose ejection is over, back in rotation now (cheap when none is due)."""
        if now < self._next_release:
            return []
        back = sorted(r for r, until in self.ejected.items() if until <= now)
        for r in back:
            del self.ejected[r]
            s = self._replicas.setdefault(r, _Replica())
            s.failures, s.samples, s.per_token, s.returned_at = 0, 0, 0.0, now
        self._next_release = min(self.ejected.values(), default=math.inf)
        return back

    def forget(self, replica: str) -> None:
        """The replica left the pool."""
        self._replicas.pop(replica, None)
        if self.ejected.pop(replica, None) is not None:
            self._next_release = min(self.ejected.values(), default=math.inf)


__all__ = ["Ejection", "OutlierDetector"]
