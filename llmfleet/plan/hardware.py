"""GPU profiles for the roofline: peak dense FLOP/s, HBM bandwidth and capacity, interconnect.

Numbers are the vendors' published dense (no 2:4 sparsity) figures for the SXM parts (PCIe for L40S and L4; HGX
B200/B300 at 1,000 W / 1,100 W).
Every field can be overridden from the CLI (`--gpu-override hbmBandwidthTBs=4.0`) or a JSON file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from llmfleet.api.common import Resources
from llmfleet.api.trainingjob import TrainingJobSpec

# Dense bf16 peak TFLOP/s per GPU (vendor datasheets, without sparsity), keyed by a substring of the device
# name: a device matches the first key it contains, so longer names come before their prefixes (A10G, A10).
BF16_PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0, "H100": 989.0, "H800": 989.0, "GH200": 989.0, "GB200": 2500.0, "B200": 2250.0, "B300": 2250.0,
    "B100": 1750.0,
    "A100": 312.0, "A800": 312.0, "A10G": 70.0, "A10": 125.0, "L40S": 362.0, "L40": 181.0,
    "L4": 121.0, "V100": 125.0, "T4": 65.0, "MI300X": 1307.0, "MI250": 362.0,
}


def bf16_peak_tflops(device_name: str | None) -> float | None:
    """Dense bf16 peak TFLOP/s of a device by name (e.g. torch's "NVIDIA H200"); None when unknown."""
    if not device_name:
        return None
    name = device_name.upper()
    return next((tflops for key, tflops in BF16_PEAK_TFLOPS.items() if key in name), None)


@dataclass(frozen=True)
class GPUProfile:
    """One accelerator as the roofline sees it."""

    name: str
    bf16_tflops: float  # dense bf16/fp16 tensor-core peak, TFLOP/s
    fp8_tflops: float | None  # dense fp8 peak; None when the part has no fp8 tensor cores
    hbm_bandwidth_tbs: float  # HBM bandwidth, TB/s (1e12 bytes/s)
    hbm_gib: float  # HBM capacity, GiB as reported by the driver (decimal GB on the datasheet)
    interconnect_gbs: float  # per-GPU NVLink (or PCIe) bandwidth, GB/s, one direction
    sram_kib_per_sm: float  # shared memory + L1 per SM, KiB (FlashAttention tile budget)
    sms: int
    # pinned host->GPU copy bandwidth, GB/s: what loading offloaded KV blocks back costs (vLLM's CPU KV
    # offloading). H200: measured, 52.5 GB/s for a 64 MiB copy (one 512-token Llama-3-8B block) over PCIe
    # Gen5 x16 (benchmarks/roofline_measure.py --only host-link); H100: the same link, assumed equal;
    # A100 / L40S: PCIe Gen4 x16, the typical pinned-copy figure, not measured here.
    host_link_gbs: float = 25.0
    # The share of one physical GPU this profile occupies: 1 for a whole GPU; for a MIG slice the larger of its
    # compute and memory fractions (what it keeps other slices from using). A replica's GPU-seconds count at it.
    gpu_share: float = 1.0

    @property
    def peak_flops(self) -> float:
        return self.bf16_tflops * 1e12

    def peak_flops_for(self, dtype: str) -> float:
        if dtype in ("fp8", "int8", "int4") and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.peak_flops

    @property
    def bandwidth(self) -> float:
        """HBM bytes/s."""
        return self.hbm_bandwidth_tbs * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * 2**30

    @property
    def ridge_point(self) -> float:
        """FLOP per byte where the bf16 roofline turns from memory-bound to compute-bound."""
        return self.peak_flops / self.bandwidth

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ridgePointFlopPerByte"] = round(self.ridge_point, 1)
        return d


# H100 SXM5 80GB, H200 SXM 141GB, A100 SXM4 80GB, L40S 48GB (PCIe Gen4 x16), B200 (HGX, 180 GB), B300 (HGX,
# 270 GB usable), L4 24GB (PCIe Gen4 x16, no NVLink). HBM as the driver reports it (nvidia-smi: B200 183,359 MiB,
# B300 275,040 MiB, L4 23,034 MiB). NVLink 5 is 1.8 TB/s both directions per GPU: 900 GB/s one way. B200/B300 host
# links: PCIe Gen5 hosts, assumed equal to the H200's measured copy; not measured here.
GPUS: dict[str, GPUProfile] = {
    "H100": GPUProfile("H100", BF16_PEAK_TFLOPS["H100"], 1979.0, 3.35, 79.6, 450.0, 228.0, 132, host_link_gbs=52.5),
    "H200": GPUProfile("H200", BF16_PEAK_TFLOPS["H200"], 1979.0, 4.8, 139.8, 450.0, 228.0, 132, host_link_gbs=52.5),
    "A100": GPUProfile("A100", BF16_PEAK_TFLOPS["A100"], None, 2.039, 79.2, 300.0, 192.0, 108, host_link_gbs=25.0),
    "L40S": GPUProfile("L40S", BF16_PEAK_TFLOPS["L40S"], 733.0, 0.864, 44.4, 32.0, 128.0, 142, host_link_gbs=25.0),
    "B200": GPUProfile("B200", BF16_PEAK_TFLOPS["B200"], 4500.0, 8.0, 179.0, 900.0, 228.0, 148, host_link_gbs=52.5),
    "B300": GPUProfile("B300", BF16_PEAK_TFLOPS["B300"], 4500.0, 8.0, 268.5, 900.0, 228.0, 148, host_link_gbs=52.5),
    "L4": GPUProfile("L4", BF16_PEAK_TFLOPS["L4"], 242.5, 0.3, 22.4, 32.0, 128.0, 58, host_link_gbs=25.0),
}

# The product names NVIDIA's driver reports for each GPU type (`nvidia-smi -L`, torch's device name), every variant
# of the type (SXM, PCIe, NVL: they differ in clocks and HBM; the profiles above are the SXM parts'). NVIDIA GPU
# feature discovery labels a node `nvidia.com/gpu.product=<the name, spaces as dashes>` ("NVIDIA-H100-80GB-HBM3"):
# the operator's node affinity for a gpuType accepts each of them, and `llmfleet up` matches a device by them.
GPU_PRODUCTS: dict[str, tuple[str, ...]] = {
    "H200": ("NVIDIA H200", "NVIDIA H200 NVL"),
    "H100": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
    "A100": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"),
    "L40S": ("NVIDIA L40S",),
    "B200": ("NVIDIA B200",),
    "B300": ("NVIDIA B300 SXM6 AC",),
    "L4": ("NVIDIA L4",),
}


def gpu_products(gpu_type: str) -> tuple[str, ...] | None:
    """The product names of a GPU type in GPU_PRODUCTS (any case), or None for a type the table lacks."""
    return GPU_PRODUCTS.get(gpu_type.upper())


# MIG GPU-instance profiles per GPU (NVIDIA MIG user guide, "Supported MIG Profiles"; the SXM parts above):
# profile -> (compute slices of 7, memory slices of 8). A slice gets its compute fraction of the SMs and peak
# FLOP/s and its memory fraction of HBM capacity and bandwidth (each memory slice has its own controllers).
# L40S and L4 have no MIG. The "+me" variants (media engines, nothing an LLM engine uses) are left out: Kubernetes resource
# names cannot hold a "+".
MIG_PROFILES: dict[str, dict[str, tuple[int, int]]] = {
    "H200": {"1g.18gb": (1, 1), "1g.35gb": (1, 2), "2g.35gb": (2, 2), "3g.71gb": (3, 4), "4g.71gb": (4, 4),
             "7g.141gb": (7, 8)},
    "H100": {"1g.10gb": (1, 1), "1g.20gb": (1, 2), "2g.20gb": (2, 2), "3g.40gb": (3, 4), "4g.40gb": (4, 4),
             "7g.80gb": (7, 8)},
    "A100": {"1g.10gb": (1, 1), "1g.20gb": (1, 2), "2g.20gb": (2, 2), "3g.40gb": (3, 4), "4g.40gb": (4, 4),
             "7g.80gb": (7, 8)},
    "B200": {"1g.23gb": (1, 1), "1g.45gb": (1, 2), "2g.45gb": (2, 2), "3g.90gb": (3, 4), "4g.90gb": (4, 4),
             "7g.180gb": (7, 8)},
    "B300": {"1g.34gb": (1, 1), "1g.67gb": (1, 2), "2g.67gb": (2, 2), "3g.135gb": (3, 4), "4g.135gb": (4, 4),
             "7g.269gb": (7, 8)},
}
_MIG_COMPUTE_SLICES, _MIG_MEMORY_SLICES = 7, 8


def mig_slice(gpu: GPUProfile, profile: str) -> GPUProfile:
    """`gpu` as one MIG instance of `profile` (e.g. "3g.71gb"): the slice's share of compute, memory and memory
    bandwidth, and the share of the GPU it occupies. The interconnect is kept (tensor parallelism across MIG
    instances is not possible; one slice is one device). ValueError for a profile the GPU does not have."""
    table = MIG_PROFILES.get(gpu.name.upper())
    if table is None:
        raise ValueError(f"{gpu.name} has no MIG profiles (MIG-capable here: {', '.join(MIG_PROFILES)})")
    if profile not in table:
        raise ValueError(f"{gpu.name} has no MIG profile {profile!r}; its profiles: {', '.join(table)}")
    compute, memory = table[profile]
    c, m = compute / _MIG_COMPUTE_SLICES, memory / _MIG_MEMORY_SLICES
    return replace(gpu, name=f"{gpu.name} MIG {profile}", bf16_tflops=gpu.bf16_tflops * c,
                   fp8_tflops=None if gpu.fp8_tflops is None else gpu.fp8_tflops * c,
                   hbm_bandwidth_tbs=gpu.hbm_bandwidth_tbs * m, hbm_gib=gpu.hbm_gib * m,
                   sms=max(1, gpu.sms * compute // _MIG_COMPUTE_SLICES), gpu_share=max(c, m))


_FIELD_ALIASES = {
    "bf16Tflops": "bf16_tflops", "fp8Tflops": "fp8_tflops", "hbmBandwidthTBs": "hbm_bandwidth_tbs",
    "hbmGiB": "hbm_gib", "interconnectGBs": "interconnect_gbs", "sramKiBPerSM": "sram_kib_per_sm", "sms": "sms",
    "hostLinkGBs": "host_link_gbs",
}


def get_gpu(name: str, overrides: dict[str, Any] | None = None, mig: str | None = None) -> GPUProfile:
    """A profile by (case-insensitive) name, with fields replaced by `overrides` (snake or camelCase keys), as
    one MIG instance of profile `mig` when given (mig_slice, applied after the overrides)."""
    key = name.upper()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)} (override fields to describe others)")
    gpu = GPUS[key]
    if overrides:
        valid = {f.name for f in fields(GPUProfile)}
        clean: dict[str, Any] = {}
        for k, v in overrides.items():
            field = _FIELD_ALIASES.get(k, k)
            if field not in valid or field in ("name", "gpu_share"):
                raise ValueError(f"unknown GPU field {k!r}; known: {', '.join(sorted(_FIELD_ALIASES))}")
            value = None if v is None else float(v)
            # a number the roofline divides by or scales with: finite and > 0 (fp8 peak None: no fp8 cores)
            ok = field == "fp8_tflops" if value is None else math.isfinite(value) and value > 0
            if not ok:
                raise ValueError(f"GPU field {k!r} must be a finite number > 0, got {v!r}")
            clean[field] = int(value) if field == "sms" and value is not None else value
        gpu = replace(gpu, **clean)
    return mig_slice(gpu, mig) if mig else gpu


def training_precision_problems(spec: TrainingJobSpec, prefix: str = "spec") -> list[tuple[str, str]]:
    """(field path, message) for a precision the job's GPUs cannot run: fp8 on CPU workers or on a GPU of
    the table without fp8 tensor cores. A GPU type the table does not know is left to the worker, which
    checks the device it gets."""
    if spec.optimization.precision != "fp8":
        return []
    path = f"{prefix}.optimization.precision"
    if spec.workers.gpus_per_worker == 0:
        return [(path, "fp8 needs GPUs with fp8 tensor cores; workers.gpusPerWorker is 0 (CPU workers): "
                       "use bf16 or fp32")]
    gpu = GPUS.get((spec.workers.gpu_type or "").upper())
    if gpu is not None and gpu.fp8_tflops is None:
        return [(path, f"fp8 needs fp8 tensor cores and {gpu.name} (workers.gpuType) has none: use bf16")]
    return []


def mig_profile_problem(resources: Resources) -> str | None:
    """Why `resources.migProfile` cannot be scheduled or planned (a profile its gpuType does not have, a GPU
    without MIG), or None. A gpuType the table does not know is left to the cluster's device plugin."""
    gpu = GPUS.get((resources.gpu_type or "").upper())
    if resources.mig_profile is None or gpu is None:
        return None
    try:
        mig_slice(gpu, resources.mig_profile)
    except ValueError as err:
        return str(err)
    return None
