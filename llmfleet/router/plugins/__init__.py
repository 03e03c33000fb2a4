"""Routing plugins: one interface (base.py), the built-in filters and scorers (builtin.py).

Pure Python, importable without aiohttp: `from llmfleet.router.plugins import build_pipeline`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from llmfleet.router.plugins.base import (
    Decision,
    Filter,
    Pipeline,
    ReplicaState,
    RequestInfo,
    Scorer,
    clamp01,
)
from llmfleet.router.plugins.builtin import (
    HealthyFilter,
    KVCacheScorer,
    ModelFilter,
    PrefixCacheScorer,
    QueueDepthScorer,
    RunningRequestsScorer,
    SessionAffinityScorer,
    build_scorer,
)
from llmfleet.router.prefix_index import PrefixIndex


def build_pipeline(weights: Mapping[str, float], index: PrefixIndex | None = None, seed: int = 0) -> Pipeline:
    """The standard pipeline: healthy + model filters, then the named scorers with their weights."""
    index = index if index is not None else PrefixIndex()
    scorers = [(build_scorer(name, index), w) for name, w in weights.items()]
    return Pipeline([HealthyFilter(), ModelFilter()], scorers, random.Random(seed))


__all__ = [
    "Decision", "Filter", "HealthyFilter", "KVCacheScorer", "ModelFilter", "Pipeline", "PrefixCacheScorer",
    "PrefixIndex", "QueueDepthScorer", "ReplicaState", "RequestInfo", "RunningRequestsScorer", "Scorer",
    "SessionAffinityScorer", "build_pipeline", "build_scorer", "clamp01",
]
