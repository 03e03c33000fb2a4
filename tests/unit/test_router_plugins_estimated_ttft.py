"""The estimated-TTFT scorer, the prefill charge/release hook, and large-fleet candidate preselection."""

from __future__ import annotations

import math
import random

import pytest

from llmfleet.router.plugins import (
    EstimatedTTFTScorer,
    HealthyFilter,
    Pipeline,
    PrefixCacheScorer,
    PrefixIndex,
    PrefixSampledPreselector,
    ReplicaState,
    RequestInfo,
    build_pipeline,
    charge_prefill,
    release_prefill,
)
from llmfleet.router.plugins.estimated_ttft import busy_period_externality, sole_holder_discounted

RATE = 1000.0  # tokens/s: estimates read directly as seconds


def R(id: str, **kw: object) -> ReplicaState:  # noqa: N802
    kw.setdefault("stale", False)
    return ReplicaState(id=id, pool="primary", models=("m",), **kw)  # type: ignore[arg-type]


def _index_with(replica: str, keys: list[int]) -> PrefixIndex:
    index = PrefixIndex()
    index.insert(replica, keys)
    return index


KEYS = [11, 12, 13, 14, 15, 16]  # 6 blocks of 16 tokens; "a" holds the first 4 (64 tokens)
REQ = dict(model="m", block_hashes=KEYS, input_tokens=100, block_size=16, now=10.0)


@pytest.mark.parametrize(
    "replicas, expected_s",
    [
        # a: 100 - 64 cached = 36 tokens; b: all 100
        ([R("a"), R("b")], [0.036, 0.100]),
        # a has 1 s of queued prefill ahead (busy until 11.0 at now 10.0): the cache hit is not worth it
        ([R("a", in_flight=2, prefill_tokens=500.0, prefill_busy_until=11.0), R("b")], [1.036, 0.100]),
        # queued work whose predicted end has passed counts 0
        ([R("a", in_flight=1, prefill_tokens=500.0, prefill_busy_until=9.0), R("b")], [0.036, 0.100]),
        # nothing in flight: a charge whose release was lost is ignored
        ([R("a", in_flight=0, prefill_tokens=500.0, prefill_busy_until=50.0), R("b")], [0.036, 0.100]),
        # per-replica prefill rate (configured or measured) overrides the default
        ([R("a"), R("b", prefill_tokens_per_s=10 * RATE)], [0.036, 0.010]),
    ],
)
def test_estimates_and_scores(replicas: list[ReplicaState], expected_s: list[float]) -> None:
    # work_externality 0, no sole-holder discount: the scores are the TTFT estimates' ratios (both tested below)
    s = EstimatedTTFTScorer(_index_with("a", KEYS[:4]), default_tokens_per_s=RATE, attention_tokens=None,
                            work_externality=0.0, sole_holder_discount=False)
    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    assert s.estimates(req, replicas) == pytest.approx(expected_s)
    scores = s.score(req, replicas)
    assert scores == pytest.approx([min(expected_s) / e for e in expected_s])
    assert max(scores) == 1.0 and all(0.0 < x <= 1.0 for x in scores)


def test_a_replica_that_cannot_admit_counts_one_objective_of_wait() -> None:
    """KV admission: a replica whose engine queues requests with its KV cache full (long answers hold the blocks)
    cannot start this one until running requests finish, however much of its prompt it has cached: its estimate
    counts one TTFT objective of wait, and the request goes to a replica that can admit it. A queue with KV to
    spare, a stale scrape or no objective change nothing; every candidate blocked alike keeps the cache hit."""
    def scorer(objective: float | None = 2.0) -> EstimatedTTFTScorer:
        s = EstimatedTTFTScorer(_index_with("a", KEYS[:4]), default_tokens_per_s=RATE, attention_tokens=None,
                                work_externality=0.0, sole_holder_discount=False)
        s.ttft_objective_s = objective
        return s

    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    blocked = dict(waiting=3.0, kv_usage=0.99)
    assert scorer().estimates(req, [R("a", **blocked), R("b")]) == pytest.approx([2.036, 0.100])
    assert scorer().score(req, [R("a", **blocked), R("b")]) == pytest.approx([0.100 / 2.036, 1.0])
    assert scorer().estimates(req, [R("a", waiting=3.0, kv_usage=0.80), R("b")]) == pytest.approx([0.036, 0.100])
    assert scorer().estimates(req, [R("a", **blocked, stale=True), R("b")]) == pytest.approx([0.036, 0.100])
    assert scorer(None).estimates(req, [R("a", **blocked), R("b")]) == pytest.approx([0.036, 0.100])
    both = scorer().estimates(req, [R("a", **blocked), R("b", **blocked)])
    assert both == pytest.approx([2.036, 2.100]) and both[0] < both[1]


