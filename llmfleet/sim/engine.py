"""The discrete-event loop: arrivals -> router -> replicas, autoscaler ticks, cold starts, metrics.

    from llmfleet.sim.engine import simulate, SimConfig, PoolSpec
    from llmfleet.sim.workload import load_mooncake
    res = simulate(load_mooncake(path), SimConfig(pools=[PoolSpec(replicas=8)]), router="least-request")
    res.summary["ttft"]["p99"], res.records, res.series

Events are (time, seq, kind, a, b) tuples on one heap; arrivals are read from the sorted request list
without entering the heap. Replicas plan a step when the previous one ends; `Replica.version` invalidates
step events that a truncated decode run made obsolete.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.actuation import Replica as ScaleInReplica
from llmfleet.autoscaler.policy import PoolSignals
from llmfleet.autoscaler.scalein import choose_victims
from llmfleet.plan.hardware import get_gpu
from llmfleet.plan.models import get_model
from llmfleet.plan.roofline import StepCostModel, calibrate, host_kv_tier, kv_capacity
from llmfleet.sim.replica import Replica
from llmfleet.sim.workload import Request, Workload, gc_paused

_STEP, _READY, _TICK, _SAMPLE = 0, 1, 2, 3


@dataclass
class PoolSpec:
    """One pool of identical replicas."""

    name: str = "primary"
    role: Literal["primary", "student"] = "primary"
    model: str | ModelShape = "llama-3-8b"
    gpu: str = "H200"
    gpu_overrides: dict[str, float] = field(default_factory=dict)
    replicas: int = 8
    min_replicas: int = 1
    max_replicas: int = 64
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    chunked_prefill: bool = True
    kv_blocks: int | None = None  # override the planner's KV capacity (in simulator blocks)
    host_kv_gib: float = 0.0  # host-memory KV tier per replica (vLLM --kv-offloading-size); 0 = none
    adapter_slots: int = 0  # LoRA adapters a replica holds at once (spec.lora maxCpuLoras); 0 = no LoRA limit
    adapter_load_s: float = 0.0  # seconds one adapter load stalls the replica
    cold_start_s: float = 60.0
    calibration: str | None = None  # JSON: {"points": [...]} for plan.roofline.calibrate, or StepCostModel fields
    cost: StepCostModel | None = None  # use this step-cost model as is (tests, custom hardware)

    def shape(self) -> ModelShape:
        return self.model if isinstance(self.model, ModelShape) else get_model(self.model)

    def cost_model(self) -> StepCostModel:
        if self.cost is not None:
            return self.cost
        g = get_gpu(self.gpu, self.gpu_overrides)
        cost = StepCostModel.build(self.shape(), g, weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype,
                                   tensor_parallel=self.tensor_parallel)
        if self.calibration:
            data = json.loads(Path(self.calibration).read_text())
            if "points" in data:
                cost = calibrate(cost, data["points"])
            else:
                cost = StepCostModel(**{**cost.__dict__, **{k: float(v) for k, v in data.items()}})
        return cost

    def blocks(self, block_size: int) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        cap = kv_capacity(self.shape(), get_gpu(self.gpu, self.gpu_overrides), weight_dtype=self.weight_dtype,
                          kv_dtype=self.kv_dtype, tensor_parallel=self.tensor_parallel,
                          gpu_memory_utilization=self.gpu_memory_utilization, block_size=block_size)
        return cap.blocks

    def host_tier(self, block_size: int) -> tuple[int, float]:
        """Host-tier blocks per replica and the seconds to load one block back over the host link."""
        if self.host_kv_gib <= 0:
            return 0, 0.0
        tier = host_kv_tier(self.shape(), get_gpu(self.gpu, self.gpu_overrides), self.host_kv_gib,
                            block_size=block_size, kv_dtype=self.kv_dtype, weight_dtype=self.weight_dtype,
                            tensor_parallel=self.tensor_parallel)
        return tier.blocks, tier.load_s_per_token * block_size


@dataclass
class SimConfig:
    pools: list[PoolSpec] = field(default_factory=lambda: [PoolSpec()])
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    autoscale_interval_s: float = 15.0
    # Which replicas a scale-in drains: "cache-aware" is the production choice (llmfleet.autoscaler.scalein:
    # not-ready ones, then the fewest prefix blocks only that replica caches per the router's index, then the
    # fewest in flight); "least-loaded" ignores the index (what the simulator did before; for comparison).
    scale_in: Literal["cache-aware", "least-loaded"] = "cache-aware"
    series_interval_s: float = 10.0
    seed: int = 0
    check_invariants: bool = False  # verify block accounting after every step (slow; tests)
    keep_records: bool = True  # per-request records in the result (drop them for million-request runs)


# The simulator hands the autoscaler hook the production policy's own signal type, so a policy runs here
# exactly as it runs against a cluster.
SimPoolSignals = PoolSignals


# (now, signals) -> desired replicas per pool (pools left out keep their size)
Autoscaler = Callable[[float, list[SimPoolSignals]], dict[str, int]]


class Fleet:
    """What routers see: the replicas by pool. Routers read replica state directly (it is the truth)."""

    def __init__(self, cfg: SimConfig, block_size: int) -> None:
        self.cfg = cfg
        self.block_size = block_size
        self.specs = {p.name: p for p in cfg.pools}
        self.costs = {p.name: p.cost_model() for p in cfg.pools}
        self.pool_blocks = {p.name: p.blocks(block_size) for p in cfg.pools}
        self.pool_host = {p.name: p.host_tier(block_size) for p in cfg.pools}
        self.primary = next((p.name for p in cfg.pools if p.role == "primary"), cfg.pools[0].name)
        self.replicas: list[Replica] = []
        self.routable: dict[str, list[Replica]] = {p.name: [] for p in cfg.pools}
        self.listeners: list[Callable[[str, Replica], None]] = []  # ("add"|"remove", replica)

    def add(self, pool: str, now: float, ready_at: float) -> Replica:
        spec = self.specs[pool]
        host_blocks, host_load_s = self.pool_host[pool]
        r = Replica(len(self.replicas), pool, self.pool_blocks[pool], self.block_size, self.costs[pool],
                    max_num_seqs=spec.max_num_seqs, max_batched_tokens=spec.max_batched_tokens,
                    chunked_prefill=spec.chunked_prefill, ready_at=ready_at, host_blocks=host_blocks,
                    host_load_s_per_block=host_load_s, adapter_slots=spec.adapter_slots,
                    adapter_load_s=spec.adapter_load_s)
        r.started_at = now
        self.replicas.append(r)
        return r

    def make_routable(self, r: Replica) -> None:
        self.routable[r.pool].append(r)
        for f in self.listeners:
            f("add", r)

    def unroute(self, r: Replica) -> None:
        if r in self.routable[r.pool]:
            self.routable[r.pool].remove(r)
            for f in self.listeners:
                f("remove", r)

    def load(self, r: Replica) -> int:
        return len(r.running) + len(r.waiting)


class Router:
    """Routing hook: pick a replica (of any pool) for a request. Subclasses in llmfleet.sim.routers."""

    name = "router"

    def attach(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def route(self, req: Request, fleet: Fleet, now: float) -> Replica | None:
        raise NotImplementedError

    def on_first_token(self, req: Request, now: float) -> None:
        """Called when a request's first token is produced (the router's first byte from the replica)."""

    def on_complete(self, req: Request, now: float) -> None:
        """Called when a request finishes (policies that learn from latency use it)."""

    # Routers that keep their own copy of the replicas' load set this and implement replica_changed: the
    # engine calls it after every change of a replica's queues or blocks (dispatch, step end).
    watches_replicas = False

    def replica_changed(self, rep: Replica) -> None:
        """The replica's running/waiting queues or KV blocks may have changed."""

    def blocks_lost_if_removed(self, reps: list[Replica]) -> dict[str, int] | None:
        """Per replica id: cached prefix blocks no other replica holds, as the production router's index
        reports them to the autoscaler for scale-in. None: this router keeps no prefix index."""
        return None


