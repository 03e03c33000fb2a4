"""One vLLM-like replica: continuous batching, chunked prefill, paged KV blocks with an LRU prefix cache.

Blocks and the optional host tier (vLLM's native CPU KV offloading) are kv_blocks.py's `BlockCache`. A prompt
found in the host tier is loaded back; the load time (bytes over the host link) is added to the step that
admits the request: pessimistic for the rest of that batch, since vLLM overlaps the copy with other steps.

Optional LoRA adapters (`adapter_slots` > 0): the replica holds at most that many adapters, least recently used
evicted first. A request routed to a replica that does not hold its adapter loads it there (`use_adapter`, at
dispatch; a later request for it finds it held): the load time stalls the replica's next step, as vLLM's adapter
load runs in the engine between steps. Adapters are not limited per batch (vLLM's maxLoras).

A step is planned when the previous one ends (vLLM V1 scheduler order): running requests first (one token
per decode, a chunk per unfinished prefill, within the token budget), preempting the newest running request
(recompute) when blocks run out; then waiting requests in arrival order, each looked up in the prefix cache.
When a step holds only decodes and nothing can be admitted, the replica plans a *decode run*: all the steps
until the first sequence finishes, costed in closed form; an arrival truncates the run at the step in
progress. That keeps the event count per request small without changing the schedule.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from itertools import repeat
from operator import attrgetter, ge, sub

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.kv_blocks import BlockCache
from llmfleet.sim.workload import Request

_tokens, _held = attrgetter("tokens"), attrgetter("held")
_output_len, _generated = attrgetter("output_len"), attrgetter("generated")
_target = attrgetter("target")


def _series(a: float, b: float, lo: int, hi: int) -> float:
    """sum_{i=lo}^{hi-1} (a + b·i)"""
    n = hi - lo
    return n * a + b * (lo + hi - 1) * n / 2 if n > 0 else 0.0


class SimReplica(BlockCache):
    def __init__(self, rid: int, pool: str, blocks: int, block_size: int, cost: StepCostModel, *,
                 max_num_seqs: int = 256, max_batched_tokens: int = 8192, chunked_prefill: bool = True,
                 ready_at: float = 0.0, host_blocks: int = 0, host_load_s_per_block: float = 0.0,
                 adapter_slots: int = 0, adapter_load_s: float = 0.0) -> None:
        super().__init__(rid, blocks, block_size, host_blocks)
        self.pool = pool
        self.cost = cost
        self.max_seqs = max_num_seqs
        self.budget = max_batched_tokens
        self.chunked = chunked_prefill
        self.host_load_s = host_load_s_per_block
        self.adapter_slots = adapter_slots
        self.adapter_load_s = adapter_load_s
        self.adapters: OrderedDict[str, None] = OrderedDict()  # held adapters, least recently used first
        self.adapter_loads = 0
        self.adapter_pending_s = 0.0  # adapter load time the next step pays
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.ready_at = ready_at
        self.started_at = ready_at
        self.stopped_at: float | None = None
        self.draining = False
        self.version = 0  # bumps invalidate scheduled step events
        self.busy_until = -1.0  # end of the planned step/run; < now when idle
        self.plan: list[tuple[Request, int]] = []
        self.run: tuple[float, int, float, float, float, float] | None = None  # start, k, and the cost lines
        self.step_start = 0.0
        # counters
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.host_hit_tokens = 0  # of hit_tokens, those loaded from the host tier
        self.busy_s = 0.0
        self.steps = 0
        self.preemptions = 0
        self.served = 0
        # token-level work, counted as steps complete: prompt tokens computed (cache hits are not computed;
        # recomputation after a preemption is) and tokens generated; the autoscaler's tokens/s come from these
        self.computed_prompt = 0
        self.generated = 0
        self.min_waiting = 0  # the shortest waiting queue since the last autoscaler tick (the engine resets it)
        self.tick_marks = (0, 0)  # (computed_prompt, generated) at the last autoscaler tick
        self.first_tokens: list[Request] = []  # got their first token in the last completed step (engine drains)
        self.host_busy: list[int] | None = None  # busy replicas on a host shared with others (share_host)
        self.host_cores = 0.0
        self.on_host = False  # counted in host_busy
        self.slow = 1.0  # the planned step's (or decode run's) time factor for sharing the host's cores

    def share_host(self, busy: list[int], cores: float) -> None:
        """Run on a host of `cores` cores with the other replicas holding the same `busy` counter (a one-item
        list; each replica steps on about one core): a step is planned max(1, busy replicas / cores) times as
        long as alone, the busy count sampled when the step is planned (this one included)."""
        if cores <= 0:
            raise ValueError(f"a shared host needs cores > 0, got {cores}")
        self.host_busy = busy
        self.host_cores = cores

    def _host_slowdown(self, busy: bool) -> None:
        hb = self.host_busy
        if hb is None:
            return
        if busy != self.on_host:
            hb[0] += 1 if busy else -1
            self.on_host = busy
        self.slow = max(1.0, hb[0] / self.host_cores)

    def _preempt(self, r: Request) -> None:
        self._release(r)
        self.running.remove(r)
        r.preemptions += 1
        self.preemptions += 1
        # recompute: prompt plus every token generated so far, then the next token is sampled
        r.target = r.prompt_len + r.generated
        r.tokens = 0
        self.waiting.appendleft(r)

    def check_blocks(self) -> None:
        """Raise if block accounting is broken (tests and --check)."""
        self.check_block_accounting(self.running)

    # -- scheduling ----------------------------------------------------------------------------------------
    def use_adapter(self, name: str) -> None:
        """A request for adapter `name` arrives: refresh it, or load it (evicting the least recently used)."""
        if name in self.adapters:
            self.adapters.move_to_end(name)
            return
        if self.adapter_slots and len(self.adapters) >= self.adapter_slots:
            self.adapters.popitem(last=False)
        self.adapters[name] = None
        self.adapter_loads += 1
        self.adapter_pending_s += self.adapter_load_s

    def schedule(self, now: float) -> float | None:
        """Plan the next step (or decode run) starting at `now`; returns its end time, None when idle."""
        budget = self.budget
        bs = self.bs
        # host-tier blocks loaded for the requests this step admits, plus adapter loads since the last step
        load_s, self.adapter_pending_s = self.adapter_pending_s, 0.0
        preempted_before = self.preemptions
        admitted_now = 0  # requests admitted for the first time: each adds the cost model's request overhead
        plan: list[tuple[Request, int]] = []
        tokens = 0
        attended = 0.0
        read = 0.0
        all_decode = True
        i = 0
        running = self.running
        # the hottest loop of a big run (once per running request per step): block arithmetic inlined,
        # `avail` (free + idle blocks) kept in a local and refreshed whenever blocks move
        avail = self.free + self.idle
        if 0 < len(running) <= budget:
            # Fast path (most steps of a big run): every running request decodes one token and their new
            # blocks fit, so the loop below would plan them all in order without preempting. Same plan and
            # block moves; the float sums are of integers (exact), so they equal the loop's.
            tok = list(map(_tokens, running))
            if all(map(ge, tok, map(_target, running))):
                grows = list(map(sub, [-(-(t + 1) // bs) for t in tok], map(_held, running)))
                grow = sum([g for g in grows if g > 0])
                if grow <= avail:
                    if grow:
                        self._take(grow)
                        avail -= grow
                        for r, g in zip(running, grows, strict=True):
                            if g > 0:
                                r.held += g
                    i = b = len(running)
                    plan = list(zip(running, repeat(1)))
                    ctx = sum(tok)
                    attended = float(ctx + b)
                    read = float(ctx)
                    tokens = b
                    budget -= b
        while i < len(running) and budget > 0:
            r = running[i]
            t, target = r.tokens, r.target
            n = 1 if t >= target else min(target - t, budget)
            need = -(-(t + n) // bs) - r.held
            if need > avail:
                while True:
                    victim = running[-1]
                    self._preempt(victim)
                    avail = self.free + self.idle
                    if victim is r or need <= avail:
                        break
                if victim is r:
                    continue  # r itself was preempted: running[i] is now the next request (or the list ended)
            if need > 0:
                if need <= self.free:
                    self.free -= need
                else:
                    self._take(need)
                r.held += need
                avail -= need
            plan.append((r, n))
            if n > 1 or t < target:
                all_decode = False
            attended += n * t + n * (n + 1) / 2
            read += t
            tokens += n
            budget -= n
            i += 1
        admit_blocked = self.preemptions != preempted_before  # vLLM admits nothing in a step that preempted
        while self.waiting and not admit_blocked:
            if budget <= 0 or len(running) >= self.max_seqs:
                admit_blocked = True
                break
            r = self.waiting[0]
            fresh = r.tokens == 0 and r.held == 0
            hit = self._lookup(r) if fresh else 0
            loaded = self._host_match(r) if fresh and self.host_total else 0
            start = hit + loaded * bs
            n = min(r.target - start, budget)
            if not self.chunked and n < r.target - start:
                self._undo_lookup(r)
                admit_blocked = True
                break
            need = -(-(start + n) // bs) - r.held
            if need > self.free + self.idle:
                self._undo_lookup(r)
                admit_blocked = True  # only finishes free blocks, and a decode run ends at the first finish
                break
            self.waiting.popleft()
            self._take(need)
            r.held += need
            r.tokens = start
            if loaded:
                load_s += loaded * self.host_load_s
            if r.admitted_at < 0:  # first admission (a preempted request is re-admitted later)
                admitted_now += 1
                r.admitted_at = now
                r.hit_tokens = start
                self.prompt_tokens += r.prompt_len
                self.hit_tokens += start
                self.host_hit_tokens += loaded * bs
            running.append(r)
            plan.append((r, n))
            all_decode = False
            attended += n * start + n * (n + 1) / 2
            read += start
            tokens += n
            budget -= n
        if not plan:
            self.adapter_pending_s += load_s  # nothing runs: the next step pays the adapter loads
            self.plan = []
            self.run = None
            self._host_slowdown(False)
            return None
        self.plan = plan
        self.step_start = now
        self._host_slowdown(True)
        c = self.cost
        if all_decode and len(plan) == len(running) and (not self.waiting or admit_blocked) and not load_s:
            k = min(map(sub, map(_output_len, running), map(_generated, running)))
            k, grow = self._fit_run(k)
            if k > 1:
                # the run's blocks are taken now, in one go (_fit_run checked they exist; taking them per
                # request in running order consumes free blocks, then evicts, in the same order)
                if grow:
                    self._take(grow)
                    for r in running:
                        extra = -(-(r.tokens + k) // bs) - r.held
                        if extra > 0:
                            r.held += extra
                b = len(running)
                ctx = read
                # per-step time j: overhead + max(fa + fb·j, ma + mb·j)
                fa = (c.flops_per_token * b + c.attn_flops_per_ctx * (ctx + b)) / (c.peak_flops * c.compute_eff)
                fb = c.attn_flops_per_ctx * b / (c.peak_flops * c.compute_eff)
                ma = (c.weight_bytes + c.kv_bytes * (ctx + b)) / (c.bandwidth * c.bandwidth_eff)
                mb = c.kv_bytes * b / (c.bandwidth * c.bandwidth_eff)
                self.run = (now, k, fa, fb, ma, mb)
                self.busy_until = now + self.run_time(k)
                return self.busy_until
        self.run = None
        step = c.step_time(tokens, attended, read) + admitted_now * c.request_overhead_s
        self.busy_until = now + step * self.slow + load_s
        return self.busy_until

    def _undo_lookup(self, r: Request) -> None:
        if r.shared and r.tokens == 0:
            self._release(r)

    def _fit_run(self, k: int) -> tuple[int, int]:
        """Largest run length <= k whose block growth fits the free blocks (1 if even two steps don't), and
        the blocks that growth takes (for k > 1)."""
        avail = self.free + self.idle
        bs = self.bs
        running = self.running
        tokens = list(map(_tokens, running))
        held = list(map(_held, running))
        while k > 1:
            # a truncated run can leave a request holding more blocks than it needs: count growth only
            need = sum([g for t, h in zip(tokens, held, strict=True) if (g := -(-(t + k) // bs) - h) > 0])
            if need <= avail:
                return k, need
            k //= 2
        return 1, 0

    def run_time(self, j: int) -> float:
        """Seconds for the first j steps of the current decode run (exact sum of the roofline maxima)."""
        if self.run is None:
            raise RuntimeError("no decode run")
        _, _, fa, fb, ma, mb = self.run
        series = _series
        d0, dd = fa - ma, fb - mb  # compute minus memory time: linear in i, changes sign at most once
        if dd == 0:
            body = series(fa, fb, 0, j) if d0 >= 0 else series(ma, mb, 0, j)
        else:
            split = min(j, max(0, math.ceil(-d0 / dd)))
            if dd > 0:  # memory-bound first, compute-bound from `split`
                body = series(ma, mb, 0, split) + series(fa, fb, split, j)
            else:  # compute-bound first, memory-bound from `split`
                body = series(fa, fb, 0, split) + series(ma, mb, split, j)
        return (j * self.cost.overhead_s + body) * self.slow

    def truncate(self, now: float) -> float | None:
        """An arrival during a decode run: end the run after the step in progress; returns the new end."""
        if self.run is None or now >= self.busy_until:
            return None
        start, k = self.run[0], self.run[1]
        lo, hi = 1, k  # smallest j with start + run_time(j) > now
        while lo < hi:
            mid = (lo + hi) // 2
            if start + self.run_time(mid) > now:
                hi = mid
            else:
                lo = mid + 1
        if lo >= k:
            return None
        self.run = (start, lo, *self.run[2:])
        self.busy_until = start + self.run_time(lo)
        return self.busy_until

    def complete(self, now: float) -> list[Request]:
        """Apply the planned step (or run) that ends at `now`; returns the requests that finished."""
        steps = self.run[1] if self.run is not None else 1
        self.busy_s += now - self.step_start
        self.steps += steps
        done: list[Request] = []
        rid = self.id
        if self.run is not None:  # a decode run: every planned request decodes (planned only then)
            for r, _ in self.plan:
                if r.replica != rid or r.held == 0:
                    continue  # preempted since planning (cannot happen within a step, kept for safety)
                r.tokens += steps
                r.generated += steps
                self.generated += steps
                if r.generated >= r.output_len:
                    r.finish = now
                    done.append(r)
        else:
            for r, n in self.plan:
                if r.replica != rid or r.held == 0:
                    continue
                if r.tokens < r.target:  # prefill chunk
                    r.tokens += n
                    self.computed_prompt += n
                    if r.tokens >= r.target:
                        if r.registered < len(r.keys):
                            self._register(r)
                        r.generated += 1
                        self.generated += 1
                        if r.first_token < 0:
                            r.first_token = now
                            self.first_tokens.append(r)
                    else:  # a partial chunk: its full blocks become cached
                        self._register(r)
                else:  # decode (tokens >= target stays true)
                    r.tokens += 1
                    r.generated += 1
                    self.generated += 1
                if r.generated >= r.output_len:
                    r.finish = now
                    done.append(r)
        if done:
            for r in done:
                if self.host_total:
                    self._host_touch(r)
                self._release(r)
            gone = set(id(r) for r in done)
            self.running = [r for r in self.running if id(r) not in gone]
            self.served += len(done)
        self.plan = []
        self.run = None
        return done
