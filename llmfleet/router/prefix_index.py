"""Approximate index of which replica holds which prompt-prefix KV blocks.

Prompts are keyed per block by block_keys.py (a hash chain: equal keys mean equal prefixes). Per replica the
index keeps an LRU of keys bounded by that replica's KV capacity in blocks, the larger of its
GPU and host offload tiers (aging: what a replica has not seen recently is what its engine evicted first);
globally it is bounded by `max_blocks`. A lookup returns, for each replica, how many leading blocks of the
prompt it is believed to hold. `apply_kv_event` corrects the index from vLLM KV-cache events (BlockStored / BlockRemoved /
AllBlocksCleared), keeping a block while any tier holds it, and `hot_blocks_lost_if_removed` tells the
autoscaler what scaling a replica in would cost in cache.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import and_, not_
from typing import Any

from llmfleet.router.block_keys import BlockHasher, BlockKeys, adapter_seed
from llmfleet.router.kv_tiers import count_add, count_sub, medium_slot

log = logging.getLogger("llmfleet.router.prefix_index")

DEFAULT_CAPACITY_BLOCKS = 16384


class PrefixIndex:
    """replica id -> LRU of block keys; key -> bitmask of replicas holding it."""

    def __init__(self, max_blocks: int = 1_000_000, default_capacity: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self.default_capacity = default_capacity
        self._owners: dict[int, int] = {}  # key -> replica bitmask
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._bit: dict[str, int] = {}
        self._by_bit: dict[int, str] = {}
        self._capacity: dict[str, int] = {}
        self._engine_map: dict[str, dict[int, int]] = {}  # replica -> vLLM block hash -> our key
        self._engine_media: dict[str, dict[int, int]] = {}  # replica -> vLLM block hash -> packed media counts
        self._engine_hasher: dict[int, BlockHasher] = {}
        self._size = 0
        # match() memo: several plugins look up the same prompt in one routing decision. Valid while the
        # index is unchanged (`_version` bumps on every mutation) and for the same keys object.
        self._version = 0
        self._memo: tuple[Sequence[int], int, int, dict[str, int]] | None = None
        self._last_insert: tuple[Iterable[int] | None, str, int] = (None, "", -1)

    # -- replicas -------------------------------------------------------------------------------------------
    def _ensure(self, replica: str) -> int:
        bit = self._bit.get(replica)
        if bit is None:
            i = 0
            while (1 << i) in self._by_bit:
                i += 1
            bit = 1 << i
            self._bit[replica] = bit
            self._by_bit[bit] = replica
            self._lru[replica] = OrderedDict()
        return bit

    def set_capacity(self, replica: str, blocks: int | None) -> None:
        if blocks:
            self._capacity[replica] = int(blocks)
            self._evict(replica)

    def remove_replica(self, replica: str) -> None:
        bit = self._bit.pop(replica, None)
        if bit is None:
            return
        self._version += 1
        del self._by_bit[bit]
        self._clear_all(list(self._lru.pop(replica)), bit)
        self._capacity.pop(replica, None)
        self._engine_map.pop(replica, None)
        self._engine_media.pop(replica, None)

    def replicas(self) -> list[str]:
        return list(self._bit)

    def __len__(self) -> int:
        return self._size

    def blocks_of(self, replica: str) -> int:
        return len(self._lru.get(replica, ()))

    def capacity_of(self, replica: str) -> int:
        """Blocks `replica`'s LRU holds at most: its KV capacity (`set_capacity`), else the default."""
        return self._capacity.get(replica, self.default_capacity)

    def over_capacity(self, replica: str, new_blocks: int) -> int:
        """Blocks `replica` would hold beyond its capacity after taking `new_blocks` more (<= 0: it has room)."""
        return self.blocks_of(replica) + new_blocks - self.capacity_of(replica)

    def has_room(self, replica: str, new_blocks: int) -> bool:
        """Whether `replica` is believed to take `new_blocks` more blocks without evicting any: what it holds
        plus them fits its capacity (a replica added empty has room; one whose cache has filled has none)."""
        return self.over_capacity(replica, new_blocks) <= 0

    # -- core ------------------------------------------------------------------------------------------------
    def _clear(self, key: int, bit: int) -> None:
        self._version += 1
        m = self._owners.get(key, 0) & ~bit
        if m:
            self._owners[key] = m
        else:
            self._owners.pop(key, None)
        self._size -= 1

    def _clear_all(self, keys: list[int], bit: int) -> None:
        """`_clear` of each key (distinct keys the replica of `bit` held), as C-level passes over the list: the
        router evicts thousands of keys per long prompt with fine-grained blocks, and a Python call per key
        was a large share of its insert time."""
        if not keys:
            return
        self._version += 1
        owners = self._owners
        masks = list(map(and_, map(owners.get, keys, repeat(0)), repeat(~bit)))
        owners.update(zip(keys, masks, strict=True))
        deque(map(owners.pop, compress(keys, map(not_, masks))), maxlen=0)  # held by nobody now
        self._size -= len(keys)

    def _drop_oldest(self, replica: str, n: int) -> None:
        """`replica`'s `n` least recently used blocks leave its LRU."""
        pop = self._lru[replica].popitem
        self._clear_all([pop(False)[0] for _ in repeat(None, n)], self._bit[replica])

    def _evict(self, replica: str) -> None:
        lru = self._lru.get(replica)
        if lru is None:
            return
        excess = len(lru) - self.capacity_of(replica)
        if excess > 0:
            self._drop_oldest(replica, excess)

    def _evict_global(self) -> None:
        """Over the global bound: the replicas holding the most lose their oldest blocks, down to 1% under the
        bound. Water-filling: the biggest LRUs are cut to one common level, with one sort per call (not an
        O(replicas) scan per evicted block, which stalls a fleet of hundreds of replicas)."""
        target = self.max_blocks - self.max_blocks // 100
        excess = self._size - target
        if excess <= 0:
            return
        sizes = sorted(((len(lru), r) for r, lru in self._lru.items()), reverse=True)
        top = 0
        level = 0
        for i, (n, _) in enumerate(sizes):
            top += n
            below = sizes[i + 1][0] if i + 1 < len(sizes) else 0
            if top - (i + 1) * below >= excess:  # cutting the i+1 biggest to `level` frees enough
                level = max(below, (top - excess) // (i + 1))
                break
        for n, r in sizes:
            if n <= level:
                break
            self._drop_oldest(r, n - level)

    def insert(self, replica: str, keys: Iterable[int]) -> None:
        """`replica` now holds these blocks (most recently used)."""
        if (keys is self._last_insert[0] and replica == self._last_insert[1]
                and self._version == self._last_insert[2]):
            return  # the same prompt inserted again by a second plugin in the same decision: nothing changes
        bit = self._ensure(replica)
        lru = self._lru[replica]
        owners = self._owners
        self._version += 1
        # tails first, so the prompt's first block is the most recently used: eviction (oldest first) then
        # takes suffixes before prefixes, as the engine's LRU does, and what remains is still a usable prefix
        for k in reversed(keys if isinstance(keys, list) or isinstance(keys, Sequence) else list(keys)):
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
                owners[k] = owners.get(k, 0) | bit
                self._size += 1
        self._evict(replica)
        if self._size > self.max_blocks:
            self._evict_global()
        self._last_insert = (keys, replica, self._version)

    def match(self, keys: Sequence[int]) -> dict[str, int]:
        """Leading blocks of `keys` each replica holds (replicas with 0 omitted).

        One bisection shared by all replicas (see `_match`): blocks of one replica are prefix-closed in practice
        (inserting a prompt refreshes all of its blocks, so eviction takes suffixes first), which keeps a lookup
        O(R log n) at worst.
        """
        if not keys:
            return {}
        memo = self._memo
        if memo is not None and memo[0] is keys and memo[1] == len(keys) and memo[2] == self._version:
            return memo[3]
        out = self._match(keys)
        self._memo = (keys, len(keys), self._version, out)
        return out

    def _match(self, keys: Sequence[int]) -> dict[str, int]:
        owners = self._owners
        # BlockKeys: read single keys from the array (no conversion of the whole prompt)
        # (a plain list first: isinstance against BlockKeys, a Sequence ABC, is the slow path)
        key = keys.__getitem__ if type(keys) is list or not isinstance(keys, BlockKeys) else keys.array.item
        first = owners.get(key(0), 0)
        if not first:
            return {}
        n = len(keys)
        last = owners.get(key(n - 1), 0)
        ends: dict[int, int] = {}  # replica bit -> blocks held
        # One bisection for all replicas at once: `bits` are set at lo and unset at hi; each probe splits them
        # into those still set at mid (their prefix ends in [mid, hi)) and the rest (it ends in [lo, mid)).
        # A replica takes the same path as its own binary search would, but a probe is made once for all of
        # the replicas sharing that interval.
        stack = [(0, n - 1, first & ~last)]
        while stack:
            lo, hi, bits = stack.pop()
            if not bits:
                continue
            if hi - lo <= 1:
                while bits:
                    bit = bits & -bits
                    bits ^= bit
                    ends[bit] = lo + 1
                continue
            mid = (lo + hi) // 2
            at_mid = owners.get(key(mid), 0) & bits
            stack.append((lo, mid, bits & ~at_mid))
            stack.append((mid, hi, at_mid))
        by_bit = self._by_bit
        out: dict[str, int] = {}
        while first:  # in bit order, as callers may break ties by iteration order
            bit = first & -first
            first ^= bit
            out[by_bit[bit]] = n if bit & last else ends[bit]
        return out

    def hot_blocks_lost_if_removed(self, replica: str, hot: int | None = None) -> int:
        """Blocks only `replica` holds (lost from the fleet's caches if it scales in).

        `hot`: count only among its `hot` most recently used blocks (None: all of them).
        """
        bit = self._bit.get(replica)
        if bit is None:
            return 0
        lru = self._lru[replica]
        keys: Iterable[int] = reversed(lru) if hot is None else list(reversed(lru))[:hot]
        return sum(1 for k in keys if self._owners.get(k, 0) == bit)

    # -- vLLM KV-cache events --------------------------------------------------------------------------------
    def apply_kv_event(self, replica: str, event: Mapping[str, Any], block_size: int) -> None:
        """Apply one vLLM KV event (dict form of BlockStored / BlockRemoved / AllBlocksCleared).

        BlockStored carries the token ids, so its blocks get our own chain keys (continuing from the parent
        block's chain when we saw it); the engine's hashes are remembered to resolve later removals. Only
        meaningful when the router tokenizes with the served model's tokenizer.

        Tiers: with KV offloading each block is reported per `medium` ("GPU", "CPU"; None from engines without
        tiers = GPU) under the same engine hash, and stays matchable while any medium holds it (a GPU eviction of
        a block still in host memory keeps it). Stores/removals are reference-counted per medium, as vLLM asks:
        a hash can be announced twice (duplicate GPU blocks, offload chunks sharing a block). A store without
        token ids (the offload connector's default payload) counts for a block keyed earlier, else is skipped.
        AllBlocksCleared has no medium and a host-tier reset emits no events, so it clears every tier: a
        forgotten block costs a missed match, a stale one a misroute.
        """
        kind = event.get("type") or event.get("kind")
        emap = self._engine_map.setdefault(replica, {})
        media = self._engine_media.setdefault(replica, {})
        if kind == "AllBlocksCleared":
            bit = self._bit.get(replica)
            if bit is not None:
                self._clear_all(list(self._lru[replica]), bit)
                self._lru[replica].clear()
            emap.clear()
            media.clear()
        elif kind == "BlockStored":
            slot = medium_slot(event.get("medium"))
            hashes = event.get("block_hashes") or []
            tokens = event.get("token_ids") or []
            if not tokens:
                for eh in hashes:
                    if eh in emap:
                        media[eh] = count_add(media.get(eh, 0), slot)
                return
            hasher = self._engine_hasher.get(block_size)
            if hasher is None:
                hasher = self._engine_hasher[block_size] = BlockHasher(block_size)
            parent_hash = event.get("parent_block_hash")
            # a chain's first block starts from its adapter's seed (vLLM names the adapter in lora_name)
            parent = emap.get(parent_hash, 0) if parent_hash is not None else adapter_seed(event.get("lora_name"))
            if parent_hash is not None and parent_hash not in emap:
                return  # a chain we never saw the start of: cannot key it
            keys = hasher.keys(tokens, parent)
            for eh, k in zip(hashes, keys, strict=False):
                emap[eh] = k
                media[eh] = count_add(media.get(eh, 0), slot)
            self.insert(replica, keys)
        elif kind == "BlockRemoved":
            bit = self._bit.get(replica)
            if bit is None:
                return
            slot = medium_slot(event.get("medium"))
            lru = self._lru[replica]
            for eh in event.get("block_hashes") or []:
                counts = media.get(eh)
                if counts is None:
                    continue
                counts = count_sub(counts, slot)
                if counts:
                    media[eh] = counts  # another medium (or copy) still holds it
                    continue
                del media[eh]
                gone = emap.pop(eh, None)
                if gone is not None and lru.pop(gone, 0) is None:
                    self._clear(gone, bit)

    def stats(self) -> dict[str, Any]:
        return {"blocks": self._size, "keys": len(self._owners), "replicas": {r: len(v) for r, v in self._lru.items()}}

    def dumps(self) -> str:
        return json.dumps(self.stats())
