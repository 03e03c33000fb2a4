"""Routing plugins: one interface (base.py), the built-in filters and scorers (builtin.py; estimated TTFT in
estimated_ttft.py, session affinity in session.py).

Pure Python, importable without aiohttp: `from llmfleet.router.plugins import build_pipeline`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from llmfleet.api.inferenceservice import DEFAULT_EVICTION_COST, DEFAULT_SOLE_HOLDER_DISCOUNT
from llmfleet.router.config import DEFAULT_SESSION_BYTES
from llmfleet.router.plugins.base import (
    Filter,
    Pipeline,
    PrefillCostFit,
    Preselector,
    ReplicaState,
    RequestInfo,
    RoutingDecision,
    Scorer,
    charge_prefill,
    clamp01,
    release_prefill,
)
from llmfleet.router.plugins.builtin import (
    AdapterLoadedScorer,
    HealthyFilter,
    KVCacheScorer,
    LoadBalanceScorer,
    ModelFilter,
    PrefixCacheScorer,
    PrefixSampledPreselector,
    QueueDepthScorer,
    RunningRequestsScorer,
    build_scorer,
)
from llmfleet.router.plugins.estimated_ttft import DEFAULT_WORK_EXTERNALITY, EstimatedTTFTScorer
from llmfleet.router.plugins.session import BYTES_PER_SESSION, SessionAffinityScorer, session_key
from llmfleet.router.prefill_price import DEFAULT_PREFILL_TOKENS_PER_S
from llmfleet.router.prefix_index import PrefixIndex

DEFAULT_MAX_CANDIDATES = 32  # fleets larger than this are preselected (prefix matches + a random sample)


def build_pipeline(weights: Mapping[str, float], index: PrefixIndex | None = None, seed: int = 0,
                   max_candidates: int | None = DEFAULT_MAX_CANDIDATES, prefix_candidates: int = 8,
                   session_bytes: int = DEFAULT_SESSION_BYTES, measure_prefill_rate: bool | None = None,
                   pool_prefill_rates: Mapping[str, float] | None = None,
                   sole_holder_discount: bool = DEFAULT_SOLE_HOLDER_DISCOUNT,
                   eviction_cost: bool = DEFAULT_EVICTION_COST,
                   ttft_objective_s: float | None = None,
                   work_externality: float = DEFAULT_WORK_EXTERNALITY) -> Pipeline:
    """The standard pipeline: healthy + model filters, then the named scorers with their weights.

    Fleets with more than `max_candidates` replicas are first narrowed by `PrefixSampledPreselector`
    (None: always score every replica). `session_bytes` bounds the session-affinity scorer's table;
    `pool_prefill_rates` are the planner's prices of the pools' prefill (prefill_price.py) and
    `measure_prefill_rate` which pools the estimated-TTFT scorer measures instead (True: all; False: none; None:
    those without a price);
    `sole_holder_discount` switches its sole-holder discount (`sole_holder_discounted`; off by default), which
    applies only where the alternative must evict cached blocks and stops where the holder's estimate passes
    `ttft_objective_s` (the service's TTFT objective; None: no bound); `eviction_cost` switches its eviction cost
    (`EstimatedTTFTScorer._with_eviction`; off by default). `work_externality` scales the
    estimated-TTFT scorer's busy-period externality (0: plain TTFT; benchmarks compare the two).
    """
    index = index if index is not None else PrefixIndex()
    scorers: list[tuple[Scorer, float]] = [
        (SessionAffinityScorer(session_bytes) if name == SessionAffinityScorer.name else build_scorer(name, index), w)
        for name, w in weights.items()]
    pre = (PrefixSampledPreselector(index, max_candidates, min(prefix_candidates, max_candidates))
           if max_candidates is not None else None)
    for scorer, _ in scorers:
        if isinstance(scorer, EstimatedTTFTScorer):
            scorer.measure_rate = measure_prefill_rate
            scorer.pool_rates = dict(pool_prefill_rates or {})
            scorer.sole_holder_discount = sole_holder_discount
            scorer.eviction_cost = eviction_cost
            scorer.ttft_objective_s = ttft_objective_s
            scorer.work_externality = work_externality
    return Pipeline([HealthyFilter(), ModelFilter()], scorers, random.Random(seed), preselector=pre)


__all__ = [
    "BYTES_PER_SESSION", "DEFAULT_SESSION_BYTES", "session_key",
    "AdapterLoadedScorer", "DEFAULT_MAX_CANDIDATES", "DEFAULT_PREFILL_TOKENS_PER_S", "DEFAULT_WORK_EXTERNALITY", "RoutingDecision", "EstimatedTTFTScorer", "Filter",
    "HealthyFilter", "KVCacheScorer", "LoadBalanceScorer", "ModelFilter", "Pipeline", "PrefillCostFit", "PrefixCacheScorer", "PrefixIndex",
    "PrefixSampledPreselector", "Preselector", "QueueDepthScorer", "ReplicaState", "RequestInfo",
    "RunningRequestsScorer", "Scorer", "SessionAffinityScorer", "build_pipeline", "build_scorer",
    "charge_prefill", "clamp01", "release_prefill",
]
