"""Prefix index: hash chains, matching, aging, bounds, KV events, scale-in cost."""

from __future__ import annotations

import numpy as np

from llmfleet.router.block_keys import BlockHasher, load_tokenizer
from llmfleet.router.prefix_index import PrefixIndex
from llmfleet.router.prompt_tokens import PromptBlocks


def test_chain_equals_sequential_and_prefix_property() -> None:
    h = BlockHasher(4)
    toks = list(range(100, 140))
    k = h.keys(toks)
    assert len(k) == 10 and len(set(k)) == 10
    assert h.keys(toks[:22]) == k[:5]  # partial last block ignored; prefixes share keys
    other = toks.copy()
    other[9] = 7  # change inside block 2: blocks 0,1 equal, all later differ
    k2 = h.keys(other)
    assert k2[:2] == k[:2] and all(x != y for x, y in zip(k2[2:], k[2:], strict=True))
    raw = h.raw_chain(toks)
    assert h.raw_chain(toks[8:], parent=int(raw[1])).tolist() == raw[2:].tolist()
    assert h.keys([]) == []
    long = np.arange(5000, dtype=np.uint64)
    assert len(h.keys(long)) == 1250  # grows its power tables...
    assert h.keys(long) == h.small_keys(long.tolist())  # ...to the powers the sequential chain multiplies by


def test_text_blocks_without_tokenizer(tmp_path) -> None:
    assert load_tokenizer(None) is None and load_tokenizer(str(tmp_path)) is None
    pb = PromptBlocks(4)
    a, n = pb("x" * 64 + "tail one")
    b, _ = pb("x" * 64 + "tail two")
    assert n == 18 and len(a) == 4 and a == b[: len(a)]


def test_match_per_replica() -> None:
    idx = PrefixIndex()
    keys = list(range(1, 101))
    idx.insert("a", keys)
    idx.insert("b", keys[:37])
    idx.insert("c", [999])
    assert idx.match(keys) == {"a": 100, "b": 37}
    assert idx.match(keys[:10]) == {"a": 10, "b": 10}
    assert idx.match([500, 6]) == {} and idx.match([]) == {}


def test_aging_by_capacity_and_global_bound() -> None:
    idx = PrefixIndex(max_blocks=50)
    idx.set_capacity("a", 10)
    idx.insert("a", list(range(1, 8)))
    idx.insert("a", list(range(100, 106)))  # 13 > 10: the older prompt's tail (5, 6, 7) is evicted
    assert idx.blocks_of("a") == 10 and idx.match(list(range(1, 8))) == {"a": 4}  # its prefix still matches
    assert idx.match(list(range(100, 106))) == {"a": 6}
    for r in "bcdefg":
        idx.insert(r, list(range(1000, 1020)))
    assert len(idx) <= 50
    idx.remove_replica("b")
    assert "b" not in idx.replicas()


def test_hot_blocks_lost_if_removed() -> None:
    idx = PrefixIndex()
    idx.insert("a", [1, 2, 3, 4])
    idx.insert("b", [1, 2])
    idx.insert("a", [10, 11])
    assert idx.hot_blocks_lost_if_removed("a") == 4  # 3, 4, 10, 11
    assert idx.hot_blocks_lost_if_removed("a", hot=2) == 2
    assert idx.hot_blocks_lost_if_removed("b") == 0
    assert idx.hot_blocks_lost_if_removed("zz") == 0


def test_kv_events() -> None:
    bs = 4
    h = BlockHasher(bs)
    toks = list(range(1, 13))
    ours = h.keys(toks)
    idx = PrefixIndex()
    idx.apply_kv_event("r", {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
                             "token_ids": toks[:8]}, bs)
    idx.apply_kv_event("r", {"type": "BlockStored", "block_hashes": [13], "parent_block_hash": 12,
                             "token_ids": toks[8:]}, bs)
    assert idx.match(ours) == {"r": 3}
    idx.apply_kv_event("r", {"type": "BlockStored", "block_hashes": [99], "parent_block_hash": 4242,
                             "token_ids": [5, 5, 5, 5]}, bs)  # unknown parent: ignored
    idx.apply_kv_event("r", {"type": "BlockRemoved", "block_hashes": [13]}, bs)
    assert idx.match(ours) == {"r": 2}
    idx.apply_kv_event("r", {"type": "AllBlocksCleared"}, bs)
    assert idx.match(ours) == {} and len(idx) == 0


