"""Simulator routing: the finite-cache hit-rate bounds by hand, the llmfleet router's prefill bookkeeping,
preselection on a large simulated fleet, determinism."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec, SimConfig, simulate
from llmfleet.sim.report import finite_cache_hit_bound, oracle_hit_rate
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.traces import load_mooncake
from llmfleet.sim.workload import Request, SyntheticSpec, Workload, synthetic

HEAD300 = Path(__file__).parent / "sim_data" / "mooncake_head300.jsonl"
UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


def _abx() -> Workload:
    # block size 4, prompts of 8 tokens = 2 blocks, of which only the first can hit (the last token is computed)
    return Workload("abx", [Request(0, 0.0, 8, 1, (1, 2)), Request(1, 1.0, 8, 1, (3, 4)),
                            Request(2, 2.0, 8, 1, (1, 2))], block_size=4)


@pytest.mark.parametrize(
    "capacity, policy, hit_tokens",
    [
        (100, "lru", 4), (100, "belady", 4),  # room for everything: the oracle
        (2, "lru", 0),  # request 1 evicts blocks 1, 2 before request 2 comes back
        (2, "belady", 4),  # Belady does not cache 3, 4 (never used again): request 2 hits block 1
        (0, "belady", 0),
    ],
)
def test_finite_cache_bounds_by_hand(capacity: int, policy: str, hit_tokens: int) -> None:
    assert finite_cache_hit_bound(_abx(), capacity, policy) == pytest.approx(hit_tokens / 24)


def test_finite_cache_bounds_order_on_a_real_trace() -> None:
    w = load_mooncake(HEAD300)
    oracle = oracle_hit_rate(w)
    for cap in (200, 1000, 5000):
        lru, belady = finite_cache_hit_bound(w, cap, "lru"), finite_cache_hit_bound(w, cap, "belady")
        assert lru <= belady + 1e-12 <= oracle + 2e-12
    assert finite_cache_hit_bound(w, 10**7, "lru") == pytest.approx(oracle)
    with pytest.raises(ValueError):
        finite_cache_hit_bound(w, 10, "fifo")


def _run(w: Workload, replicas: int, seed: int = 0, **router_kw: object) -> tuple[dict, LlmfleetRouter]:
    rt = LlmfleetRouter(seed=seed, **router_kw)  # type: ignore[arg-type]
    # a context above the trace's longest request (191k tokens): nothing rejected
    pool = PoolSpec(replicas=replicas, max_model_len=1 << 18)
    res = simulate(w, SimConfig(pools=[pool], seed=seed, check_invariants=True), router=rt)
    return res.summary, rt


def test_llmfleet_router_releases_every_prefill_charge() -> None:
    w = load_mooncake(HEAD300).scaled(3.0)
    summary, rt = _run(w, 4, weights={"estimated-ttft": 1.0, "queue-depth": 0.1})
    assert summary["completed"] == len(w.requests)
    assert not rt.infos  # every routed request got its first token (or finished) and was released
    for st in rt.states.values():
        assert st.prefill_tokens == 0.0
    rr = simulate(w, SimConfig(pools=[PoolSpec(replicas=4, max_model_len=1 << 18)]), router="round-robin").summary
    assert summary["prefixHitRate"] > 1.5 * rr["prefixHitRate"]  # the prefill-time estimate values cache hits


def test_llmfleet_router_deterministic_with_preselection_on_a_large_fleet() -> None:
    w = synthetic(SyntheticSpec(duration_s=20, rate_rps=60, tenants=12, seed=3))
    a, rt = _run(w, 48, seed=1, max_candidates=8)
    b, _ = _run(w, 48, seed=1, max_candidates=8)
    assert rt.pipeline.preselector is not None and rt.pipeline.preselector.max_candidates == 8
    assert a == b
    c, _ = _run(w, 48, seed=2, max_candidates=8)
    assert c["completed"] == a["completed"] == len(w.requests)


class _CheckingRouter(LlmfleetRouter):
    """Asserts, at every routing decision, that the states the plugins read equal the live replicas."""

    checked = 0

    def route(self, req, fleet, now):  # type: ignore[no-untyped-def]
        for pool in fleet.routable.values():
            for rep in pool:
                st = self.states[rep.id]
                running, waiting = len(rep.running), len(rep.waiting)
                assert (st.running, st.waiting, st.in_flight) == (float(running), float(waiting), running + waiting)
                assert st.kv_usage == rep.kv_usage()
                self.checked += 1
        return super().route(req, fleet, now)


def test_llmfleet_router_states_track_the_replicas_exactly() -> None:
    # The engine pushes each replica change into the router's ReplicaState (replica_changed); a missed call
    # would leave a stale queue or KV figure that the scorers read. Small KV: preemptions and evictions too.
    w = synthetic(SyntheticSpec(duration_s=60, rate_rps=20, tenants=4, seed=3))
    rt = _CheckingRouter()
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=3, kv_blocks=600, max_model_len=131072)]), router=rt)
    assert res.summary["completed"] == len(w.requests)
    assert rt.checked >= 3 * len(w.requests)


def test_llmfleet_router_routes_through_the_routing_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator runs the router's own dispatch functions, not a copy of them."""
    from llmfleet.router import dispatch

    calls: dict[str, int] = {}

    def counting(name: str):  # type: ignore[no-untyped-def]
        real = getattr(dispatch, name)

        def wrapper(*a, **kw):  # type: ignore[no-untyped-def]
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **kw)

        return wrapper

    for name in ("pick_replica", "commit", "on_first_byte", "on_done"):
        monkeypatch.setattr(dispatch, name, counting(name))
    w = _abx()
    _run(w, 2)
    n = len(w.requests)
    assert calls == {"pick_replica": n, "commit": n, "on_first_byte": n, "on_done": n}


