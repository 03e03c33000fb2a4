"""Approximate index of which replica holds which prompt-prefix KV blocks.

A prompt is cut into fixed-size blocks of tokens (the served model's tokenizer when its tokenizer.json is
readable, else UTF-8 bytes in blocks of 4 x block_size as a text stand-in). Block i's key hashes the whole
prefix up to and including block i (a hash chain c_i = c_{i-1} * M + inner(block_i) mod 2^64), so equal keys
mean equal prefixes (up to 64-bit collisions). The chain is computed in closed form with numpy
(c_i = M^i * cumsum(inner_k * M^-k)), which keeps an 8k-token prompt well under the route-decision budget.

Per replica the index keeps an LRU of keys bounded by that replica's KV capacity in blocks, the larger of its
GPU and host offload tiers (aging: what a replica has not seen recently is what its engine evicted first);
globally it is bounded by `max_blocks`. A lookup returns, for each replica, how many leading blocks of the
prompt it is believed to hold. `apply_kv_event` corrects the index from vLLM KV-cache events (BlockStored / BlockRemoved /
AllBlocksCleared), keeping a block while any tier holds it, and `hot_blocks_lost_if_removed` tells the
autoscaler what scaling a replica in would cost in cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llmfleet.router.kv_tiers import count_add, count_sub, medium_slot

log = logging.getLogger("llmfleet.router.prefix_index")

_M = 0xC2B2AE3D27D4EB4F  # chain multiplier (odd: invertible mod 2^64)
_M_INV = pow(_M, -1, 1 << 64)
_MASK = (1 << 64) - 1
_B = 0x9E3779B97F4A7C15  # inner (within-block) polynomial base
DEFAULT_CAPACITY_BLOCKS = 16384
TEXT_BYTES_PER_TOKEN = 4
# Up to this many blocks a prompt is hashed in plain Python (BlockHasher.small_keys), beyond it with numpy:
# the crossover measured in a running router, where numpy's fixed per-call cost is paid with cold caches.
SMALL_PROMPT_BLOCKS = 8


def adapter_seed(adapter: str | None) -> int:
    """The chain's start for a prompt run with a LoRA adapter (0 for the base model): KV blocks of the same
    tokens differ per adapter (vLLM puts the LoRA name in its block hashes), so their keys must too. Stable
    across processes (no Python hash()), so the router and KV events (their `lora_name`) agree."""
    if not adapter:
        return 0
    return int.from_bytes(hashlib.blake2b(adapter.encode(), digest_size=8).digest(), "little") or 1


class BlockKeys(Sequence[int]):
    """A prompt's block keys, kept as the hasher's uint64 array; Python ints only when asked for.

    The route decision reads a handful of keys (the prefix match bisects), so converting all of an 8k-token
    prompt's 512 keys to Python ints (a quarter of the hashing time) waits until the index update after the
    decision, which iterates them all. Compares equal to a list of the same ints.
    """

    __slots__ = ("array", "_list")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self._list: list[int] | None = None

    def tolist(self) -> list[int]:
        if self._list is None:
            self._list = self.array.tolist()
        return self._list

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.tolist()[i]
        return self.array.item(i)

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __reversed__(self) -> Iterator[int]:
        return reversed(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockKeys):
            return self.tolist() == other.tolist()
        if isinstance(other, Sequence):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking sequence: unhashable, like a list

    def __repr__(self) -> str:
        return f"BlockKeys({self.tolist()!r})"


class BlockHasher:
    """Token ids (or bytes) -> one key per full block. Stateless apart from cached power tables.

    Token ids are hashed as 32-bit values (every vocabulary fits), text as bytes. A block's values are read as
    64-bit words (two token ids, or eight bytes, per word) when the block is a whole number of words, which
    halves (eighths, for text) the multiply-adds of the inner hash; otherwise each value is its own word.
    Keys are the raw chain values: the chain is already a hash of the whole prefix, and a bijective mix on
    top would change no collision (it cost a fifth of the hashing time).
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._inner: dict[int, np.ndarray] = {}  # words per block -> B^j table
        self._inner_ints: dict[int, list[int]] = {}  # the same tables as Python ints (small_keys)
        self._grow(64)

    def _inner_table(self, words: int) -> np.ndarray:
        t = self._inner.get(words)
        if t is None:
            t = self._inner[words] = np.array([pow(_B, j, 1 << 64) for j in range(words)], dtype=np.uint64)
        return t

    def _grow(self, n: int) -> None:
        self._pow = np.array([pow(_M, i, 1 << 64) for i in range(n)], dtype=np.uint64)
        self._ipow = np.array([pow(_M_INV, i, 1 << 64) for i in range(n)], dtype=np.uint64)

    def _words(self, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """(full blocks, words per block) uint64 matrix of the input."""
        arr = np.asarray(tokens)
        if arr.dtype != np.uint8:
            arr = arr.astype("<u4", copy=False)  # token ids: 32 bits each, whatever dtype they came in
        bs = self.block_size
        n = len(arr) // bs
        data = arr[: n * bs]
        if (bs * arr.itemsize) % 8 == 0:
            # little-endian words on any machine, as small_keys builds them
            return np.ascontiguousarray(data).view("<u8").reshape(n, bs * arr.itemsize // 8)
        return data.astype(np.uint64).reshape(n, bs)

    def raw_chain(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> np.ndarray:
        """Chain values of each full block; `parent` continues an earlier chain.

        Array arithmetic on uint64 wraps modulo 2^64 without warnings (no errstate context needed).
        """
        words = self._words(tokens)
        n = len(words)
        if n == 0:
            return np.zeros(0, dtype=np.uint64)
        if n + 1 > len(self._pow):
            self._grow(max(n + 1, 2 * len(self._pow)))
        inner = words @ self._inner_table(words.shape[1])
        inner += np.uint64(1)  # so an all-zero block still moves the chain
        inner *= self._ipow[1 : n + 1]
        pw = self._pow[1 : n + 1]
        # c_i = M^i * sum_k inner_k M^-k  ==  sequential c_i = c_{i-1} * M + inner_i (with c_0 = parent)
        chain: np.ndarray = np.cumsum(inner, out=inner)
        chain *= pw
        if parent:
            chain += np.full(1, parent, dtype=np.uint64) * pw
        return chain

    def keys(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> list[int]:
        keys: list[int] = self.raw_chain(tokens, parent).tolist()
        return keys

    def small_keys(self, values: Sequence[int] | bytes, parent: int = 0) -> list[int]:
        """The same keys as `keys`, in plain Python: for the few blocks of a short prompt, where numpy's
        per-call overhead (about a dozen array operations, each with cold caches inside a request) costs more
        than the arithmetic. `values`: token ids, or the bytes of text."""
        bs = self.block_size
        n = len(values) // bs
        if n == 0:
            return []
        if isinstance(values, (bytes, bytearray)):
            if bs % 8 == 0:  # eight bytes per word, little-endian
                words: Sequence[int] = struct.unpack_from(f"<{n * bs // 8}Q", values)
            else:
                words = values[: n * bs]
        elif bs % 2 == 0:  # two 32-bit token ids per word
            words = [(values[k] & 0xFFFFFFFF) | (values[k + 1] & 0xFFFFFFFF) << 32 for k in range(0, n * bs, 2)]
        else:
            words = [v & 0xFFFFFFFF for v in values[: n * bs]]
        wpb = len(words) // n
        table = self._inner_ints.get(wpb)
        if table is None:
            table = self._inner_ints[wpb] = self._inner_table(wpb).tolist()
        out = []
        c = parent
        for i in range(0, n * wpb, wpb):
            # sum + map: the block's multiply-adds in C (exact ints; only the chain is reduced mod 2^64)
            c = (c * _M + 1 + sum(map(operator.mul, words[i : i + wpb], table))) & _MASK
            out.append(c)
        return out

    def block_keys(self, tokens: Sequence[int] | np.ndarray, parent: int = 0) -> BlockKeys:
        """The keys, converted to Python ints lazily (see BlockKeys): what the route decision uses."""
        return BlockKeys(self.raw_chain(tokens, parent))


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

    def __call__(self, text: str, adapter: str | None = None) -> tuple[Sequence[int], int]:
        """`adapter`: the LoRA adapter the prompt runs with (its keys differ from the base model's)."""
        small = SMALL_PROMPT_BLOCKS * self.hasher.block_size
        seed = adapter_seed(adapter)
        if self.tokenizer is not None:
            ids = self.tokenizer.encode(text, add_special_tokens=True).ids
            if len(ids) <= small:
                return self.hasher.small_keys(ids, seed), len(ids)
            return self.hasher.block_keys(np.asarray(ids, dtype=np.uint32), seed), len(ids)
        data = text.encode("utf-8", "surrogatepass")
        n_tokens = max(1, len(data) // TEXT_BYTES_PER_TOKEN)
        if len(data) <= small:
            return self.hasher.small_keys(data, seed), n_tokens
        return self.hasher.block_keys(np.frombuffer(data, dtype=np.uint8), seed), n_tokens


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
        for k in self._lru.pop(replica):
            self._clear(k, bit)
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

    def has_room(self, replica: str, new_blocks: int) -> bool:
        """Whether `replica` is believed to take `new_blocks` more blocks without evicting any: what it holds
        plus them fits its capacity (a replica added empty has room; one whose cache has filled has none)."""
        return self.blocks_of(replica) + new_blocks <= self.capacity_of(replica)

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
        cap = self.capacity_of(replica)
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
                for k in self._lru[replica]:
                    self._clear(k, bit)
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
