"""Workloads for the simulator: requests, a workload's transformations, a synthetic generator. Trace files are read
by `llmfleet.sim.traces`.

A request's prompt is described by the keys of its full KV blocks (`keys`): key i identifies the whole
prefix up to and including block i (a hash chain, `chain`), so two requests share cache exactly where their keys
are equal. The traces' block hashes become such chains; traces without content share nothing; the synthetic
generator builds chains from tenants' system prompts and multi-turn sessions.
"""

from __future__ import annotations

import gc
import itertools
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np


class WorkloadError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


class BlockSizeError(WorkloadError):
    """A KV block size a workload's blocks cannot be merged into (the option is wrong for every run, not the file)."""

    def __init__(self, name: str, kv_block_size: int, block_size: int) -> None:
        super().__init__(f"{name}: KV block size {kv_block_size} is not a multiple of the workload's {block_size}-token "
                         "blocks (blocks can be merged, not split)")


# The `shared` list of every request that references no cached block: one list for all of them, never mutated
# (kv_blocks gives a request its own list when it registers its first block): 56 bytes a request less, ~15 % of
# a long trace's workload.
NO_BLOCKS: list[int] = []


class Request:
    """One request. Static fields come from the workload; the rest is filled by the simulation."""

    __slots__ = (
        "rid", "arrival", "prompt_len", "output_len", "keys", "tenant", "session", "cls", "adapter", "after", "think",
        # simulation state
        "replica", "pool", "degraded", "tokens", "target", "generated", "held", "shared", "registered",
        "hit_tokens", "first_token", "finish", "preemptions", "admitted_at",
    )

    def __init__(self, rid: int, arrival: float, prompt_len: int, output_len: int, keys: tuple[int, ...] = (),
                 tenant: str = "default", session: str | None = None, cls: str | None = None,
                 adapter: str | None = None, after: int = -1, think: float = 0.0) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt_len = int(prompt_len)  # >= 1: the loaders and simulate() refuse anything else
        self.output_len = int(output_len)
        self.keys = keys
        self.tenant = tenant
        self.session = session
        self.cls = cls
        self.adapter = adapter  # the LoRA adapter it asks for (None: the base model)
        # A closed-loop client (a conversation's next turn): sent `think` seconds after request `after` (a
        # smaller rid) finished or was rejected; `arrival` is then set when it is sent. -1: sent at `arrival`.
        self.after = after
        self.think = think
        self.reset()

    def reset(self) -> None:
        self.replica = -1
        self.pool = ""
        self.degraded = False
        self.tokens = 0  # tokens whose KV is in the replica's cache
        self.target = self.prompt_len  # tokens to (re)compute before the next token is sampled
        self.generated = 0
        self.held = 0  # blocks this request references (shared + private)
        self.shared = NO_BLOCKS  # cached block keys it references
        self.registered = 0  # prompt blocks registered in the prefix cache
        self.hit_tokens = 0  # prompt tokens served from the prefix cache (first admission)
        self.first_token = -1.0
        self.finish = -1.0
        self.preemptions = 0
        self.admitted_at = -1.0  # when a replica first scheduled its prefill (the end of its engine queue time)


