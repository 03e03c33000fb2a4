"""The estimated-TTFT scorer's tail band: time under the fleet's unavoidable TTFT tail does not buy a diversion."""

from __future__ import annotations

import pytest

from llmfleet.router.plugins import EstimatedTTFTScorer, PrefixIndex, ReplicaState, RequestInfo
from llmfleet.router.plugins.tail import TailLevel, tail_banded

RATE = 1000.0  # tokens/s: estimates read directly as seconds
KEYS = [11, 12, 13, 14, 15, 16]  # 6 blocks of 16 tokens; "a" holds the first 4 (64 of the prompt's 100 tokens)
REQ = dict(model="m", block_hashes=KEYS, input_tokens=100, block_size=16, now=10.0)


def R(id: str, **kw: object) -> ReplicaState:  # noqa: N802
    kw.setdefault("stale", False)
    return ReplicaState(id=id, pool="primary", models=("m",), **kw)  # type: ignore[arg-type]


def test_tail_level_is_a_windowed_quantile_once_it_has_a_sample_beyond_it() -> None:
    t = TailLevel(quantile=0.95, window=40)
    for x in range(19):
        t.add(float(x))
    assert t.level() == 0.0  # 19 samples: none beyond the 95th percentile yet
    t.add(19.0)
    assert t.level() == 19.0  # 20 samples: the largest is the 95th percentile
    for x in range(20, 40):
        t.add(float(x))
    assert t.level() == 38.0  # 0..39: int(0.95 x 40) = 38
    for _ in range(40):
        t.add(1.0)
    assert t.level() == 1.0  # the window slid: the old samples are gone
    with pytest.raises(ValueError, match="quantile"):
        TailLevel(quantile=1.0)


def test_tail_banded_raises_only_candidates_that_would_repeat_cached_work() -> None:
    # a holds the prefix (work 36) and costs 0.5; b and c recompute it (work 100 and 68)
    costs, work = [0.5, 0.1, 2.0], [36.0, 100.0, 68.0]
    assert tail_banded(costs, work, level=1.0) == [0.5, 1.0, 2.0]  # c above the level: unchanged
    # nobody holds more than the others: nothing changes, whatever the level
    assert tail_banded([0.3, 0.1], [100.0, 100.0], level=5.0) == [0.3, 0.1]
    # two holders: both keep their costs, the faster one still wins between them
    assert tail_banded([0.4, 0.2, 0.1], [36.0, 36.0, 100.0], level=1.0) == [0.4, 0.2, 1.0]
    # no level yet: plain costs
    assert tail_banded(costs, work, level=0.0) == costs


def _scorer(objective_s: float | None = None) -> EstimatedTTFTScorer:
    index = PrefixIndex()
    index.insert("a", KEYS[:4])
    s = EstimatedTTFTScorer(index, default_tokens_per_s=RATE, attention_tokens=None, sole_holder_discount=False)
    s.ttft_objective_s = objective_s
    for _ in range(s.tail.min_samples):
        s.tail.add(1.0)  # recent requests could not start faster than 1 s: the tail level
    return s


@pytest.mark.parametrize(("wait_s", "holder_keeps"), [(0.5, True), (1.5, False)])
def test_holder_keeps_the_request_while_under_the_tail_level(wait_s: float, holder_keeps: bool) -> None:
    """a: `wait_s` of queued prefill + 36 new tokens; b: idle, 100 tokens. One of two candidates is busy, so new
    work counts 1.25x (the work externality): a costs wait + 0.045 s, b 0.125 s. Plain estimated TTFT sends the
    request to b either way; under the 1 s tail level b's gain buys nothing, so b costs 1 s and a keeps the
    request until it costs more than that."""
    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    reps = [R("a", in_flight=1, prefill_tokens=wait_s * RATE, prefill_busy_until=10.0 + wait_s), R("b")]
    s = _scorer()
    assert s.estimates(req, reps) == pytest.approx([wait_s + 0.036, 0.100])  # estimates stay plain TTFT
    a = wait_s + 0.045
    assert s.score(req, reps) == pytest.approx([1.0, a / 1.0] if holder_keeps else [1.0 / a, 1.0])
    # a fresh scorer (no level yet) is plain estimated TTFT: b wins
    fresh = EstimatedTTFTScorer(s.index, default_tokens_per_s=RATE, attention_tokens=None, sole_holder_discount=False)
    assert fresh.score(req, reps) == pytest.approx([0.125 / a, 1.0])


def test_the_band_stops_at_the_ttft_objective() -> None:
    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    reps = [R("a", in_flight=1, prefill_tokens=500.0, prefill_busy_until=10.5), R("b")]
    assert _scorer(objective_s=0.3).score(req, reps)[1] == 1.0  # level 1 s cut to 0.3 s: b takes it


def test_routing_feeds_the_tail_level_with_the_least_own_prefill_time() -> None:
    s = EstimatedTTFTScorer(PrefixIndex(), default_tokens_per_s=RATE, attention_tokens=None)
    reps = [R("a"), R("b")]
    for _ in range(s.tail.min_samples):
        req = RequestInfo(model="m", input_tokens=250, now=10.0)
        s.score(req, reps)
        s.on_routed(req, reps[0])
    assert s.tail.level() == pytest.approx(0.25)
