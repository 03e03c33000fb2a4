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


def _whole_gpus() -> list[Any]:
    """The whole GPUs here (MIG instances left out); the test is skipped when there are none."""
    assert NVIDIA_SMI is not None
    whole = [d for d in list_devices(NVIDIA_SMI) if d.mig is None]
    if not whole:
        pytest.skip("every GPU here is MIG-partitioned")
    return whole


def _token_data(data: Path) -> Path:
    """A tiny tokenized dataset (llmfleet.workers.train's shard format) in folder `data`."""
    import json

    import numpy as np

    data.mkdir()
    np.tile(np.arange(1000, dtype=np.uint16), 50).tofile(data / "shard-00000.bin")
    (data / "manifest.json").write_text(json.dumps({"dtype": "uint16", "vocab": 1024, "eos": 1023, "tokens": 50_000,
                                                    "shards": [{"file": "shard-00000.bin", "tokens": 50_000}]}))
    return data


@pytest.mark.timeout(600)
def test_each_replica_gets_a_gpu_of_its_own_and_one_more_waits(tmp_path: Path) -> None:
    whole = _whole_gpus()
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


@pytest.mark.timeout(600)
def test_llmfleet_train_claims_its_gpu_and_refuses_while_another_run_holds_it(tmp_path: Path) -> None:
    """`llmfleet train` claims a free GPU machine-wide: while every GPU is claimed (as a `llmfleet up` replica
    claims it) it stops with one line; once one is free it trains on it."""
    import json
    import os
    import subprocess

    import yaml

    from llmfleet.local.gpus import LOCK_DIR_ENV, DeviceLocks

    whole = _whole_gpus()
    data = _token_data(tmp_path / "data")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "model": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1024, "seqLen": 128},
        "data": {"path": str(data)}, "workers": {"count": 1, "gpusPerWorker": 1},
        "optimization": {"globalBatchTokens": 512, "microBatch": 2, "steps": 3, "precision": "bf16"},
        "checkpoint": {"uri": str(tmp_path / "ckpt"), "interval": 3}}))
    env = dict(os.environ, **{LOCK_DIR_ENV: str(tmp_path / "locks")})
    cmd = [sys.executable, "-m", "llmfleet", "train", "-f", str(job)]
    others = DeviceLocks(tmp_path / "locks")
    assert all(others.acquire(d) for d in whole)
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "too few free" in refused.stderr, refused.stderr[-2000:]
    others.release(whole[-1])
    ran = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert f"training on GPU {whole[-1].id}" in ran.stdout
    assert json.loads((tmp_path / "ckpt" / "status.json").read_text())["done"]
    others.release_all()


@pytest.mark.timeout(300)
def test_a_gpu_another_program_computes_on_is_not_given_out(tmp_path: Path) -> None:
    """A program that is not llmfleet's (no claim) computes on every whole GPU: a replica waits and its event names
    the program's pid; once the program exits, the replica starts."""
    import os
    import subprocess

    from llmfleet.local.gpus import BUSY_TTL_S, LOCK_DIR_ENV

    whole = _whole_gpus()
    hog = ("import sys, time, torch; xs = [torch.ones(1, device=f'cuda:{i}') for i in range(torch.cuda.device_count())]; "
           "torch.cuda.synchronize(); print('up', flush=True); time.sleep(300)")
    notebook = subprocess.Popen([sys.executable, "-c", hog], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(d.id for d in whole),
                                         CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "busy"},
        "spec": {"model": {"path": "/m"}, "replicas": 1, "maxReplicas": 1, "drainSeconds": 1,
                 "resources": {"gpus": 1}}})
    sup = StandInSupervisor(isvc, tmp_path, prometheus=False, env={LOCK_DIR_ENV: str(tmp_path / "locks")})
    try:
        assert notebook.stdout is not None and notebook.stdout.readline().strip() == "up"
        sup.start()
        (replica,) = sup.slots["primary"]
        assert replica.proc is None, "a GPU a program computes on was given out"
        assert any(f"pid {notebook.pid}" in m or "in use by other programs" in m for _, m in sup.events), sup.events
        notebook.kill()
        notebook.wait(timeout=30)
        deadline = time.monotonic() + BUSY_TTL_S + 30
        while replica.proc is None and time.monotonic() < deadline:
            sup.reconcile()
            time.sleep(0.5)
        assert replica.proc is not None and _said(replica)[0] == whole[0].id
    finally:
        notebook.kill()
        asyncio.run(sup.stop(grace_s=0))


