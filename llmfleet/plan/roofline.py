"""Roofline arithmetic for inference: intensity per phase, KV-cache capacity, attention traffic, step times.

Conventions: a matmul of an (n x k) activation with a (k x m) weight is 2·n·k·m FLOPs; attention over a
context of c tokens costs 4·hidden·c FLOPs per token per layer (QK^T and PV). Bytes are HBM traffic.
Everything is a pure function of (model, GPU, dtypes, sizes) so the simulator, the autoscaler and the CLI
share one cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.hardware import GPUProfile
from llmfleet.plan.models import dtype_bytes, kv_bytes_per_token, matmul_params, total_params


@dataclass(frozen=True)
class PhaseRoofline:
    """FLOPs, bytes and the roofline verdict of one forward pass."""

    phase: str
    flops: float
    bytes: float
    intensity: float  # FLOP per byte
    ridge_point: float
    bound: str  # "compute" or "memory"
    time_s: float  # ideal roofline time: max(flops/peak, bytes/bandwidth)


def _verdict(phase: str, flops: float, nbytes: float, gpu: GPUProfile, weight_dtype: str) -> PhaseRoofline:
    peak = gpu.peak_flops_for(weight_dtype)
    ridge = peak / gpu.bandwidth
    intensity = flops / nbytes
    return PhaseRoofline(phase, flops, nbytes, intensity, ridge, "compute" if intensity >= ridge else "memory",
                         max(flops / peak, nbytes / gpu.bandwidth))


def weight_bytes(m: ModelShape, weight_dtype: str = "bf16") -> float:
    return total_params(m) * dtype_bytes(weight_dtype)


def prefill_roofline(m: ModelShape, gpu: GPUProfile, prompt_tokens: int, *, weight_dtype: str = "bf16",
                     kv_dtype: str = "bf16") -> PhaseRoofline:
    """One sequence's prefill of `prompt_tokens` (causal attention: half the S x S matrix)."""
    s = prompt_tokens
    flops = 2.0 * matmul_params(m) * s + 2.0 * m.layers * m.hidden * s * s
    act = dtype_bytes("bf16")
    nbytes = weight_bytes(m, weight_dtype) + s * kv_bytes_per_token(m, kv_dtype) + 2 * s * m.hidden * act * m.layers
    return _verdict("prefill", flops, nbytes, gpu, weight_dtype)


def decode_roofline(m: ModelShape, gpu: GPUProfile, batch: int, context: int, *, weight_dtype: str = "bf16",
                    kv_dtype: str = "bf16") -> PhaseRoofline:
    """One decode step: `batch` sequences, each attending over `context` cached tokens."""
    kvb = kv_bytes_per_token(m, kv_dtype)
    flops = batch * (2.0 * matmul_params(m) + 4.0 * m.layers * m.hidden * context)
    nbytes = weight_bytes(m, weight_dtype) + batch * (context + 1) * kvb
    return _verdict("decode", flops, nbytes, gpu, weight_dtype)


def decode_compute_bound_batch(m: ModelShape, gpu: GPUProfile, context: int, *, weight_dtype: str = "bf16",
                               kv_dtype: str = "bf16") -> float | None:
    """Smallest decode batch whose intensity reaches the ridge point; None if no batch gets there.

    Solves B·(2N + 4·L·d·c) = ridge·(W + B·(c+1)·kv) for B. Attention reads its KV once per sequence, so
    its own intensity is only ~heads/kvHeads FLOP/byte: past a few hundred tokens of context the KV reads
    grow as fast as the FLOPs and decode never becomes compute-bound, whatever the batch.
    """
    ridge = gpu.peak_flops_for(weight_dtype) / gpu.bandwidth
    per_seq_flops = 2.0 * matmul_params(m) + 4.0 * m.layers * m.hidden * context
    per_seq_bytes = (context + 1) * kv_bytes_per_token(m, kv_dtype)
    denom = per_seq_flops - ridge * per_seq_bytes
    if denom <= 0:
        return None
    return ridge * weight_bytes(m, weight_dtype) / denom


@dataclass(frozen=True)
class KVCapacity:
    kv_bytes_per_token: float
    weights_bytes: float
    kv_pool_bytes: float
    tokens: int
    blocks: int
    block_size: int
    sequences: int  # of `tokens_per_sequence` tokens each
    tokens_per_sequence: int