@dataclass
class SimResult:
    workload: str
    router: str
    records: list[dict[str, Any]]
    series: list[dict[str, Any]]
    replicas: list[dict[str, Any]]
    summary: dict[str, Any]
    config: dict[str, Any]

    def to_json(self, records: bool = False) -> dict[str, Any]:
        d = {"workload": self.workload, "router": self.router, "summary": self.summary, "series": self.series,
             "replicas": self.replicas, "config": self.config}
        if records:
            d["records"] = self.records
        return d


def _check_unchunked_budget(cfg: SimConfig, reqs: list[Request]) -> None:
    """Without chunked prefill a sequence must fit one step's token budget, or it would wait forever: vLLM
    refuses to start unless max_num_batched_tokens >= max_model_len. Same rule, against the workload."""
    longest = max((r.prompt_len + r.output_len for r in reqs), default=0)
    for p in cfg.pools:
        if not p.chunked_prefill and p.max_batched_tokens < longest:
            raise ValueError(f"pool {p.name}: chunked prefill is off, so max_batched_tokens ({p.max_batched_tokens}) "
                             f"must hold the longest sequence of the workload ({longest} tokens, prompt + output), "
                             "as vLLM requires max_num_batched_tokens >= max_model_len")


def simulate(workload: Workload, cfg: SimConfig, router: Router | str = "least-request",
             autoscaler: Autoscaler | None = None) -> SimResult:
    with gc_paused():  # see gc_paused: measured 5% of the CPU at 100k requests, growing with the heap
        return _simulate(workload, cfg, router, autoscaler)


