"""Training math: FLOPs per token (PaLM appendix B), MFU/HFU, FSDP memory per GPU.

The one home of the FLOPs accounting: the planner and the trainer's live MFU/HFU both use it.
FLOPs per token follow PaLM (Chowdhery et al. 2022), appendix B: 6N + 12·L·H·Q·T, where N counts the
parameters that do matrix work (all but the input embedding lookup), L layers, H heads, Q head dim,
T attended tokens (the sequence, capped by a sliding window). HFU adds the forward recomputed by activation
checkpointing: 2·N_block + 4·H·Q·T per token for every checkpointed block.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmfleet.api.trainingjob import ModelShape
from llmfleet.plan.models import embedding_params, layer_params, total_params


def flops_params(m: ModelShape) -> int:
    """N of PaLM's 6N: every parameter except the input embedding table (a lookup, not a matmul).

    With tied embeddings the table is also the LM head, which is a matmul: then it counts.
    """
    n = total_params(m)
    return n if m.tie_embeddings else n - embedding_params(m)


def attended_tokens(m: ModelShape, seq_len: int | None = None) -> int:
    """T of 12·L·H·Q·T: the sequence length, capped by the sliding window."""
    t = seq_len or m.seq_len
    return min(t, m.sliding_window) if m.sliding_window else t


def attention_flops_per_token(m: ModelShape, seq_len: int | None = None) -> int:
    """12·L·H·Q·T (forward + backward of QK^T and AV, counted as full S x S as PaLM does)."""
    return 12 * m.layers * m.heads * m.head_dim * attended_tokens(m, seq_len)


def model_flops_per_token(m: ModelShape, seq_len: int | None = None) -> int:
    """6·N + 12·L·H·Q·T: forward + backward of the dense weights and of attention."""
    return 6 * flops_params(m) + attention_flops_per_token(m, seq_len)


def causal_flops_per_token(m: ModelShape, seq_len: int | None = None) -> int:
    """The other common MFU convention, reported beside the project's: 6·N with N *all* parameters (input
    embedding included) + 6·L·H·Q·T, attention halved because a causal kernel skips the masked half of S x S.
    For the 0.9B reference model: 6.14 vs 6.54 GFLOP/token, so its MFU reads 6.2% lower."""
    return 6 * total_params(m) + 6 * m.layers * m.heads * m.head_dim * attended_tokens(m, seq_len)


def recomputed_blocks(layers: int, activation_checkpointing: str) -> int:
    """Blocks whose forward runs twice: all with full checkpointing, every other one (0, 2, 4...) with selective."""
    if activation_checkpointing == "full":
        return layers
    if activation_checkpointing == "selective":
        return (layers + 1) // 2
    if activation_checkpointing == "none":
        return 0
    raise ValueError("activation_checkpointing must be none, selective or full")


def hardware_flops_per_token(m: ModelShape, seq_len: int | None = None, activation_checkpointing: str = "none") -> int:
    """FLOPs the hardware really executes: one more forward (2·N_block + 4·H·Q·T) per recomputed block."""
    per_block_fwd = 2 * layer_params(m) + 4 * m.heads * m.head_dim * attended_tokens(m, seq_len)
    return model_flops_per_token(m, seq_len) + recomputed_blocks(m.layers, activation_checkpointing) * per_block_fwd


def flops_utilization(flops_per_token: float, tokens_per_s_per_gpu: float, peak_flops_per_gpu: float) -> float:
    """MFU (with model FLOPs) or HFU (with hardware FLOPs): achieved FLOP/s per GPU over its peak."""
    return flops_per_token * tokens_per_s_per_gpu / peak_flops_per_gpu


@dataclass(frozen=True)
class Utilization:
    tokens_per_s: float
    model_flops_per_token: float
    hardware_flops_per_token: float
    achieved_tflops_per_gpu: float
    mfu: float
    hfu: float


def utilization(m: ModelShape, tokens_per_s: float, n_gpus: int, peak_flops_per_gpu: float, *,
                seq_len: int | None = None, activation_checkpointing: str = "none") -> Utilization:
    """MFU = model FLOPs/s ÷ peak; HFU counts the recomputation as well (so HFU >= MFU)."""
    if tokens_per_s < 0 or n_gpus < 1 or peak_flops_per_gpu <= 0:
        raise ValueError("tokens_per_s >= 0, n_gpus >= 1 and peak > 0 are required")
    mf = model_flops_per_token(m, seq_len)
    hf = hardware_flops_per_token(m, seq_len, activation_checkpointing)
    per_gpu = tokens_per_s / n_gpus
    return Utilization(tokens_per_s, mf, hf, per_gpu * mf / 1e12, flops_utilization(mf, per_gpu, peak_flops_per_gpu),
                       flops_utilization(hf, per_gpu, peak_flops_per_gpu))


@dataclass(frozen=True)
class FSDPMemory:
    shard_size: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    gathered_bytes: float
    activation_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.gathered_bytes + self.activation_bytes


def fsdp_memory_per_gpu(m: ModelShape, world_size: int, *, replicate_groups: int = 1, micro_batch: int = 1,
                        seq_len: int | None = None, activation_checkpointing: str = "none",
                        reshard_after_forward: bool = True) -> FSDPMemory:
    """Memory per GPU for FSDP2 with bf16 compute and fp32 master weights, AdamW.

    Sharded across world_size / replicate_groups ranks (HSDP replicates across groups): fp32 params (4 B),
    fp32 grads (4 B), Adam m and v (8 B). Gathered bf16 weights: two blocks in flight (current + prefetch),
    or all of them when reshard_after_forward is false. Activations with FlashAttention: ~34·s·b·h bytes
    per layer (Korthikanti et al. 2022, without the 5·a·s²·b term that fused attention removes); full
    checkpointing keeps only each block's input (2·s·b·h) plus one block's worth.
    """
    if world_size < 1 or replicate_groups < 1 or world_size % replicate_groups:
        raise ValueError("world_size must be a positive multiple of replicate_groups")
    shard = world_size // replicate_groups
    n = total_params(m)
    layer = (total_params(m) - 2 * m.vocab * m.hidden) / m.layers
    gathered = (n * 2.0) if not reshard_after_forward else 2 * layer * 2.0
    s = seq_len or m.seq_len
    sbh = s * micro_batch * m.hidden
    per_layer = 34.0 * sbh
    if activation_checkpointing == "full":
        act = m.layers * 2.0 * sbh + per_layer
    elif activation_checkpointing == "selective":
        act = (m.layers / 2) * per_layer + (m.layers / 2) * 2.0 * sbh
    elif activation_checkpointing == "none":
        act = m.layers * per_layer
    else:
        raise ValueError("activation_checkpointing must be none, selective or full")
    act += 4.0 * s * micro_batch * m.vocab  # fp32 logits for the loss
    return FSDPMemory(shard, 4.0 * n / shard, 4.0 * n / shard, 8.0 * n / shard, gathered, act)


@dataclass(frozen=True)
class FSDPComm:
    bytes_per_gpu: float  # received by each rank per optimizer step
    comm_s: float  # at the interconnect's one-direction bandwidth
    compute_s: float  # model FLOPs of the rank's tokens at the given MFU
    ratio: float  # comm / compute: above ~1 the collectives cannot hide behind compute


def fsdp_comm_per_step(m: ModelShape, world_size: int, tokens_per_gpu: int, interconnect_gbs: float,
                       peak_flops: float, *, mfu: float = 0.5, reshard_after_forward: bool = True,
                       reduce_bytes: float = 4.0, seq_len: int | None = None) -> FSDPComm:
    """FSDP2 traffic per step: all-gather bf16 weights in forward (and again in backward when resharded),
    reduce-scatter gradients in `reduce_bytes` (fp32 by default); each moves (n-1)/n of the tensor per rank."""
    if world_size < 1 or tokens_per_gpu < 1:
        raise ValueError("world_size and tokens_per_gpu must be >= 1")
    n = total_params(m)
    share = (world_size - 1) / world_size
    nbytes = n * share * (2.0 + (2.0 if reshard_after_forward else 0.0) + reduce_bytes)
    comm = nbytes / (interconnect_gbs * 1e9)
    compute = tokens_per_gpu * model_flops_per_token(m, seq_len) / (peak_flops * mfu)
    return FSDPComm(nbytes, comm, compute, comm / compute if compute else float("inf"))
