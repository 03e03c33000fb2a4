"""Read rank 0's `GET /status` (the training status contract in DEVELOPERS.md), with a timeout.

The operator reaches rank 0 through the headless Service (pod DNS `<job>-0.<service>`), so workers need no
ServiceAccount and the operator no write access to pods: one HTTP GET per timer tick per running job.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

StatusReader = Callable[[str], Awaitable[dict[str, Any]]]

# Fields of the contract and the TrainingJob status fields they become.
STATUS_FIELDS = {
    "step": "step",
    "loss": "loss",
    "tokensPerSecond": "tokensPerSecond",
    "mfu": "mfu",
    "hfu": "hfu",
    "lastCheckpoint": "lastCheckpoint",
    "stragglers": "stragglers",
    "microBatch": "microBatch",
}


class WorkerStatusError(Exception):
    """Rank 0 did not answer with a status document (unreachable, timeout, bad JSON)."""


class HttpStatusReader:
    """aiohttp GET with a total timeout; one session for the operator's lifetime."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, url: str) -> dict[str, Any]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    raise WorkerStatusError(f"GET {url}: HTTP {resp.status}")
                data = json.loads(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise WorkerStatusError(f"GET {url}: {type(err).__name__}: {err}") from err
        if not isinstance(data, dict):
            raise WorkerStatusError(f"GET {url}: expected a JSON object")
        return data

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def status_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The TrainingJob status patch from a worker status document (unknown/ill-typed values dropped)."""
    out: dict[str, Any] = {}
    for src, dst in STATUS_FIELDS.items():
        value = doc.get(src)
        if value is None:
            continue
        if src == "stragglers":
            if isinstance(value, list) and all(isinstance(v, int) for v in value):
                out[dst] = value
        elif src == "lastCheckpoint":
            if isinstance(value, str):
                out[dst] = value
        elif src in ("step", "microBatch"):
            if isinstance(value, int) and not isinstance(value, bool):
                out[dst] = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[dst] = float(value)
    return out
