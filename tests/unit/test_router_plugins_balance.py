"""The measured prefill cost (PrefillCostFit, learned by the estimated-TTFT scorer per pool) and the load-balance
guard scorer."""

from __future__ import annotations

import pytest

from llmfleet.router.plugins import (
    EstimatedTTFTScorer,
    LoadBalanceScorer,
    PrefillCostFit,
    PrefixIndex,
    ReplicaState,
    RequestInfo,
    build_pipeline,
    build_scorer,
    release_prefill,
)
from llmfleet.router.plugins.base import FIT_MIN_SAMPLES


def R(id: str, pool: str = "primary", **kw: object) -> ReplicaState:  # noqa: N802
    kw.setdefault("stale", False)
    return ReplicaState(id=id, pool=pool, models=("m",), **kw)  # type: ignore[arg-type]


def test_fit_recovers_overhead_and_rate() -> None:
    fit = PrefillCostFit()
    for i in range(40):
        work = 100.0 + 50.0 * (i % 9)
        fit.add(work, 0.02 + work / 2000.0)
    overhead, rate = fit.estimate(30_000.0)  # type: ignore[misc]
    assert overhead == pytest.approx(0.02, rel=1e-6) and rate == pytest.approx(2000.0, rel=1e-6)


def test_fit_needs_samples_ignores_bad_ones_and_falls_back_without_spread() -> None:
    fit = PrefillCostFit()
    for _ in range(FIT_MIN_SAMPLES - 1):
        fit.add(500.0, 0.5)
    fit.add(float("nan"), 1.0)
    fit.add(100.0, -1.0)
    fit.add(0.0, 1.0)
    assert fit.estimate(30_000.0) is None  # bad samples are not samples
    fit.add(500.0, 0.5)
    # all samples of one size: overhead and rate cannot be told apart, one effective rate instead
    assert fit.estimate(30_000.0) == pytest.approx((0.0, 1000.0))
    # bounded by the default rate's factors (1e-3 .. 1e3)
    slow = PrefillCostFit()
    for _ in range(FIT_MIN_SAMPLES):
        slow.add(1.0, 100.0)
    assert slow.estimate(30_000.0) == pytest.approx((0.0, 30.0))


def _route_and_answer(s: EstimatedTTFTScorer, replica: ReplicaState, tokens: int, now: float, rate: float) -> float:
    """Route one request with nothing queued on `replica`; its first byte comes at the replica's real speed."""
    req = RequestInfo(model="m", input_tokens=tokens, now=now)
    s.score(req, [replica])
    s.on_routed(req, replica)
    t = now + tokens / rate
    release_prefill(req, now=t)
    return t


def test_estimated_ttft_learns_its_pools_rate_from_first_bytes() -> None:
    s = EstimatedTTFTScorer(PrefixIndex(), default_tokens_per_s=30_000.0, attention_tokens=None, work_externality=0.0,
                            measure_rate=True)
    a, b, other = R("a"), R("b"), R("c", pool="student")
    assert s.rate(a) == 30_000.0
    t = 0.0
    for i in range(2 * FIT_MIN_SAMPLES):
        t = _route_and_answer(s, a, 100 + 40 * (i % 5), t + 1.0, rate=1000.0) + 1.0
    assert s.rate(a) == pytest.approx(1000.0, rel=1e-6)
    assert s.rate(b) == pytest.approx(1000.0, rel=1e-6)  # same pool, same engine: one fit
    assert s.rate(other) == 30_000.0  # another pool learns its own
    assert s.rate(R("d", prefill_tokens_per_s=5000.0)) == 5000.0  # a configured rate wins


def test_queued_request_first_bytes_are_not_samples() -> None:
    s = EstimatedTTFTScorer(PrefixIndex(), default_tokens_per_s=1000.0, attention_tokens=None, measure_rate=True)
    a = R("a", in_flight=1)
    first = RequestInfo(model="m", input_tokens=1000, now=0.0)
    second = RequestInfo(model="m", input_tokens=1000, now=0.1)
    s.on_routed(first, a)
    s.on_routed(second, a)  # queued behind `first`: its first byte also measures the wait
    release_prefill(second, now=5.0)
    release_prefill(first, now=1.0)
    assert s.fits["primary"].samples == 1


