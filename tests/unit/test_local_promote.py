"""Promotion on the local runtime: the operator's rules over supervisor slots (surge, drain, verdict, rollback)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmfleet.api import InferenceService
from llmfleet.autoscaler.actuation import ObservedReplica as ActuatorReplica
from llmfleet.local.actuator import LocalActuator
from llmfleet.local.promote import PromotionFollower, read_promotion, request_promotion, with_pool_model
from llmfleet.local.runtime import ReplicaSlot, Supervisor
from llmfleet.operator.promotion import Promotion, RolloutProgress, apply_merge_patch, rollout_state


def _isvc(student_max: int = 2) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "p"},
        "spec": {"model": {"path": "/models/primary", "servedName": "p"}, "vllm": {"blockSize": 32},
                 "replicas": 1, "maxReplicas": 1, "slo": {"ttftP95Ms": 1000},
                 "fallback": {"pools": [{"name": "student", "model": {"path": "/models/old", "servedName": "s"},
                                         "replicas": 1, "minReplicas": 1, "maxReplicas": student_max}]},
                 "autoscaling": {"policy": "static"}},
    })


async def _zero(_: ActuatorReplica) -> float:
    return 0.0


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    s = Supervisor(_isvc(), tmp_path, prometheus=False)
    # Each "replica" is a sleeping process: the follower only needs pids, readiness and the model it serves.
    s.replica_command = lambda r: [sys.executable, "-c", "import time; time.sleep(120)"]  # type: ignore[method-assign]
    yield s
    for r in s.replicas():
        if r.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                r.proc.kill()
            r.proc.wait()


def _ready(sup: Supervisor, pool: str) -> list[ReplicaSlot]:
    for r in sup.replicas(pool):
        if r.proc is not None:
            r.ready = True
    return [r for r in sup.replicas(pool) if r.proc is not None and not r.stopping]


def _promote(sup: Supervisor, model: str, metrics: dict[str, object] | None = None) -> PromotionFollower:
    """A ready student replica, then a promotion of `model` started (first follower step)."""
    sup.reconcile()
    _ready(sup, "student")
    follower = PromotionFollower(sup, LocalActuator(sup, probe=_zero))
    follower.metrics = metrics
    request_promotion(sup.run_dir, "distill", "student", model)
    asyncio.run(follower.step())
    return follower


def test_merge_patch_and_pool_model() -> None:
    assert apply_merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None, "d": 3}, "l": [2]}) == {
        "a": {"c": 2, "d": 3}, "l": [2]}
    new = with_pool_model(_isvc(), "student", "/models/new")
    assert new is not None and [p.model.path for p in new.pools()] == ["/models/primary", "/models/new"]
    assert [p.model.served_name for p in new.pools()] == ["p", "s"]
    assert with_pool_model(_isvc(), "nope", "/x") is None


def _student_metrics(ttft_ms: float) -> dict[str, object]:
    """status.metrics as live_metrics writes it: the primary's fields plus every pool's own entry."""
    return {"ttftP95Ms": 300.0, "stale": False,
            "pools": [{"name": "primary", "ttftP95Ms": 300.0, "stale": False},
                      {"name": "student", "ttftP95Ms": ttft_ms, "stale": False}]}


def test_rollout_state_from_progress() -> None:
    p = Promotion(training_job="t", pool="student", model="/new", previous="/old")
    assert rollout_state(p, 1000, None, RolloutProgress(desired=1, updated=1, ready=1, total=2))[0] == "RollingOut"
    assert rollout_state(p, 1000, None, RolloutProgress(desired=1, updated=1, ready=1, total=1))[0] == "Succeeded"
    assert rollout_state(p, 1000, None, RolloutProgress(1, 0, 0, 1, failed="stuck")) == ("RolledBack", "stuck")
    # The promoted pool's own entry decides: a burning primary does not roll the student back.
    primary_burns = {"ttftP95Ms": 1500.0, "stale": False,
                     "pools": [{"name": "primary", "ttftP95Ms": 1500.0, "stale": False},
                               {"name": "student", "ttftP95Ms": 200.0, "stale": False}]}
    assert rollout_state(p, 1000, primary_burns, RolloutProgress(1, 1, 1, 1))[0] == "Succeeded"
    bad = {"ttftP95Ms": 200.0, "stale": False, "pools": [{"name": "student", "ttftP95Ms": 1500.0, "stale": False}]}
    assert rollout_state(p, 1000, bad, RolloutProgress(1, 1, 1, 1))[0] == "RolledBack"


def test_promotion_surges_then_drains_then_succeeds(sup: Supervisor) -> None:
    sup.reconcile()
    (old,) = _ready(sup, "student")
    assert old.model == "/models/old"
    follower = PromotionFollower(sup, LocalActuator(sup, probe=_zero))
    follower.metrics = _student_metrics(400.0)
    request_promotion(sup.run_dir, "distill", "student", "/models/new")

    asyncio.run(follower.step())  # start + surge: a second slot on the new model, the old one still serves
    promo = read_promotion(sup.run_dir)
    assert promo is not None and promo.state == "RollingOut" and promo.previous == "/models/old"
    assert promo.baseline_ttft_ms == 400.0
    running = [r for r in sup.replicas("student") if r.proc is not None]
    assert sorted(r.model for r in running) == ["/models/new", "/models/old"]
    assert sup.desired["student"] == 1 and sup.surge == {"student": 1}
    # The autoscaler does not see the surge replica (a Deployment's maxSurge pod is not in spec.replicas).
    assert [r.name for r in asyncio.run(follower.actuator.list_replicas("student"))] == ["student-0"]

    asyncio.run(follower.step())  # the surge replica is not ready yet: nothing is drained
    assert not old.stopping
    _ready(sup, "student")
    asyncio.run(follower.step())  # ready -> the old replica is drained and stopped -> every replica is updated
    assert old.stopping and not old.wanted and sup.desired["student"] == 1 and not sup.surge
    promo = read_promotion(sup.run_dir)
    assert promo is not None and promo.state == "Succeeded", promo
    assert any("promotion succeeded" in m for _, m in sup.events)


def test_a_removed_surge_replica_is_started_again(sup: Supervisor) -> None:
    follower = _promote(sup, "/models/new")
    surge = next(r for r in sup.replicas("student") if r.model == "/models/new")
    surge.wanted = False  # e.g. removed by someone else while starting
    sup.surge.clear()
    sup.reconcile()
    if surge.proc is not None:
        surge.proc.wait(timeout=10)
    sup.reconcile()
    asyncio.run(follower.step())  # no replacement running: the rollout surges again
    assert sup.surge == {"student": 1}
    assert any(r.model == "/models/new" and r.proc is not None and not r.stopping for r in sup.replicas("student"))


def test_promotion_rolls_back_on_an_slo_regression(sup: Supervisor) -> None:
    follower = _promote(sup, "/models/new", _student_metrics(400.0))
    follower.metrics = _student_metrics(2500.0)  # the student pool over the 1000 ms SLO during the rollout
    asyncio.run(follower.step())
    promo = read_promotion(sup.run_dir)
    assert promo is not None and promo.state == "RolledBack" and "SLO" in promo.message
    assert sup.pools["student"].model.path == "/models/old"  # the spec is back; converge replaces new replicas


def test_a_crash_looping_new_model_is_rolled_back(sup: Supervisor) -> None:
    follower = _promote(sup, "/models/broken")
    surge = next(r for r in sup.replicas("student") if r.model == "/models/broken")
    surge.restarts = 3  # what the supervisor counts when the engine keeps exiting
    asyncio.run(follower.step())
    promo = read_promotion(sup.run_dir)
    assert promo is not None and promo.state == "RolledBack" and "crashed 3 times" in promo.message
    assert sup.pools["student"].model.path == "/models/old"


def test_promotion_into_a_missing_pool_is_refused(sup: Supervisor) -> None:
    follower = PromotionFollower(sup, LocalActuator(sup, probe=_zero))
    request_promotion(sup.run_dir, "distill", "nope", "/models/new")
    asyncio.run(follower.step())
    promo = read_promotion(sup.run_dir)
    assert promo is not None and promo.state == "RolledBack" and "no pool 'nope'" in promo.message


def test_on_a_full_gpu_machine_the_old_replica_goes_before_the_new_one_starts(tmp_path: Path) -> None:
    """A surge replica needs a free device: with the student's only GPU held by the old replica, the rollout drains
    the old one first and the new one starts on the GPU it released (gpus.py)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)'\n")
    smi.chmod(0o755)
    isvc = _isvc().model_copy(deep=True)
    isvc.spec.fallback.pools[0].resources.gpus = 1
    s = Supervisor(isvc, tmp_path / "run", prometheus=False, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LLMFLEET_DEVICE_LOCKS": str(tmp_path / "locks")})
    # Replicas that take the drain's SIGTERM as a draining engine does (they go when killed here): one that exited
    # at once could be replaced within the rollout's own step, before the test looks.
    s.replica_command = lambda r: [  # type: ignore[method-assign]
        sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', "
                              "flush=True); time.sleep(120)"]
    try:
        s.reconcile()
        (first,) = [r for r in s.replicas("student") if r.proc is not None]
        deadline = time.monotonic() + 20
        while "up" not in Path(first.log).read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        follower = _promote(s, "/models/new")
        (old,) = [r for r in s.replicas("student") if r.proc is not None]
        assert not s.surge and old.stopping and old.devices == ["0"] and old.model == "/models/old"
        assert old.proc is not None
        old.proc.kill()
        old.proc.wait(timeout=10)
        s.reconcile()  # the drained slot is taken again (desired is unchanged) on the new model and the same GPU
        (new,) = [r for r in s.replicas("student") if r.proc is not None]
        assert new.devices == ["0"] and new.model == "/models/new" and not new.stopping
        assert follower.promotion is not None and follower.promotion.state == "RollingOut"
    finally:
        for r in s.replicas():
            if r.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    r.proc.kill()
                r.proc.wait()
