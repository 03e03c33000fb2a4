"""Waiting for a condition in synchronous tests: poll with a deadline, never sleep-and-hope."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 2.0) -> T:
    """Call fn until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
