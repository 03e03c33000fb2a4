"""Model promotion on the local runtime: the operator's promotion logic, with supervisor slots as the replicas.

`llmfleet train` (a TrainingJob with `output.promoteTo`) writes `<run>/promotion-request.json` into the
run folder of the running `llmfleet up`. The supervisor's `PromotionFollower` then does what the operator's
two reconciles do (llmfleet.operator.promotion):

1. start: `start_promotion` (the live metrics, `live_metrics` of the autoscaler's signals, are the
   baseline) and `pool_model_patch` applied to the running InferenceService;
2. roll out, one replica at a time: with a free slot, a surge replica on the new model starts, and once
   it is ready an old one is drained (router `/admin/drain`, in-flight requests finish) and stopped
   (maxSurge 1, maxUnavailable 0); with no free slot an old one is drained first;
3. watch: every tick `rollout_state` with the live metrics and the pool's RolloutProgress; on a
   TTFT-SLO or error-rate regression the previous model is patched back and rolled out the same way.

The promotion's state is written to `<run>/promotion.json` (the operator's annotation, as JSON) and
reported as supervisor events.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.autoscaler.actuation import ObservedReplica as ActuatorReplica
from llmfleet.autoscaler.live_metrics import live_metrics
from llmfleet.local.actuator import LocalActuator
from llmfleet.local.runtime import ReplicaSlot, Supervisor
from llmfleet.operator.promotion import (
    Promotion,
    RolloutProgress,
    apply_merge_patch,
    pool_model,
    pool_model_patch,
    rollout_state,
    start_promotion,
)

REQUEST_FILE = "promotion-request.json"
PROMOTION_FILE = "promotion.json"
FINAL_STATES = ("Succeeded", "RolledBack")
# Local counterparts of a Deployment's progressDeadlineSeconds (600 s by default) for a rollout that cannot
# finish: the new model's replica keeps crashing, or the rollout takes longer than this.
CRASH_LIMIT = 3
PROGRESS_DEADLINE_S = 600.0


def request_promotion(run_dir: Path, training_job: str, pool: str, model: str) -> Path:
    """Ask the supervisor of `run_dir` to promote `model` into `pool` (what the TrainingJob reconcile starts)."""
    path = run_dir / REQUEST_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"trainingJob": training_job, "pool": pool, "model": model}))
    tmp.replace(path)
    (run_dir / PROMOTION_FILE).unlink(missing_ok=True)
    return path


def read_promotion(run_dir: Path) -> Promotion | None:
    try:
        return Promotion(**json.loads((run_dir / PROMOTION_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def with_pool_model(isvc: InferenceService, pool: str, model: str) -> InferenceService | None:
    """`isvc` with `pool`'s model path replaced (the operator's merge patch, applied here); None: no such pool."""
    body = isvc.model_dump(by_alias=True, exclude_none=True, mode="json")
    patch = pool_model_patch(body, pool, model)
    if patch is None:
        return None
    patch.pop("metadata", None)  # resourceVersion guards the API server's list replacement; nothing to guard here
    return InferenceService.model_validate(apply_merge_patch(body, patch))


class PromotionFollower:
    """Starts, rolls out and watches promotions for one Supervisor; `metrics` is fed by the autoscaler loop."""

    def __init__(self, sup: Supervisor, actuator: LocalActuator | None = None) -> None:
        self.sup = sup
        self.actuator = actuator or LocalActuator(sup)
        self.metrics: dict[str, Any] | None = None
        self.promotion: Promotion | None = read_promotion(sup.run_dir)
        self._started_at: float | None = None

    def observe(self, signals: Any) -> None:
        """The autoscaler's signals of one step -> the live metrics (the operator's status.metrics)."""
        self.metrics = live_metrics(signals, _now_iso())

    # -- start -------------------------------------------------------------------------------------------
    def _start(self, request: dict[str, Any]) -> None:
        pool, model, job = str(request.get("pool", "")), str(request.get("model", "")), str(request.get("trainingJob", ""))
        body = self.sup.isvc.model_dump(by_alias=True, exclude_none=True, mode="json")
        previous = pool_model(body, pool)
        if previous is None or not model:
            promo = Promotion(training_job=job, pool=pool, model=model, previous="", state="RolledBack",
                              message=f"InferenceService {self.sup.isvc.metadata.name} has no pool {pool!r}"
                              if previous is None else "no model path in the request")
            self._save(promo)
            self.sup.event(f"promotion refused: {promo.message}")
            return
        promo = start_promotion(job, pool, model, previous, self.metrics, _now_iso())
        self._started_at = time.time()
        self._set_model(pool, model)
        self._save(promo)
        base = f", baseline TTFT p95 {promo.baseline_ttft_ms:.0f} ms" if promo.baseline_ttft_ms is not None else ""
        self.sup.event(f"promotion: rolling {model} out to pool {pool} (was {previous}), from TrainingJob {job}{base}")

    def _set_model(self, pool: str, model: str) -> None:
        isvc = with_pool_model(self.sup.isvc, pool, model)
        if isvc is not None:
            self.sup.isvc = isvc
            self.sup.pools = {p.name: p for p in isvc.pools()}

    def _save(self, promo: Promotion) -> None:
        self.promotion = promo
        tmp = self.sup.run_dir / (PROMOTION_FILE + ".tmp")
        tmp.write_text(promo.to_annotation())
        tmp.replace(self.sup.run_dir / PROMOTION_FILE)

    # -- roll out ----------------------------------------------------------------------------------------
    def progress(self, pool: str) -> RolloutProgress:
        target = self.sup.pools[pool].model.path
        running = [r for r in self.sup.replicas(pool) if r.proc is not None and not r.stopping]
        failed = None
        crashing = [r for r in self.sup.replicas(pool) if r.wanted and r.model == target and r.restarts >= CRASH_LIMIT]
        if crashing:
            failed = f"the new model's replica {crashing[0].name} crashed {crashing[0].restarts} times (log {crashing[0].log})"
        elif self._started_at is not None and time.time() - self._started_at > PROGRESS_DEADLINE_S:
            failed = f"the new model's replicas did not become ready in {PROGRESS_DEADLINE_S:.0f} s"
        return RolloutProgress(desired=self.sup.desired[pool], updated=sum(r.model == target for r in running),
                               ready=sum(r.ready for r in running), total=len(running), failed=failed)

    async def converge(self, pool: str) -> None:
        """One step of replacing `pool`'s replicas that run another model than the spec's, one at a time."""
        target = self.sup.pools[pool].model.path
        running = [r for r in self.sup.replicas(pool) if r.proc is not None and not r.stopping]
        stale = [r for r in running if r.model != target]
        fresh = [r for r in running if r.model == target]
        surging = self.sup.surge.get(pool, 0) > 0
        if not stale:
            self.sup.surge.pop(pool, None)
            return
        if surging and not fresh and not any(r.wanted and r.proc is None for r in self.sup.replicas(pool)):
            self.sup.surge.pop(pool, None)  # the surge replica is gone (crashed, or removed): start over
            return
        if any(not r.ready for r in fresh):
            return  # the replacement is still starting
        if surging:
            if fresh:  # the surge replica is ready: an old one goes, and the surge becomes a regular replica
                await self._drain(stale[0], target)
                self.sup.surge.pop(pool, None)
                self.sup.desired[pool] += 1  # drain_and_remove lowered it; the replica count is unchanged
            return
        free = [r for r in self.sup.replicas(pool) if r.proc is None and not r.wanted]
        # A surge replica needs a slot and, on GPUs, a free device: on a full machine the old replica goes first.
        if free and self.sup.devices_free_for(pool):
            self.sup.surge[pool] = 1
            self.sup.event(f"promotion: surge replica in pool {pool} on {target}")
        else:
            await self._drain(stale[0], target)
            self.sup.desired[pool] += 1
        self.sup.reconcile()

    async def _drain(self, r: ReplicaSlot, target: str) -> None:
        self.sup.event(f"promotion: draining {r.name} ({r.model}), replaced by {target}")
        await self.actuator.drain_and_remove(ActuatorReplica(pool=r.pool, name=r.name, url=r.url, ready=r.ready),
                                             timeout_s=float(self.sup.isvc.spec.drain_seconds))

    # -- the loop ----------------------------------------------------------------------------------------
    async def step(self) -> None:
        request = self.sup.run_dir / REQUEST_FILE
        if request.exists() and (self.promotion is None or self.promotion.state in FINAL_STATES):
            try:
                data = json.loads(request.read_text())
            except (OSError, ValueError):
                data = {}
            request.unlink(missing_ok=True)
            self._start(data if isinstance(data, dict) else {})
        for pool in list(self.sup.pools):
            await self.converge(pool)
        promo = self.promotion
        if promo is None or promo.state != "RollingOut" or promo.pool not in self.sup.pools:
            return
        slo = self.sup.isvc.spec.slo
        state, message = rollout_state(promo, slo.ttft_p95_ms, self.metrics, self.progress(promo.pool),
                                       slo_tpot_ms=slo.tpot_p95_ms)
        if (state, message) == (promo.state, promo.message):
            return
        promo.state, promo.message = state, message
        if state == "RolledBack":
            self._set_model(promo.pool, promo.previous)
            self.sup.event(f"promotion rolled back: pool {promo.pool} back to {promo.previous}: {message}")
        elif state == "Succeeded":
            self.sup.event(f"promotion succeeded: {message}")
        self._save(promo)

    async def run(self, stop: asyncio.Event, tick_s: float = 1.0) -> None:
        while not stop.is_set():
            await self.step()
            try:
                await asyncio.wait_for(stop.wait(), timeout=tick_s)
            except TimeoutError:
                pass


def wait_promotion(run_dir: Path, timeout_s: float, on_change: Any = None) -> Promotion | None:
    """Poll `<run>/promotion.json` until a final state (or the timeout); None when it never started."""
    deadline = time.monotonic() + timeout_s
    last: tuple[str, str] | None = None
    promo = None
    while time.monotonic() < deadline:
        promo = read_promotion(run_dir)
        if promo is not None:
            if on_change is not None and (promo.state, promo.message) != last:
                on_change(promo)
            last = (promo.state, promo.message)
            if promo.state in FINAL_STATES:
                return promo
        time.sleep(1.0)
    return promo