@dataclass
class Workload:
    name: str
    requests: list[Request]
    block_size: int
    # Arrivals (on the requests' clock) of trace records of a 0-token prompt or output (failed or cancelled
    # requests), not replayed: kept as times, not a count, so a cut (`head`) counts only those within it.
    skipped_at: tuple[float, ...] = ()

    @property
    def duration(self) -> float:
        return self.requests[-1].arrival - self.requests[0].arrival if self.requests else 0.0

    @property
    def skipped_empty(self) -> int:
        """Trace records within this workload's span not replayed for a 0-token prompt or output."""
        return len(self.skipped_at)

    @property
    def skipped_note(self) -> str:
        """` (N with a 0-token prompt or output in the trace, not replayed)`, or "" when none was: what the sim
        CLI's title and the benchmarks print after the request count."""
        return skipped_note(self.skipped_empty)

    def scaled(self, k: float) -> Workload:
        """Replay at k x the rate: arrival times (and closed-loop think times) divided by k, lengths and prompt
        contents kept, so k = 2 is the same traffic twice as dense and k = 0.5 half as dense. Pure: a new
        workload named `<name>x<k>`; a held-out variant of a trace for policies developed on it."""
        k = rate_scale(k, f"{self.name}: rate scale")
        reqs = [Request(r.rid, r.arrival / k, r.prompt_len, r.output_len, r.keys, r.tenant, r.session, r.cls,
                        r.adapter, r.after, r.think / k) for r in self.requests]
        return Workload(f"{self.name}x{k:g}", reqs, self.block_size, tuple(t / k for t in self.skipped_at))

    def head(self, n: int | None = None, seconds: float | None = None) -> Workload:
        """The first `n` requests and/or those within `seconds` of the first, as fresh copies. The skipped records
        kept are those the loader's own cut would count (`load_trace`'s `seconds`/`requests`): within the time
        window, and with a request limit none after the last request kept (the file was not read past it)."""
        reqs, skipped = self.requests, self.skipped_at
        if seconds is not None:
            t0 = reqs[0].arrival if reqs else 0.0
            reqs = [r for r in reqs if r.arrival - t0 <= seconds]
            skipped = tuple(t for t in skipped if t - t0 <= seconds)
        if n is not None:
            reqs = reqs[:n]
            last = reqs[-1].arrival if reqs else -math.inf
            skipped = tuple(t for t in skipped if t <= last)
        return Workload(self.name, [Request(r.rid, r.arrival, r.prompt_len, r.output_len, r.keys, r.tenant,
                                            r.session, r.cls, r.adapter, r.after, r.think) for r in reqs],
                        self.block_size, skipped)

    def fresh(self) -> Workload:
        """A copy with simulation state cleared (workloads are reused across runs)."""
        return self.head()

    def reblocked(self, block_size: int) -> Workload:
        """The same requests on an engine whose KV blocks are `block_size` tokens, a multiple of this workload's: every
        `block_size / self.block_size` consecutive blocks become one (a chain key stands for its whole prefix, so the
        last key of each group is the merged block's key; a partial group is not a full block and is not cached).
        What vLLM's `--block-size` does to the same prompts, at that many times fewer block operations: a trace cut
        into 16-token blocks simulates several times faster merged into 64- or 128-token ones."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise WorkloadError(f"{self.name}: KV block size must be a whole number of tokens >= 1, got {block_size!r}")
        if block_size == self.block_size:
            return self
        if block_size % self.block_size:
            raise BlockSizeError(self.name, block_size, self.block_size)
        k = block_size // self.block_size
        reqs = [Request(r.rid, r.arrival, r.prompt_len, r.output_len, r.keys[k - 1::k], r.tenant, r.session, r.cls,
                        r.adapter, r.after, r.think) for r in self.requests]
        return Workload(self.name, reqs, block_size, self.skipped_at)


def merge_blocks(w: Workload, kv_block_size: int | None) -> Workload:
    """`--kv-block-size N` of the benchmarks (`load_trace`): a workload with blocks smaller than N tokens simulated on
    an engine with N-token blocks (`Workload.reblocked`; N a multiple of its blocks, else a BlockSizeError); one with
    blocks of N or more as it is, so one flag speeds up the fine-grained traces of a mixed set (16-token Qwen-Bailian
    ones) and leaves Mooncake's."""
    if kv_block_size is None or w.block_size >= kv_block_size:
        return w
    return w.reblocked(kv_block_size)


def rate_scale(k: object, what: str = "rate scale") -> float:
    """`k` as a factor for `Workload.scaled` (a finite number > 0), else a WorkloadError naming `what`."""
    if isinstance(k, bool) or not isinstance(k, int | float) or not math.isfinite(k) or k <= 0:
        raise WorkloadError(f"{what} must be a finite number > 0, got {k!r}")
    return float(k)


