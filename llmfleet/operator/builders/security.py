"""Every pod the operator creates meets the "restricted" Pod Security Standard, with a read-only root filesystem.

Pod level: runAsNonRoot as the llmfleet images' user (config.POD_UID, so a CR's own image that would run as
root runs as that user too; OperatorConfig.pod_user), fsGroup so volumes are writable by it
(fsGroupChangePolicy OnRootMismatch: a large model claim is not chowned on every mount), seccomp RuntimeDefault.
With pod_user None the user is the image's or the platform's (OpenShift), still required to be non-root.
Container level (init containers too): no privilege escalation, every capability dropped, readOnlyRootFilesystem.

What the processes write goes to emptyDirs: /tmp (Python, torchrun's rendezvous files, Ray, TorchInductor's
default cache) and a home folder (HOME) that holds every cache a library keeps under it: Hugging Face,
torch, Triton, vLLM, CUDA's JIT cache, numba; their variables point there explicitly, so an image whose HOME
is elsewhere (or whose user has none) behaves the same. GPU pods keep their /dev/shm memory volume (vLLM's
workers and NCCL exchange through shared memory). Nothing here applies to the local runtime (`llmfleet up`),
which starts plain processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmfleet.operator.config import POD_UID

TMP_DIR = "/tmp"
HOME_DIR = "/home/llmfleet"
CACHE_DIR = f"{HOME_DIR}/.cache"
# Caches the serving, training and router libraries write, all under HOME (what each library would pick by
# itself from HOME, set explicitly so they do not depend on the image's HOME or user).
CACHE_ENV = {
    "HOME": HOME_DIR,
    "XDG_CACHE_HOME": CACHE_DIR,
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "TORCH_HOME": f"{CACHE_DIR}/torch",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/torchinductor",
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
    "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",
    "VLLM_CONFIG_ROOT": f"{HOME_DIR}/.config/vllm",
    "CUDA_CACHE_PATH": f"{CACHE_DIR}/nv",
    "NUMBA_CACHE_DIR": f"{CACHE_DIR}/numba",
    "MPLCONFIGDIR": f"{HOME_DIR}/.config/matplotlib",
}


@dataclass(frozen=True)
class Scratch:
    """sizeLimits of the writable emptyDirs (Kubernetes quantities): compile caches on GPU pods need room."""

    tmp: str = "1Gi"
    home: str = "1Gi"


# vLLM and torch.compile caches (Triton kernels, Inductor graphs, CUDA graphs) run to gigabytes.
ENGINE_SCRATCH = Scratch(tmp="4Gi", home="8Gi")


def pod_security_context(user: int | None = POD_UID) -> dict[str, Any]:
    ids = {"runAsUser": user, "runAsGroup": user, "fsGroup": user, "fsGroupChangePolicy": "OnRootMismatch"}
    return {"runAsNonRoot": True, **(ids if user is not None else {}), "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def restricted(pod_spec: dict[str, Any], scratch: Scratch = Scratch(), user: int | None = POD_UID,
               pull_secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    """The pod spec with security contexts (running as `user`), the writable emptyDirs, the cache variables and
    the image pull secrets (a new dict).

    A folder the pod already mounts (e.g. a checkpoint volume at /tmp) keeps its own volume."""
    volumes = list(pod_spec.get("volumes") or [])
    names = {v["name"] for v in volumes}
    writable = {"tmp": (TMP_DIR, scratch.tmp), "home": (HOME_DIR, scratch.home)}
    for name, (_, size) in writable.items():
        if name in names:
            raise ValueError(f"volume name {name!r} is reserved for the writable emptyDirs")
        volumes.append({"name": name, "emptyDir": {"sizeLimit": size}})

    def harden(container: dict[str, Any]) -> dict[str, Any]:
        mounts = list(container.get("volumeMounts") or [])
        taken = {m["mountPath"] for m in mounts}
        mounts += [{"name": name, "mountPath": path} for name, (path, _) in writable.items() if path not in taken]
        env = list(container.get("env") or [])
        own = {e["name"] for e in env}
        env += [{"name": k, "value": v} for k, v in CACHE_ENV.items() if k not in own]
        return {**container, "env": env, "volumeMounts": mounts,
                "securityContext": {**container_security_context(), **(container.get("securityContext") or {})}}

    out = {**pod_spec, "securityContext": pod_security_context(user), "volumes": volumes,
           "containers": [harden(c) for c in pod_spec.get("containers") or []]}
    if pull_secrets:
        out["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    if pod_spec.get("initContainers"):
        out["initContainers"] = [harden(c) for c in pod_spec["initContainers"]]
    return out
