"""The estimated-TTFT scorer's eviction cost (`eviction_cost=True`, spec.router.evictionCost): a candidate whose
cache is full pays for the history it pushes out while another candidate has room."""

from __future__ import annotations

import pytest

from llmfleet.router.plugins import EstimatedTTFTScorer, PrefixIndex, ReplicaState, RequestInfo

RATE = 1000.0  # tokens/s: costs read directly as seconds
BLOCK = 16  # tokens per block


def R(id: str) -> ReplicaState:  # noqa: N802
    return ReplicaState(id=id, pool="primary", models=("m",), stale=False)


def req(keys: list[int]) -> RequestInfo:
    return RequestInfo(model="m", block_hashes=keys, input_tokens=BLOCK * len(keys), block_size=BLOCK, now=0.0)


def scorer(index: PrefixIndex, eviction_cost: bool = True) -> EstimatedTTFTScorer:
    # plain TTFT otherwise (no externality, no discount, linear work): only the eviction term differs
    return EstimatedTTFTScorer(index, default_tokens_per_s=RATE, attention_tokens=None, work_externality=0.0,
                               sole_holder_discount=False, eviction_cost=eviction_cost)


def _fleet() -> PrefixIndex:
    """'full' holds the common first block (0) and other conversations' history up to its 10-block capacity;
    'roomy' holds nothing and has room for everything."""
    index = PrefixIndex()
    for rid in ("full", "roomy"):
        index.set_capacity(rid, 10)
    index.insert("full", [0, 101, 102, 103, 104, 105, 106, 107, 108, 109][::-1])
    index.insert("full", [0])
    index.insert("roomy", [])
    return index


def _learn_reuse(s: EstimatedTTFTScorer, held: int, seen: int) -> None:
    """Route one request whose chosen replica held `held` of its `seen` blocks (the scorer counts on_routed)."""
    index = PrefixIndex()
    keys = list(range(1000, 1000 + seen))
    index.insert("x", keys[:held])
    s.index, saved = index, s.index
    r = req(keys)
    s.estimates(r, [R("x")])
    s.on_routed(r, R("x"))
    s.index = saved


def test_a_new_conversation_goes_where_it_evicts_nothing_once_the_fleet_finds_blocks_cached() -> None:
    """Holding the common first block makes 'full' one block faster, but taking the 4 new blocks there evicts 4
    blocks of other conversations' history: with half of all routed blocks found cached, that costs
    4 x 16 tokens x 0.5 / rate more than the block it saves, so the request goes to 'roomy'. Before any block
    was found cached (no reuse) plain TTFT decides, as before the term existed."""
    keys = [0, 201, 202, 203, 204]
    s = scorer(_fleet())
    cands = [R("full"), R("roomy")]
    s.score(req(keys), cands)
    assert s._costs == pytest.approx([4 * BLOCK / RATE, 5 * BLOCK / RATE])  # nothing learned yet: no term
    _learn_reuse(s, held=5, seen=10)
    assert s.blocks_held == 5 and s.blocks_seen == 10
    scores = s.score(req(keys), cands)
    assert s._costs == pytest.approx([4 * BLOCK / RATE + 4 * BLOCK / RATE * 0.5, 5 * BLOCK / RATE])
    assert scores[1] == 1.0 and scores[0] < 1.0


def test_off_by_default_and_when_switched_off() -> None:
    """The default scorer (and `eviction_cost=False`) ranks 'full' first as plain TTFT does, with the same
    reuse learned."""
    keys = [0, 201, 202, 203, 204]
    for s in (EstimatedTTFTScorer(_fleet(), default_tokens_per_s=RATE, attention_tokens=None, work_externality=0.0),
              scorer(_fleet(), eviction_cost=False)):
        _learn_reuse(s, held=5, seen=10)
        scores = s.score(req(keys), [R("full"), R("roomy")])
        assert s._costs == pytest.approx([4 * BLOCK / RATE, 5 * BLOCK / RATE]) and scores[0] == 1.0


