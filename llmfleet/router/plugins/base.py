"""The one routing-plugin interface, and the framework that runs a pipeline of plugins.

Pure Python (no aiohttp): the simulator (llmfleet.sim) runs exactly this code.

A request passes filters (each keeps a subset of replicas), then scorers (each returns one number in [0, 1]
per replica, higher is better), then the picker: the weighted sum of scores, ties broken by power-of-two
choices on load. The framework clamps scores to [0, 1] (NaN -> 0), applies weights, times each plugin and
logs the decision at DEBUG. Randomness only comes from the `random.Random` handed in, so a seeded run is
deterministic. In a fleet larger than a `Preselector`'s `max_candidates`, it first narrows the candidates
(O(candidates), not O(fleet)). `charge_prefill` / `release_prefill` keep the per-replica prefill queue that
the estimated-TTFT scorer reads: the router releases a request's charge on its first byte and at its end.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger("llmfleet.router.pipeline")

STALE_LOAD_FACTOR = 0.5  # load scores of a replica whose metrics are stale are halved (distrusted)
TIE_EPSILON = 1e-9


# The measured prefill cost: a replica's first-byte times are fitted online to overhead + work / rate (least
# squares over exponentially decayed sums). FIT_HALF_LIFE samples: recent enough to follow a replica whose speed
# changes (co-located load, a new engine version), long enough that one slow request moves it little. A fit is
# used only after FIT_MIN_SAMPLES; below FIT_MIN_SPREAD (relative spread of the work sizes seen) overhead and rate
# cannot be told apart, so the fit falls back to one effective rate (sum work / sum time, no overhead).
FIT_HALF_LIFE = 64.0
FIT_MIN_SAMPLES = 8
FIT_MIN_SPREAD = 0.25
# A measured rate is kept within these factors of the configured/default one (a guard against a few wild samples,
# e.g. a first byte delayed by a stalled network, not a tuning knob).
FIT_RATE_BOUNDS = (1e-3, 1e3)


@dataclass
class PrefillCostFit:
    """Online least squares of one replica's observed prefill time: seconds = overhead_s + work / rate.

    Samples come from `release_prefill` on a first byte, for requests routed while the replica had no prefill
    of this router's ahead of them (so the time from routing to the first byte is that request's own cost:
    queueing inside the engine behind decodes included, queueing behind other prefills not).
    """

    n: float = 0.0  # decayed sample count and sums of x = work, y = seconds
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    samples: int = 0
    _cached: tuple[float, tuple[float, float] | None] | None = field(default=None, repr=False)  # (default, estimate)

    def add(self, work: float, seconds: float) -> None:
        if not (work > 0 and seconds > 0):  # also rejects NaN
            return
        k = 0.5 ** (1.0 / FIT_HALF_LIFE)
        self.n = self.n * k + 1.0
        self.sx = self.sx * k + work
        self.sy = self.sy * k + seconds
        self.sxx = self.sxx * k + work * work
        self.sxy = self.sxy * k + work * seconds
        self.samples += 1
        self._cached = None

    def estimate(self, default_rate: float) -> tuple[float, float] | None:
        """(overhead_s, tokens_per_s), or None before FIT_MIN_SAMPLES samples."""
        if self.samples < FIT_MIN_SAMPLES:
            return None
        c = self._cached
        if c is not None and c[0] == default_rate:
            return c[1]
        est = self._fit(default_rate)
        self._cached = (default_rate, est)
        return est

    def _fit(self, default_rate: float) -> tuple[float, float]:
        lo, hi = default_rate * FIT_RATE_BOUNDS[0], default_rate * FIT_RATE_BOUNDS[1]
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        if var > (FIT_MIN_SPREAD * mx) ** 2:
            slope = (self.sxy / self.n - mx * my) / var
            overhead = my - slope * mx
            if slope > 0 and overhead >= 0:
                return overhead, min(hi, max(lo, 1.0 / slope))
        return 0.0, min(hi, max(lo, self.sx / self.sy))


@dataclass
class ReplicaState:
    """What the router knows about one replica. Mutable: discovery, scraping and the proxy update it."""

    id: str  # base URL, e.g. http://10.0.0.7:8000 (unique)
    pool: str
    models: tuple[str, ...] = ()  # served model names
    healthy: bool = True
    draining: bool = False
    running: float = 0.0  # vllm:num_requests_running (scraped)
    waiting: float = 0.0  # vllm:num_requests_waiting (scraped)
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0-1 (scraped)
    in_flight: int = 0  # requests this router has open to the replica right now
    # Of those, streamed requests that have not answered a first byte yet: queued at the engine or in its prefill
    # (a non-streamed answer's first byte is the whole answer, so those are not counted).
    awaiting_first_byte: int = 0
    stale: bool = True  # no fresh scrape: load numbers are guesses
    cache_capacity_blocks: int | None = None  # KV blocks (from config or vllm:cache_config_info)
    kv_block_tokens: int | None = None  # tokens per engine KV block (vllm:cache_config_info's block_size)
    prefix_hits: float = 0.0  # vllm prefix-cache hit counter (tokens or queries, as scraped)
    prefix_queries: float = 0.0
    # Prefill work this router sent the replica that has not produced a first byte yet (charged at routing,
    # released by `release_prefill`), in prompt tokens, and when the replica should be through with it: a
    # virtual FCFS queue at the replica's prefill rate, corrected by every observed first byte.
    prefill_tokens: float = 0.0
    prefill_busy_until: float = 0.0  # on the clock of RequestInfo.now
    prefill_tokens_per_s: float | None = None  # configured prefill rate (None: measured, else the scorer's default)
    # LoRA adapters the replica holds (the engine's /v1/models, plus loads this router has under way) and how
    # many it holds at once (spec.lora: maxCpuLoras; 0 = unknown / no LoRA).
    adapters: set[str] = field(default_factory=set)
    adapters_loading: set[str] = field(default_factory=set)
    adapter_slots: int = 0

    @property
    def load(self) -> float:
        """Requests at the replica: the scraped count, or our own in-flight count when that is higher."""
        return max(self.running + self.waiting, float(self.in_flight))

    @property
    def queued(self) -> float:
        """Requests at the replica still waiting for their first token: the engine's waiting queue, or this router's
        streamed requests without a first byte when there are more of those. With chunked prefill an engine admits
        a burst into its running batch at once (up to max_num_seqs), so its waiting queue stays empty while the
        prompts wait their turn for the step's token budget: the engine's queue alone does not show that delay."""
        return max(self.waiting, float(self.awaiting_first_byte))

    def prefill_wait_s(self, now: float) -> float:
        """Seconds until the replica is through the prefill work this router sent it (0 when none is pending);
        `now` on the clock of RequestInfo.now."""
        return max(self.prefill_busy_until - now, 0.0) if self.prefill_tokens > 0 else 0.0

    @property
    def generating(self) -> float:
        """Requests at the replica past their first token (the rest of `running + waiting`, see `queued`)."""
        return max(self.running + self.waiting - self.queued, 0.0)


class AwaitingFirstByte:
    """A streamed request counted in its replica's `awaiting_first_byte` until `release` (its first byte, or its end
    without one; idempotent). `replica` None: not counted (a non-streamed answer's first byte is the whole answer)."""

    def __init__(self, replica: ReplicaState | None) -> None:
        self.replica = replica
        if replica is not None:
            replica.awaiting_first_byte += 1

    def release(self) -> None:
        if self.replica is not None:
            self.replica.awaiting_first_byte -= 1
            self.replica = None


@dataclass
class RequestInfo:
    """What plugins may look at for one request."""

    model: str
    block_hashes: Sequence[int] = ()  # prefix-index keys of the prompt's full blocks (see prefix_index)
    input_tokens: int = 0
    session_id: str | None = None
    tenant: str = "default"
    request_class: str | None = None
    stream: bool = False
    now: float | None = None  # the routing time on the clock release_prefill uses (None: time.monotonic())
    block_size: int = 0  # tokens per prefix-index block (0: inferred as input_tokens // len(block_hashes))
    adapter: str | None = None  # the LoRA adapter asked for (its name is the request's `model`); None: base model
    # (replica, tokens, predicted end of its prefill, routing time when nothing was queued ahead of it, else
    # None, the fit that learns from its first byte) charged at routing; `release_prefill` undoes it
    prefill_charge: tuple[ReplicaState, float, float, float | None, PrefillCostFit | None] | None = None

    def tokens_per_block(self) -> int:
        if self.block_size > 0:
            return self.block_size
        return self.input_tokens // len(self.block_hashes) if self.block_hashes else 0

    def clock(self) -> float:
        return self.now if self.now is not None else time.monotonic()


def charge_prefill(req: RequestInfo, replica: ReplicaState, tokens: float, tokens_per_s: float,
                   fit: PrefillCostFit | None = None) -> float:
    """Queue `tokens` of prefill work for `req` on `replica` (replacing an earlier charge, e.g. on a retry).

    Returns the predicted end of its prefill: after the work already queued there, at `tokens_per_s`. With a
    `fit`, the request's first byte is a sample of the replica's prefill cost when nothing was queued ahead.
    """
    now = req.clock()
    release_prefill(req, now, first_byte=False)
    idle = replica.prefill_tokens == 0.0 or replica.prefill_busy_until <= now
    end = max(now, replica.prefill_busy_until) + tokens / tokens_per_s
    replica.prefill_busy_until = end
    replica.prefill_tokens += tokens
    req.prefill_charge = (replica, tokens, end, now if idle else None, fit)
    return end


def release_prefill(req: RequestInfo, now: float | None = None, first_byte: bool = True) -> None:
    """The request's prefill is over (its first byte arrived: `first_byte=True`) or abandoned or finished
    without a first byte seen (error, retry, non-streaming response: `first_byte=False`). Idempotent.

    The router calls it on the first byte from the replica and again when the request ends. A first byte
    earlier or later than predicted moves the replica's queue end by the same error (the work behind it
    was mispredicted the same way). `now` is on the clock of `RequestInfo.now` (None: time.monotonic()).
    """
    charge = req.prefill_charge
    if charge is None:
        return
    req.prefill_charge = None
    replica, tokens, end, idle_since, fit = charge
    t = now if now is not None else time.monotonic()
    if first_byte and idle_since is not None and fit is not None:  # nothing of ours was ahead: its own cost
        fit.add(tokens, t - idle_since)
    left = replica.prefill_tokens - tokens
    # every charge is >= 1 token, so less than half a token left is float rounding of the sum: nothing left
    replica.prefill_tokens = left if left >= 0.5 else 0.0
    if replica.prefill_tokens == 0.0:
        replica.prefill_busy_until = min(replica.prefill_busy_until, t)  # nothing queued any more
    elif first_byte:
        replica.prefill_busy_until = max(t, replica.prefill_busy_until + (t - end))


class Filter:
    """Keeps the replicas a request may go to."""

    name = "filter"

    def filter(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        raise NotImplementedError

    def on_routed(self, req: RequestInfo, replica: ReplicaState) -> None:
        """Called once the request is sent to `replica` (plugins with memory update it here)."""


class Scorer(Filter):
    """Scores each replica in [0, 1] (higher = better); the framework clamps and weights."""

    name = "scorer"

    def score(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> Sequence[float]:
        raise NotImplementedError

    def filter(self, req: RequestInfo, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
        return list(replicas)


class Preselector:
    """Narrows a large fleet to at most `max_candidates` replicas before filters and scorers run.

    The pipeline calls it only when there are more replicas than that; it must be O(candidates), not O(fleet).
    """

    name = "preselect"
    max_candidates = 32

    def select(self, req: RequestInfo, replicas: Sequence[ReplicaState], rng: random.Random) -> list[ReplicaState]:
        raise NotImplementedError


@dataclass
class RoutingDecision:
    replica: ReplicaState | None
    candidates: int
    scores: dict[str, list[float]] = field(default_factory=dict)  # scorer -> clamped score per candidate
    totals: list[float] = field(default_factory=list)
    plugin_ns: dict[str, int] = field(default_factory=dict)  # time spent per plugin
    reason: str = ""  # why no replica (when replica is None)


def clamp01(x: float) -> float:
    if x != x:  # NaN
        return 0.0
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


class Pipeline:
    """filters -> weighted scorers -> picker. Construct once; `pick` per request."""

    def __init__(
        self, filters: Sequence[Filter], scorers: Sequence[tuple[Scorer, float]], rng: random.Random | None = None,
        preselector: Preselector | None = None,
    ) -> None:
        self.filters = list(filters)
        self.scorers = [(s, float(w)) for s, w in scorers if w > 0]
        self.rng = rng or random.Random(0)
        self.preselector = preselector

    def _filter(self, req: RequestInfo, cands: list[ReplicaState], timings: dict[str, int]) -> str | None:
        """Run the filters in place on `cands`; returns the name of the filter that left nothing, else None."""
        for f in self.filters:
            t0 = time.perf_counter_ns()
            cands[:] = f.filter(req, cands)
            timings[f.name] = timings.get(f.name, 0) + time.perf_counter_ns() - t0
            if not cands:
                return f.name
        return None

    def pick(self, req: RequestInfo, replicas: Sequence[ReplicaState], commit: bool = True) -> RoutingDecision:
        """Choose a replica. `commit=False` skips the plugins' on_routed updates: call `commit` later."""
        timings: dict[str, int] = {}
        pre = self.preselector
        cands: list[ReplicaState] = []
        empty: str | None = None
        if pre is not None and len(replicas) > pre.max_candidates:
            # Large fleet: score a preselected subset; filters run on it, and on everyone if it filters to nothing.
            t0 = time.perf_counter_ns()
            cands = pre.select(req, replicas, self.rng)
            timings[pre.name] = time.perf_counter_ns() - t0
            empty = self._filter(req, cands, timings)
        if not cands:
            cands = list(replicas)
            empty = self._filter(req, cands, timings)
            if empty is None and pre is not None and len(cands) > pre.max_candidates:
                cands = pre.select(req, cands, self.rng)
        if empty is not None or not cands:
            return RoutingDecision(None, 0, plugin_ns=timings, reason=f"no replica passed filter {empty}")
        n = len(cands)
        totals: list[float] | None = None
        all_scores: dict[str, list[float]] = {}
        if n > 1:
            clock = time.perf_counter_ns
            for s, w in self.scorers:
                t0 = clock()
                raw = s.score(req, cands)
                timings[s.name] = clock() - t0
                if len(raw) != n:
                    raise ValueError(f"scorer {s.name} returned {len(raw)} scores for {n} replicas")
                # clamp01 inlined (hot path): NaN and negatives -> 0, above 1 -> 1
                vals = [0.0 if not x > 0.0 else 1.0 if x > 1.0 else float(x) for x in raw]
                all_scores[s.name] = vals
                totals = [w * v for v in vals] if totals is None else [t + w * v for t, v in zip(totals, vals, strict=True)]
        if totals is None:
            totals = [0.0] * n
        chosen = self._pick(cands, totals)
        if commit:
            self.commit(req, chosen)
        d = RoutingDecision(chosen, len(cands), all_scores, totals, timings)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route model=%s -> %s totals=%s scores=%s ns=%s", req.model, chosen.id, totals, all_scores, timings)
        return d

    def commit(self, req: RequestInfo, chosen: ReplicaState) -> None:
        """Tell every plugin where the request went (prefix index insert, session pin)."""
        for plugin in (*self.filters, *(s for s, _ in self.scorers)):
            plugin.on_routed(req, chosen)

    def _pick(self, cands: list[ReplicaState], totals: list[float]) -> ReplicaState:
        best = max(totals) if totals else 0.0
        tol = TIE_EPSILON * max(1.0, abs(best))
        tied = [c for c, t in zip(cands, totals, strict=True) if best - t <= tol]
        if len(tied) == 1:
            return tied[0]
        a, b = self.rng.sample(tied, 2)  # power of two choices among equals: least loaded of two
        return a if a.load <= b.load else b

