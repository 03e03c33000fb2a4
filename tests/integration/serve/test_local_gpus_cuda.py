"""`llmfleet up` on real GPUs: each replica of `gpus: 1` sees one GPU of its own and can take most of its memory; one
more replica than the machine has whole GPUs waits, and starts on the GPU a scaled-down replica releases.

Skipped without nvidia-smi and a CUDA GPU (CI); run on the device machine with
`python -m pytest -q tests/integration/serve/test_local_gpus_cuda.py`.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llmfleet.api import InferenceService
from llmfleet.local.gpus import list_devices
from llmfleet.local.runtime import ReplicaSlot, Supervisor

torch = pytest.importorskip("torch")
NVIDIA_SMI = shutil.which("nvidia-smi")
pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif(NVIDIA_SMI is None or not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# A stand-in engine that does what vLLM does first: take most of its GPU's memory (60 %: two cannot share a GPU).
REPLICA = ("import os, signal, sys, time, torch; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
           "total = torch.cuda.get_device_properties(0).total_memory; "
           "x = torch.empty(int(0.6 * total), dtype=torch.uint8, device='cuda'); "
           "print('REPLICA', os.environ.get('CUDA_VISIBLE_DEVICES'), torch.cuda.device_count(), "
           "torch.cuda.get_device_properties(0).uuid, flush=True); time.sleep(120)")


class StandInSupervisor(Supervisor):
    def replica_command(self, r: Any) -> list[str]:
        return [sys.executable, "-c", REPLICA]

    def start_router(self) -> None:
        self.router = None


def _said(r: ReplicaSlot, timeout_s: float = 120.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = Path(r.log).read_text() if Path(r.log).exists() else ""
        if got := [ln.split() for ln in text.splitlines() if ln.startswith("REPLICA")]:
            return got[-1][1:]
        if r.proc is not None and r.proc.poll() is not None:
            raise AssertionError(f"{r.name} exited {r.proc.returncode}:\n{text[-2000:]}")
        time.sleep(0.2)
    raise TimeoutError(r.name)


@pytest.mark.timeout(600)
def test_each_replica_gets_a_gpu_of_its_own_and_one_more_waits(tmp_path: Path) -> None:
    assert NVIDIA_SMI is not None
    whole = [d for d in list_devices(NVIDIA_SMI) if d.mig is None]
    if not whole:
        pytest.skip("every GPU here is MIG-partitioned")
    n = len(whole)
    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "gpus"},
        "spec": {"model": {"path": "/m"}, "replicas": n + 1, "maxReplicas": n + 1, "drainSeconds": 1,
                 "resources": {"gpus": 1}}})
    sup = StandInSupervisor(isvc, tmp_path, prometheus=False, env={"CUDA_VISIBLE_DEVICES": ",".join(d.id for d in whole)})
    try:
        sup.start()
        slots = sup.slots["primary"]
        seen = [_said(r) for r in slots[:n]]
        assert [s[0] for s in seen] == [d.id for d in whole]  # CUDA_VISIBLE_DEVICES: the replica's own GPU
        assert all(s[1] == "1" for s in seen) and len({s[2] for s in seen}) == n  # one device each, all different
        last = slots[n]
        assert last.proc is None and last.waiting_for is not None

        first = slots[0]
        first.wanted, sup.desired["primary"] = False, n  # scaled down: its GPU goes to the waiting replica
        sup.reconcile()
        assert first.proc is not None
        first.proc.wait(timeout=60)
        sup.reconcile()
        assert last.devices == [whole[0].id] and _said(last)[2] == seen[0][2]
    finally:
        asyncio.run(sup.stop(grace_s=0))
