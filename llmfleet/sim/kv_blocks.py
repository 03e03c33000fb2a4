"""A simulated replica's paged KV blocks, with an LRU prefix cache and an optional host tier.

Blocks: `free` never-used or released blocks; `cache` maps a block key to its reference count; the `idle`
cached blocks nobody references are evictable, least recently used first (a lazy queue, see the blocks
section). Invariant (checked by tests): free + idle + referenced cached blocks + private blocks == total.

Optional host tier (vLLM's native CPU KV offloading, `--kv-offloading-size`): every block the replica
computes is also written to a host-memory LRU of `host_total` blocks; a new request's prompt is looked up
there after the GPU prefix cache, and the following blocks found in host memory are loaded back (allocated
on the GPU, not recomputed). A request that finishes refreshes its blocks in the host LRU, prefixes most
recent, as vLLM's LRU policy does.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import compress, islice, repeat, takewhile
from operator import add, eq, neg, sub

from llmfleet.router.kv_tiers import cached_capacity
from llmfleet.sim.workload import NO_BLOCKS, Request


class BlockCache:
    """A replica's paged KV blocks: private blocks, the refcounted prefix cache, the lazy LRU of idle blocks, and
    the optional host tier. The replica (SimReplica) schedules requests on top of it."""

    def __init__(self, rid: int, blocks: int, block_size: int, host_blocks: int = 0) -> None:
        self.id = rid
        self.total = blocks
        self.bs = block_size
        self.free = blocks
        self.cache: dict[int, int] = {}  # key -> references, or -stamp when idle (see below)
        self.idle_stamps: deque[int] = deque()  # the lazy LRU queue of idle blocks, as two parallel deques
        self.idle_keys: deque[int] = deque()
        self.idle = 0  # cached blocks nobody references
        self.stamp = 0
        self.host_total = host_blocks
        self.host: OrderedDict[int, None] = OrderedDict()  # host-tier block keys, least recently used first
        self.on_evict: Callable[[int, int], None] | None = None
        self.on_store: Callable[[int, int], None] | None = None

    # -- blocks --------------------------------------------------------------------------------------------
    # `cache` maps a cached block key to its reference count, or to -stamp when nobody references it (idle:
    # evictable). The LRU of idle blocks is lazy: `idle_stamps`/`idle_keys` get (stamp, key) each time a
    # block becomes idle, and an entry is valid only while cache[key] == -stamp, so a lookup that re-references an idle block
    # leaves the queue alone. Eviction pops the oldest valid entry: the same order as an ordered LRU, with
    # fewer random memory touches per block (the simulator's hottest loop: ~80 blocks per request).
    @property
    def available(self) -> int:
        return self.free + self.idle

    @property
    def used_blocks(self) -> int:
        return self.total - self.available

    @property
    def cached_capacity(self) -> int:
        """Distinct blocks the replica can hold cached (the production router's rule: kv_tiers.cached_capacity)."""
        return cached_capacity(self.total, self.host_total)

    def kv_usage(self) -> float:
        return self.used_blocks / self.total if self.total else 1.0

    def _take(self, n: int) -> None:
        """Allocate n private blocks (caller checked availability): free blocks first, then evict LRU."""
        f = min(n, self.free)
        self.free -= f
        n -= f
        if not n:
            return
        pop_stamp, pop_key, cache = self.idle_stamps.popleft, self.idle_keys.popleft, self.cache
        self.idle -= n
        while n:
            stamp, k = pop_stamp(), pop_key()
            if cache.get(k) == -stamp:
                del cache[k]
                if self.on_evict is not None:
                    self.on_evict(self.id, k)
                n -= 1

    def _make_idle(self, keys: list[int]) -> None:
        """These blocks (in this order) lost their last reference: most recently used last."""
        s0 = self.stamp
        self.stamp = s1 = s0 + len(keys)
        stamps = range(s0 + 1, s1 + 1)
        self.cache.update(zip(keys, map(neg, stamps), strict=True))
        self.idle_stamps.extend(stamps)
        self.idle_keys.extend(keys)
        self.idle += len(keys)
        if len(self.idle_keys) > 2 * self.idle + 4096:  # mostly stale entries: compact (amortised O(1))
            # an entry is live while cache[key] == -stamp (C-level maps: this runs over ~2x the idle blocks)
            live = list(map(eq, map(self.cache.get, self.idle_keys), map(neg, self.idle_stamps)))
            self.idle_stamps = deque(compress(self.idle_stamps, live))
            self.idle_keys = deque(compress(self.idle_keys, live))

    def _release(self, r: Request) -> None:
        cache = self.cache
        shared = r.shared
        counts = list(map(sub, map(cache.__getitem__, shared), repeat(1)))
        if 0 in counts:
            # chain tails go first in the LRU, so prefixes outlive their suffixes
            idle = [k for k, c in zip(reversed(shared), reversed(counts), strict=True) if not c]
            if len(idle) < len(shared):
                cache.update((k, c) for k, c in zip(shared, counts, strict=True) if c)
            self._make_idle(idle)
        else:
            cache.update(zip(shared, counts, strict=True))
        self.free += r.held - len(shared)
        r.held = 0
        r.shared = NO_BLOCKS
        r.registered = 0

    def _lookup(self, r: Request) -> int:
        """Reference the cached leading blocks of r's prompt; returns the hit tokens."""
        keys, cache = r.keys, self.cache
        limit = min(len(keys), (r.target - 1) // self.bs)  # at least one token is computed
        if not limit or keys[0] not in cache:
            return 0
        shared = list(takewhile(cache.__contains__, islice(keys, limit)))
        counts = list(map(cache.__getitem__, shared))
        woken = sum(1 for c in counts if c < 0)
        if woken:  # idle blocks referenced again: their queue entries go stale
            self.idle -= woken
            cache.update(zip(shared, [c + 1 if c > 0 else 1 for c in counts], strict=True))
        else:
            cache.update(zip(shared, map(add, counts, repeat(1)), strict=True))
        n = len(shared)
        r.shared = shared
        r.held = n
        r.registered = n
        return n * self.bs

    def _host_match(self, r: Request) -> int:
        """Blocks of r's prompt found in the host tier right after its GPU hit (nothing is changed)."""
        host = self.host
        start = len(r.shared)
        limit = min(len(r.keys), (r.target - 1) // self.bs)  # at least one token is computed
        if start >= limit or r.keys[start] not in host:
            return 0
        return sum(1 for _ in takewhile(host.__contains__, islice(r.keys, start, limit)))

    def _host_store(self, keys: list[int]) -> None:
        """Write-through of computed blocks: new keys enter as most recent; the LRU overflow is dropped."""
        host = self.host
        for k in keys:
            if k in host:
                host.move_to_end(k)
            else:
                host[k] = None
        while len(host) > self.host_total:
            host.popitem(last=False)

    def _host_touch(self, r: Request) -> None:
        """A finished request refreshes its blocks in the host LRU, tails first so prefixes end most recent."""
        host = self.host
        for k in reversed(r.keys[:r.registered]):
            if k in host:
                host.move_to_end(k)

    def _register(self, r: Request) -> None:
        """Prompt blocks the request has fully computed become cached (shared) blocks."""
        full = min(r.tokens, r.prompt_len) // self.bs
        upto = min(full, len(r.keys))
        if r.registered >= upto:
            return
        if r.shared is NO_BLOCKS:  # its first cached block: a list of its own (NO_BLOCKS is never mutated)
            r.shared = []
        if self.host_total:
            self._host_store(list(r.keys[r.registered:upto]))
        cache = self.cache
        if self.on_store is None:
            new = r.keys[r.registered:upto]
            fresh = dict.fromkeys(new, 1)
            # the usual case: nobody computed these concurrently (and no key repeats within the prompt)
            if len(fresh) == len(new) and not any(map(cache.__contains__, new)):
                cache.update(fresh)
                r.shared.extend(new)
                r.registered = upto
                return
        while r.registered < upto:
            k = r.keys[r.registered]
            c = cache.get(k)
            if c is None:
                cache[k] = 1
                if self.on_store is not None:
                    self.on_store(self.id, k)
            else:  # computed concurrently by another request: share theirs, free our copy
                if c < 0:
                    self.idle -= 1
                cache[k] = c + 1 if c > 0 else 1
                self.free += 1
            r.shared.append(k)  # a private block became a shared one: held is unchanged
            r.registered += 1

    def check_block_accounting(self, holders: list[Request]) -> None:
        """Raise if block accounting is broken, `holders` the requests holding blocks (tests and --check)."""
        referenced = sum(1 for c in self.cache.values() if c > 0)
        idle = len(self.cache) - referenced
        private = sum(r.held - len(r.shared) for r in holders)
        valid = sum(1 for stamp, k in zip(self.idle_stamps, self.idle_keys, strict=True) if self.cache.get(k) == -stamp)
        if idle != self.idle or valid != idle:
            raise RuntimeError(f"replica {self.id}: idle blocks {idle}, counted {self.idle}, queued {valid}")
        if self.free + self.idle + referenced + private != self.total or self.free < 0:
            raise RuntimeError(f"replica {self.id}: block accounting broken: free {self.free} idle {self.idle} "
                               f"referenced {referenced} private {private} total {self.total}")
        refs: dict[int, int] = {}
        for r in holders:
            for k in r.shared:
                refs[k] = refs.get(k, 0) + 1
        for k, c in self.cache.items():
            if max(c, 0) != refs.get(k, 0):
                raise RuntimeError(f"replica {self.id}: block {k} refcount {c} != {refs.get(k, 0)}")