def test_a_prompt_whose_blocks_do_not_fit_the_free_cache_counts_one_objective_of_wait() -> None:
    """KV admission by size: a prompt references all of its blocks while it runs, cached ones too, so a replica whose
    free KV (1 - usage of `cache_capacity_blocks`) is smaller than the prompt cannot start it yet, with no waiting
    queue to show it (a long conversation's next turn on a replica busy with long answers). A prompt that fits, an
    unknown capacity or a stale scrape change nothing."""
    s = EstimatedTTFTScorer(_index_with("a", KEYS[:4]), default_tokens_per_s=RATE, attention_tokens=None,
                            work_externality=0.0, sole_holder_discount=False)
    s.ttft_objective_s = 2.0
    req = RequestInfo(**REQ)  # type: ignore[arg-type]  # 100 tokens = 7 blocks of 16
    full = dict(kv_usage=0.9, cache_capacity_blocks=50)  # 5 free blocks
    assert s.estimates(req, [R("a", **full), R("b")]) == pytest.approx([2.036, 0.100])
    assert s.score(req, [R("a", **full), R("b")])[1] == 1.0
    fits = dict(kv_usage=0.86, cache_capacity_blocks=50)  # 7 free blocks
    assert s.estimates(req, [R("a", **fits), R("b")]) == pytest.approx([0.036, 0.100])
    assert s.estimates(req, [R("a", kv_usage=0.9), R("b")]) == pytest.approx([0.036, 0.100])
    assert s.estimates(req, [R("a", **full, stale=True), R("b")]) == pytest.approx([0.036, 0.100])
    # the engine's own block size (scraped) counts the blocks: 100 tokens are 4 blocks of 32, which fit in 5
    assert s.estimates(req, [R("a", **full, kv_block_tokens=32), R("b")]) == pytest.approx([0.036, 0.100])


def test_work_externality_keeps_a_cache_hit_worth_a_short_wait() -> None:
    # a: 64 of 100 tokens cached but 0.07 s of queued prefill -> TTFT 0.106 s; b: idle, cold -> 0.100 s.
    # Pure TTFT sends the request to b (recomputing the prefix there). With one of the two candidates busy,
    # rho = (1 + 1) / (2 + 2) = 0.5 and new work counts 1 + rho / (1 - rho) = 2x: a 0.07 + 0.072 < b 0.2.
    reps = [R("a", in_flight=1, prefill_tokens=70.0, prefill_busy_until=10.07), R("b")]
    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    pure = EstimatedTTFTScorer(_index_with("a", KEYS[:4]), default_tokens_per_s=RATE, attention_tokens=None,
                               work_externality=0.0, sole_holder_discount=False)
    assert pure.score(req, reps) == pytest.approx([0.100 / 0.106, 1.0])
    default = EstimatedTTFTScorer(_index_with("a", KEYS[:4]), default_tokens_per_s=RATE, attention_tokens=None,
                                  sole_holder_discount=False)
    assert default.estimates(req, reps) == pytest.approx([0.106, 0.100])  # estimates stay plain TTFT
    assert default.score(req, reps) == pytest.approx([1.0, 0.142 / 0.2])
    # every candidate busy: rho = 3/4, new work counts 1 + 3 = 4x
    both = [reps[0], R("b", in_flight=1, prefill_tokens=10.0, prefill_busy_until=10.01)]
    assert default.score(req, both) == pytest.approx([1.0, (0.07 + 4 * 0.036) / (0.01 + 4 * 0.1)])
    # an idle fleet: no queue behind anyone, so plain TTFT
    idle = [R("a"), R("b")]
    assert default.score(req, idle) == pytest.approx(pure.score(req, idle))


