"""GPUs for the replicas of `llmfleet up`: the devices this machine has, and which replica holds which.

In a cluster a pod asks the NVIDIA device plugin for `nvidia.com/gpu: N` or one `nvidia.com/mig-<profile>` and sees
only what it was given. On one machine every process sees every GPU, so replicas of `gpus: 1` would all start on
CUDA device 0 (vLLM takes 90 % of its memory: the second replica fails). The supervisor plays the device plugin:
it lists the devices with `nvidia-smi -L`, gives each replica its own through CUDA_VISIBLE_DEVICES, and a replica
that no free device fits waits, as a Pending pod does, until a stopped replica releases one.

Whole GPUs are named by index with CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi numbers them in (CUDA's default
order, fastest first, can differ on a mixed machine). MIG instances can only be named by UUID (`MIG-...`); a GPU
with MIG instances is not handed out whole. A CUDA_VISIBLE_DEVICES the caller set limits the devices to those it
lists (indices or UUIDs), as a shared machine's scheduler would.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from llmfleet.api.common import Resources
from llmfleet.plan.hardware import gpu_products

NVIDIA_SMI_TIMEOUT_S = 15.0  # nvidia-smi answers in well under a second; a hung driver must not hang `llmfleet up`
_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<product>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^)]+)\)\s*$")


class GpuListError(RuntimeError):
    """nvidia-smi is there but could not list the devices (no driver, timed out, output it cannot read)."""


@dataclass(frozen=True)
class Device:
    """One device a replica can be given: a whole GPU or one MIG instance of it."""

    id: str  # what CUDA_VISIBLE_DEVICES takes: the GPU's index, or the MIG instance's UUID
    gpu: int  # the physical GPU's index
    gpu_uuid: str
    product: str  # e.g. "NVIDIA H200"
    mig: str | None = None  # the MIG profile, e.g. "3g.71gb"; None for a whole GPU


@dataclass(frozen=True)
class GpuRequest:
    """What one replica of a pool asks for: `count` whole GPUs, or one MIG instance of profile `mig`."""

    count: int
    gpu_type: str | None = None
    mig: str | None = None

    @classmethod
    def of(cls, resources: Resources) -> GpuRequest:
        return cls(count=resources.gpus, gpu_type=resources.gpu_type, mig=resources.mig_profile)

    def describe(self) -> str:
        of = f" {self.gpu_type}" if self.gpu_type else ""
        if self.mig:
            return f"a MIG {self.mig} instance of an{of} GPU"
        return f"{self.count} whole{of} GPU{'s' if self.count != 1 else ''}"


def parse_nvidia_smi_list(text: str) -> list[Device]:
    """The devices in `nvidia-smi -L` output: each GPU line, and the MIG lines under it. A GPU that has MIG
    instances is listed by its instances only (it cannot also be used whole)."""
    devices: list[Device] = []
    gpu: Device | None = None
    migs: list[Device] = []

    def flush() -> None:
        if gpu is not None:
            devices.extend(migs or [gpu])

    for line in text.splitlines():
        if m := _GPU_LINE.match(line):
            flush()
            index = int(m["index"])
            gpu, migs = Device(id=str(index), gpu=index, gpu_uuid=m["uuid"], product=m["product"].strip()), []
        elif (m := _MIG_LINE.match(line)) and gpu is not None:
            migs.append(Device(id=m["uuid"], gpu=gpu.gpu, gpu_uuid=gpu.gpu_uuid, product=gpu.product, mig=m["profile"]))
        elif line.strip():
            raise GpuListError(f"cannot read this line of `nvidia-smi -L`: {line.strip()!r}")
    flush()
    return devices


def list_devices(nvidia_smi: str, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> list[Device]:
    """This machine's devices, from `nvidia-smi -L` (the binary at `nvidia_smi`)."""
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GpuListError(f"`{nvidia_smi} -L` failed: {err}") from err
    if out.returncode != 0:
        said = (out.stdout + out.stderr).strip().splitlines()
        raise GpuListError(f"`{nvidia_smi} -L` exited {out.returncode}: {said[0] if said else 'no output'}")
    return parse_nvidia_smi_list(out.stdout)


def visible(devices: Iterable[Device], cuda_visible_devices: str | None) -> list[Device]:
    """The devices a CUDA_VISIBLE_DEVICES the caller set leaves (all of them when it is unset). Entries are GPU
    indices, GPU UUIDs or MIG UUIDs; a GPU's index or UUID admits its MIG instances too."""
    devices = list(devices)
    if cuda_visible_devices is None:
        return devices
    entries = {e.strip() for e in cuda_visible_devices.split(",") if e.strip()}
    return [d for d in devices if entries & {d.id, str(d.gpu), d.gpu_uuid}]


def _tokens(s: str) -> list[str]:
    return [t for t in re.split(r"[\s_-]+", s.upper()) if t]


def matches_type(product: str, gpu_type: str | None) -> bool:
    """Whether a GPU's product name is of `gpu_type`: one of the type's product names (plan.hardware.GPU_PRODUCTS,
    which the operator's node affinity also uses), or, for a type outside that table, a name holding the type's
    words in a row ("RTX 6000" is "NVIDIA RTX 6000 Ada Generation", "H10" is not "NVIDIA H100 PCIe")."""
    if not gpu_type:
        return True
    if (known := gpu_products(gpu_type)) is not None:
        return product.upper() in {k.upper() for k in known}
    want, have = _tokens(gpu_type), _tokens(product)
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def pick(devices: Iterable[Device], held: Collection[str], want: GpuRequest) -> list[Device] | None:
    """The devices a replica asking `want` gets: the first free ones of its kind in nvidia-smi's order, or None
    when too few are free (the replica waits)."""
    if want.count <= 0:
        return []
    fit = [d for d in devices if d.id not in held and d.mig == want.mig and matches_type(d.product, want.gpu_type)]
    n = 1 if want.mig else want.count
    return fit[:n] if len(fit) >= n else None


def device_env(devices: Iterable[Device]) -> dict[str, str]:
    """The environment that shows a replica exactly `devices`."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(d.id for d in devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
