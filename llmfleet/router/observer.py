"""What the proxy (`upstream.py`) needs from the router it reports to: its metrics and `observe`.

A Protocol below both `server.py` (whose `Router` satisfies it) and `upstream.py` (which calls it), so the
proxy does not import the server.
"""

from __future__ import annotations

from typing import Protocol

from llmfleet.router.metrics import RouterMetrics
from llmfleet.router.requests import ParsedRequest


class RequestObserver(Protocol):
    """The router as the proxy sees it."""

    metrics: RouterMetrics

    def observe(self, pool: str, model: str, endpoint: str, status: int, tenant: str, degraded: bool,
                parsed: ParsedRequest, input_tokens: int, output_tokens: int, ttft: float | None,
                tpot: float | None, e2e: float) -> None:
        """Called at the end of every request that reached a replica or the store."""
