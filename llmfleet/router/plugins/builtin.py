"""Built-in filters and scorers. Each is small: the Pipeline does clamping, weighting, timing and logging."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterable, Sequence

from llmfleet.api.inferenceservice import DEFAULT_SOLE_HOLDER_DISCOUNT
from llmfleet.router.plugins.admission import cannot_admit
from llmfleet.router.plugins.base import (
    STALE_LOAD_FACTOR,
    Filter,
    PrefillCostFit,
    Preselector,
    ReplicaState,
    RequestInfo,
    Scorer,
    charge_prefill,
)
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


# Prefill rate assumed when a replica has none configured or measured. Only ratios of estimates matter in
# a pool of identical replicas (the scale cancels); the figure is Llama-3-8B bf16 on one H200 at the
# planner's roofline (0.6 compute efficiency), see docs/router.md.
DEFAULT_PREFILL_TOKENS_PER_S = 30_000.0
# Context length at which a prompt token's attention costs as much as its dense layers
# (flops_per_token / attention_flops_per_context_token = 2·params / (4·layers·hidden), about 30k for
# Llama-3-8B): long prompts cost more than linearly, a 60k-token prefill ~2x a 2 x 30k one.
DEFAULT_ATTENTION_TOKENS = 30_000.0
# New prefill work sent to a replica delays what is routed there after it, but only while its queue lasts: the
# score counts a replica's work for this request (1 + E) times and its queue once, E = rho / (1 - rho), the
# requests an M/M/1 busy period serves after the first one (the others a unit of work delays), at the
# utilization rho the candidates show: the share of them with queued prefill, by Laplace's rule of succession
# (busy + 1) / (candidates + 2), so it stays below 1 (E at most candidates + 1) with every candidate busy. Under
# load, recomputing a prefix on an idle replica (which also duplicates it in a second cache) must save more
# than it costs the queue behind it, and the more so the busier the fleet; in an idle fleet it is plain TTFT (a
# common factor). Nothing is fitted: a fixed linear factor (0.5 x the busy share) chosen on routing_eval.py's
# scenarios was a knife edge (docs/router.md, "Work externality"). This scales E (0: plain TTFT).
DEFAULT_WORK_EXTERNALITY = 1.0


def busy_period_externality(busy: int, candidates: int) -> float:
    """E = rho / (1 - rho) with rho = (busy + 1) / (candidates + 2): other requests a unit of new work delays."""
    rho = (busy + 1) / (candidates + 2)
    return rho / (1.0 - rho)


def sole_holder_discounted(costs: list[float], work: Sequence[float], floor: float,
                           estimates: Sequence[float] | None = None, limit_s: float | None = None,
                           has_room: Callable[[int], bool] | None = None) -> list[float]:
    """`costs` with the one candidate that alone holds the most of the prompt discounted by the work it saves.

    `work[i]`: the request's prefill work on candidate i (uncached tokens, attention-weighted, as `_work`). When
    exactly one candidate needs the least work, w1, and the runner-up needs w2 > w1, its cost is multiplied by
    w1 / w2, w1 floored at `floor` (one prefix-index block of work, the index's granularity: this bounds the
    factor by the prompt's block count). Nobody else changes: a prefix held by nobody, or equally by two or
    more candidates (a popular system prompt), is ranked by plain estimated TTFT.

    Why: blocks only one replica holds are, in practice, the request's own history (a conversation's earlier
    turns). Recomputing them elsewhere repeats work already done and leaves two copies: a new one taking
    another replica's cache space and the old one, dead (the next turn follows the longest match) until LRU
    ages it out. Plain estimated TTFT sends the request away from a busy holder as soon as waiting costs more
    than recomputing. With the discount, the choice between the holder and the rest minimises TTFT x prefill
    work: the holder may be as many times slower as it saves work. That trade has no units (the same at any
    prefill rate, prompt length, load or fleet size), so nothing is fitted to a trace; it changes nothing
    while the holder is also the fastest, e.g. in an idle fleet.

    `limit_s` (the TTFT objective): no discount once the holder's own estimate (`estimates[i]`, plain TTFT)
    exceeds it. Affinity is worth waiting for only while the wait stays within what the service promises; past
    it the holder is overloaded and the request would miss the objective for the sake of the cache
    (docs/router.md: without the bound, more TTFT misses in the autoscaler's Mooncake simulation).

    `has_room(i)`: whether candidate i takes the request's blocks without evicting any (`PrefixIndex.has_room`).
    No discount when the candidate the request would otherwise go to (the cheapest other by `costs`) has room:
    the copy made there takes free space and evicts nothing, so only the repeated work is left, which plain
    estimated TTFT already weighs against waiting. The test compares counts of one unit (blocks believed held
    plus blocks to add, against capacity), so it has no constant to fit and reads the same at any cache size,
    fleet size or load; a replica an autoscaler just added is empty, so a burst's requests move to it.
    """
    if len(costs) < 2:
        return costs
    # (hot path: min/index/slices run in C; the first of equal values wins, as min over indices would)
    w1 = min(work)
    i1 = work.index(w1)
    w2 = min(min(work[:i1], default=math.inf), min(work[i1 + 1:], default=math.inf))
    if w2 <= w1:
        return costs  # two or more candidates hold the most: plain estimated TTFT decides between them
    if limit_s is not None and estimates is not None and estimates[i1] > limit_s:
        return costs  # the holder is already past the TTFT objective: plain estimated TTFT decides
    if has_room is not None:
        head, tail = costs[:i1], costs[i1 + 1:]
        c_head, c_tail = min(head, default=math.inf), min(tail, default=math.inf)
        if has_room(head.index(c_head) if c_head <= c_tail else i1 + 1 + tail.index(c_tail)):
            return costs  # the alternative evicts nothing to take it (a replica just added): plain estimated TTFT
    out = list(costs)
    out[i1] = costs[i1] * min(1.0, max(w1, floor) / w2)
    return out


class EstimatedTTFTScorer(Scorer):
    """Estimated time to first token of THIS request on each replica, relative to the best one.

    estimate(r) = wait(r) + work(request's prompt tokens beyond r's prefix match) / rate(r)
    wait(r)     = how long r still needs for the prefill work this router already sent it (requests without
                  a first byte yet): a virtual FCFS queue at rate(r), corrected by every observed first byte;
                  plus the TTFT objective when r's engine cannot admit this prompt until running requests free
                  blocks: it queues with its KV cache full, or the prompt's blocks exceed its free cache
                  (`cannot_admit`, admission.py)
    cost(r)     = wait(r) + (1 + work_externality · E) · work / rate(r), E = rho / (1 - rho) at the share of
                  candidates with queued prefill (`busy_period_externality`): under load this request's new work
                  also delays the requests routed to r after it (see DEFAULT_WORK_EXTERNALITY; 0 = pure TTFT)
    cost(h)    *= w(h) / w(runner-up) for the one candidate h that alone holds the most of the prompt (the least
                  uncached work w), unless the cheapest other candidate has room for the prompt's blocks: its
                  cached history is worth keeping where a copy elsewhere would evict (`sole_holder_discounted`;
                  off with sole_holder_discount=False)
    score(r)    = min cost / cost(r): 1 for the cheapest replica, in (0, 1] for all, deterministic.

    Unlike request counts, a 40k-token prompt weighs what its prefill costs (`work` grows with context:
    attention), and a prefix-cache hit counts as the prefill time it saves. The charge is made in
    `on_routed` (`charge_prefill`) and released by the router on the first byte or at the end of the request
    (`release_prefill`). A replica to which the router has nothing in flight waits 0, so a lost release
    cannot penalise it forever; without any release at all the queue still drains at rate(r).
    rate(r) = `ReplicaState.prefill_tokens_per_s` when configured, else (`measure_rate`, off by default) the
    marginal rate measured for r's pool
    (`PrefillCostFit`: this router's own first-byte times of requests that found nothing of ours queued on
    their replica, fitted to overhead + work / rate; the replicas of a pool run the same engine on the same
    hardware, so they share one fit), else `default_tokens_per_s` until the fit has enough samples. Measuring
    matters because queue waits are corrected to real time by every first byte: work estimated at a default
    rate far from the replica's weighs cache hits in the wrong units (an H200 figure on a CPU replica makes
    recomputing a prefix look 10x cheaper than waiting for it). Only the marginal rate is used: the fixed
    per-request overhead is paid on whichever replica the request goes to, and the wait behind queued
    requests, overheads included, is what the first-byte corrections measure.
    """

    name = "estimated-ttft"

    def __init__(self, index: PrefixIndex, default_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
                 attention_tokens: float | None = DEFAULT_ATTENTION_TOKENS,
                 work_externality: float = DEFAULT_WORK_EXTERNALITY, measure_rate: bool = False,
                 sole_holder_discount: bool = DEFAULT_SOLE_HOLDER_DISCOUNT) -> None:
        if attention_tokens is not None and attention_tokens <= 0:
            raise ValueError("attention_tokens must be > 0 (or None for a linear cost)")
        if work_externality < 0:
            raise ValueError("work_externality must be >= 0")
        self.index = index
        self.work_externality = work_externality
        self.sole_holder_discount = sole_holder_discount  # see sole_holder_discounted
        self.ttft_objective_s: float | None = None  # the service's TTFT objective: bounds the discount
        self._costs: list[float] = []
        self.default_rate = default_tokens_per_s
        self.attention_tokens = attention_tokens
        self._last: tuple[RequestInfo | None, Sequence[ReplicaState], list[float]] = (None, (), [])
        self.fits: dict[str, PrefillCostFit] = {}  # pool -> measured prefill cost of its replicas
        # Off by default: under bursts a first byte waits inside the engine behind running requests, so the fit
        # learns a rate far below the engine's prefill rate and prices every request's own prefill too high
        # (the 10x-spike simulation: a static 8-replica H200 fleet fell from 100 % to 91 % SLO attainment).
        # For replicas far slower than the default rate (CPU hosts) it corrects the default's units.
        self.measure_rate = measure_rate

    def rate(self, replica: ReplicaState) -> float:
        """Prefill tokens/s of `replica`: configured, else (with `measure_rate`) its pool's measured marginal rate,
        else the default."""
        if replica.prefill_tokens_per_s:
            return replica.prefill_tokens_per_s
        if not self.measure_rate:
            return self.default_rate
        fit = self.fits.get(replica.pool)
        est = fit.estimate(self.default_rate) if fit is not None else None
        return est[1] if est else self.default_rate

    def _work(self, n_tokens: int, cached: int) -> float:
        """Prefill work of tokens cached..n_tokens in zero-context-token equivalents: each token costs
        1 + its context / (2 · attention_tokens), so (n - h) · (1 + (n + h) / (2 · attention_tokens))."""
        new = n_tokens - cached
        if self.attention_tokens is None:
            return float(new)
        return new * (1.0 + (n_tokens + cached) / (2.0 * self.attention_tokens))

    def estimates(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        # One pass per candidate (hot path: `_work` inlined for cached prefixes, same arithmetic).
        n_tokens = max(1, req.input_tokens)
        cold = self._work(n_tokens, 0)
        m = self.index.match(req.block_hashes) if req.block_hashes else None
        per_block = req.tokens_per_block()
        bs = per_block if m else 0
        att2 = None if self.attention_tokens is None else 2.0 * self.attention_tokens
        now = req.clock()
        uncached: list[float] = []
        out: list[float] = []
        own: list[float] = []  # this request's own prefill time per candidate
        busy_n = 0
        for r in replicas:
            h = m.get(r.id, 0) if m else 0
            rate = self.rate(r)
            if h:
                # at least one token is always computed (the engine needs the last position's logits)
                cached = min(n_tokens - 1, h * bs)
                new = n_tokens - cached
                u = float(new) if att2 is None else new * (1.0 + (n_tokens + cached) / att2)
            else:
                u = cold
            uncached.append(u)
            # queued prefill still ahead (0 when the router has nothing in flight there: a lost release
            # cannot penalise a replica forever), then this request's own uncached work
            busy = r.prefill_busy_until - now
            if busy > 0.0 and r.prefill_tokens > 0 and r.in_flight > 0:
                wait = busy
                busy_n += 1
            else:
                wait = 0.0
            if self.ttft_objective_s and not r.stale and cannot_admit(r, n_tokens, per_block):
                wait += self.ttft_objective_s  # expected to miss the objective (KV_ADMISSION_FULL, cannot_admit)
            t = u / rate
            out.append(wait + t)
            own.append(t)
        # (with nothing queued anywhere every wait is 0 and the factor common to all: skipped)
        extra = self.work_externality * busy_period_externality(busy_n, len(replicas)) if busy_n else 0.0
        costs = [e + extra * t for e, t in zip(out, own, strict=True)] if extra else out
        if self.sole_holder_discount and m:
            index, keys = self.index, req.block_hashes

            def has_room(i: int) -> bool:  # the blocks of this prompt candidate i lacks fit in its free space
                rid = replicas[i].id
                return index.has_room(rid, len(keys) - m.get(rid, 0))

            costs = sole_holder_discounted(costs, uncached, self._work(n_tokens, max(0, n_tokens - bs)),
                                           out, self.ttft_objective_s, has_room)
        self._costs = costs
        # remembered for on_routed: by then another plugin may already have taught the index this prompt
        self._last = (req, replicas, uncached)
        return out

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        self.estimates(req, replicas)
        costs = self._costs
        lo = min(costs)
        return [lo / c for c in costs]  # every cost >= 1 token / rate > 0

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        last_req, cands, uncached = self._last
        u = None
        if last_req is req:
            for r, w in zip(cands, uncached, strict=True):
                if r.id == replica.id:
                    u = w
                    break
        if u is None:  # routed without this scorer having scored it (e.g. a retry): estimate it alone now
            self.estimates(req, [replica])
            u = self._last[2][0]
        fit = (self.fits.setdefault(replica.pool, PrefillCostFit())
               if self.measure_rate and not replica.prefill_tokens_per_s else None)
        charge_prefill(req, replica, u, self.rate(replica), fit)
        if req.block_hashes:  # the index learns from routing whether or not the prefix-cache scorer runs
            self.index.insert(replica.id, req.block_hashes)


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
