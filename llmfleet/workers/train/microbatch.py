"""microBatch: auto - the largest micro-batch that fits on the device with a memory margin.

The probe runs once, before training: one forward + backward at micro-batch 1 on random tokens (the same
compiled code the run uses, so compile's memory savings are seen), then a linear model of peak memory in the
micro-batch,

    peak(mb) = static + mb x per_sequence,  static = weights + gradients + optimizer state (AdamW: 2 x fp32),
    per_sequence = peak(1) - weights - gradients,

picks the largest divisor of the per-rank sequences per step whose predicted peak stays under
(1 - margin) x device memory, and verifies that choice with one more forward + backward (stepping down on an
out-of-memory error or a measured peak over the limit). Gradient accumulation then makes up the rest of the
global batch, so the optimizer sees the same batch whatever the probe picks; the data loader's positions
depend only on the step, so the token stream is the same too. With several ranks every rank probes and all
take the smallest choice (one all-reduce). On CPU there is no device memory to measure: auto uses 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger("llmfleet.train")

# Headroom kept free: allocator fragmentation, NCCL buffers, the profiler, a checkpoint's staging copies.
MARGIN = 0.10


def divisors_desc(n: int) -> list[int]:
    return sorted((d for d in range(1, n + 1) if n % d == 0), reverse=True)


def choose(per_rank: int, static_bytes: float, per_sequence_bytes: float, capacity_bytes: float,
           margin: float = MARGIN) -> int:
    """Largest divisor of `per_rank` whose predicted peak fits under (1 - margin) x capacity; at least 1."""
    limit = (1.0 - margin) * capacity_bytes
    for mb in divisors_desc(per_rank):
        if static_bytes + mb * per_sequence_bytes <= limit:
            return mb
    return 1


@dataclass
class ProbeResult:
    micro_batch: int
    reason: str
    measured_peak_bytes: float | None = None
    predicted_peak_bytes: float | None = None
    capacity_bytes: float | None = None


def probe(
    fwd_bwd: Callable[[int], None],
    per_rank: int,
    device: torch.device,
    optimizer_state_bytes: float,
    agree: Callable[[int], int] = lambda v: v,
    world: int = 1,
    margin: float = MARGIN,
) -> ProbeResult:
    """`fwd_bwd(mb)` runs one forward + backward at micro-batch mb and leaves the gradients allocated.
    `agree(v)` returns the minimum of v over all ranks (identity on one rank), so every rank tries and
    keeps the same micro-batch; only a world of one steps down after an out-of-memory error (with several
    ranks the error ends the job: the others would wait in FSDP's collectives)."""
    if device.type != "cuda":
        return ProbeResult(1, "cpu: no device memory to probe, micro-batch 1")
    capacity = float(torch.cuda.get_device_properties(device).total_memory)
    limit = (1.0 - margin) * capacity
    torch.cuda.synchronize(device)
    base = float(torch.cuda.memory_allocated(device))  # weights (+ buffers) before any gradient exists
    torch.cuda.reset_peak_memory_stats(device)
    fwd_bwd(1)
    torch.cuda.synchronize(device)
    peak1 = float(torch.cuda.max_memory_allocated(device))
    grads = float(torch.cuda.memory_allocated(device)) - base  # what stays after backward: the gradients
    static = base + grads + optimizer_state_bytes
    per_seq = max(peak1 - base - grads, 1.0)  # what one sequence adds on top (activations, logits)
    mb = agree(choose(per_rank, static, per_seq, capacity, margin))
    while mb > 1:
        predicted = static + mb * per_seq
        measured = None
        try:
            torch.cuda.reset_peak_memory_stats(device)
            fwd_bwd(mb)
            torch.cuda.synchronize(device)
            measured = float(torch.cuda.max_memory_allocated(device)) + optimizer_state_bytes
        except torch.cuda.OutOfMemoryError:
            if world > 1:
                raise
            log.warning("microBatch auto: %d ran out of memory, trying a smaller one", mb)
            torch.cuda.empty_cache()
        fits = agree(int(measured is not None and measured <= limit))
        if fits and measured is not None:
            return ProbeResult(mb, f"largest divisor of {per_rank} sequences/rank under {1 - margin:.0%} of "
                                   f"{capacity / 2**30:.1f} GiB (measured {measured / 2**30:.1f} GiB incl. "
                                   f"optimizer state)", measured, predicted, capacity)
        if measured is not None:
            log.warning("microBatch auto: %d measured %.1f GiB > %.1f GiB limit, trying a smaller one", mb,
                        measured / 2**30, limit / 2**30)
        mb = agree(max([d for d in divisors_desc(per_rank) if d < mb], default=1))
    return ProbeResult(1, f"micro-batch 1 (predicted {(static + per_seq) / 2**30:.1f} GiB of "
                          f"{capacity / 2**30:.1f})", peak1 + optimizer_state_bytes, static + per_seq, capacity)