def test_the_work_externality_is_the_busy_period_of_the_candidates_utilization() -> None:
    # E = rho / (1 - rho), rho = (busy + 1) / (candidates + 2): grows without a fitted slope as the fleet fills,
    # and stays finite with every candidate busy (at most candidates + 1)
    assert busy_period_externality(1, 2) == pytest.approx(1.0)
    assert busy_period_externality(0, 8) == pytest.approx(1 / 9)
    assert busy_period_externality(8, 8) == pytest.approx(9.0)
    es = [busy_period_externality(b, 8) for b in range(9)]
    assert es == sorted(es) and len(set(es)) == 9
    with pytest.raises(ValueError, match="work_externality"):
        EstimatedTTFTScorer(PrefixIndex(), work_externality=-0.1)


def _index_with_full(replica: str, keys: list[int], full: str) -> PrefixIndex:
    """`replica` holds `keys`; `full`'s cache (capacity 8 blocks) is full of other prompts' blocks."""
    index = PrefixIndex(default_capacity=8)
    index.insert(replica, keys)
    index.insert(full, list(range(100, 108)))
    return index


def test_sole_holder_keeps_its_conversation_while_it_saves_more_work_than_it_waits() -> None:
    """a alone holds 64 of the prompt's 100 tokens: it computes 36, b 100. With 1 s of prefill queued on a,
    plain TTFT sends the request to b (0.100 s vs 1.036 s) and leaves a second copy of the prefix there, evicting
    other prompts' blocks (b's cache is full). The discount multiplies a's cost by 36 / 100: the holder keeps the
    request while it is at most 100 / 36 times slower, and loses it beyond that."""
    req = RequestInfo(**REQ)  # type: ignore[arg-type]

    def scorer(discount: bool = True) -> EstimatedTTFTScorer:
        return EstimatedTTFTScorer(_index_with_full("a", KEYS[:4], "b"), default_tokens_per_s=RATE,
                                   attention_tokens=None, work_externality=0.0, sole_holder_discount=discount)

    b = R("b")
    # a: 0.2 s queued + 0.036 s own = 0.236 s, 2.4x b's 0.100 s but within 100 / 36 = 2.78x: a keeps it
    a = R("a", in_flight=1, prefill_tokens=200.0, prefill_busy_until=10.2)
    assert scorer(False).score(req, [a, b]) == pytest.approx([0.100 / 0.236, 1.0])
    assert scorer().score(req, [a, b]) == pytest.approx([1.0, 0.236 * 0.36 / 0.100])
    assert scorer().estimates(req, [a, b]) == pytest.approx([0.236, 0.100])  # estimates stay plain TTFT
    # a: 0.3 s queued -> 0.336 s, 3.4x: waiting there costs more than the work it saves, b takes it
    a = R("a", in_flight=1, prefill_tokens=300.0, prefill_busy_until=10.3)
    assert scorer().score(req, [a, b]) == pytest.approx([0.100 / (0.336 * 0.36), 1.0])
    # an idle fleet: the holder is the fastest anyway, the choice is the same
    assert scorer().score(req, [R("a"), b])[0] == 1.0


@pytest.mark.parametrize(
    "costs, work, floor, expected",
    [
        ([1.0, 0.5, 0.5], [10.0, 40.0, 100.0], 0.0, [0.25, 0.5, 0.5]),  # the runner-up's work is the reference
        ([1.0, 0.5], [40.0, 40.0], 0.0, [1.0, 0.5]),  # two hold the most: nobody is discounted
        ([0.5, 1.0, 1.0], [100.0, 100.0, 100.0], 0.0, [0.5, 1.0, 1.0]),  # nobody holds anything
        ([1.0, 0.5], [1.0, 100.0], 20.0, [0.2, 0.5]),  # a full hit: at most 100 / 20 (a block) times slower
        ([1.0, 0.5], [1.0, 10.0], 20.0, [1.0, 0.5]),  # the runner-up does less than a block: no discount
        ([1.0], [1.0], 0.0, [1.0]),
    ],
)
def test_sole_holder_discounted(costs: list[float], work: list[float], floor: float, expected: list[float]) -> None:
    assert sole_holder_discounted(costs, work, floor) == pytest.approx(expected)


