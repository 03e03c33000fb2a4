"""The one routing-plugin interface, and the framework that runs a pipeline of plugins.

Pure Python (no aiohttp): the simulator (llmfleet.sim) runs exactly this code.

A request passes filters (each keeps a subset of replicas), then scorers (each returns one number in [0, 1]
per replica, higher is better), then the picker: the weighted sum of scores, ties broken by power-of-two
choices on load. The framework clamps scores to [0, 1] (NaN -> 0), applies weights, times each plugin and
logs the decision at DEBUG. Randomness only comes from the `random.Random` handed in, so a seeded run is
deterministic.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger("llmfleet.router.pipeline")

STALE_LOAD_FACTOR = 0.5  # load scores of a replica whose metrics are stale are halved (distrusted)
TIE_EPSILON = 1e-9


@dataclass
class ReplicaState:
    """What the router knows about one replica. Mutable: discovery, scraping and the proxy update it."""

    id: str  # base URL, e.g. http://10.0.0.7:8000 (unique)
    pool: str
    models: tuple[str, ...] = ()  # served model names
    healthy: bool = True
    draining: bool = False
    running: float = 0.0  # vllm:num_requests_running (scraped)
    waiting: float = 0.0  # vllm:num_requests_waiting (scraped)
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0-1 (scraped)
    in_flight: int = 0  # requests this router has open to the replica right now
    stale: bool = True  # no fresh scrape: load numbers are guesses
    cache_capacity_blocks: int | None = None  # KV blocks (from config or vllm:cache_config_info)
    prefix_hits: float = 0.0  # vllm prefix-cache hit counter (tokens or queries, as scraped)
    prefix_queries: float = 0.0

    @property
    def load(self) -> float:
        """Requests at the replica: the scraped count, or our own in-flight count when that is higher."""
        return max(self.running + self.waiting, float(self.in_flight))


@dataclass
class RequestInfo:
    """What plugins may look at for one request."""

    model: str
    block_hashes: Sequence[int] = ()  # prefix-index keys of the prompt's full blocks (see prefix_index)
    input_tokens: int = 0
    session_id: str | None = None
    tenant: str = "default"
    request_class: str | None = None
    stream: bool = False


class Filter:
    """Keeps the replicas a request may go to."""

    name = "filter"

    def filter(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        raise NotImplementedError

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        """Called once the request is sent to `replica` (plugins with memory update it here)."""


class Scorer(Filter):
    """Scores each replica in [0, 1] (higher = better); the framework clamps and weights."""

    name = "scorer"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> Sequence[float]:
        raise NotImplementedError

    def filter(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        return list(replicas)


@dataclass
class Decision:
    replica: ReplicaState | None
    candidates: int
    scores: dict[str, list[float]] = field(default_factory=dict)  # scorer -> clamped score per candidate
    totals: list[float] = field(default_factory=list)
    plugin_ns: dict[str, int] = field(default_factory=dict)  # time spent per plugin
    reason: str = ""  # why no replica (when replica is None)


def clamp01(x: float) -> float:
    if x != x:  # NaN
        return 0.0
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


class Pipeline:
    """filters -> weighted scorers -> picker. Construct once; `pick` per request."""

    def __init__(
        self, filters: Sequence[Filter], scorers: Sequence[tuple[Scorer, float]], rng: random.Random | None = None
    ) -> None:
        self.filters = list(filters)
        self.scorers = [(s, float(w)) for s, w in scorers if w > 0]
        self.rng = rng or random.Random(0)

    def pick(self, req: RequestInfo, replicas: Sequence[ReplicaState], commit: bool = True) -> Decision:
        """Choose a replica. `commit=False` skips the plugins' on_routed updates: call `commit` later."""
        timings: dict[str, int] = {}
        cands = list(replicas)
        for f in self.filters:
            t0 = time.perf_counter_ns()
            cands = f.filter(req, cands)
            timings[f.name] = time.perf_counter_ns() - t0
            if not cands:
                return Decision(None, 0, plugin_ns=timings, reason=f"no replica passed filter {f.name}")
        totals = [0.0] * len(cands)
        all_scores: dict[str, list[float]] = {}
        if len(cands) > 1:
            for s, w in self.scorers:
                t0 = time.perf_counter_ns()
                raw = s.score(req, cands)
                timings[s.name] = time.perf_counter_ns() - t0
                if len(raw) != len(cands):
                    raise ValueError(f"scorer {s.name} returned {len(raw)} scores for {len(cands)} replicas")
                vals = [clamp01(float(x)) for x in raw]
                all_scores[s.name] = vals
                for i, v in enumerate(vals):
                    totals[i] += w * v
        chosen = self._pick(cands, totals)
        if commit:
            self.commit(req, chosen)
        d = Decision(chosen, len(cands), all_scores, totals, timings)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route model=%s -> %s totals=%s scores=%s ns=%s", req.model, chosen.id, totals, all_scores, timings)
        return d

    def commit(self, req: RequestInfo, chosen: ReplicaState) -> None:
        """Tell every plugin where the request went (prefix index insert, session pin)."""
        for plugin in (*self.filters, *(s for s, _ in self.scorers)):
            plugin.on_routed(req, chosen)

    def _pick(self, cands: list[ReplicaState], totals: list[float]) -> ReplicaState:
        best = max(totals) if totals else 0.0
        tied = [c for c, t in zip(cands, totals, strict=True) if best - t <= TIE_EPSILON * max(1.0, abs(best))]
        if len(tied) == 1:
            return tied[0]
        a, b = self.rng.sample(tied, 2)  # power of two choices among equals: least loaded of two
        return a if a.load <= b.load else b

