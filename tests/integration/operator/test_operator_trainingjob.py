"""The real kopf operator against the emulator: TrainingJob workers, status from rank 0, restarts, suspend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import pytest
from operator_testkit import eventually, tj_manifest

from llmfleet.operator.config import OperatorConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TJ = "llmfleet.io/v1alpha1/trainingjobs"
JOBS = "batch/v1/jobs"


@pytest.fixture
async def rank0() -> AsyncIterator[tuple[dict[str, Any], str]]:
    """A stand-in for rank 0's `GET /status` (the DEVELOPERS.md contract); `doc` is served, None -> 503."""
    doc: dict[str, Any] = {}

    async def status(request: aiohttp.web.Request) -> aiohttp.web.Response:
        if not doc:
            return aiohttp.web.Response(status=503)
        return aiohttp.web.json_response(doc)

    app = aiohttp.web.Application()
    app.router.add_get("/{namespace}/{pod}/status", status)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield doc, f"http://127.0.0.1:{port}/{{namespace}}/{{pod}}/status"
    await runner.cleanup()


def _env(job: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


async def test_workers_status_restart_suspend(cluster: Any, operators: Any, rank0: Any) -> None:
    emu, _ = cluster
    doc, url = rank0
    await operators(config=OperatorConfig(status_url_template=url, status_timeout_seconds=1,
                                          timer_interval_seconds=0.5))
    await emu.put(TJ, tj_manifest())

    job = await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))
    assert emu.get("v1/services", "ml", "train")["spec"]["clusterIP"] == "None"
    assert "job.yaml" in emu.get("v1/configmaps", "ml", "train-spec")["data"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[0] == "torchrun" and "--rdzv-endpoint=train-r0-0.train:29400" in cmd
    assert _env(job)["NCCL_NVLS_ENABLE"] == "0"

    # Workers run; rank 0 reports progress; the timer copies it into the status.
    await emu.patch(JOBS, "ml", "train-r0", {"status": {"active": 2}}, "status")
    doc.update({"step": 7, "loss": 2.5, "tokensPerSecond": 1234.5, "mfu": 0.41, "hfu": 0.45,
                "lastCheckpoint": "/ckpt/step-5", "stragglers": [1], "done": False})

    def running() -> Any:
        st = emu.get(TJ, "ml", "train").get("status") or {}
        return st.get("phase") == "Running" and st.get("step") == 7 and st

    st = await eventually(running)
    assert st["loss"] == 2.5 and st["mfu"] == 0.41 and st["lastCheckpoint"] == "/ckpt/step-5"
    assert st["stragglers"] == [1]

    # Rank 0 unreachable: values kept, marked stale (Degraded=True, WorkerStatusStale).
    doc.clear()

    def stale() -> bool:
        st = emu.get(TJ, "ml", "train")["status"]
        return any(c["type"] == "Degraded" and c["reason"] == "WorkerStatusStale" for c in st["conditions"])

    await eventually(stale)
    assert emu.get(TJ, "ml", "train")["status"]["step"] == 7

    # A worker fails: the gang is recreated as attempt 1, resuming from the last checkpoint.
    await emu.patch(JOBS, "ml", "train-r0", {"status": {"active": 1, "failed": 1}}, "status")
    job1 = await eventually(lambda: emu.get(JOBS, "ml", "train-r1"))
    assert _env(job1)["LLMFLEET_ATTEMPT"] == "1" and "LLMFLEET_RESUME_FROM" not in _env(job1)
    assert "--rdzv-endpoint=train-r1-0.train:29400" in job1["spec"]["template"]["spec"]["containers"][0]["command"]
    await eventually(lambda: emu.get(JOBS, "ml", "train-r0") is None)
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"]["restarts"] == 1)
    # kopf posts Events in the background, after the status patch: poll for it.
    await eventually(lambda: [e for e in emu.list("v1/events", "ml") if e.get("reason") == "Restarting"])

    # Suspend (e.g. the autoscaler's arbitration) and resume.
    await emu.patch(TJ, "ml", "train", {"spec": {"suspend": True}})
    await eventually(lambda: emu.get(JOBS, "ml", "train-r1")["spec"]["suspend"] is True)
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"]["phase"] == "Suspended")
    await emu.patch(TJ, "ml", "train", {"spec": {"suspend": False}})
    await eventually(lambda: emu.get(JOBS, "ml", "train-r1")["spec"]["suspend"] is False)

    # Failures beyond maxRestarts (2) fail the job.
    await emu.patch(JOBS, "ml", "train-r1", {"status": {"failed": 1}}, "status")
    await eventually(lambda: emu.get(JOBS, "ml", "train-r2"))
    await emu.patch(JOBS, "ml", "train-r2", {"status": {"failed": 1}}, "status")
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"]["phase"] == "Failed")
    assert emu.get(JOBS, "ml", "train-r3") is None


async def test_kueue_queue_creates_suspended_job(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    await emu.put(TJ, tj_manifest(scheduling={"queue": "training"}))
    job = await eventually(lambda: emu.get(JOBS, "ml", "train-r0"))
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    # Kueue admits the workload by unsuspending the Job; the operator must not suspend it again.
    await emu.patch(JOBS, "ml", "train-r0", {"spec": {"suspend": False}})
    await emu.patch(TJ, "ml", "train", {"spec": {"maxRestarts": 5}})  # any spec change -> reconcile
    await eventually(lambda: emu.get(TJ, "ml", "train")["status"].get("observedGeneration") == 2)
    assert emu.get(JOBS, "ml", "train-r0")["spec"]["suspend"] is False