def test_sglang_baseline_keeps_the_real_routers_defaults_and_tree_budget() -> None:
    """The sglang baseline is sglang-router's (and vllm-router's) cache_aware with their CLI defaults: its tree
    remembers what was routed beyond what the replica still caches (trimmed only past 32M characters), so a
    tenant seen long ago still draws its prompts to the same replica."""
    from llmfleet.sim.routers import SGLangCacheAware

    rt = SGLangCacheAware()
    assert (rt.cache_threshold, rt.balance_abs, rt.balance_rel) == (0.3, 64, 1.5)
    # 2 replicas of 8 blocks; tenant A's 4-block prompt, then 6 other prompts that turn both caches over
    reqs = [Request(0, 0.0, 17, 1, (1, 2, 3, 4))]
    reqs += [Request(i, float(i), 17, 1, tuple(100 * i + k for k in range(4))) for i in range(1, 7)]
    reqs.append(Request(7, 7.0, 17, 1, (1, 2, 3, 4)))
    pool = PoolSpec(replicas=2, kv_blocks=8, cost=UNIT, max_model_len=64)
    res = simulate(Workload("turnover", reqs, block_size=4), SimConfig(pools=[pool]), router=rt)
    first, last = res.records[0], res.records[-1]
    assert first["replica"] >= 0 and res.summary["rejected"] == 0
    assert last["replica"] == first["replica"]  # remembered although evicted from the replica's cache
    assert rt.index.blocks_of(str(first["replica"])) > 8  # the tree holds more than the replica caches


@pytest.mark.parametrize("kv_blocks, gain", [(800, 0.001), (None, 0.0)])
def test_sole_holder_discount_keeps_more_prefix_hits_where_caches_are_full(kv_blocks: int | None,
                                                                          gain: float) -> None:
    """The Mooncake head on 4 replicas at 6x its rate: holders of a conversation are busy, and plain estimated
    TTFT recomputes the history elsewhere. With caches of 800 blocks, full, the discount (unbounded here: this
    fleet is far past any TTFT objective) keeps more of the prompt tokens cached than with it off (4.4 % against
    4.3 %: the busy-period externality of the plain score already keeps most of them on their holder). With
    the H200's own caches every replica has room for what it is sent: recomputing there evicts nothing, so
    the discount never applies and the routing is the same as without it."""
    w = load_mooncake(HEAD300).scaled(6.0)
    pool = PoolSpec(model="llama-3.1-8b", gpu="H200", replicas=4, kv_blocks=kv_blocks)
    cfg = SimConfig(pools=[pool], ttft_slo_s=2.0, tpot_slo_s=0.1)
    on = simulate(w, cfg, router=LlmfleetRouter(sole_holder_discount=True, ttft_objective_s=math.inf))
    off = simulate(w, cfg, router=LlmfleetRouter(sole_holder_discount=False))
    if gain:
        assert on.summary["prefixHitRate"] > off.summary["prefixHitRate"] + gain
    else:
        assert [r["replica"] for r in on.records] == [r["replica"] for r in off.records]


