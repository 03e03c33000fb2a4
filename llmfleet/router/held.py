"""Scale from zero: requests held for a pool that has no routable replica, and the autoscaler's wake-up call.

A pool that may scale to zero (minReplicas 0) has no replica to route to until the autoscaler starts one. The
router holds such requests (at most `max_held` over all pools, each until its deadline) instead of answering
503, and tells the autoscaler at once: `GET /admin/held?since=E&wait=S` is a long poll that returns as soon
as a pool starts holding requests (an episode: its count goes from 0 to 1; `E` is the last episode the caller
saw, so one it missed between two polls returns at once and an ongoing cold start does not wake it again).
The same long poll carries the router's burst wake-up (llmfleet.router.burst): an arrival burst is an episode
too, answered with `"burst": {"rate": r, "windowS": w}` (the arrival rate the detector measured).
The autoscaler's loop waits on it between its periodic steps (llmfleet.autoscaler.local), and
`llmfleet_router_held_requests{pool}` carries the count to scrapes and Prometheus. The health loop calls `replica_ready(pool)` when the pool
has a routable replica again: the held requests then go through the usual routing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class HoldRejected(Exception):
    """The request cannot be held: the queue is full, or its deadline passed without a replica."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class HeldRequests:
    def __init__(self, max_held: int, gauge: Callable[[str], Any] | None = None) -> None:
        self.max_held = max_held
        self.held: dict[str, int] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self.episode = 0  # pools that went from 0 to >0 held requests, counted
        self._changed = asyncio.Event()  # set on each new episode (wakes long polls)
        # the last burst episode and the arrival rate (req/s over window_s) it was detected at
        self.burst_episode, self.burst_rate, self.burst_window_s = -1, 0.0, 0.0
        self._gauge = gauge  # pool -> the prometheus gauge child

    def total(self) -> int:
        return sum(self.held.values())

    def _set(self, pool: str, n: int) -> None:
        if n > 0 and not self.held.get(pool):
            self.episode += 1
            self._changed.set()
        self.held[pool] = n
        if self._gauge is not None:
            self._gauge(pool).set(n)

    async def wait_for_replica(self, pool: str, routable: Callable[[], object], timeout_s: float) -> float:
        """Wait until `routable()` is truthy; returns the seconds waited. Raises HoldRejected when full or late."""
        if self.total() >= self.max_held:
            raise HoldRejected(f"{self.total()} requests already wait for replicas to start", retry_after_s=5.0)
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        self._set(pool, self.held.get(pool, 0) + 1)
        try:
            while not routable():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HoldRejected(f"no replica of pool {pool} became ready within {timeout_s:.0f} s",
                                       retry_after_s=10.0)
                ready = self._ready.setdefault(pool, asyncio.Event())
                try:
                    # The health loop signals readiness; re-check at least every second regardless.
                    await asyncio.wait_for(ready.wait(), timeout=min(left, 1.0))
                except TimeoutError:
                    pass
            return time.monotonic() - t0
        finally:
            self._set(pool, self.held[pool] - 1)

    def burst(self, rate: float, window_s: float) -> None:
        """An arrival burst began (llmfleet.router.burst): a new episode that wakes the long polls."""
        self.episode += 1
        self.burst_episode, self.burst_rate, self.burst_window_s = self.episode, rate, window_s
        self._changed.set()

    def burst_since(self, since: int) -> dict[str, float] | None:
        """The last burst, when it began after episode `since`: the long poll's `burst` field."""
        if self.burst_episode <= since:
            return None
        return {"rate": round(self.burst_rate, 3), "windowS": self.burst_window_s}

    def replica_ready(self, pool: str) -> None:
        """The pool has a routable replica: release its held requests (they route as usual)."""
        ready = self._ready.pop(pool, None)
        if ready is not None:
            ready.set()

    async def wait_held(self, since: int, wait_s: float) -> tuple[dict[str, int], int]:
        """Long poll: (pools with held requests, episode) once an episode after `since` began, else after
        `wait_s` ({} and the current episode). A `since` this router never reached (it restarted since the
        caller's last poll) answers at once, so the caller learns the new count."""
        deadline = time.monotonic() + wait_s
        while self.episode == since:
            left = deadline - time.monotonic()
            if left <= 0:
                return {}, self.episode
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=left)
            except TimeoutError:
                return {}, self.episode
        return {p: n for p, n in self.held.items() if n > 0}, self.episode
