"""Outlier ejection (llmfleet.router.outliers) and its use in the routing core (dispatch.pick_replica)."""

from __future__ import annotations

import pytest

from llmfleet.router import dispatch
from llmfleet.router.config import OutlierConfig, RouterConfig
from llmfleet.router.outliers import OutlierDetector
from llmfleet.router.plugins import ReplicaState, RequestInfo, build_pipeline

CFG = OutlierConfig(consecutive_failures=2, base_ejection_seconds=10, max_ejection_seconds=35, min_requests=3,
                    interval_seconds=1.0, slow_factor=3.0, slow_min_seconds_per_token=0.01)


def detector(n: int = 4, **kw: object) -> OutlierDetector:
    return OutlierDetector(CFG.model_copy(update=kw), pool_size=n)


def test_failures_in_a_row_eject_and_a_success_resets_the_count() -> None:
    d = detector()
    assert not d.record("a", 0.0, failed=True)
    d.record("a", 0.1, failed=False, seconds=0.1, output_tokens=10)  # the run is broken
    assert not d.record("a", 0.2, failed=True)
    [e] = d.record("a", 0.3, failed=True)
    assert (e.replica, e.reason, e.until) == ("a", "failures", 10.3) and d.ejected == {"a": 10.3}
    assert not d.record("a", 0.4, failed=True)  # already out


def test_back_off_grows_with_each_ejection_is_bounded_and_decays_in_rotation() -> None:
    d = detector()
    lengths = []
    now = 0.0
    for _ in range(5):
        d.record("a", now, failed=True)
        [e] = d.record("a", now, failed=True)
        lengths.append(e.until - now)
        assert d.release_due(e.until - 0.001) == [] and d.release_due(e.until) == ["a"]
        now = e.until
    assert lengths == [10, 20, 30, 35, 35]  # base x n, at most max_ejection_seconds
    now += 2 * 35  # two max_ejection periods back in rotation: the multiplier drops by two (5 -> 3)
    d.record("a", now, failed=True)
    [e] = d.record("a", now, failed=True)
    assert e.until - now == 35 and d._replicas["a"].ejections == 4
    d.release_due(e.until)
    now = e.until + 10 * 35  # long calm: back to the base
    d.record("a", now, failed=True)
    assert d.record("a", now, failed=True)[0].until - now == 10


@pytest.mark.parametrize("n, percent, most", [(1, 100, 0), (2, 50, 1), (2, 100, 1), (4, 50, 2), (5, 50, 2),
                                              (10, 10, 1), (3, 0, 0)])
def test_never_more_than_the_max_share_nor_the_last_replica(n: int, percent: float, most: int) -> None:
    d = detector(n, max_ejection_percent=percent)
    for r in range(n):
        d.record(str(r), 0.0, failed=True)
        d.record(str(r), 0.0, failed=True)
    assert len(d.ejected) == most


def test_a_far_slower_replica_is_ejected_at_the_next_judgement() -> None:
    d = detector(3, interval_seconds=10)
    t = 0
    out = []
    for _ in range(5):  # a and b: 10-12 ms per token; c: 100 ms per token
        for r, per_token in (("a", 0.010), ("b", 0.012), ("c", 0.100)):
            t += 1
            out += [(e.replica, e.reason, t) for e in
                    d.record(r, t, failed=False, seconds=per_token * 11, output_tokens=10)]
    # judged every 10 s: at 1 s nobody has 3 samples yet; at 11 s everyone has
    assert out == [("c", "slow", 11)] and d.ejected.keys() == {"c"}


def test_slow_needs_samples_a_real_margin_and_the_absolute_floor() -> None:
    d = detector(2, min_requests=3)
    for i in range(2):  # too few samples to judge
        d.record("a", i, failed=False, seconds=0.01, output_tokens=0)
        d.record("b", i, failed=False, seconds=1.0, output_tokens=0)
    assert d.ejected == {}
    fast = detector(2, slow_min_seconds_per_token=0.01)
    for i in range(10):  # 10x slower but both far under 10 ms per token: noise among fast replicas
        fast.record("a", i, failed=False, seconds=0.0001, output_tokens=0)
        fast.record("b", i, failed=False, seconds=0.001, output_tokens=0)
    assert fast.ejected == {}
    close = detector(2)
    for i in range(10):  # 2.5x: under slow_factor
        close.record("a", i, failed=False, seconds=0.1, output_tokens=0)
        close.record("b", i, failed=False, seconds=0.25, output_tokens=0)
    assert close.ejected == {}


def test_disabled_and_forget() -> None:
    off = detector(enabled=False)
    for i in range(5):
        assert not off.record("a", i, failed=True)
    d = detector()
    d.record("a", 0, failed=True)
    d.record("a", 0, failed=True)
    d.forget("a")
    assert d.ejected == {} and d.release_due(100) == []


def test_the_same_events_give_the_same_ejections() -> None:
    events = [(r, t * 0.05, t % 7 == 0, 0.01 * (1 + (r == "c") * 9)) for t in range(200) for r in "abc"]

    def run() -> list[tuple[str, str, float]]:
        d = detector(3)
        out = []
        for r, t, failed, s in events:
            d.release_due(t)
            out += [(e.replica, e.reason, e.until) for e in d.record(r, t, failed=failed, seconds=s)]
        return out

    assert run() == run() and run()


def R(id: str) -> ReplicaState:  # noqa: N802
    return ReplicaState(id=id, pool="primary", models=("m",), stale=False)


def test_pick_replica_leaves_ejected_replicas_out_unless_nothing_else_is_left() -> None:
    pipe = build_pipeline({"queue-depth": 1.0})
    a, b = R("a"), R("b")
    d = detector(2)
    d.record("a", 0.0, failed=True)
    d.record("a", 0.0, failed=True)
    info = RequestInfo(model="m")
    assert {dispatch.pick_replica(pipe, info, [a, b], (), d).replica.id for _ in range(20)} == {"b"}  # type: ignore[union-attr]
    assert dispatch.pick_replica(pipe, info, [a, b], {"b"}, d).replica is a  # a retry: an outlier beats a 503
    assert dispatch.pick_replica(pipe, info, [a, b], (), d, now=10.0).replica is not None
    assert d.ejected == {}  # `now` released it


def test_router_config_carries_outlier_settings() -> None:
    cfg = RouterConfig.model_validate({"service": "s", "pools": [{"name": "primary", "role": "primary",
                                                                 "servedNames": ["m"], "endpoints": []}],
                                       "outliers": {"consecutiveFailures": 5, "maxEjectionPercent": 20}})
    assert cfg.outliers.consecutive_failures == 5 and cfg.outliers.max_ejection_percent == 20
    for name, field in OutlierConfig.model_fields.items():
        assert field.description, name
