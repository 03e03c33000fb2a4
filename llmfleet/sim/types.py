"""The simulator's types: pools, configuration, the fleet routers see, the router and autoscaler hooks, results.

Kept apart from the event loop (engine.py) so that routers, reports and oracles import these without importing
the loop, and the loop imports them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llmfleet.api.loader import load_json_file
from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.policy import PoolSignals
from llmfleet.plan.hardware import GPUProfile, get_gpu
from llmfleet.plan.models import get_model
from llmfleet.plan.roofline import StepCostModel, calibrate, host_kv_tier, kv_capacity
from llmfleet.sim.replica import SimReplica
from llmfleet.sim.workload import Request


@dataclass
class PoolSpec:
    """One pool of identical replicas."""

    name: str = "primary"
    role: Literal["primary", "student"] = "primary"
    model: str | ModelShape = "llama-3-8b"
    gpu: str = "H200"
    gpu_overrides: dict[str, float] = field(default_factory=dict)
    mig: str | None = None  # one MIG instance of this profile of `gpu` per replica (resources.migProfile)
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
    # Replicas of this pool share one host of this many cores (CPU engines on one machine, each stepping on about
    # one core): a step takes max(1, busy replicas / shared_cores) times as long as the cost model's (which is
    # then one replica's speed alone on the host). 0: every replica has its own accelerator.
    shared_cores: float = 0.0
    # Context (prompt + output tokens) the engine accepts, as vLLM's max_model_len: longer requests are rejected
    # (the OpenAI server answers 400) or clipped (SimConfig.context_overflow). None: the model's seq_len.
    max_model_len: int | None = None
    calibration: str | None = None  # JSON: {"points": [...]} for plan.roofline.calibrate, or StepCostModel fields
    cost: StepCostModel | None = None  # use this step-cost model as is (tests, custom hardware)

    def shape(self) -> ModelShape:
        return self.model if isinstance(self.model, ModelShape) else get_model(self.model)

    def gpu_profile(self) -> GPUProfile:
        return get_gpu(self.gpu, self.gpu_overrides, self.mig)

    def gpus_per_replica(self) -> float:
        """Physical GPUs one replica occupies (a MIG slice's share of one): what its GPU-seconds count."""
        return self.tensor_parallel * (self.gpu_profile().gpu_share if self.mig else 1.0)

    def context_len(self) -> int:
        return self.max_model_len if self.max_model_len is not None else self.shape().seq_len

    def cost_model(self) -> StepCostModel:
        if self.cost is not None:
            return self.cost
        g = self.gpu_profile()
        cost = StepCostModel.build(self.shape(), g, weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype,
                                   tensor_parallel=self.tensor_parallel)
        if self.calibration:
            data = load_json_file(self.calibration)
            if "points" in data:
                cost = calibrate(cost, data["points"])
            else:
                cost = StepCostModel(**{**cost.__dict__, **{k: float(v) for k, v in data.items()}})
        return cost

    def blocks(self, block_size: int) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        cap = kv_capacity(self.shape(), self.gpu_profile(), weight_dtype=self.weight_dtype,
                          kv_dtype=self.kv_dtype, tensor_parallel=self.tensor_parallel,
                          gpu_memory_utilization=self.gpu_memory_utilization, block_size=block_size)
        return cap.blocks

    def host_tier(self, block_size: int) -> tuple[int, float]:
        """Host-tier blocks per replica and the seconds to load one block back over the host link."""
        if self.host_kv_gib <= 0:
            return 0, 0.0
        tier = host_kv_tier(self.shape(), self.gpu_profile(), self.host_kv_gib,
                            block_size=block_size, kv_dtype=self.kv_dtype, weight_dtype=self.weight_dtype,
                            tensor_parallel=self.tensor_parallel)
        return tier.blocks, tier.load_s_per_token * block_size


@dataclass
class SimConfig:
    pools: list[PoolSpec] = field(default_factory=lambda: [PoolSpec()])
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    autoscale_interval_s: float = 15.0
    # Seconds the autoscaler's regular decisions are shifted by: they come at phase + k x interval after the first
    # arrival (k >= 1). Traffic has no fixed phase against a controller's timer; a result that holds at one phase
    # only is luck (benchmarks/autoscale_phase.py measures it).
    autoscale_phase_s: float = 0.0
    # Run the autoscaler also when the router's burst detector wakes it (router.wake_due; llmfleet.router.burst),
    # as the production controller does for the slo policy.
    autoscale_on_burst: bool = False
    # Which replicas a scale-in drains: "cache-aware" is the production choice (llmfleet.autoscaler.scalein:
    # not-ready ones, then the fewest prefix blocks only that replica caches per the router's index, then the
    # fewest in flight); "least-loaded" ignores the index (what the simulator did before; for comparison).
    scale_in: Literal["cache-aware", "least-loaded"] = "cache-aware"
    series_interval_s: float = 10.0
    seed: int = 0
    check_invariants: bool = False  # verify block accounting after every step (slow; tests)
    keep_records: bool = True  # per-request records in the result (drop them for million-request runs)
    # A request longer than its pool's context (PoolSpec.max_model_len): "reject" it as the engine does (counted
    # in the summary's `rejected`), or "clip" it before the run: the prompt keeps its head, cut to the primary's
    # context minus the output (the output to the context minus one token).
    context_overflow: Literal["reject", "clip"] = "reject"
    # Stop the run once it can no longer reach this TTFT attainment: more requests have missed (first token later
    # than ttft_slo_s, or refused for lack of KV blocks) than (1 - it) of all requests, so fewer than it of any
    # subset, the servable requests included, can be in time. For searches that only ask whether a run meets a
    # target (oracle.fewest_static, the hindsight descent): a fleet too small for the traffic is told by its first
    # misses instead of a full replay. The summary then says `stopped`; unfinished requests count as misses.
    stop_below_attainment: float | None = None


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
        self.replicas: list[SimReplica] = []
        self.hosts = {p.name: [0] for p in cfg.pools}  # busy replicas on each pool's shared host (shared_cores)
        self.routable: dict[str, list[SimReplica]] = {p.name: [] for p in cfg.pools}
        self.listeners: list[Callable[[str, SimReplica], None]] = []  # ("add"|"remove", replica)

    def add(self, pool: str, now: float, ready_at: float) -> SimReplica:
        spec = self.specs[pool]
        host_blocks, host_load_s = self.pool_host[pool]
        r = SimReplica(len(self.replicas), pool, self.pool_blocks[pool], self.block_size, self.costs[pool],
                    max_num_seqs=spec.max_num_seqs, max_batched_tokens=spec.max_batched_tokens,
                    chunked_prefill=spec.chunked_prefill, ready_at=ready_at, host_blocks=host_blocks,
                    host_load_s_per_block=host_load_s, adapter_slots=spec.adapter_slots,
                    adapter_load_s=spec.adapter_load_s)
        if spec.shared_cores > 0:
            r.share_host(self.hosts[pool], spec.shared_cores)
        r.started_at = now
        self.replicas.append(r)
        return r

    def make_routable(self, r: SimReplica) -> None:
        self.routable[r.pool].append(r)
        for f in self.listeners:
            f("add", r)

    def unroute(self, r: SimReplica) -> None:
        if r in self.routable[r.pool]:
            self.routable[r.pool].remove(r)
            for f in self.listeners:
                f("remove", r)

    def load(self, r: SimReplica) -> int:
        return len(r.running) + len(r.waiting)


class SimRouter:
    """Routing hook: pick a replica (of any pool) for a request. Subclasses in llmfleet.sim.routers."""

    name = "router"

    def attach(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def route(self, req: Request, fleet: Fleet, now: float) -> SimReplica | None:
        raise NotImplementedError

    def on_first_token(self, req: Request, now: float) -> None:
        """Called when a request's first token is produced (the router's first byte from the replica)."""

    def on_complete(self, req: Request, now: float) -> None:
        """Called when a request finishes (policies that learn from latency use it)."""

    # Routers that keep their own copy of the replicas' load set this and implement replica_changed: the
    # engine calls it after every change of a replica's queues or blocks (dispatch, step end).
    watches_replicas = False

    def replica_changed(self, rep: SimReplica) -> None:
        """The replica's running/waiting queues or KV blocks may have changed."""

    def blocks_lost_if_removed(self, reps: list[SimReplica]) -> dict[str, int] | None:
        """Per replica id: cached prefix blocks no other replica holds, as the production router's index
        reports them to the autoscaler for scale-in. None: this router keeps no prefix index."""
        return None

    # The production router's burst wake-up (llmfleet.router.burst): set when an arrival opened a burst episode; with
    # SimConfig.autoscale_on_burst the engine then runs the autoscaler, at least WINDOW_S after its last run.
    # `wake_rate`: the arrival rate the detector counted over its window when it opened the episode.
    wake_due = False
    wake_rate = 0.0

    def on_arrival(self, req: Request, now: float) -> None:
        """A request reached the router (its arrival, not a re-dispatch of one held for a replica)."""


# A request record's keys (its JSON and the mapping its readers index) and the attribute each is held in.
RECORD_KEYS = {"rid": "rid", "arrival": "arrival", "prompt": "prompt", "output": "output", "pool": "pool",
               "replica": "replica", "degraded": "degraded", "hitTokens": "hit_tokens", "ttft": "ttft", "e2e": "e2e",
               "preemptions": "preemptions", "tenant": "tenant", "rejected": "rejected"}


@dataclass(slots=True, eq=False)
class RequestRecord(Mapping[str, Any]):
    """One request's outcome in a simulation, read as a read-only mapping of RECORD_KEYS (`r["ttft"]`,
    `r.get("rejected")`, `dict(r)` for JSON; equal to a dict of the same items). Slotted rather than a dict: a run
    keeps one per request, and a dict of these 13 keys holds ~3x the memory (benchmarks/sim_long_trace.py measures
    the bytes a request holds)."""

    rid: int
    arrival: float
    prompt: int
    output: int
    pool: str
    replica: int
    degraded: bool
    hit_tokens: int
    ttft: float | None  # None: no first token (rejected, or still waiting at the end)
    e2e: float | None
    preemptions: int
    tenant: str
    rejected: str | None  # "context" (over the model's context), "kv" (larger than the replica's KV cache), None

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, RECORD_KEYS[key])
        except KeyError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(RECORD_KEYS)

    def __len__(self) -> int:
        return len(RECORD_KEYS)


@dataclass
class SimResult:
    workload: str
    router: str
    records: list[RequestRecord]
    series: list[dict[str, Any]]
    replicas: list[dict[str, Any]]
    summary: dict[str, Any]
    config: dict[str, Any]

    def to_json(self, records: bool = False) -> dict[str, Any]:
        d = {"workload": self.workload, "router": self.router, "summary": self.summary, "series": self.series,
             "replicas": self.replicas, "config": self.config}
        if records:
            d["records"] = [dict(r) for r in self.records]
        return d