@pytest.mark.parametrize("b_full", [False, True])
def test_no_sole_holder_discount_where_the_alternative_evicts_nothing(b_full: bool) -> None:
    """The discount prices the copy a recompute leaves in another cache. A replica with room for the prompt (b
    just added by the autoscaler: an empty cache) loses nothing by taking it, so plain estimated TTFT decides and
    the busy holder a loses the request; once b's cache is full, a keeps it (0.236 x 0.36 < 0.100)."""
    index = _index_with_full("a", KEYS[:4], "b") if b_full else _index_with("a", KEYS[:4])
    s = EstimatedTTFTScorer(index, default_tokens_per_s=RATE, attention_tokens=None, work_externality=0.0,
                            sole_holder_discount=True)
    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    a = R("a", in_flight=1, prefill_tokens=200.0, prefill_busy_until=10.2)
    scores = s.score(req, [a, R("b")])
    assert scores == pytest.approx([1.0, 0.236 * 0.36 / 0.100] if b_full else [0.100 / 0.236, 1.0])


@pytest.mark.parametrize(
    "room, expected",
    [
        ((), [0.25, 0.5, 0.6]),  # nobody has room: discounted
        ((1,), [1.0, 0.5, 0.6]),  # the cheapest other candidate (1) has room: no discount
        ((2,), [0.25, 0.5, 0.6]),  # only a dearer one has room: the request would go to 1, which must evict
    ],
)
def test_sole_holder_discount_asks_the_cheapest_other_candidate_for_room(room: tuple[int, ...],
                                                                         expected: list[float]) -> None:
    asked: list[int] = []

    def has_room(i: int) -> bool:
        asked.append(i)
        return i in room

    assert sole_holder_discounted([1.0, 0.5, 0.6], [10.0, 40.0, 100.0], 0.0, has_room=has_room) == pytest.approx(
        expected)
    assert asked == [1]


def test_sole_holder_discount_with_the_holder_first_and_every_other_candidate_at_infinite_cost() -> None:
    # An infinite TTFT objective makes a candidate that cannot admit cost inf (the scorer adds the objective):
    # with the holder first, the cheapest other candidate is found in the rest, not looked up in nothing.
    asked: list[int] = []

    def has_room(i: int) -> bool:
        asked.append(i)
        return False

    out = sole_holder_discounted([1.0, math.inf, math.inf], [10.0, 40.0, 100.0], 0.0, has_room=has_room)
    assert out == pytest.approx([0.25, math.inf, math.inf]) and asked == [1]


def test_prefix_index_has_room_counts_the_blocks_held_against_the_capacity() -> None:
    index = PrefixIndex(default_capacity=8)
    assert index.has_room("new", 8) and not index.has_room("new", 9)  # unknown replica: empty, default capacity
    index.insert("a", [1, 2, 3, 4, 5])
    assert index.has_room("a", 3) and not index.has_room("a", 4)
    assert (index.over_capacity("a", 3), index.over_capacity("a", 4)) == (0, 1)  # the eviction cost's count
    index.set_capacity("a", 16)
    assert index.capacity_of("a") == 16 and index.has_room("a", 11)


def test_a_popular_prefix_on_several_replicas_is_ranked_by_plain_ttft() -> None:
    """A system prompt that two replicas hold equally gives neither a discount: the idle cold replica c, faster
    than both busy holders, gets the request as with the discount off."""
    index = PrefixIndex()
    index.insert("a", KEYS[:4])
    index.insert("b", KEYS[:4])
    s = EstimatedTTFTScorer(index, default_tokens_per_s=RATE, attention_tokens=None, work_externality=0.0)
    off = EstimatedTTFTScorer(index, default_tokens_per_s=RATE, attention_tokens=None, work_externality=0.0,
                              sole_holder_discount=False)
    reps = [R("a", in_flight=1, prefill_tokens=200.0, prefill_busy_until=10.2),
            R("b", in_flight=1, prefill_tokens=300.0, prefill_busy_until=10.3), R("c")]
    req = RequestInfo(**REQ)  # type: ignore[arg-type]
    assert s.score(req, reps) == pytest.approx(off.score(req, reps))
    assert s.score(req, reps)[2] == 1.0


@pytest.mark.parametrize(
    "n_tokens, cached, attention_tokens, work",
    [
        (2000, 0, None, 2000.0),
        (2000, 0, 1000.0, 4000.0),  # 2000 · (1 + 2000 / 2000)
        (2000, 1000, 1000.0, 2500.0),  # 1000 · (1 + 3000 / 2000): the cached half was the cheap half
        (100, 99, 1e9, 1.0),
    ],
)
def test_prefill_work_grows_with_context(n_tokens: int, cached: int, attention_tokens: float | None,
                                         work: float) -> None:
    s = EstimatedTTFTScorer(PrefixIndex(), attention_tokens=attention_tokens)
    assert s._work(n_tokens, cached) == pytest.approx(work)