def chain(ids: list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """Prefix-chain keys: key_i = hash(key_{i-1}, id_i)."""
    out = []
    h = 0
    for i in ids:
        h = hash((h, i))
        out.append(h)
    return tuple(out)


def skipped_note(n: int) -> str:
    """The one phrase for trace records not replayed (`Workload.skipped_at`), after a request count; "" for none."""
    return f" ({n:,} with a 0-token prompt or output in the trace, not replayed)" if n else ""


# A trace clock coarser than this is read as logging arrivals in bins (`spread_clock_ties`); a finer one already places
# equal stamps within one engine step (an 8B model's decode step takes ~10 ms), where the engine batches them anyway.
STEP_RESOLUTION_S = 0.01


def spread_clock_ties(reqs: list[Request]) -> None:
    """Spread requests that share a timestamp over their tick of the trace's clock, in place.

    Some traces log arrivals at a coarse resolution: BurstGPT in whole seconds, Mooncake's conversation trace on a
    3-second grid (about ten requests a stamp). Replayed as written, each stamp's requests arrive at the same
    instant, a clump no service saw; it inflates every policy's queueing alike and the clumps' spacing is the
    logger's, not the traffic's. The tick is the smallest gap between distinct stamps (never wider than the trace
    shows an empty gap), and where it is at least STEP_RESOLUTION_S, a stamp's requests are placed at uniform
    random times within [stamp, stamp + tick), sorted so they keep their file order, drawn from a generator seeded
    by the stamp: the same file replays the same way. A finer clock, or a trace with no equal stamps, is left as it is."""
    stamps = sorted({r.arrival for r in reqs})
    if len(stamps) == len(reqs) or len(stamps) < 2:
        return
    tick = min(b - a for a, b in itertools.pairwise(stamps))
    if tick < STEP_RESOLUTION_S:
        return
    by_stamp: dict[float, list[Request]] = {}
    for r in reqs:
        by_stamp.setdefault(r.arrival, []).append(r)
    for stamp, group in by_stamp.items():
        if len(group) > 1:
            # seeded by the stamp: a slice of the trace draws the same offsets (scaled by its own tick, which is
            # the trace's wherever the slice holds two neighbouring stamps)
            rng = random.Random(repr(stamp))
            for r, offset in zip(group, sorted(rng.random() * tick for _ in group), strict=True):
                r.arrival = stamp + offset


def in_arrival_order(reqs: list[Request], *, from_zero: bool = False) -> list[Request]:
    """Sorted by arrival, numbered in that order; `from_zero` shifts arrivals so the first is at 0."""
    reqs.sort(key=lambda r: r.arrival)
    t0 = reqs[0].arrival if from_zero and reqs else 0.0
    for i, r in enumerate(reqs):
        r.rid, r.arrival = i, r.arrival - t0
    return reqs


@dataclass
class SyntheticSpec:
    """Tenants with shared system prompts, multi-turn sessions, bursts and a diurnal rate."""

    duration_s: float = 600.0
    rate_rps: float = 10.0  # mean request rate (all turns)
    tenants: int = 8
    system_prompt_tokens: tuple[int, int] = (512, 4096)  # per tenant, uniform range
    user_tokens_mean: float = 300.0  # new user tokens per turn (lognormal)
    output_tokens_mean: float = 250.0  # lognormal
    length_sigma: tuple[float, float] = (0.6, 0.7)  # lognormal sigma of the user and output tokens (tail weight)
    turns_mean: float = 4.0  # geometric
    think_time_s: float = 20.0  # exponential gap between turns of a session
    diurnal_amplitude: float = 0.3  # rate x (1 + a·sin(2πt/period))
    diurnal_period_s: float = 86400.0
    bursts: list[tuple[float, float, float]] = field(default_factory=list)  # (start_s, length_s, rate factor)
    tenant_skew: float = 1.1  # Zipf exponent of tenant popularity
    # Coefficient of variation of the gaps between session starts: 1 is Poisson; otherwise a gamma renewal process
    # (above 1 its arrivals clump: API traffic, BurstGPT's gaps fit gamma with CV > 1) at the same mean rate. The
    # diurnal sine and bursts thin it, which moves the kept gaps' CV toward 1.
    arrival_cv: float = 1.0
    block_size: int = 64
    seed: int = 0
    warmup_s: float = 0.0  # start sessions this long before t=0 and drop earlier turns (steady state at t=0)

    def __post_init__(self) -> None:
        if not self.arrival_cv > 0:
            raise ValueError(f"arrival_cv must be > 0, got {self.arrival_cv}")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (restored on exit). Building a workload or running a simulation
    allocates millions of long-lived objects and almost no reference cycles, so the collector's full passes
    only re-traverse the live heap: ~30% of a 1M-request workload's generation CPU, ~5% of a simulation's.
    Reference counting still frees everything else at once."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def synthetic(spec: SyntheticSpec) -> Workload:
    with gc_paused():
        return _synthetic(spec)


def _synthetic(spec: SyntheticSpec) -> Workload:
    rng = np.random.default_rng(spec.seed)
    bs = spec.block_size
    sys_len = rng.integers(spec.system_prompt_tokens[0], spec.system_prompt_tokens[1] + 1, spec.tenants)
    sys_len = (sys_len // bs) * bs  # system prompts fill whole blocks
    pop = 1.0 / np.arange(1, spec.tenants + 1) ** spec.tenant_skew
    pop /= pop.sum()
    session_rate = spec.rate_rps / spec.turns_mean
    peak = 1.0 + abs(spec.diurnal_amplitude) + 0.0
    peak *= max([1.0] + [b[2] for b in spec.bursts])

    def rate_factor(t: float) -> float:
        f = 1.0 + spec.diurnal_amplitude * math.sin(2 * math.pi * t / spec.diurnal_period_s)
        for start, length, k in spec.bursts:
            if start <= t < start + length:
                f *= k
        return max(0.0, f)

    reqs: list[Request] = []
    sys_chains = [list(chain([hash(("sys", t_, j)) for j in range(int(sys_len[t_]) // bs)]))
                  for t_ in range(spec.tenants)]
    t = -spec.warmup_s
    sid = 0
    mean_gap, shape = 1.0 / (session_rate * peak), 1.0 / spec.arrival_cv**2
    while True:  # sessions arrive by thinning a renewal process (Poisson unless arrival_cv != 1) at the peak rate
        t += rng.exponential(mean_gap) if spec.arrival_cv == 1.0 else rng.gamma(shape, mean_gap / shape)
        if t >= spec.duration_s:
            break
        if rng.random() > rate_factor(max(0.0, t)) / peak:
            continue
        sid += 1
        tenant = int(rng.choice(spec.tenants, p=pop))
        keys = list(sys_chains[tenant])  # grows with the conversation; key objects are shared across turns
        n_sys = len(keys)
        turns = int(rng.geometric(1.0 / spec.turns_mean))
        history = 0  # tokens after the system prompt
        at = t
        for _turn in range(turns):
            if at >= spec.duration_s:
                break
            user = max(1, int(rng.lognormal(math.log(spec.user_tokens_mean), spec.length_sigma[0])))
            out = max(1, int(rng.lognormal(math.log(spec.output_tokens_mean), spec.length_sigma[1])))
            prompt = int(sys_len[tenant]) + history + user
            n_blocks = prompt // bs
            while len(keys) < n_blocks:  # extend the chain: the same keys chain(ids) would give
                keys.append(hash((keys[-1] if keys else 0, hash(("s", sid, len(keys) - n_sys)))))
            if at >= 0:
                reqs.append(Request(0, at, prompt, out, tuple(keys[:n_blocks]), f"tenant-{tenant}", f"s{sid}"))
            history += user + out
            at += rng.exponential(spec.think_time_s)
    return Workload(f"synthetic-{spec.seed}", in_arrival_order(reqs), bs)