def _replicas(router: object, reqs: list[Request], replicas: int = 3, seed: int = 0) -> list[int]:
    pool = PoolSpec(replicas=replicas, kv_blocks=64, cost=UNIT, max_model_len=256)
    res = simulate(Workload("w", reqs, block_size=4), SimConfig(pools=[pool], seed=seed, check_invariants=True),
                   router=router)  # type: ignore[arg-type]
    return [r["replica"] for r in sorted(res.records, key=lambda r: r["rid"])]


def _prompt(rid: int, at: float, tenant: int) -> Request:
    return Request(rid, at, 41, 1, tuple(1000 * tenant + k for k in range(10)))  # 41 tokens: 41 ms at UNIT


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sglang_baseline_breaks_load_ties_in_a_fixed_worker_order(seed: int) -> None:
    """sglang-router 0.3.2 picks the least loaded worker with Rust's min_by_key over its worker list: the
    first of the tied ones, in an order fixed for the router process. On an idle fleet every new prompt goes
    to the same replica (the real router sent every tenant to one vLLM replica); with that replica busy, the
    next one in the order."""
    from llmfleet.sim.routers import SGLangCacheAware

    idle = [_prompt(i, float(i), tenant=i) for i in range(6)]  # each done long before the next
    assert len(set(_replicas(SGLangCacheAware(seed=seed), idle))) == 1
    # three new tenants while the earlier ones are in flight, then a fourth on an idle fleet again
    busy = [_prompt(0, 0.0, 0), _prompt(1, 0.01, 1), _prompt(2, 0.02, 2), _prompt(3, 1.0, 3)]
    a, b, c, d = _replicas(SGLangCacheAware(seed=seed), busy)
    assert len({a, b, c}) == 3 and d == a


def test_vllm_router_without_render_has_no_prefix_affinity() -> None:
    """vllm-router 0.1.17 whose render calls the engines refuse: identical prompts in flight together spread
    over the replicas (least loaded), where the sglang baseline keeps them on the replica with the prefix."""
    from llmfleet.sim.routers import SGLangCacheAware, VllmRouterNoRender

    same = [_prompt(i, 0.01 * i, tenant=0) for i in range(3)]
    assert len(set(_replicas(VllmRouterNoRender(), same))) == 3
    assert len(set(_replicas(SGLangCacheAware(), same))) == 1
    idle = [_prompt(i, float(i), tenant=i) for i in range(4)]
    assert len(set(_replicas(VllmRouterNoRender(), idle))) == 1  # ties: the first worker of its list


def test_the_sole_holder_variant_is_its_own_router() -> None:
    """`llmfleet-sole-holder` (routing_eval, `sim run --router`) is the default pipeline with the discount on,
    reported under its own name so benchmarks do not mistake it for the default or for a baseline."""
    from llmfleet.sim.routers import ROUTERS, make_router

    variant, default = make_router("llmfleet-sole-holder"), make_router("llmfleet")
    assert "llmfleet-sole-holder" in ROUTERS
    assert (variant.name, variant.sole_holder_discount) == ("llmfleet-sole-holder", True)  # type: ignore[attr-defined]
    assert (default.name, default.sole_holder_discount) == ("llmfleet", False)  # type: ignore[attr-defined]


def test_the_eviction_cost_variant_is_its_own_router() -> None:
    """`llmfleet-eviction-cost` is the default pipeline with spec.router.evictionCost on, under its own name."""
    from llmfleet.router.plugins import EstimatedTTFTScorer, PrefixIndex
    from llmfleet.sim.routers import ROUTERS, make_router

    variant, default = make_router("llmfleet-eviction-cost"), make_router("llmfleet")
    assert "llmfleet-eviction-cost" in ROUTERS
    assert (variant.name, variant.eviction_cost) == ("llmfleet-eviction-cost", True)  # type: ignore[attr-defined]
    assert (default.name, default.eviction_cost) == ("llmfleet", False)  # type: ignore[attr-defined]
    assert not EstimatedTTFTScorer(PrefixIndex()).eviction_cost