def test_no_prefix_keys_and_full_match_still_cost_a_token() -> None:
    s = EstimatedTTFTScorer(_index_with("a", [1, 2]), default_tokens_per_s=RATE, attention_tokens=None)
    no_keys = RequestInfo(model="m", input_tokens=50, now=0.0)
    assert s.estimates(no_keys, [R("a"), R("b")]) == pytest.approx([0.05, 0.05])
    full = RequestInfo(model="m", block_hashes=[1, 2], input_tokens=32, block_size=16, now=0.0)
    assert s.estimates(full, [R("a")]) == pytest.approx([0.001])  # the last token is always computed
    # block size inferred from the prompt when the caller does not give it
    assert RequestInfo(model="m", block_hashes=[1, 2], input_tokens=40).tokens_per_block() == 20


def test_charge_and_release_form_a_corrected_fcfs_queue() -> None:
    a = R("a")
    r1 = RequestInfo(model="m", now=0.0)
    r2 = RequestInfo(model="m", now=0.5)
    assert charge_prefill(r1, a, 1000.0, RATE) == pytest.approx(1.0)
    assert charge_prefill(r2, a, 500.0, RATE) == pytest.approx(1.5)  # queued behind r1
    assert a.prefill_tokens == 1500.0
    release_prefill(r1, now=0.8)  # first byte 0.2 s early: the work behind it is early too
    assert a.prefill_busy_until == pytest.approx(1.3) and a.prefill_tokens == 500.0
    release_prefill(r1, now=5.0)  # idempotent
    assert a.prefill_busy_until == pytest.approx(1.3) and a.prefill_tokens == 500.0
    release_prefill(r2, now=1.2, first_byte=False)  # finished or failed without a first byte: no correction
    assert a.prefill_tokens == 0.0 and a.prefill_busy_until == pytest.approx(1.2)
    # a retry moves the charge: the first replica is released, the second charged
    b = R("b")
    r3 = RequestInfo(model="m", now=2.0)
    charge_prefill(r3, a, 100.0, RATE)
    charge_prefill(r3, b, 100.0, RATE)
    assert a.prefill_tokens == 0.0 and b.prefill_tokens == 100.0 and r3.prefill_charge is not None


def test_charge_uses_the_uncached_tokens_seen_when_scoring() -> None:
    """The prefix-cache scorer teaches the index first; the charge must still be the pre-routing estimate."""
    index = PrefixIndex()
    pipe = Pipeline([HealthyFilter()], [(PrefixCacheScorer(index), 1.0),
                                        (EstimatedTTFTScorer(index, RATE, attention_tokens=None), 1.0)],
                    random.Random(0))
    a, b = R("a"), R("b")
    req = RequestInfo(model="m", block_hashes=KEYS, input_tokens=100, block_size=16, now=0.0)
    chosen = pipe.pick(req, [a, b]).replica
    assert chosen is not None and chosen.prefill_tokens == 100.0
    assert chosen.prefill_busy_until == pytest.approx(0.1)
    again = RequestInfo(model="m", block_hashes=KEYS, input_tokens=100, block_size=16, now=0.0)
    other = b if chosen is a else a
    # all 6 blocks cached there now: 100 - 96 = 4 tokens after a 0.1 s queue, vs 100 cold tokens elsewhere
    assert pipe.pick(again, [a, b]).replica is chosen
    assert other.prefill_tokens == 0.0


def test_charge_without_scoring_estimates_that_replica_alone() -> None:
    """A replica the scorer never scored (the pipeline had a single candidate, or a retry) is charged the
    request's uncached work on it, computed on the spot."""
    s = EstimatedTTFTScorer(_index_with("a", KEYS[:4]), default_tokens_per_s=RATE, attention_tokens=None)
    a = R("a")
    s.on_routed(RequestInfo(**REQ), a)  # type: ignore[arg-type]
    assert a.prefill_tokens == 36.0  # 100 - 64 cached
    b = R("b")
    s.on_routed(RequestInfo(**REQ), b)  # type: ignore[arg-type]
    assert b.prefill_tokens == 100.0


