"""The autoscaler's Actuator for the local runtime: replicas are processes of the Supervisor."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from llmfleet.autoscaler.actuation import (
    DrainResult,
    InFlightProbe,
    ObservedReplica,
    scrape_in_flight,
    wait_drained,
)
from llmfleet.local.runtime import Supervisor


class LocalActuator:
    """Implements llmfleet.autoscaler.actuation.Actuator over a Supervisor's slots.

    Scale-up/down changes `supervisor.desired`; the supervisor's reconcile starts or drains processes.
    `drain_and_remove` takes the replica out of the router (its /admin/drain endpoint), waits for its
    in-flight requests (vLLM's running + waiting gauges), then stops exactly that slot.
    """

    def __init__(self, supervisor: Supervisor, *, probe: InFlightProbe | None = None) -> None:
        self.sup = supervisor
        self._probe = probe or scrape_in_flight

    async def list_replicas(self, pool: str) -> list[ObservedReplica]:
        # A wanted slot waiting for a GPU is a replica that is not ready, as a Pending pod is on Kubernetes.
        live = [r for r in self.sup.replicas(pool)
                if (r.proc is not None and not r.stopping) or (r.wanted and r.waiting_for is not None)]
        surge = self.sup.surge.get(pool, 0)
        if surge:  # a rollout's surge replicas (the newest) are not the autoscaler's, as on Kubernetes
            live = sorted(live, key=lambda r: r.started_at or 0.0)[:max(0, len(live) - surge)]
        return [ObservedReplica(pool=r.pool, name=r.name, url=r.url, ready=r.ready) for r in live]

    async def set_replicas(self, desired: Mapping[str, int], *, reason: str, state_json: str | None = None) -> None:
        for pool, n in desired.items():
            if pool not in self.sup.slots:
                raise KeyError(f"no pool {pool!r} in InferenceService {self.sup.isvc.metadata.name}")
            n = max(0, min(int(n), len(self.sup.slots[pool])))
            if n != self.sup.desired[pool]:
                self.sup.event(f"autoscaler: {pool} {self.sup.desired[pool]} -> {n} replicas ({reason})")
                self.sup.desired[pool] = n
                for r in self.sup.slots[pool]:
                    if not r.wanted:
                        await self._router_drain(r.url, False)  # a slot coming back must be routable again
        if state_json is not None:
            (self.sup.run_dir / "autoscaler-state.json").write_text(state_json)
        self.sup.reconcile()

    async def drain_and_remove(self, replica: ObservedReplica, *, timeout_s: float) -> DrainResult:
        slot = next((r for r in self.sup.replicas(replica.pool) if r.name == replica.name), None)
        if slot is None:
            return DrainResult(replica=replica, drained=False, removed=False, waited_s=0.0)
        await self._router_drain(slot.url, True)

        async def probe(r: ObservedReplica) -> float | None:
            # A replica that never passed /health (or never started: it waits for a GPU) was never routed to:
            # nothing can be in flight, and its engine (not up yet) cannot answer /metrics.
            if not slot.ready and (slot.proc is None or slot.proc.poll() is None):
                return 0.0
            return await self._probe(r)

        drained, waited, last = await wait_drained(replica, probe, timeout_s=timeout_s)
        slot.wanted = False
        self.sup.desired[replica.pool] = max(0, self.sup.desired[replica.pool] - 1)
        self.sup.event(f"removed {replica.name} after {waited:.1f}s drain ({'clean' if drained else 'timeout'})")
        self.sup.reconcile()
        return DrainResult(replica=replica, drained=drained, removed=True, waited_s=waited, in_flight_at_removal=last)

    async def _router_drain(self, url: str, draining: bool) -> None:
        import httpx

        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=2.0) as client:
                await client.post(self.sup.url + "/admin/drain", json={"replica": url, "draining": draining})

