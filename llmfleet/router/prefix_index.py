"""Approximate index of which replica holds which prompt-prefix KV blocks.

A prompt is cut into fixed-size blocks of tokens (the served model's tokenizer when its tokenizer.json is
readable, else UTF-8 bytes in blocks of 4 x block_size as a text stand-in). Block i's key hashes the whole
prefix up to and including block i (a hash chain c_i = c_{i-1} * M + inner(block_i) mod 2^64, then a bijective
mix), so equal keys mean equal prefixes. The chain is computed in closed form with numpy
(c_i = M^i * cumsum(inner_k * M^-k)), which keeps an 8k-token prompt well under the route-decision budget.

Per replica the index keeps an LRU of keys bounded by that replica's KV capacity in blocks (aging: what a
replica has not seen recently is what its engine evicted first); globally it is bounded by `max_blocks`.
A lookup returns, for each replica, how many leading blocks of the prompt it is believed to hold.
`apply_kv_event` corrects the index from vLLM KV-cache events (BlockStored / BlockRemoved / AllBlocksCleared),
and `hot_blocks_lost_if_removed` tells the autoscaler what scaling a replica in would cost in cache.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("llmfleet.router.prefix_index")

_MASK = (1 << 64) - 1
_B = np.uint64(0x9E3779B97F4A7C15)  # inner (within-block) polynomial base
_M = 0xC2B2AE3D27D4EB4F  # chain multiplier (odd: invertible mod 2^64)
_M_INV = pow(_M, -1, 1 << 64)
DEFAULT_CAPACITY_BLOCKS = 16384
TEXT_BYTES_PER_TOKEN = 4


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (bijective), vectorized."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


class BlockHasher:
    """Token ids (or bytes) -> one key per full block. Stateless apart from cached power tables."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._inner = np.array([pow(0x9E3779B97F4A7C15, j, 1 << 64) for j in range(block_size)], dtype=np.uint64)
        self._grow(64)

    def _grow(self, n: int) -> None:
        self._pow = np.array([pow(_M, i, 1 << 64) for i in range(n)], dtype=np.uint64)
        self._ipow = np.array([pow(_M_INV, i, 1 << 64) for i in range(n)], dtype=np.uint64)

    def raw_chain(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> np.ndarray:
        """Unmixed chain values of each full block; `parent` continues an earlier chain.

        Array arithmetic on uint64 wraps modulo 2^64 without warnings (no errstate context needed).
        """
        arr = np.asarray(tokens, dtype=np.uint64)
        n = len(arr) // self.block_size
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        if n + 1 > len(self._pow):
            self._grow(max(n + 1, 2 * len(self._pow)))
        blocks = arr[: n * self.block_size].reshape(n, self.block_size)
        inner = blocks @ self._inner + np.uint64(1)  # +1 so an all-zero block still moves the chain
        pw = self._pow[1 : n + 1]
        # c_i = M^i * sum_k inner_k M^-k  ==  sequential c_i = c_{i-1} * M + inner_i (with c_0 = parent)
        chain: np.ndarray = pw * np.cumsum(inner * self._ipow[1 : n + 1])
        if parent:
            chain = chain + np.full(1, parent, dtype=np.uint64) * pw
        return chain

    def keys(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> list[int]:
        keys: list[int] = _mix(self.raw_chain(tokens, parent)).tolist()
        return keys


def load_tokenizer(path: str | None) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json (file or folder), or None (text blocks)."""
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        return Tokenizer.from_file(str(p))
    except (OSError, ValueError, RuntimeError) as e:  # tokenizers raises Exception subclasses on bad files
        log.warning("tokenizer %s unreadable (%s): text blocks instead", p, e)
        return None


class PromptBlocks:
    """Prompt text -> (keys, input token count), with a tokenizer or the text stand-in."""

    def __init__(self, block_size: int, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.hasher = BlockHasher(block_size if tokenizer is not None else block_size * TEXT_BYTES_PER_TOKEN)

    def tokens(self, text: str) -> np.ndarray:
        if self.tokenizer is not None:
            # Special tokens as the engine adds them (BOS), so keys line up with vLLM's KV events.
            return np.asarray(self.tokenizer.encode(text, add_special_tokens=True).ids, dtype=np.uint64)
        return np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)

    def __call__(self, text: str) -> tuple[list[int], int]:
        toks = self.tokens(text)
        n_tokens = len(toks) if self.tokenizer is not None else max(1, len(toks) // TEXT_BYTES_PER_TOKEN)
        return self.hasher.keys(toks), n_tokens


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
        self._engine_map: dict[str, dict[int, int]] = {}  # replica -> vLLM block hash -> raw chain value
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
        for k in self._lru.pop(replica):
            self._clear(k, bit)
        self._capacity.pop(replica, None)
        self._engine_map.pop(replica, None)

    def replicas(self) -> list[str]:
        return list(self._bit)

    def __len__(self) -> int:
        return self._size

    def blocks_of(self, replica: str) -> int:
        return len(self._lru.get(replica, ()))

    # -- core ------------------------------------------------------------------------------------------------
    def _clear(self, key: int, bit: int) -> None:
        self._version += 1
        m = self._owners.get(key, 0) & ~bit
        if m:
            self._owners[key] = m
        else:
            self._owners.pop(key, None)
        self._size -= 1

    def _evict(self, replica: str) -> None:
        lru = self._lru.get(replica)
        if lru is None:
            return
        bit = self._bit[replica]
        cap = self._capacity.get(replica, self.default_capacity)
        while len(lru) > cap:
            k, _ = lru.popitem(last=False)
            self._clear(k, bit)

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
            lru, bit = self._lru[r], self._bit[r]
            for _ in range(n - level):
                k, _ = lru.popitem(last=False)
                self._clear(k, bit)

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
        for k in reversed(keys if isinstance(keys, Sequence) else list(keys)):
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

        Binary search per replica: blocks of one replica are prefix-closed in practice (inserting a prompt
        refreshes all of its blocks, so eviction takes suffixes first), which keeps a lookup O(R log n).
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
        first = owners.get(keys[0], 0)
        if not first:
            return {}
        n = len(keys)
        cache: dict[int, int] = {0: first}

        def at(i: int) -> int:
            m = cache.get(i)
            if m is None:
                m = cache[i] = owners.get(keys[i], 0)
            return m

        out: dict[str, int] = {}
        last = at(n - 1)
        bits = first
        while bits:
            bit = bits & -bits
            bits ^= bit
            if last & bit:
                out[self._by_bit[bit]] = n
                continue
            lo, hi = 0, n - 1  # bit set at lo, unset at hi
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if at(mid) & bit:
                    lo = mid
                else:
                    hi = mid
            out[self._by_bit[bit]] = lo + 1
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
        """
        kind = event.get("type") or event.get("kind")
        emap = self._engine_map.setdefault(replica, {})
        if kind == "AllBlocksCleared":
            bit = self._bit.get(replica)
            if bit is not None:
                for k in self._lru[replica]:
                    self._clear(k, bit)
                self._lru[replica].clear()
            emap.clear()
        elif kind == "BlockStored":
            hasher = self._engine_hasher.get(block_size)
            if hasher is None:
                hasher = self._engine_hasher[block_size] = BlockHasher(block_size)
            parent_hash = event.get("parent_block_hash")
            parent = emap.get(parent_hash, 0) if parent_hash is not None else 0
            if parent_hash is not None and parent_hash not in emap:
                return  # a chain we never saw the start of: cannot key it
            raw = hasher.raw_chain(event.get("token_ids", []), parent)
            mixed = _mix(raw).tolist()
            for eh, r in zip(event.get("block_hashes", []), raw.tolist(), strict=False):
                emap[eh] = r
            self.insert(replica, mixed)
        elif kind == "BlockRemoved":
            bit = self._bit.get(replica)
            if bit is None:
                return
            lru = self._lru[replica]
            for eh in event.get("block_hashes", []):
                r = emap.pop(eh, None)
                if r is None:
                    continue
                k = int(_mix(np.array([r], dtype=np.uint64))[0])
                if lru.pop(k, 0) is None:
                    self._clear(k, bit)

    def stats(self) -> dict[str, Any]:
        return {"blocks": self._size, "keys": len(self._owners), "replicas": {r: len(v) for r, v in self._lru.items()}}

    def dumps(self) -> str:
        return json.dumps(self.stats())
