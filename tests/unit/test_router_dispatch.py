"""The routing core (router/dispatch.py): what the router and the simulator both call."""

from __future__ import annotations

from llmfleet.router import dispatch
from llmfleet.router.config import FallbackConfig, SLOConfig
from llmfleet.router.fallback import FallbackPolicy, FallbackSignals
from llmfleet.router.plugins import PrefixIndex, ReplicaState, RequestInfo, build_pipeline


def _replicas(n: int = 3) -> list[ReplicaState]:
    return [ReplicaState(id=f"r{i}", pool="p", models=("m",), stale=False) for i in range(n)]


def test_pick_replica_skips_tried_and_learns_only_on_commit() -> None:
    index = PrefixIndex()
    pipe = build_pipeline({"prefix-cache": 1.0}, index, seed=0)
    reps = _replicas()
    info = RequestInfo(model="m", block_hashes=[11, 12, 13], input_tokens=48, block_size=16)
    d = dispatch.pick_replica(pipe, info, iter(reps), tried={"r0", "r1"})
    assert d.replica is reps[2]
    assert index.match([11, 12, 13]) == {}  # picking teaches nothing
    dispatch.commit(pipe, info, reps[2])
    assert index.match([11, 12, 13]) == {"r2": 3}
    again = dispatch.pick_replica(pipe, RequestInfo(model="m", block_hashes=[11, 12, 13], input_tokens=48,
                                                    block_size=16), reps)
    assert again.replica is reps[2]  # the prefix it just learned
    assert dispatch.pick_replica(pipe, info, reps, tried={"r0", "r1", "r2"}).replica is None


def test_first_byte_and_done_release_the_prefill_charge_once() -> None:
    pipe = build_pipeline({"estimated-ttft": 1.0}, PrefixIndex(), seed=0)
    reps = _replicas(2)
    info = RequestInfo(model="m", block_hashes=[1, 2], input_tokens=2000, block_size=16, now=10.0)
    chosen = dispatch.pick_replica(pipe, info, reps).replica
    assert chosen is not None
    dispatch.commit(pipe, info, chosen)
    assert chosen.prefill_tokens > 0 and info.prefill_charge is not None
    dispatch.on_first_byte(info, 10.1)
    assert chosen.prefill_tokens == 0 and info.prefill_charge is None
    dispatch.on_done(info, 10.5)  # idempotent: nothing left to release
    assert chosen.prefill_tokens == 0
    dispatch.on_first_byte(None)  # a request the store answered has no RequestInfo
    dispatch.on_done(None)


def test_on_done_without_a_first_byte_releases_and_feeds_the_slo_window() -> None:
    pipe = build_pipeline({"estimated-ttft": 1.0}, PrefixIndex(), seed=0)
    reps = _replicas(1)
    info = RequestInfo(model="m", input_tokens=500, now=1.0)
    dispatch.commit(pipe, info, reps[0])
    policy = FallbackPolicy(FallbackConfig(), SLOConfig(ttft_p95_ms=100))
    before = policy.slo_tracker.count(2.0)
    dispatch.on_done(info, 2.0, policy, dispatch.Latency(ttft_ms=900.0, tpot_ms=None, e2e_ms=1000.0))
    assert reps[0].prefill_tokens == 0
    assert policy.slo_tracker.count(2.0) == before + 1


def test_pick_pool_decides_and_records_the_tenant_window() -> None:
    policy = FallbackPolicy(FallbackConfig(max_degraded_fraction=1.0), SLOConfig())
    down = FallbackSignals("primary", routable_replicas=0)
    d = dispatch.pick_pool(policy, 5.0, down, [FallbackSignals("small", routable_replicas=1)], tenant="t",
                           input_tokens=10, request_class=None)
    assert (d.pool, d.degraded, d.reason) == ("small", True, "unavailable")
    assert policy.tenants.fraction("t", 5.0) == 1.0  # recorded: the degraded-fraction cap counts it
