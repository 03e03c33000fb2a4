"""The estimated-TTFT scorer: each candidate's time to first token for this request, from the prefill work the
router has sent it and the prompt's prefix matches, with the sole-holder discount and the eviction cost."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from llmfleet.api.inferenceservice import DEFAULT_EVICTION_COST, DEFAULT_SOLE_HOLDER_DISCOUNT
from llmfleet.router.plugins.admission import cannot_admit
from llmfleet.router.plugins.base import (
    PrefillCostFit,
    ReplicaState,
    RequestInfo,
    Scorer,
    charge_prefill,
)
from llmfleet.router.prefill_price import DEFAULT_PREFILL_TOKENS_PER_S
from llmfleet.router.prefix_index import PrefixIndex

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
        # (head is empty when the holder comes first: then every other candidate is in tail, inf costs included)
        if has_room(head.index(c_head) if head and c_head <= c_tail else i1 + 1 + tail.index(c_tail)):
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
    cost(r)    += min(n, over) · tokens_per_block / rate(r) · reuse on a candidate whose cache is believed full
                  while another candidate no busier than r has room: n blocks of the prompt it lacks, `over` of
                  what it would then hold beyond its capacity, reuse the share of routed prompt blocks found
                  cached (`_with_eviction`; off unless eviction_cost=True)
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
    rate(r) = `ReplicaState.prefill_tokens_per_s` when configured; else, where r's pool is measured, the
    marginal rate measured for it
    (`PrefillCostFit`: this router's own first-byte times of requests that found nothing of ours queued on
    their replica, fitted to overhead + work / rate; the replicas of a pool run the same engine on the same
    hardware, so they share one fit); else, and until the fit has enough samples, the pool's planned rate
    (`pool_rates`: prefill_price.py), else `default_tokens_per_s`. A pool is measured when `measure_rate` is
    True, or when it is None (the default) and the pool has no planned rate. Measuring
    matters because queue waits are corrected to real time by every first byte: work estimated at a default
    rate far from the replica's weighs cache hits in the wrong units (an H200 figure on a CPU replica makes
    recomputing a prefix look 10x cheaper than waiting for it). Only the marginal rate is used: the fixed
    per-request overhead is paid on whichever replica the request goes to, and the wait behind queued
    requests, overheads included, is what the first-byte corrections measure.
    """

    name = "estimated-ttft"

    def __init__(self, index: PrefixIndex, default_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S,
                 attention_tokens: float | None = DEFAULT_ATTENTION_TOKENS,
                 work_externality: float = DEFAULT_WORK_EXTERNALITY, measure_rate: bool | None = None,
                 sole_holder_discount: bool = DEFAULT_SOLE_HOLDER_DISCOUNT,
                 eviction_cost: bool = DEFAULT_EVICTION_COST) -> None:
        if attention_tokens is not None and attention_tokens <= 0:
            raise ValueError("attention_tokens must be > 0 (or None for a linear cost)")
        if work_externality < 0:
            raise ValueError("work_externality must be >= 0")
        self.index = index
        self.work_externality = work_externality
        self.sole_holder_discount = sole_holder_discount  # see sole_holder_discounted
        self.eviction_cost = eviction_cost  # see _with_eviction
        self.ttft_objective_s: float | None = None  # the service's TTFT objective: bounds the discount
        self._costs: list[float] = []
        self.default_rate = default_tokens_per_s
        self.attention_tokens = attention_tokens
        self._last: tuple[RequestInfo | None, Sequence[ReplicaState], list[float], dict[str, int]] = (
            None, (), [], {})
        # prompt blocks routed so far, and how many of them the chosen replica was believed to hold: their ratio
        # is the chance that a cached block is used again (`_with_eviction`)
        self.blocks_seen = 0
        self.blocks_held = 0
        self.fits: dict[str, PrefillCostFit] = {}  # pool -> measured prefill cost of its replicas
        # pool -> the planner's price of its prefill (prefill_price.py); a pool without one is measured by default
        self.pool_rates: dict[str, float] = {}
        # True: measure every pool; False: none (a pool without a planned rate gets the default); None: the pools
        # without a planned rate. Under bursts a first byte waits inside the engine behind running requests, so a
        # fit learns a rate below the engine's: the safe side, where a rate above the replicas' collapses a fleet.
        self.measure_rate = measure_rate

    def measures(self, pool: str) -> bool:
        """Whether `pool`'s rate is measured (see `rate`)."""
        return self.measure_rate if self.measure_rate is not None else pool not in self.pool_rates

    def rate(self, replica: ReplicaState) -> float:
        """Prefill tokens/s of `replica`: configured, else its pool's measured marginal rate where it is measured,
        else the pool's planned rate, else the default."""
        if replica.prefill_tokens_per_s:
            return replica.prefill_tokens_per_s
        base = self.pool_rates.get(replica.pool, self.default_rate)
        if not self.measures(replica.pool):
            return base
        fit = self.fits.get(replica.pool)
        est = fit.estimate(base) if fit is not None else None
        return est[1] if est else base

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
        if self.eviction_cost and self.blocks_held and req.block_hashes:
            costs = self._with_eviction(costs, req, replicas, m or {})
        if self.sole_holder_discount and m:
            index, keys = self.index, req.block_hashes

            def has_room(i: int) -> bool:  # the blocks of this prompt candidate i lacks fit in its free space
                rid = replicas[i].id
                return index.has_room(rid, len(keys) - m.get(rid, 0))

            costs = sole_holder_discounted(costs, uncached, self._work(n_tokens, max(0, n_tokens - bs)),
                                           out, self.ttft_objective_s, has_room)
        self._costs = costs
        # remembered for on_routed: by then another plugin may already have taught the index this prompt
        self._last = (req, replicas, uncached, m or {})
        return out

    def _with_eviction(self, costs: list[float], req: RequestInfo, replicas: Sequence[ReplicaState],
                       m: dict[str, int]) -> list[float]:
        """`costs` plus, on each candidate that would evict to take the request while another would not, the
        prefill time those evictions will cost.

        The request's blocks that candidate r lacks, n, go into its cache; what it holds plus n beyond its
        capacity (`PrefixIndex.over_capacity`) is evicted: min(n, over) blocks. Each would have been found again
        by a later request with the probability the fleet has been finding prompt blocks cached (blocks_held /
        blocks_seen, counted in `on_routed` over every decision this router has made: ~0 for unrelated prompts,
        high for conversations), and would then cost its recompute, per_block / rate(r). The
        cost is in seconds like the rest and has no constant to fit.

        Only while some candidate takes the request without evicting (a replica just added, or one whose cache
        still has space): then evicting is a choice, and the term sends a new conversation to the free space
        instead of pushing other conversations' history out of a full cache for a slightly faster start. Why:
        on a trace whose prompts all share a first block (the Mooncake conversation trace), its few holders are
        always a little faster and took nearly every new conversation, which then evicted each other's history
        in those few caches while the rest of a 32-replica fleet stayed cold (docs/router.md, "Eviction cost").
        When every candidate must evict (a fleet whose caches have all filled), it adds nothing and plain estimated
        TTFT decides as without it: evicting is then no choice, and what LRU evicts from a full cache is its oldest
        history, whose chance of reuse the fleet-wide ratio overstates.

        A candidate that must evict pays only if some candidate with room is no busier than it (`ReplicaState.load`:
        requests at the replica). Room on a replica that already carries more requests is no reason to move a
        request there. Without this the term herds: every request that would evict flees to the few replicas still
        with room until their caches fill. The room counts prompt blocks, while the requests that flood such a
        replica grow their KV as they answer. On the reasoning-style shape (4,000-token answers) one replica went
        from 4 requests running to 117 in three minutes and preempted 69 times, while full replicas ran 9 to 16
        (docs/router.md, "Eviction cost").
        """
        reuse = self.blocks_held / self.blocks_seen
        per_block = req.tokens_per_block()
        keys = len(req.block_hashes)
        index = self.index
        evicted = []
        for r in replicas:
            n = keys - m.get(r.id, 0)
            evicted.append(min(n, index.over_capacity(r.id, n)))
        if min(evicted) > 0:
            return costs  # every candidate must evict: plain estimated TTFT decides which
        # the least busy replica with room: a full one that carries fewer requests pays nothing
        least = min(r.load for r, e in zip(replicas, evicted, strict=True) if e <= 0)
        return [c + e * per_block / self.rate(r) * reuse if e > 0 and r.load >= least else c
                for c, e, r in zip(costs, evicted, replicas, strict=True)]

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[float]:
        self.estimates(req, replicas)
        costs = self._costs
        lo = min(costs)
        return [lo / c for c in costs]  # every cost >= 1 token / rate > 0

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        last_req, cands, uncached, m = self._last
        u = None
        if last_req is req:
            for r, w in zip(cands, uncached, strict=True):
                if r.id == replica.id:
                    u = w
                    break
        if u is None:  # routed without this scorer having scored it (e.g. a retry): estimate it alone now
            self.estimates(req, [replica])
            u = self._last[2][0]
            m = self._last[3]
        fit = (self.fits.setdefault(replica.pool, PrefillCostFit())
               if self.measures(replica.pool) and not replica.prefill_tokens_per_s else None)
        charge_prefill(req, replica, u, self.rate(replica), fit)
        if req.block_hashes:
            if self.eviction_cost:  # the reuse ratio only the eviction cost reads
                self.blocks_seen += len(req.block_hashes)
                self.blocks_held += min(len(req.block_hashes), m.get(replica.id, 0))
            # the index learns from routing whether or not the prefix-cache scorer runs
            self.index.insert(replica.id, req.block_hashes)
