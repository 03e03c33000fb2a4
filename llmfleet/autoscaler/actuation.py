"""Actuation: turning a Decision into replicas.

`Actuator` is the one interface the autoscaler loop talks to. Two implementations:
- `KubernetesActuator` (llmfleet.autoscaler.kube): writes `spec.replicas` (primary) and `spec.fallback.pools[i].replicas`
  (students) of the InferenceService with a JSON patch guarded by `test` ops, and the policy memory
  (last action time = cooldown, learned capacity, measured cold start) into the annotation
  `llmfleet.io/autoscaler-state`. The operator turns spec replicas into pods; the scale subresource
  (`spec.replicas`/`status.replicas`) stays the primary's. Scale-in of a chosen pod: label it
  `llmfleet.io/serving=false` (out of the Service's endpoints: the router stops sending it new requests), wait until its in-flight requests finish
  (its `/metrics`), give it the lowest `controller.kubernetes.io/pod-deletion-cost`, then decrement
  replicas so the ReplicaSet deletes exactly that pod.
- the local runtime's actuator (llmfleet/local), which starts/stops replica processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from llmfleet.api.inferenceservice import PRIMARY_POOL
from llmfleet.util.prom_text import parse_samples


@dataclass(frozen=True)
class ObservedReplica:
    """One serving replica as the autoscaler sees it."""

    pool: str
    name: str  # pod name, or the local runtime's replica id
    url: str | None = None  # OpenAI base URL, e.g. http://10.0.0.5:8000
    ready: bool = True


@dataclass(frozen=True)
class DrainResult:
    """How a drain-then-remove went."""

    replica: ObservedReplica
    drained: bool  # in-flight reached 0 before the timeout
    removed: bool
    waited_s: float
    in_flight_at_removal: float | None = None


@runtime_checkable
class Actuator(Protocol):
    """What the autoscaler needs from a runtime (Kubernetes, local processes, the simulator)."""

    async def list_replicas(self, pool: str) -> list[ObservedReplica]:
        """Current replicas of `pool`."""
        ...

    async def set_replicas(self, desired: Mapping[str, int], *, reason: str, state_json: str | None = None) -> None:
        """Ask for `desired[pool]` replicas (scale-up, or scale-in of unspecified replicas).

        `state_json` is the policy memory to persist with it (Kubernetes: an annotation).
        """
        ...

    async def drain_and_remove(self, replica: ObservedReplica, *, timeout_s: float) -> DrainResult:
        """Stop new requests to `replica`, wait for its in-flight requests (<= timeout_s), then remove it
        and lower its pool's desired replicas by one."""
        ...


InFlightProbe = Callable[[ObservedReplica], Awaitable[float | None]]


async def wait_drained(
    replica: ObservedReplica, probe: InFlightProbe, *, timeout_s: float, poll_s: float = 0.5
) -> tuple[bool, float, float | None]:
    """Poll `probe` until the replica has no request in flight; returns (drained, waited_s, last_value).

    A probe that cannot answer (None) counts as "not drained yet": we never remove a replica on a guess.
    """
    start = time.monotonic()
    last: float | None = None
    while True:
        last = await probe(replica)
        waited = time.monotonic() - start
        if last is not None and last <= 0:
            return True, waited, last
        if waited >= timeout_s:
            return False, waited, last
        await asyncio.sleep(min(poll_s, max(timeout_s - waited, 0.01)))


async def scrape_in_flight(replica: ObservedReplica, *, timeout_s: float = 2.0) -> float | None:
    """Running + waiting requests of a vLLM-compatible replica, from its Prometheus /metrics."""
    if not replica.url:
        return None
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            resp = await client.get(replica.url.rstrip("/") + "/metrics")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        samples = parse_samples(resp.text)
    except ValueError:
        return None
    load = [v for (name, _), v in samples.items() if name in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
    return sum(load) if load else None


def replicas_patch(spec: Mapping[str, Any], desired: Mapping[str, int]) -> list[dict[str, Any]]:
    """JSON patch that sets the replicas of the named pools, with `test` ops pinning each student's index."""
    ops: list[dict[str, Any]] = []
    for pool, n in sorted(desired.items()):
        if pool == PRIMARY_POOL:
            ops.append({"op": "replace" if "replicas" in spec else "add", "path": "/spec/replicas", "value": int(n)})
            continue
        students = (spec.get("fallback") or {}).get("pools") or []
        index = next((i for i, p in enumerate(students) if p.get("name") == pool), None)
        if index is None:
            raise KeyError(f"no pool {pool!r} in spec.fallback.pools")
        ops.append({"op": "test", "path": f"/spec/fallback/pools/{index}/name", "value": pool})
        op = "replace" if "replicas" in students[index] else "add"
        ops.append({"op": op, "path": f"/spec/fallback/pools/{index}/replicas", "value": int(n)})
    return ops