def test_small_prompt_path_gives_the_numpy_keys() -> None:
    """Short prompts are hashed in plain Python; the keys must be the numpy path's, for ids and text bytes."""
    rng = np.random.default_rng(3)
    for bs in (1, 3, 4, 16, 32, 64):
        h = BlockHasher(bs)
        for n in (0, bs - 1, 3 * bs + 1, 9 * bs):
            ids = rng.integers(0, 200_000, max(0, n)).tolist()
            assert h.small_keys(ids) == h.keys(ids) == h.keys(np.asarray(ids, dtype=np.int64))
            assert h.small_keys(ids, parent=987654321) == h.keys(ids, parent=987654321)
            raw = rng.integers(0, 256, max(0, n), dtype=np.uint8).tobytes()
            assert h.small_keys(raw) == h.keys(np.frombuffer(raw, dtype=np.uint8))
    pb = PromptBlocks(4)
    short, long = "y" * 100, "y" * 10_000  # below and above the small-prompt cut-off
    ks, _ = pb(short)
    kl, _ = pb(long)
    assert list(kl[: len(ks)]) == list(ks)  # both paths agree on the shared prefix


def test_block_keys_behave_like_a_list() -> None:
    h = BlockHasher(4)
    toks = list(range(40))
    bk = h.block_keys(toks)
    ref = h.keys(toks)
    assert len(bk) == 10 and bk == ref and list(bk) == ref and list(reversed(bk)) == ref[::-1]
    assert bk[3] == ref[3] and bk[-1] == ref[-1] and bk[2:5] == ref[2:5]
    assert bk and not h.block_keys([])
    idx = PrefixIndex()
    idx.insert("a", bk)
    assert idx.match(ref) == {"a": 10} and idx.match(h.block_keys(toks[:20])) == {"a": 5}


def test_match_agrees_with_a_linear_scan() -> None:
    """The shared bisection returns, per replica, the leading blocks it holds (random prefix-closed fleets)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        idx = PrefixIndex()
        keys = rng.integers(1, 1 << 62, 64).tolist()
        held = {}
        for r in range(int(rng.integers(1, 12))):
            k = int(rng.integers(0, 65))
            if k:
                idx.insert(f"r{r}", keys[:k])
                held[f"r{r}"] = k
        probe = keys[: int(rng.integers(1, 65))]
        expect = {r: min(k, len(probe)) for r, k in held.items()}
        assert idx.match(probe) == expect
        assert list(idx.match(probe)) == [r for r in sorted(held, key=lambda x: int(x[1:]))]  # bit order


class _ReferenceIndex:
    """The index's bookkeeping one key at a time: per replica an LRU (oldest first), moved as insert describes."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.lru: dict[str, list[int]] = {}
        self.capacity: dict[str, int] = {}

    def insert(self, replica: str, keys: list[int]) -> None:
        lru = self.lru.setdefault(replica, [])
        for k in reversed(keys):
            if k in lru:
                lru.remove(k)
            lru.append(k)
        del lru[: max(len(lru) - self.capacity.get(replica, 16384), 0)]
        size = sum(map(len, self.lru.values()))
        if size > self.max_blocks:  # water-filling: the biggest LRUs lose their oldest blocks to one level
            target = self.max_blocks - self.max_blocks // 100
            level = max(len(v) for v in self.lru.values())
            while sum(min(len(v), level) for v in self.lru.values()) > target:
                level -= 1
            for v in self.lru.values():
                del v[: max(len(v) - level, 0)]

    def owners(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for r, keys in self.lru.items():
            for k in keys:
                out.setdefault(k, set()).add(r)
        return out


def test_bulk_updates_match_one_key_at_a_time() -> None:
    """insert, eviction to capacity and the global bound give the LRU order and owners of moving one key at a time,
    also for prompts that share prefixes, repeat a key, or come back after being partly evicted."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        max_blocks = int(rng.integers(40, 400))
        idx, ref = PrefixIndex(max_blocks=max_blocks), _ReferenceIndex(max_blocks)
        replicas = [f"r{i}" for i in range(int(rng.integers(1, 6)))]
        for r in replicas:
            cap = int(rng.integers(5, 120))
            idx.set_capacity(r, cap)
            ref.capacity[r] = cap
        pool = rng.integers(1, 1 << 40, 300).tolist()
        for _ in range(80):
            start, n = int(rng.integers(0, 200)), int(rng.integers(1, 100))
            keys = pool[start:start + n]
            if trial % 5 == 0 and len(keys) > 3:
                keys = keys + keys[:2]  # a key twice in one prompt
            r = replicas[int(rng.integers(0, len(replicas)))]
            idx.insert(r, keys)
            ref.insert(r, keys)
            for name, lru in ref.lru.items():
                assert list(idx._lru[name]) == lru
            owners = ref.owners()
            assert len(idx) == sum(map(len, ref.lru.values())) and set(idx._owners) == set(owners)
            assert all(idx._owners[k] == sum(idx._bit[r] for r in rs) for k, rs in owners.items())
        gone = replicas[0]
        idx.remove_replica(gone)
        del ref.lru[gone]
        owners = ref.owners()
        assert set(idx._owners) == set(owners) and len(idx) == sum(map(len, ref.lru.values()))