def _simulate(workload: Workload, cfg: SimConfig, router: Router | str,
              autoscaler: Autoscaler | None) -> SimResult:
    from llmfleet.sim.report import summarize
    from llmfleet.sim.routers import make_router

    rt = make_router(router, cfg.seed) if isinstance(router, str) else router
    changed = rt.replica_changed if rt.watches_replicas else None
    bs = workload.block_size
    reqs = workload.fresh().requests
    _check_unchunked_budget(cfg, reqs)
    if cfg.scale_in not in ("cache-aware", "least-loaded"):
        raise ValueError(f"scale_in must be 'cache-aware' or 'least-loaded', got {cfg.scale_in!r}")
    fleet = Fleet(cfg, bs)
    rt.attach(fleet)
    heap: list[tuple[float, int, int, int, int]] = []
    seq = 0

    def push(t: float, kind: int, a: int = 0, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, a, b))

    def push_step(r: Replica, end: float | None) -> None:
        r.version += 1
        if end is not None:
            push(end, _STEP, r.id, r.version)

    t0 = reqs[0].arrival if reqs else 0.0
    for p in cfg.pools:
        for _ in range(p.replicas):
            fleet.make_routable(fleet.add(p.name, t0, t0))
    pending: list[Request] = []  # arrived while no replica could take them
    rejected: list[Request] = []
    finished = 0
    window: list[Request] = []  # arrivals since the last autoscaler tick
    done_window: list[Request] = []
    series: list[dict[str, Any]] = []
    next_tick = t0 + cfg.autoscale_interval_s if autoscaler else math.inf
    if autoscaler:
        push(next_tick, _TICK)
    push(t0, _SAMPLE)
    n = len(reqs)
    i = 0

    def dispatch(req: Request, now: float) -> None:
        rep = rt.route(req, fleet, now)
        if rep is None:
            pending.append(req)
            return
        if rep.pool not in fleet.pool_blocks or -(-(req.prompt_len + req.output_len) // bs) > rep.total:
            rejected.append(req)
            return
        req.replica, req.pool = rep.id, rep.pool
        req.degraded = fleet.specs[rep.pool].role == "student"
        if req.adapter is not None:
            rep.use_adapter(req.adapter)
        rep.waiting.append(req)
        if not rep.plan:
            push_step(rep, rep.schedule(now))
        elif rep.run is not None:
            end = rep.truncate(now)
            if end is not None:
                push_step(rep, end)
        if changed is not None:
            changed(rep)

    horizon = (reqs[-1].arrival if reqs else t0) + 86400.0  # requests still pending a day later stay pending

    def more(now: float) -> bool:
        return (i < n or finished + len(rejected) < n) and now < horizon

    def stop_if_drained(rep: Replica, now: float) -> None:
        if rep.draining and not rep.running and not rep.waiting and rep.stopped_at is None:
            rep.stopped_at = now

    while True:
        na = reqs[i].arrival if i < n else math.inf
        if heap and heap[0][0] <= na:
            now, _, kind, a, b = heapq.heappop(heap)
            if kind == _STEP:
                rep = fleet.replicas[a]
                if b != rep.version:
                    continue
                done = rep.complete(now)
                if cfg.check_invariants:
                    rep.check_blocks()
                if rep.first_tokens:
                    for r in rep.first_tokens:
                        rt.on_first_token(r, now)
                    rep.first_tokens.clear()
                for r in done:
                    finished += 1
                    done_window.append(r)
                    rt.on_complete(r, now)
                push_step(rep, rep.schedule(now))
                if changed is not None:
                    changed(rep)
                stop_if_drained(rep, now)
            elif kind == _READY:
                rep = fleet.replicas[a]
                if rep.stopped_at is None and not rep.draining:
                    fleet.make_routable(rep)
                    waiting, pending[:] = pending[:], []
                    for r in waiting:
                        dispatch(r, now)
            elif kind == _TICK and autoscaler is not None:
                _autoscale(fleet, autoscaler, rt, cfg, now, window, done_window, push, stop_if_drained)
                window, done_window = [], []
                if more(now):
                    push(now + cfg.autoscale_interval_s, _TICK)
            elif kind == _SAMPLE:
                series.append(_sample(fleet, now, len(pending)))
                if more(now):
                    push(now + cfg.series_interval_s, _SAMPLE)
        elif i < n:
            req = reqs[i]
            i += 1
            window.append(req)
            dispatch(req, req.arrival)
        else:
            break
    end = max([r.finish for r in reqs if r.finish >= 0] + [t0])
    for rep in fleet.replicas:
        if rep.stopped_at is None:
            rep.stopped_at = end
    lost = n - finished - len(rejected) - len(pending)
    if lost:
        raise RuntimeError(f"simulation lost {lost} requests (bug)")
    summary = summarize(reqs, fleet, cfg, t0, end, rejected, pending)
    cfg_dict = {"pools": [{**asdict(p), "model": p.model if isinstance(p.model, str) else p.model.to_wire(),
                           "kvBlocks": fleet.pool_blocks[p.name], "hostKvBlocks": fleet.pool_host[p.name][0]}
                          for p in cfg.pools],
                "ttftSloS": cfg.ttft_slo_s, "tpotSloS": cfg.tpot_slo_s, "blockSize": bs, "seed": cfg.seed}
    records = [{"rid": r.rid, "arrival": r.arrival, "prompt": r.prompt_len, "output": r.output_len,
                "pool": r.pool, "replica": r.replica, "degraded": r.degraded, "hitTokens": r.hit_tokens,
                "ttft": (r.first_token - r.arrival) if r.first_token >= 0 else None,
                "e2e": (r.finish - r.arrival) if r.finish >= 0 else None, "preemptions": r.preemptions,
                "tenant": r.tenant} for r in reqs] if cfg.keep_records else []
    reps = [{"id": r.id, "pool": r.pool, "served": r.served, "busyS": round(r.busy_s, 3),
             "gpuS": round((r.stopped_at or end) - r.started_at, 3), "promptTokens": r.prompt_tokens,
             "hitTokens": r.hit_tokens, "hostHitTokens": r.host_hit_tokens, "preemptions": r.preemptions, "steps": r.steps} for r in fleet.replicas]
    return SimResult(workload.name, rt.name, records, series, reps, summary, cfg_dict)


def _sample(fleet: Fleet, now: float, pending: int) -> dict[str, Any]:
    out: dict[str, Any] = {"t": now, "pending": pending}
    for pool in fleet.specs:
        reps = [r for r in fleet.replicas if r.pool == pool and r.stopped_at is None]
        out[pool] = {"replicas": len(reps), "ready": len(fleet.routable[pool]),
                     "waiting": sum(len(r.waiting) for r in reps), "running": sum(len(r.running) for r in reps),
                     "kv": round(sum(r.kv_usage() for r in reps) / len(reps), 4) if reps else 0.0}
    return out


def _p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(0.95 * len(xs))) - 1)]