def test_measured_rate_keeps_a_prefix_hit_that_a_default_rate_gives_up() -> None:
    """The replica holding the prompt's prefix has measured (real-time) queued work ahead. At the default
    rate, recomputing the prompt elsewhere looks 30x cheaper than it is and the hit is abandoned; once the
    pool's rate is measured, the hit wins."""
    keys = list(range(1, 33))  # 32 blocks of 32 tokens
    index = PrefixIndex()
    index.insert("a", keys[:30])
    # the sole-holder discount alone would keep this hit (a saves 30 of 32 blocks): off, to test the rate
    s = EstimatedTTFTScorer(index, default_tokens_per_s=30_000.0, attention_tokens=None, work_externality=0.0,
                            measure_rate=True, sole_holder_discount=False)
    a = R("a", in_flight=1, prefill_tokens=200.0, prefill_busy_until=10.3)  # 0.3 s of work ahead (real time)
    b = R("b")
    req = RequestInfo(model="m", block_hashes=keys, input_tokens=1024, block_size=32, now=10.0)
    before = s.score(req, [a, b])
    assert before[1] > before[0]  # default rate: 1,024 tokens on b cost 34 ms, less than a's 0.3 s queue
    t = 0.0
    for i in range(2 * FIT_MIN_SAMPLES):
        t = _route_and_answer(s, R("warm"), 100 + 40 * (i % 5), t + 1.0, rate=1000.0) + 1.0
    after = s.score(req, [a, b])
    assert after[0] > after[1]  # measured 1,000 tokens/s: a costs 0.3 + 0.064 s, b 1.024 s


def test_which_pools_are_measured() -> None:
    """By default (`measure_rate` None) a pool the planner priced keeps its planned rate and learns nothing (first
    bytes under a burst wait inside the engine), while a pool without a price (CPU replicas, no model preset) is
    measured; False measures none (the default rate where there is no price), True every pool, around its price.
    `build_pipeline` hands the router config's `measure_prefill_rate` and the pools' prices to the scorer."""
    def learn(s: EstimatedTTFTScorer, replica: ReplicaState) -> None:
        t = 0.0
        for i in range(2 * FIT_MIN_SAMPLES):
            t = _route_and_answer(s, replica, 100 + 40 * (i % 5), t + 1.0, rate=1000.0) + 1.0

    auto = EstimatedTTFTScorer(PrefixIndex(), default_tokens_per_s=30_000.0, attention_tokens=None,
                               work_externality=0.0)
    auto.pool_rates = {"primary": 4000.0}
    learn(auto, R("a"))
    learn(auto, R("s", pool="student"))
    assert auto.rate(R("a")) == 4000.0 and "primary" not in auto.fits  # priced: the planner's rate, no fit
    assert auto.rate(R("s", pool="student")) == pytest.approx(1000.0, rel=1e-6)  # unpriced: measured
    never = EstimatedTTFTScorer(PrefixIndex(), default_tokens_per_s=30_000.0, attention_tokens=None,
                                work_externality=0.0, measure_rate=False)
    learn(never, R("s", pool="student"))
    assert never.rate(R("s", pool="student")) == 30_000.0 and not never.fits
    every = EstimatedTTFTScorer(PrefixIndex(), default_tokens_per_s=30_000.0, attention_tokens=None,
                                work_externality=0.0, measure_rate=True)
    every.pool_rates = {"primary": 4000.0}
    assert every.rate(R("a")) == 4000.0  # the price until the fit has its samples
    learn(every, R("a"))
    assert every.rate(R("a")) == pytest.approx(1000.0, rel=1e-6)
    priced = build_pipeline({"estimated-ttft": 1.0}, PrefixIndex(), pool_prefill_rates={"primary": 4000.0})
    on = build_pipeline({"estimated-ttft": 1.0}, PrefixIndex(), measure_prefill_rate=True)
    off = build_pipeline({"estimated-ttft": 1.0}, PrefixIndex(), measure_prefill_rate=False)
    assert [(sc.measure_rate, sc.pool_rates) for sc, _ in priced.scorers] == [(None, {"primary": 4000.0})]
    assert [sc.measure_rate for sc, _ in on.scorers] == [True]
    assert [sc.measure_rate for sc, _ in off.scorers] == [False]


@pytest.mark.parametrize(
    "loads, expected",
    [
        ([0, 1, 2], [1.0, 1.0, 1.0]),  # within min + 2: affinity decides alone
        ([0, 3, 5], [1.0, 0.5, 0.25]),  # 1 and 3 requests beyond the band
        ([10, 15, 16], [1.0, 1.0, 0.5]),  # the band is 1.5 x the least loaded once that is larger
        ([4, 4, 4], [1.0, 1.0, 1.0]),
    ],
)
def test_load_balance_scores_the_band(loads: list[int], expected: list[float]) -> None:
    reps = [R(str(i), in_flight=n) for i, n in enumerate(loads)]
    assert LoadBalanceScorer().score(RequestInfo(model="m"), reps) == pytest.approx(expected)


def test_load_balance_is_a_registered_scorer_with_checked_arguments() -> None:
    assert isinstance(build_scorer("load-balance", PrefixIndex()), LoadBalanceScorer)
    with pytest.raises(ValueError):
        LoadBalanceScorer(abs_slack=-1)
    with pytest.raises(ValueError):
        LoadBalanceScorer(rel=0.5)
