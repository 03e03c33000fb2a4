"""Built-in filters and scorers. Each is small: the Pipeline does clamping, weighting, timing and logging."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from llmfleet.router.plugins.base import STALE_LOAD_FACTOR, Filter, ReplicaState, RequestInfo, Scorer
from llmfleet.router.prefix_index import PrefixIndex


class HealthyFilter(Filter):
    """Drop replicas that fail health checks or are draining (a draining replica gets nothing new)."""

    name = "healthy"

    def filter(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        return [r for r in replicas if r.healthy and not r.draining]


class ModelFilter(Filter):
    """Keep replicas that serve the requested model (replicas with an unknown model list are kept)."""

    name = "model"

    def filter(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        return [r for r in replicas if not r.models or req.model in r.models]


def _relative_low_is_good(values: Sequence[float]) -> list[float]:
    """Min-max normalisation: the least loaded gets 1, the most loaded 0, all equal -> all 1."""
    lo, hi = min(values), max(values)
    if hi - lo <= 0:
        return [1.0] * len(values)
    return [(hi - v) / (hi - lo) for v in values]


def _stale_damped(scores: list[float], replicas: Sequence[ReplicaState]) -> list[float]:
    return [s * STALE_LOAD_FACTOR if r.stale else s for s, r in zip(scores, replicas, strict=True)]


class QueueDepthScorer(Scorer):
    """Fewer waiting requests is better (relative across candidates)."""

    name = "queue-depth"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        # Router-own in-flight requests beyond the scraped running count are queued somewhere too.
        q = [max(r.waiting, r.in_flight - r.running) for r in replicas]
        return _stale_damped(_relative_low_is_good(q), replicas)


class RunningRequestsScorer(Scorer):
    """Fewer requests at the replica (running + waiting, or our in-flight count) is better."""

    name = "running-requests"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        return _stale_damped(_relative_low_is_good([r.load for r in replicas]), replicas)


class KVCacheScorer(Scorer):
    """Free KV cache is better: 1 - usage (absolute, already 0..1)."""

    name = "kv-cache"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        return _stale_damped([1.0 - r.kv_usage for r in replicas], replicas)


class PrefixCacheScorer(Scorer):
    """Fraction of the prompt's blocks a replica is believed to hold; routing teaches the index."""

    name = "prefix-cache"

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index
        self.last_match: Mapping[str, int] = {}

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        n = len(req.block_hashes)
        if n == 0:
            self.last_match = {}
            return [0.0] * len(replicas)
        m = self.last_match = self.index.match(req.block_hashes)
        return [m.get(r.id, 0) / n for r in replicas]

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        if req.block_hashes:
            self.index.insert(replica.id, req.block_hashes)


class SessionAffinityScorer(Scorer):
    """1 for the replica that served this session last, else 0. Bounded LRU of sessions."""

    name = "session-affinity"

    def __init__(self, max_sessions: int = 100_000) -> None:
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.last_pinned: str | None = None

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        pinned = self.last_pinned = self.sessions.get(req.session_id) if req.session_id else None
        return [1.0 if r.id == pinned else 0.0 for r in replicas]

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        if not req.session_id:
            return
        self.sessions[req.session_id] = replica.id
        self.sessions.move_to_end(req.session_id)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)


def build_scorer(name: str, index: PrefixIndex) -> Scorer:
    if name == "prefix-cache":
        return PrefixCacheScorer(index)
    if name == "queue-depth":
        return QueueDepthScorer()
    if name == "running-requests":
        return RunningRequestsScorer()
    if name == "kv-cache":
        return KVCacheScorer()
    if name == "session-affinity":
        return SessionAffinityScorer()
    raise ValueError(f"unknown scorer {name!r}")