def test_scores_deterministic_and_bounded_on_random_states() -> None:
    rng = random.Random(3)
    index = PrefixIndex()
    for i in range(8):
        index.insert(f"r{i}", list(range(1, 1 + rng.randrange(0, 20))))
    s = EstimatedTTFTScorer(index)
    for _ in range(50):
        reps = [R(f"r{i}", in_flight=rng.randrange(3), prefill_tokens=rng.random() * 1e5,
                  prefill_busy_until=rng.random() * 20) for i in range(8)]
        req = RequestInfo(model="m", block_hashes=list(range(1, 21)), input_tokens=rng.randrange(1, 50_000),
                          now=rng.random() * 20)
        a, b = s.score(req, reps), s.score(req, reps)
        assert a == b and max(a) == 1.0 and all(0.0 < x <= 1.0 for x in a)


# -- preselection ------------------------------------------------------------------------------------------
def test_preselector_prefix_holders_first_then_a_sample() -> None:
    reps = [R(f"r{i:03d}") for i in range(200)]
    index = PrefixIndex()
    index.insert("r042", [1, 2, 3])
    index.insert("r007", [1, 2])
    index.insert("r150", [1])
    pre = PrefixSampledPreselector(index, max_candidates=16, prefix_candidates=2)
    req = RequestInfo(model="m", block_hashes=[1, 2, 3])
    got = pre.select(req, reps, random.Random(0))
    assert [r.id for r in got[:2]] == ["r042", "r007"]  # longest match first, capped at prefix_candidates
    assert len(got) == 16 and len({r.id for r in got}) == 16
    assert [r.id for r in pre.select(req, reps, random.Random(0))] == [r.id for r in got]  # seeded
    # the fleet changed (a replica left): positions are rebuilt, never a wrong replica
    smaller = [r for r in reps if r.id != "r000"]
    assert pre.select(req, smaller, random.Random(1))[0].id == "r042"


def test_preselector_many_prefix_holders_take_the_longest_even_when_some_are_elsewhere() -> None:
    """A shared system prompt puts many replicas in the match (the heap path): the k longest matches win,
    ties by id, and holders outside the candidate list (another pool's replicas) are skipped for the next."""
    rng = random.Random(3)
    reps = [R(f"r{i:03d}") for i in range(300)]
    index = PrefixIndex()
    held = {}
    for i in range(120):  # 120 holders: far more than 4 x prefix_candidates
        n = rng.randint(1, 40)
        index.insert(f"r{i:03d}", list(range(1, n + 1)))
        held[f"r{i:03d}"] = n
    for j in range(5):  # the longest holders of all live in another pool
        index.insert(f"other{j}", list(range(1, 41)))
    pre = PrefixSampledPreselector(index, max_candidates=32, prefix_candidates=8)
    got = pre.select(RequestInfo(model="m", block_hashes=list(range(1, 41))), reps, random.Random(0))
    expect = sorted(held, key=lambda r: (-held[r], r))[:8]
    assert [r.id for r in got[:8]] == expect
    assert len(got) == 32 and len({r.id for r in got}) == 32


@pytest.mark.parametrize("max_candidates, prefix_candidates", [(1, 0), (8, 9), (8, -1)])
def test_preselector_rejects_bad_sizes(max_candidates: int, prefix_candidates: int) -> None:
    with pytest.raises(ValueError):
        PrefixSampledPreselector(PrefixIndex(), max_candidates, prefix_candidates)


def test_pipeline_preselects_only_large_fleets() -> None:
    index = PrefixIndex()
    pipe = build_pipeline({"estimated-ttft": 1.0, "queue-depth": 0.1}, index, seed=0, max_candidates=8)
    req = RequestInfo(model="m", input_tokens=10, now=0.0)
    assert pipe.pick(req, [R(f"r{i}") for i in range(8)]).candidates == 8  # at the limit: everyone scored
    d = pipe.pick(RequestInfo(model="m", input_tokens=10, now=0.0), [R(f"r{i}") for i in range(500)])
    assert d.candidates == 8 and "preselect" in d.plugin_ns
    assert build_pipeline({"kv-cache": 1}, max_candidates=None).preselector is None


def test_preselection_falls_back_to_the_whole_fleet_when_the_sample_is_filtered_out() -> None:
    reps = [R(f"r{i}", healthy=False) for i in range(300)] + [R("ok")]
    pipe = build_pipeline({"queue-depth": 1.0}, seed=0, max_candidates=4)
    for _ in range(5):
        d = pipe.pick(RequestInfo(model="m"), reps)
        assert d.replica is not None and d.replica.id == "ok"
    d = pipe.pick(RequestInfo(model="m"), [R(f"r{i}", draining=True) for i in range(50)])
    assert d.replica is None and "healthy" in d.reason


