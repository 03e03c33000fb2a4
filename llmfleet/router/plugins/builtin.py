"""Built-in filters and scorers. Each is small: the Pipeline does clamping, weighting, timing and logging."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Sequence

from llmfleet.router.plugins.base import (
    STALE_LOAD_FACTOR,
    Filter,
    Preselector,
    ReplicaState,
    RequestInfo,
    Scorer,
)
from llmfleet.router.plugins.estimated_ttft import EstimatedTTFTScorer
from llmfleet.router.plugins.session import SessionAffinityScorer
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
    for r in replicas:
        if r.stale:
            break
    else:
        return scores  # nothing stale (the usual case): no copy
    return [s * STALE_LOAD_FACTOR if r.stale else s for s, r in zip(scores, replicas, strict=True)]


class QueueDepthScorer(Scorer):
    """Fewer waiting requests is better (relative across candidates)."""

    name = "queue-depth"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        # Router-own in-flight requests beyond the scraped running count are queued somewhere too.
        q = []
        for r in replicas:  # each field read once: the simulator's replica states compute them on access
            w = r.waiting
            x = r.in_flight - r.running
            q.append(w if w >= x else x)
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


# A replica is overloaded when it has more than this many requests beyond the least loaded candidate AND more
# than LOAD_BALANCE_REL times as many (sglang-router's cache_aware rule, whose relative default 1.5 this keeps).
# The absolute slack is counted in requests, not tuned per fleet: each request beyond the least loaded replica's
# costs the new one at least a share of an engine step there, so two extra requests already outweigh the prefill
# a cache hit saves on typical chat prompts; sglang-router's 64 suits engines that batch hundreds of sequences,
# where the relative rule decides anyway (64 < 1.5 x 128).
LOAD_BALANCE_ABS = 2.0
LOAD_BALANCE_REL = 1.5


class LoadBalanceScorer(Scorer):
    """Keeps affinity from piling requests onto one replica: 1 within the balance band, less beyond it.

    excess(r) = min(load(r) - min_load - abs_slack, load(r) - rel · min_load), clamped at 0; score = 1 / (1 + excess).
    load = requests at the replica (`ReplicaState.load`: the scraped count or this router's in-flight count).
    Within the band every candidate scores 1, so the other scorers (prefix affinity, estimated TTFT) decide
    alone; a replica 1 request beyond it loses half the scorer's weight, 3 beyond loses three quarters. With a
    weight of 1 next to estimated-ttft's 1 (whose score is in (0, 1]), an overloaded replica loses to one in
    the band unless its cache saves most of the request's cost.
    """

    name = "load-balance"

    def __init__(self, abs_slack: float = LOAD_BALANCE_ABS, rel: float = LOAD_BALANCE_REL) -> None:
        if abs_slack < 0 or rel < 1:
            raise ValueError("load-balance needs abs_slack >= 0 and rel >= 1")
        self.abs_slack = abs_slack
        self.rel = rel

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        loads = [r.load for r in replicas]
        lo = min(loads)
        floor = max(lo + self.abs_slack, self.rel * lo)
        return [1.0 if x <= floor else 1.0 / (1.0 + x - floor) for x in loads]


class PrefixCacheScorer(Scorer):
    """Fraction of the prompt's blocks a replica is believed to hold; routing teaches the index."""

    name = "prefix-cache"

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        n = len(req.block_hashes)
        if n == 0:
            return [0.0] * len(replicas)
        m = self.index.match(req.block_hashes)
        return [m.get(r.id, 0) / n for r in replicas]

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        if req.block_hashes:
            self.index.insert(replica.id, req.block_hashes)


class AdapterLoadedScorer(Scorer):
    """LoRA adapter affinity: 1 on a replica that holds the request's adapter; elsewhere 0.5 x the fraction of
    its adapter slots still free (a load there evicts nothing), 0 on a full one. Base-model requests: 1 on all.

    Load scorers weigh against it, so a hot adapter's requests move to a second replica (which then loads it)
    once the replicas holding it are busy enough: hot adapters spread, cold ones stay where they are warm.
    """

    name = "adapter-loaded"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        adapter = req.adapter
        if adapter is None:
            return [1.0] * len(replicas)
        out = []
        for r in replicas:
            if adapter in r.adapters:
                out.append(1.0)
            elif r.adapter_slots <= 0:
                out.append(0.5)  # slots unknown: a load is needed, eviction unknown
            else:
                out.append(0.5 * max(0, r.adapter_slots - len(r.adapters)) / r.adapter_slots)
        return out


class PrefixSampledPreselector(Preselector):
    """For large fleets: the replicas with the longest prefix matches, plus a uniform random sample.

    At most `prefix_candidates` replicas come from the prefix index (longest match first, ties by id); the
    rest up to `max_candidates` are sampled uniformly, so the load scorers pick the least loaded of a
    sample (power of k choices) and replicas the index knows nothing about still get traffic. Cost is
    O(max_candidates), independent of the fleet size, once the id -> position map is built.
    """

    name = "preselect"

    def __init__(self, index: PrefixIndex, max_candidates: int = 32, prefix_candidates: int = 8) -> None:
        if max_candidates < 2 or not 0 <= prefix_candidates <= max_candidates:
            raise ValueError("need max_candidates >= 2 and 0 <= prefix_candidates <= max_candidates")
        self.index = index
        self.max_candidates = max_candidates
        self.prefix_candidates = prefix_candidates
        self._pos: dict[str, int] = {}
        self._pos_key: tuple[int, int] | None = None

    def _position(self, replicas: Sequence[ReplicaState], rid: str) -> int | None:
        i = self._pos.get(rid)
        if i is not None and i < len(replicas) and replicas[i].id == rid:
            return i
        key = (id(replicas), len(replicas))
        if i is None and key == self._pos_key:
            return None  # a replica outside this list (another pool's, say): no O(fleet) rebuild per request
        self._pos = {r.id: j for j, r in enumerate(replicas)}  # the list changed: rebuild once
        self._pos_key = key
        return self._pos.get(rid)

    def select(self, req: RequestInfo, replicas: Sequence[ReplicaState], rng: random.Random) -> list[ReplicaState]:
        out: list[ReplicaState] = []
        taken: set[int] = set()
        k = self.prefix_candidates
        if req.block_hashes and k:
            m = self.index.match(req.block_hashes)
            # Longest match first, ties by id. A shared system prompt puts hundreds of replicas in `m`: take the
            # k best with a heap and sort the rest only if some of those k are not in `replicas`.
            order = (_longest_first(m.items()) if len(m) <= 4 * k
                     else heapq.nsmallest(k, m.items(), key=_longest_first_key))
            rest = len(m) > len(order)
            for rid, _ in order:
                i = self._position(replicas, rid)
                if i is not None and i not in taken:
                    taken.add(i)
                    out.append(replicas[i])
                    if len(out) >= k:
                        rest = False
                        break
            if rest:
                for rid, _ in _longest_first(m.items())[len(order):]:
                    i = self._position(replicas, rid)
                    if i is not None and i not in taken:
                        taken.add(i)
                        out.append(replicas[i])
                        if len(out) >= k:
                            break
        n = len(replicas)
        want = min(self.max_candidates, n) - len(out)
        draw = rng.random
        while want > 0:  # rejection sampling: expected draws want·n/(n-want), cheap when n >> max_candidates
            i = int(draw() * n)  # uniform on 0..n-1 (randrange is several times slower per draw)
            if i not in taken:
                taken.add(i)
                out.append(replicas[i])
                want -= 1
        return out


def _longest_first_key(kv: tuple[str, int]) -> tuple[int, str]:
    return -kv[1], kv[0]


def _longest_first(items: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted(items, key=_longest_first_key)


# The scorer registry: name -> factory. Its names are the API's SCORER_NAMES (llmfleet.api.inferenceservice),
# which validates `router.scorers`; tests/unit/test_router_plugins.py keeps the two equal.
SCORERS: dict[str, Callable[[PrefixIndex], Scorer]] = {
    "estimated-ttft": EstimatedTTFTScorer,
    "prefix-cache": PrefixCacheScorer,
    "queue-depth": lambda index: QueueDepthScorer(),
    "running-requests": lambda index: RunningRequestsScorer(),
    "kv-cache": lambda index: KVCacheScorer(),
    "session-affinity": lambda index: SessionAffinityScorer(),
    "adapter-loaded": lambda index: AdapterLoadedScorer(),
    "load-balance": lambda index: LoadBalanceScorer(),
}


def build_scorer(name: str, index: PrefixIndex) -> Scorer:
    factory = SCORERS.get(name)
    if factory is None:
        raise ValueError(f"unknown scorer {name!r} (known: {', '.join(SCORERS)})")
    return factory(index)
