"""The full planner report (what `llmfleet plan` prints): a pure function from inputs to a JSON-able dict."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.capacity import TrafficShape, replicas_needed
from llmfleet.plan.hardware import GPUProfile
from llmfleet.plan.models import attention_kind, kv_bytes_per_token, total_params
from llmfleet.plan.roofline import (
    attention_traffic,
    decode_compute_bound_batch,
    decode_roofline,
    host_kv_tier,
    kv_capacity,
    prefill_roofline,
)
from llmfleet.plan.training import fsdp_comm_per_step, fsdp_memory_per_gpu, utilization


@dataclass(frozen=True)
class PlanInputs:
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    block_size: int = 16
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.9
    attention_seq_len: int = 8192
    train_tokens_per_s: float | None = None  # measured, whole job
    train_gpus: int = 8
    train_seq_len: int | None = None
    replicate_groups: int = 1
    micro_batch: int = 1
    activation_checkpointing: str = "none"
    train_tokens_per_gpu_step: int | None = None  # tokens per GPU per optimizer step (seqLen x microBatch)
    host_kv_gib: float | None = None  # host-memory KV tier per replica (vLLM --kv-offloading-size)
    prompts: tuple[int, ...] = ()  # a sample's prompt lengths: replicas planned at their mean prefill (capacity.py)


def build_report(m: ModelShape, gpu: GPUProfile, w: TrafficShape, p: PlanInputs) -> dict[str, Any]:
    ctx = w.input_tokens + w.output_tokens // 2
    pre = prefill_roofline(m, gpu, w.input_tokens, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    dec1 = decode_roofline(m, gpu, 1, ctx, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    plan = replicas_needed(m, gpu, w, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype,
                           tensor_parallel=p.tensor_parallel, prompts=p.prompts)
    decb = decode_roofline(m, gpu, plan.capacity.max_batch, ctx, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    cb0 = decode_compute_bound_batch(m, gpu, 0, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    cbc = decode_compute_bound_batch(m, gpu, ctx, weight_dtype=p.weight_dtype, kv_dtype=p.kv_dtype)
    kv = {}
    for dt in ("bf16", "fp8", "int4"):
        cap = kv_capacity(m, gpu, weight_dtype=p.weight_dtype, kv_dtype=dt, tensor_parallel=p.tensor_parallel,
                          gpu_memory_utilization=p.gpu_memory_utilization, block_size=p.block_size,
                          tokens_per_sequence=w.input_tokens + w.output_tokens)
        kv[dt] = asdict(cap)
    variants = {}
    for name, kvh in (("MHA", m.heads), ("GQA", m.n_kv_heads), ("MQA", 1)):
        shape = m.model_copy(update={"kv_heads": kvh})
        variants[name] = {"kvHeads": kvh, **{dt: kv_bytes_per_token(shape, dt) for dt in ("bf16", "fp8", "int4")}}
    att = attention_traffic(m, gpu, p.attention_seq_len)
    host = (asdict(host_kv_tier(m, gpu, p.host_kv_gib, block_size=p.block_size, kv_dtype=p.kv_dtype,
                                weight_dtype=p.weight_dtype, tensor_parallel=p.tensor_parallel))
            if p.host_kv_gib else None)
    out: dict[str, Any] = {
        "model": {**m.to_wire(), "params": total_params(m), "attention": attention_kind(m)},
        "gpu": gpu.to_dict(),
        "workload": asdict(w),
        "roofline": {
            "prefill": asdict(pre), "decodeBatch1": asdict(dec1), "decodeAtMaxBatch": asdict(decb),
            "decodeComputeBoundBatch": {"context0": cb0, f"context{ctx}": cbc},
        },
        "kvCache": {"bytesPerToken": kv_bytes_per_token(m, p.kv_dtype), "byDtype": kv, "byAttention": variants,
                    "hostTier": host},
        "attention": asdict(att),
        "replicas": {"needed": plan.replicas, "capacity": asdict(plan.capacity), "reasoning": plan.reasoning},
    }
    ts = p.train_seq_len or m.seq_len
    train: dict[str, Any] = {"fsdpMemoryPerGPU": {
        **asdict(fsdp := fsdp_memory_per_gpu(m, p.train_gpus, replicate_groups=p.replicate_groups,
                                             micro_batch=p.micro_batch, seq_len=ts,
                                             activation_checkpointing=p.activation_checkpointing)),
        "totalBytes": fsdp.total_bytes, "fitsInHBM": fsdp.total_bytes <= gpu.hbm_bytes}}
    shard = max(1, p.train_gpus // p.replicate_groups)
    train["fsdpCommPerStep"] = asdict(fsdp_comm_per_step(
        m, shard, p.train_tokens_per_gpu_step or ts * p.micro_batch, gpu.interconnect_gbs, gpu.peak_flops,
        seq_len=ts))
    if p.train_tokens_per_s is not None:
        train["utilization"] = asdict(utilization(m, p.train_tokens_per_s, p.train_gpus, gpu.peak_flops,
                                                  seq_len=ts, activation_checkpointing=p.activation_checkpointing))
    out["training"] = train
    return out