def kv_capacity(m: ModelShape, gpu: GPUProfile, *, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                gpu_memory_utilization: float = 0.9, tensor_parallel: int = 1, block_size: int = 16,
                tokens_per_sequence: int = 4096, activation_reserve_gib: float = 2.0) -> KVCapacity:
    """What fits in the KV pool of one replica, the way vLLM sizes it (budget - weights - activations)."""
    kvb = kv_bytes_per_token(m, kv_dtype)
    budget = gpu.hbm_bytes * gpu_memory_utilization * tensor_parallel
    weights = weight_bytes(m, weight_dtype)
    pool = budget - weights - activation_reserve_gib * 2**30 * tensor_parallel
    if pool <= 0:
        raise ValueError(
            f"weights ({weights / 2**30:.1f} GiB) do not fit in {budget / 2**30:.1f} GiB "
            f"({tensor_parallel}x {gpu.name} at {gpu_memory_utilization:.0%}); raise tensor parallelism"
        )
    blocks = int(pool // (kvb * block_size))
    tokens = blocks * block_size
    per_seq_blocks = math.ceil(tokens_per_sequence / block_size)
    return KVCapacity(kvb, weights, pool, tokens, blocks, block_size, blocks // per_seq_blocks, tokens_per_sequence)


@dataclass(frozen=True)
class HostKVTier:
    """A host-memory KV tier (vLLM's CPU offloading) for one replica: capacity, and loading a cached token
    back over the host link against recomputing it inside a long prefill."""

    gib: float
    block_size: int
    blocks: int
    tokens: int
    block_bytes: float
    load_s_per_token: float  # kv bytes / host link bandwidth
    recompute_s_per_token: float  # 2 x matmul params / peak FLOP/s: a prefill token's dense work at the roofline
    recompute_over_load: float


def host_kv_tier(m: ModelShape, gpu: GPUProfile, gib: float, *, block_size: int = 16, kv_dtype: str = "bf16",
                 weight_dtype: str = "bf16", tensor_parallel: int = 1) -> HostKVTier:
    """What `gib` GiB of host memory per replica hold, and what loading from it saves. The recompute time is
    the dense (weight) FLOPs alone at peak, so the ratio is a lower bound: attention over a long context and
    real efficiency (~0.6) make recomputing dearer still."""
    if gib <= 0:
        raise ValueError(f"host KV tier size must be > 0 GiB, got {gib:g}")
    kvb = kv_bytes_per_token(m, kv_dtype)
    blocks = int(gib * 2**30 // (kvb * block_size))
    load = kvb / (gpu.host_link_gbs * 1e9 * tensor_parallel)
    recompute = 2.0 * matmul_params(m) / (gpu.peak_flops_for(weight_dtype) * tensor_parallel)
    return HostKVTier(gib, block_size, blocks, blocks * block_size, kvb * block_size, load, recompute, recompute / load)


@dataclass(frozen=True)
class AttentionTraffic:
    """HBM traffic and extra memory of one layer's attention for one sequence, all heads."""

    seq_len: int
    materialized_bytes: float  # standard attention: S and P written to and read from HBM
    fused_bytes: float  # FlashAttention: Q, K, V, O tiles streamed through SRAM
    materialized_memory: float  # the S x S score matrix per head, all heads
    fused_memory: float  # softmax statistics only (logsumexp per row, fp32)
    block_rows: int  # FlashAttention query-tile rows that fit the SRAM budget
    ratio: float


def attention_traffic(m: ModelShape, gpu: GPUProfile, seq_len: int, *, dtype: str = "bf16") -> AttentionTraffic:
    """Standard vs fused attention (FlashAttention-2 schedule: query tiles outer, K/V streamed).

    Standard: read Q, K, V; write S = QK^T; read S, write P = softmax(S); read P and V; write O:
      4·S·d + 4·S² elements per head (the S² terms dominate for S >> d).
    Fused: Q read and O written once; K and V read once per query tile of Br rows, with
      Bc = ceil(M / 4d), Br = min(Bc, d) for an SRAM of M elements (Dao et al. 2022, Algorithm 1).
    """
    b = dtype_bytes(dtype)
    d = m.head_dim
    s = seq_len
    per_head_mat = (4 * s * d + 4 * s * s) * b
    sram_elems = gpu.sram_kib_per_sm * 1024 / b
    bc = math.ceil(sram_elems / (4 * d))
    br = max(1, min(bc, d))
    tiles = math.ceil(s / br)
    per_head_fused = (2 * s * d + tiles * 2 * s * d) * b
    mat = per_head_mat * m.heads
    fused = per_head_fused * m.heads
    return AttentionTraffic(s, mat, fused, m.heads * s * s * b, m.heads * s * 4.0, br, mat / fused)


@dataclass(frozen=True)
class StepCostModel:
    """Time of one engine step (a mixed batch of prefill chunks and decode tokens) on one replica.

    time = overhead + max(flops / (peak·computeEff), bytes / (bandwidth·bandwidthEff)), where
      flops = 2·N·tokens + 4·L·d·attendedContext     (attendedContext: Σ over tokens of the context they see)
      bytes = weights + kv·(readContext + tokens)   (readContext: Σ over sequences of cached tokens read)
    The efficiencies and the overhead default to typical vLLM-on-Hopper values; a calibration file of
    measured step times replaces them (see `calibrate`).
    """

    flops_per_token: float
    attn_flops_per_ctx: float
    weight_bytes: float
    kv_bytes: float
    peak_flops: float
    bandwidth: float
    compute_eff: float = 0.6
    bandwidth_eff: float = 0.8
    overhead_s: float = 0.003
    # Fixed cost of each request, paid once by the step that admits it (not by its later steps): the work around
    # the engine's steps that a step's overhead would otherwise absorb when a calibration times whole requests
    # (chat template, tokenization; HTTP for client-side timings). 0: none (step times only).
    request_overhead_s: float = 0.0

    @classmethod
    def build(cls, m: ModelShape, gpu: GPUProfile, *, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
              tensor_parallel: int = 1, compute_eff: float = 0.6, bandwidth_eff: float = 0.8,
              overhead_s: float = 0.003) -> StepCostModel:
        return cls(
            flops_per_token=2.0 * matmul_params(m),
            attn_flops_per_ctx=4.0 * m.layers * m.hidden,
            weight_bytes=weight_bytes(m, weight_dtype),
            kv_bytes=kv_bytes_per_token(m, kv_dtype),
            peak_flops=gpu.peak_flops_for(weight_dtype) * tensor_parallel,
            bandwidth=gpu.bandwidth * tensor_parallel,
            compute_eff=compute_eff, bandwidth_eff=bandwidth_eff, overhead_s=overhead_s,
        )

    def step_time(self, tokens: float, attended_context: float, read_context: float) -> float:
        """Seconds for a step computing `tokens` tokens in total (prefill + decode)."""
        if tokens <= 0:
            return 0.0
        flops = self.flops_per_token * tokens + self.attn_flops_per_ctx * attended_context
        nbytes = self.weight_bytes + self.kv_bytes * (read_context + tokens)
        return self.overhead_s + max(flops / (self.peak_flops * self.compute_eff),
                                     nbytes / (self.bandwidth * self.bandwidth_eff))

    def prefill_time(self, tokens: int, cached_prefix: int = 0) -> float:
        """One sequence prefilling `tokens` new tokens after `cached_prefix` cached ones, in one step."""
        return self.step_time(tokens, _prefill_attended(tokens, cached_prefix), cached_prefix)

    def prefill_batched_time(self, tokens: int, cached_prefix: int = 0) -> float:
        """What one sequence's prefill of `tokens` new tokens after `cached_prefix` cached ones adds to an engine step
        that runs anyway: its own FLOPs and KV traffic. Continuous batching puts a prefill into the step of the
        running decodes, whose step already pays the fixed overhead and the weight read that a prefill alone
        (`prefill_time`) pays too: a replica's throughput is priced with this, one request's latency on an idle
        replica with `prefill_time`. The step's own formula without those fixed costs."""
        marginal = replace(self, overhead_s=0.0, weight_bytes=0.0)
        return marginal.step_time(tokens, _prefill_attended(tokens, cached_prefix), cached_prefix)

    def decode_step_time(self, batch: int, context: float) -> float:
        """One decode step of `batch` sequences with `context` cached tokens each."""
        return self.step_time(batch, batch * context, batch * context)

    def decode_compute_time(self, context: float) -> float:
        """Seconds one decode token's FLOPs hold the compute units (after `context` tokens): the step formula's compute
        term alone. A decode step is memory-bound, so a prefill batched into it runs on the compute it leaves idle
        and is slowed only by this much per decode token."""
        return replace(self, overhead_s=0.0, weight_bytes=0.0, kv_bytes=0.0).step_time(1, context, 0.0)

    @property
    def prefill_tokens_per_s(self) -> float:
        """A prefill's marginal rate at no context: its dense FLOPs alone at the compute units' efficiency (a long
        prefill is compute-bound; attention and the step's fixed costs come on top)."""
        return self.peak_flops * self.compute_eff / self.flops_per_token

    @property
    def prefill_attention_ratio(self) -> float:
        """r in "a prefill of L tokens computes in proportion to L + r*L^2": its FLOPs are
        flops_per_token*L + attn_flops_per_ctx*L(L+1)/2 (`_prefill_attended`)."""
        return self.attn_flops_per_ctx / (2.0 * self.flops_per_token)


def _prefill_attended(tokens: int, cached_prefix: int) -> float:
    """Σ over a prefill's new tokens of the positions each attends: the cached prefix and, causally, itself."""
    return tokens * cached_prefix + tokens * (tokens + 1) / 2


def calibrate(model: StepCostModel, points: list[dict[str, float]]) -> StepCostModel:
    """Fit overhead and one scale factor on the roofline time to measured steps (least squares).

    Each point: {"tokens", "attendedContext", "readContext", "seconds"}; at least two points with
    different roofline times are needed.
    """
    base = StepCostModel(**{**model.__dict__, "overhead_s": 0.0})
    xs = [base.step_time(p["tokens"], p.get("attendedContext", 0.0), p.get("readContext", 0.0)) for p in points]
    ys = [float(p["seconds"]) for p in points]
    n = len(xs)
    if n < 2:
        raise ValueError("calibration needs at least two measured steps")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        raise ValueError("calibration points all have the same predicted time; vary batch sizes")
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if k <= 0:
        raise ValueError("calibration points do not grow with work; check the file")
    overhead = max(0.0, my - k * mx)
    return StepCostModel(**{**model.__dict__, "compute_eff": model.compute_eff / k,
                            "bandwidth_eff": model.bandwidth_eff / k, "overhead_s": overhead})


def calibrate_with_request_cost(model: StepCostModel, points: list[dict[str, float]]) -> StepCostModel:
    """`calibrate` for points of two kinds: whole requests (`"wholeRequest": true`: one step plus what the request
    costs once, as a client timing a 1-token completion sees it) and single steps (the rest, e.g. decode steps
    from e2e differences). Least squares with one scale on the roofline time and two constants: the steps' is
    the per-step overhead, the requests' excess over it is `request_overhead_s` (one constant for both would
    charge every step part of the per-request cost)."""
    base = StepCostModel(**{**model.__dict__, "overhead_s": 0.0, "request_overhead_s": 0.0})
    groups: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for p in points:
        x = base.step_time(p["tokens"], p.get("attendedContext", 0.0), p.get("readContext", 0.0))
        groups[bool(p.get("wholeRequest", False))].append((x, float(p["seconds"])))
    if not groups[True] or not groups[False]:
        raise ValueError("calibration needs whole-request points and single-step points")
    means = {g: (sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v)) for g, v in groups.items()}
    sxx = sum((x - means[g][0]) ** 2 for g, v in groups.items() for x, _ in v)
    if sxx <= 0:
        raise ValueError("calibration points all have the same predicted time; vary batch sizes")
    k = sum((x - means[g][0]) * (y - means[g][1]) for g, v in groups.items() for x, y in v) / sxx
    if k <= 0:
        raise ValueError("calibration points do not grow with work; check the file")
    step_s = max(0.0, means[False][1] - k * means[False][0])
    request_s = max(0.0, means[True][1] - k * means[True][0] - step_s)
    return StepCostModel(**{**model.__dict__, "compute_eff": model.compute_eff / k,
                            "bandwidth_eff": model.bandwidth_eff / k, "overhead_s": step_s,
                            "request_overhead_s": request_s})