def test_preselected_pipeline_balances_a_large_fleet() -> None:
    """Power of k choices through the preselector: no replica gets far more than its share."""
    reps = [R(f"r{i}") for i in range(100)]
    pipe = build_pipeline({"queue-depth": 1.0}, seed=0, max_candidates=8)
    for _ in range(1000):
        d = pipe.pick(RequestInfo(model="m"), reps)
        assert d.replica is not None
        d.replica.waiting += 1
    loads = [r.waiting for r in reps]
    assert sum(loads) == 1000 and max(loads) <= 12  # mean 10


def test_global_index_bound_cuts_the_biggest_replicas_first() -> None:
    idx = PrefixIndex(max_blocks=1000)
    for i in range(5):
        idx.insert(f"small{i}", list(range(10_000 * i, 10_000 * i + 50)))  # 250 blocks
    idx.insert("big", list(range(100_000, 100_900)))  # 1,150 > 1,000: cut to 1% under the bound
    sizes = idx.stats()["replicas"]
    assert len(idx) <= 990 and all(sizes[f"small{i}"] == 50 for i in range(5)) and sizes["big"] <= 740
    # the big replica kept the head of its prompt (tails are evicted first)
    assert idx.match(list(range(100_000, 100_900))) == {"big": sizes["big"]}
    for i in range(200):  # many replicas at the bound: one sort per insert, not a scan per evicted block
        idx.insert(f"r{i}", list(range(200_000 + 100 * i, 200_000 + 100 * i + 100)))
        assert len(idx) <= 1000


@pytest.mark.parametrize("discount", [True, False])
def test_router_config_switches_the_sole_holder_discount(discount: bool) -> None:
    """RouterConfig.sole_holder_discount reaches the pipeline's estimated-ttft scorer: with it a busy sole holder
    (2.4x slower, saving 100 / 36 of the work) keeps the request, without it plain TTFT sends it to b."""
    pipe = build_pipeline({"estimated-ttft": 1.0}, _index_with_full("a", KEYS[:4], "b"), sole_holder_discount=discount)
    scorer = next(s for s, _ in pipe.scorers if isinstance(s, EstimatedTTFTScorer))
    assert scorer.sole_holder_discount is discount
    scorer.default_rate, scorer.attention_tokens, scorer.work_externality = RATE, None, 0.0
    a = R("a", in_flight=1, prefill_tokens=200.0, prefill_busy_until=10.2)
    picked = pipe.pick(RequestInfo(**REQ), [a, R("b")])  # type: ignore[arg-type]
    assert picked.replica.id == ("a" if discount else "b")


@pytest.mark.parametrize("holder_estimate_s, discounted", [(0.7, True), (0.8, True), (0.9, False)])
def test_sole_holder_discount_stops_at_the_ttft_objective(holder_estimate_s: float, discounted: bool) -> None:
    """Past the TTFT objective the holder is overloaded: plain estimated TTFT decides, so the request can move
    to a replica that holds nothing yet (one an autoscaler just added)."""
    out = sole_holder_discounted([holder_estimate_s, 0.5], [10.0, 100.0], 0.0,
                                 estimates=[holder_estimate_s, 0.5], limit_s=0.8)
    assert out == pytest.approx([holder_estimate_s * 0.1 if discounted else holder_estimate_s, 0.5])


def test_pipeline_bounds_the_discount_by_the_objective() -> None:
    """build_pipeline's ttft_objective_s reaches the scorer: a holder estimated at 0.236 s keeps the request under
    a 0.3 s objective and loses it under a 0.2 s one."""
    for objective, expected in ((0.3, "a"), (0.2, "b")):
        pipe = build_pipeline({"estimated-ttft": 1.0}, _index_with_full("a", KEYS[:4], "b"), sole_holder_discount=True,
                              ttft_objective_s=objective)
        scorer = next(s for s, _ in pipe.scorers if isinstance(s, EstimatedTTFTScorer))
        scorer.default_rate, scorer.attention_tokens, scorer.work_externality = RATE, None, 0.0
        a = R("a", in_flight=1, prefill_tokens=200.0, prefill_busy_until=10.2)
        assert pipe.pick(RequestInfo(**REQ), [a, R("b")]).replica.id == expected  # type: ignore[arg-type]
