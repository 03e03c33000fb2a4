"""Filters, scorers and the pipeline framework (table-driven)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tracemalloc

import pytest

from llmfleet.router.plugins import (
    BYTES_PER_SESSION,
    HealthyFilter,
    KVCacheScorer,
    ModelFilter,
    Pipeline,
    PrefixCacheScorer,
    PrefixIndex,
    QueueDepthScorer,
    ReplicaState,
    RequestInfo,
    RunningRequestsScorer,
    Scorer,
    SessionAffinityScorer,
    build_pipeline,
    clamp01,
    session_key,
)


def R(id: str, **kw: object) -> ReplicaState:  # noqa: N802
    kw.setdefault("stale", False)
    return ReplicaState(id=id, pool="primary", models=("m",), **kw)  # type: ignore[arg-type]


REQ = RequestInfo(model="m")


@pytest.mark.parametrize(
    "replicas, kept",
    [
        ([R("a"), R("b", healthy=False), R("c", draining=True)], ["a"]),
        ([R("a", healthy=False)], []),
        ([R("a"), R("b")], ["a", "b"]),
    ],
)
def test_healthy_filter(replicas: list[ReplicaState], kept: list[str]) -> None:
    assert [r.id for r in HealthyFilter().filter(REQ, replicas)] == kept


def test_model_filter() -> None:
    rs = [R("a"), ReplicaState(id="b", pool="p", models=("other",)), ReplicaState(id="c", pool="p")]
    assert [r.id for r in ModelFilter().filter(REQ, rs)] == ["a", "c"]


@pytest.mark.parametrize(
    "scorer, replicas, expected",
    [
        (QueueDepthScorer(), [R("a", waiting=0), R("b", waiting=5), R("c", waiting=10)], [1.0, 0.5, 0.0]),
        (QueueDepthScorer(), [R("a", waiting=3), R("b", waiting=3)], [1.0, 1.0]),
        (QueueDepthScorer(), [R("a", waiting=0, stale=True), R("b", waiting=4)], [0.5, 0.0]),
        # own in-flight beyond what the replica reported running counts as queued
        (QueueDepthScorer(), [R("a", in_flight=6, running=2), R("b")], [0.0, 1.0]),
        (RunningRequestsScorer(), [R("a", running=2, waiting=2), R("b", in_flight=8), R("c")], [0.5, 0.0, 1.0]),
        (KVCacheScorer(), [R("a", kv_usage=0.25), R("b", kv_usage=1.0), R("c", kv_usage=0.0, stale=True)],
         [0.75, 0.0, 0.5]),
    ],
)
def test_load_scorers(scorer: Scorer, replicas: list[ReplicaState], expected: list[float]) -> None:
    assert scorer.score(REQ, replicas) == pytest.approx(expected)


def test_prefix_scorer_learns_from_routing() -> None:
    index = PrefixIndex()
    s = PrefixCacheScorer(index)
    a, b = R("a"), R("b")
    req = RequestInfo(model="m", block_hashes=[1, 2, 3, 4])
    assert s.score(req, [a, b]) == [0.0, 0.0]
    s.on_routed(req, b)
    assert s.score(req, [a, b]) == [0.0, 1.0]
    half = RequestInfo(model="m", block_hashes=[1, 2, 9, 9])
    assert s.score(half, [a, b]) == [0.0, 0.5]
    assert s.score(RequestInfo(model="m"), [a, b]) == [0.0, 0.0]


def test_session_affinity_bounded() -> None:
    s = SessionAffinityScorer(max_bytes=2 * BYTES_PER_SESSION)
    a, b = R("a"), R("b")
    for sid, rep in [("s1", a), ("s2", b), ("s3", a)]:
        s.on_routed(RequestInfo(model="m", session_id=sid), rep)
    assert s.score(RequestInfo(model="m", session_id="s2"), [a, b]) == [0.0, 1.0]
    assert s.score(RequestInfo(model="m", session_id="s1"), [a, b]) == [0.0, 0.0]  # evicted
    assert s.score(RequestInfo(model="m"), [a, b]) == [0.0, 0.0]


def test_session_affinity_memory_is_bounded_by_bytes_whatever_the_ids_length() -> None:
    """20k distinct 8 KB session ids (what a client may send in x-session-id) within a 1 MiB budget: the table
    keeps hashes, so its memory stays under the budget instead of growing with the ids (160 MB)."""
    budget = 1024 * 1024
    s = SessionAffinityScorer(max_bytes=budget)
    a, b = R("a"), R("b")
    ids = [f"{i:08d}" + "x" * 8184 for i in range(20_000)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, sid in enumerate(ids):
        s.on_routed(RequestInfo(model="m", session_id=sid), a if i % 2 else b)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown <= budget, grown
    assert len(s.sessions) == budget // BYTES_PER_SESSION
    last = ids[-1]
    assert s.score(RequestInfo(model="m", session_id=last[:8] + "x" * 8184), [a, b]) == [1.0, 0.0]  # equal, not same
    assert s.score(RequestInfo(model="m", session_id=ids[0]), [a, b]) == [0.0, 0.0]  # evicted
    assert s.score(RequestInfo(model="m", session_id="\udc80 surrogate-escaped header"), [a, b]) == [0.0, 0.0]


def test_session_keys_are_stable_across_processes() -> None:
    out = subprocess.run([sys.executable, "-c", "from llmfleet.router.plugins import session_key; "
                          "print(session_key('s1'))"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert int(out.stdout) == session_key("s1")


class _Bad(Scorer):
    name = "bad"

    def score(self, req, replicas):  # type: ignore[no-untyped-def]
        return [float("nan"), 7.0, -3.0][: len(replicas)]


def test_framework_clamps_weights_and_times() -> None:
    pipe = Pipeline([HealthyFilter()], [(_Bad(), 2.0), (KVCacheScorer(), 1.0)], random.Random(0))
    d = pipe.pick(REQ, [R("a"), R("b"), R("c")])
    assert d.scores["bad"] == [0.0, 1.0, 0.0]
    assert d.totals == [1.0, 3.0, 1.0] and d.replica is not None and d.replica.id == "b"
    assert set(d.plugin_ns) == {"healthy", "bad", "kv-cache"}


def test_no_candidates_reason() -> None:
    d = build_pipeline({"kv-cache": 1}).pick(REQ, [R("a", draining=True)])
    assert d.replica is None and "healthy" in d.reason


def test_ties_power_of_two_deterministic() -> None:
    reps = [R(f"r{i}", in_flight=i) for i in range(4)]
    picks1 = [build_pipeline({"kv-cache": 1}, seed=7).pick(REQ, reps).replica.id for _ in range(5)]  # type: ignore[union-attr]
    picks2 = [build_pipeline({"kv-cache": 1}, seed=7).pick(REQ, reps).replica.id for _ in range(5)]  # type: ignore[union-attr]
    assert picks1 == picks2
    pipe = build_pipeline({"kv-cache": 1}, seed=1)
    chosen = [pipe.pick(REQ, reps).replica.id for _ in range(200)]  # type: ignore[union-attr]
    assert "r3" not in chosen  # the most loaded never wins a two-way duel
    assert chosen.count("r0") > chosen.count("r2")


def test_affinity_vs_load_tradeoff() -> None:
    index = PrefixIndex()
    pipe = build_pipeline({"prefix-cache": 2.0, "queue-depth": 1.0}, index, seed=0)
    a, b = R("a"), R("b")
    req = RequestInfo(model="m", block_hashes=list(range(1, 11)))
    first = pipe.pick(req, [a, b]).replica
    assert first is not None
    for _ in range(5):
        assert pipe.pick(req, [a, b]).replica is first  # sticks to the cached replica
    first.waiting = 100  # heavily queued: affinity 2*1 + queue 0 vs 0 + 1 ... still affinity
    assert pipe.pick(req, [a, b]).replica is first
    pipe2 = build_pipeline({"prefix-cache": 1.0, "queue-depth": 2.0}, index, seed=0)
    assert pipe2.pick(req, [a, b]).replica is not first  # load weighted higher wins


@pytest.mark.parametrize("x, y", [(float("nan"), 0.0), (-1, 0.0), (0.3, 0.3), (9, 1.0)])
def test_clamp(x: float, y: float) -> None:
    assert clamp01(x) == y


def test_scorer_wrong_length_rejected() -> None:
    class Short(Scorer):
        name = "short"

        def score(self, req, replicas):  # type: ignore[no-untyped-def]
            return [1.0]

    with pytest.raises(ValueError, match="short"):
        Pipeline([], [(Short(), 1.0)]).pick(REQ, [R("a"), R("b")])