def test_evictions_are_the_blocks_beyond_capacity_at_most_the_blocks_added() -> None:
    """A cache with 2 blocks free evicts 2 of the 4 blocks it adds, beside an empty one; estimates (plain TTFT)
    are unchanged."""
    index = PrefixIndex()
    for rid in ("a", "empty"):
        index.set_capacity(rid, 10)
    index.insert("a", [0, 101, 102, 103, 104, 105, 106, 107])  # 8 of 10
    s = scorer(index)
    _learn_reuse(s, held=1, seen=4)
    keys = [0, 301, 302, 303, 304]
    est = s.estimates(req(keys), [R("a"), R("empty")])
    assert est == pytest.approx([4 * BLOCK / RATE, 5 * BLOCK / RATE])
    assert s._costs == pytest.approx([4 * BLOCK / RATE + 2 * BLOCK / RATE * 0.25, 5 * BLOCK / RATE])


def test_when_every_candidate_must_evict_plain_ttft_decides() -> None:
    """Full caches everywhere: evicting is no choice, so no candidate pays for it (what LRU pushes out there is
    the oldest history, which the fleet-wide reuse ratio would overprice)."""
    index = PrefixIndex()
    for rid in ("a", "b"):
        index.set_capacity(rid, 4)
        index.insert(rid, [hash((rid, i)) for i in range(4)])
    index.insert("a", [7])  # a holds the prompt's first block: one block less to compute, 1 still evicted
    s = scorer(index)
    _learn_reuse(s, held=3, seen=4)
    s.score(req([7, 8]), [R("a"), R("b")])
    assert s._costs == pytest.approx([1 * BLOCK / RATE, 2 * BLOCK / RATE])


def test_on_routed_counts_the_blocks_the_chosen_replica_held_before_it_learned_the_prompt() -> None:
    index = PrefixIndex()
    index.insert("a", [1, 2])
    s = scorer(index)
    r = req([1, 2, 3, 4])
    s.estimates(r, [R("a"), R("b")])
    index.insert("a", [1, 2, 3, 4])  # another plugin taught the index first: the count is the match at scoring
    s.on_routed(r, R("a"))
    assert (s.blocks_held, s.blocks_seen) == (2, 4)
    s.on_routed(req([1, 2, 3, 4, 5]), R("b"))  # not scored (a retry): matched now, b holds nothing
    assert (s.blocks_held, s.blocks_seen) == (2, 9)


def test_room_on_a_busier_replica_is_no_reason_to_move_a_request() -> None:
    """The full candidate pays for its evictions only while a candidate with room is no busier than it: once the
    roomy replica carries more requests, the request stays where plain TTFT puts it (without this, every request
    that would evict flees to the few replicas with room until their caches fill)."""
    keys = [0, 201, 202, 203, 204]
    s = scorer(_fleet())
    _learn_reuse(s, held=5, seen=10)
    penalised = [4 * BLOCK / RATE + 4 * BLOCK / RATE * 0.5, 5 * BLOCK / RATE]
    for full_load, roomy_load, expected in ((0, 0, penalised), (3, 3, penalised), (5, 2, penalised),
                                            (2, 5, [4 * BLOCK / RATE, 5 * BLOCK / RATE])):
        full, roomy = R("full"), R("roomy")
        full.in_flight, roomy.in_flight = full_load, roomy_load
        s.score(req(keys), [full, roomy])
        assert s._costs == pytest.approx(expected), (full_load, roomy_load)
    busy_roomy = R("roomy")
    busy_roomy.running, busy_roomy.waiting = 4.0, 1.0  # the engine's scraped counts are load too
    s.score(req(keys), [R("full"), busy_roomy])
    assert s._costs == pytest.approx([4 * BLOCK / RATE, 5 * BLOCK / RATE])