def _autoscale(fleet: Fleet, autoscaler: Autoscaler, router: Router, cfg: SimConfig, now: float, arrivals: list[Request],
               done: list[Request], push: Callable[..., None], stop_if_drained: Callable[[Replica, float], None]) -> None:
    iv = cfg.autoscale_interval_s
    sigs = []
    for spec in cfg.pools:
        reps = [r for r in fleet.replicas if r.pool == spec.name and r.stopped_at is None and not r.draining]
        mine = [r for r in done if r.pool == spec.name]
        arr = arrivals if spec.role == "primary" else [r for r in arrivals if r.pool == spec.name]
        ttfts = [(r.first_token - r.arrival) * 1e3 for r in mine]
        tpots = [(r.finish - r.first_token) * 1e3 / (r.output_len - 1) for r in mine if r.output_len > 1]
        prompt = sum(r.prompt_len for r in mine)
        sigs.append(SimPoolSignals(
            pool=spec.name, role=spec.role, now=now, replicas=len(reps), ready_replicas=len(fleet.routable[spec.name]),
            arrival_rate=len(arr) / iv,
            mean_input_tokens=sum(r.prompt_len for r in arr) / len(arr) if arr else None,
            mean_output_tokens=sum(r.output_len for r in arr) / len(arr) if arr else None,
            ttft_p95_ms=_p95(ttfts), tpot_p95_ms=_p95(tpots),
            queue_depth=float(sum(len(r.waiting) for r in reps)), running=float(sum(len(r.running) for r in reps)),
            kv_utilization=sum(r.kv_usage() for r in reps) / len(reps) if reps else None,
            prefix_hit_rate=sum(r.hit_tokens for r in mine) / prompt if prompt else None,
            degraded_fraction=(sum(1 for r in arrivals if r.degraded) / len(arrivals)) if arrivals else None,
            prefill_tokens_per_s=sum(r.prompt_len - r.hit_tokens for r in mine) / iv,
            decode_tokens_per_s=sum(r.output_len for r in mine) / iv,
            ttft_slo_miss_fraction=(sum(1 for x in ttfts if x > cfg.ttft_slo_s * 1e3) / len(ttfts)) if ttfts else None,
        ))
    desired = autoscaler(now, sigs)
    for spec in cfg.pools:
        if spec.name not in desired:
            continue
        want = max(spec.min_replicas, min(spec.max_replicas, int(desired[spec.name])))
        live = [r for r in fleet.replicas if r.pool == spec.name and r.stopped_at is None and not r.draining]
        if want > len(live):
            for _ in range(want - len(live)):
                rep = fleet.add(spec.name, now, now + spec.cold_start_s)
                push(rep.ready_at, _READY, rep.id)
        elif want < len(live):
            # the production choice of victims (choose_victims), fed what the production router would report
            by_id = {str(r.id): r for r in live}
            views = [ScaleInReplica(pool=spec.name, name=k, ready=r.ready_at <= now) for k, r in by_id.items()]
            lost = router.blocks_lost_if_removed(live) if cfg.scale_in == "cache-aware" else None
            in_flight = {k: float(len(r.running) + len(r.waiting)) for k, r in by_id.items()}
            for view in choose_victims(views, len(live) - want, lost, in_flight):
                rep = by_id[view.name]
                rep.draining = True
                fleet.unroute(rep)
                stop_if_drained(rep, now)