@pytest.mark.timeout(900)
def test_a_higher_priority_service_takes_the_gpu_a_training_run_holds_and_the_run_resumes(tmp_path: Path) -> None:
    """`llmfleet train` (priority 0) trains on the one GPU left free; a service of priority 10 wants a replica: the
    replica waits and asks, the run checkpoints and lets go, the replica starts on that GPU; once the service scales
    in, the run resumes on the GPU from its checkpoint (local GPU arbitration, gpu_arbitration.py)."""
    import os
    import signal
    import subprocess
    import threading

    import yaml

    from llmfleet.local.gpus import LOCK_DIR_ENV, DeviceLocks

    whole = _whole_gpus()
    data = _token_data(tmp_path / "data")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "metadata": {"name": "pretrain"},
        "spec": {"model": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 1024, "seqLen": 128},
                 "data": {"path": str(data)}, "workers": {"count": 1, "gpusPerWorker": 1},
                 "scheduling": {"priority": 0},
                 "optimization": {"globalBatchTokens": 512, "microBatch": 2, "steps": 1_000_000, "precision": "bf16"},
                 "checkpoint": {"uri": str(tmp_path / "ckpt"), "interval": 20}}}))
    locks = tmp_path / "locks"
    others = DeviceLocks(locks)
    assert all(others.acquire(d) for d in whole[:-1])  # every GPU but the last is another run's
    train = subprocess.Popen([sys.executable, "-m", "llmfleet", "train", "-f", str(job)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env=dict(os.environ, **{LOCK_DIR_ENV: str(locks)}))
    said: list[str] = []
    assert train.stdout is not None
    reader = threading.Thread(target=lambda: said.extend(train.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()

    def wait_for(text: str, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in said):
            assert train.poll() is None, "".join(said)[-4000:]
            assert time.monotonic() < deadline, f"no {text!r}:\n{''.join(said)[-4000:]}"
            time.sleep(0.2)

    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "annotations": {"llmfleet.io/priority": "10"}},
        "spec": {"model": {"path": "/m"}, "replicas": 1, "maxReplicas": 1, "drainSeconds": 1,
                 "resources": {"gpus": 1}}})
    sup = StandInSupervisor(isvc, tmp_path / "run", prometheus=False, env={LOCK_DIR_ENV: str(locks)})
    try:
        wait_for(f"training on GPU {whole[-1].id}")
        deadline = time.monotonic() + 300
        while not (tmp_path / "ckpt" / "status.json").exists() and time.monotonic() < deadline:
            time.sleep(0.5)  # trains for a while first
        sup.start()
        (replica,) = sup.slots["primary"]
        deadline = time.monotonic() + 300
        while replica.proc is None and time.monotonic() < deadline:
            sup.reconcile()
            time.sleep(0.5)
        assert any("asked training pretrain" in m for _, m in sup.events), sup.events
        wait_for("suspending: InferenceService chat (priority 10)")
        assert _said(replica)[0] == whole[-1].id  # the stand-in engine took 60 % of the GPU training let go of

        replica.wanted, sup.desired["primary"] = False, 0  # the service scales in
        sup.reconcile()
        assert replica.proc is not None
        replica.proc.wait(timeout=60)
        sup.reconcile()
        sup.reconcile()
        wait_for(f"resuming on GPU {whole[-1].id}")
        deadline = time.monotonic() + 300
        while "resumed from" not in "".join(said) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "resumed from" in "".join(said), "".join(said)[-4000:]  # the trainer's log: from the checkpoint
    finally:
        if train.poll() is None:  # the CLI and its trainer: the trainer checkpoints and exits
            os.killpg(train.pid, signal.SIGTERM)
            train.wait(timeout=120)
        asyncio.run(sup.stop(grace_s=0))
        others.release_all()
