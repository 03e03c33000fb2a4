"""Cache-aware scale-in: which replica to remove, and removing it without dropping a request.

`choose_victims` (pure) prefers, in order: replicas that are not ready (nothing cached, nothing
running), then the fewest hot prefix blocks that only this replica holds (the router's prefix
index: `PrefixIndex.hot_blocks_lost_if_removed`, or its gauge
`llmfleet_router_replica_exclusive_blocks{pool,replica}`), then the fewest requests in flight,
then the name (determinism). `scale_in` drains each victim through the Actuator (no new requests,
wait for in-flight ones) before removing it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from llmfleet.autoscaler.actuation import Actuator, DrainResult, ObservedReplica

if TYPE_CHECKING:
    from llmfleet.router.prefix_index import PrefixIndex


def choose_victims(
    replicas: Sequence[ObservedReplica],
    count: int,
    lost_blocks: Mapping[str, int] | None = None,
    in_flight: Mapping[str, float] | None = None,
) -> list[ObservedReplica]:
    """The `count` replicas whose removal costs least. Maps are keyed by replica URL or name."""
    lost_blocks = lost_blocks or {}
    in_flight = in_flight or {}
    # A replica the index knows nothing about (while it knows others) counts as the most expensive:
    # never evict on a guess.
    unknown_lost = float("inf") if lost_blocks else 0.0

    def get(m: Mapping[str, float] | Mapping[str, int], r: ObservedReplica, default: float) -> float:
        for key in (r.url, r.name):
            if key is not None and key in m:
                return float(m[key])
        return default

    ranked = sorted(
        replicas, key=lambda r: (r.ready, get(lost_blocks, r, unknown_lost), get(in_flight, r, 0.0), r.name)
    )
    return ranked[: max(count, 0)]


def lost_blocks_from_index(index: PrefixIndex, replicas: Sequence[ObservedReplica], hot: int | None = None) -> dict[str, int]:
    """`hot_blocks_lost_if_removed` for each replica (the router keys replicas by their base URL)."""
    out = {}
    for r in replicas:
        key = r.url or r.name
        out[key] = index.hot_blocks_lost_if_removed(key, hot=hot)
    return out


def lost_blocks_from_metrics(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], pool: str) -> dict[str, int]:
    """From parsed router metrics (llmfleet.util.prom_text.parse_samples): replica -> exclusive blocks."""
    out: dict[str, int] = {}
    for (name, labels), value in samples.items():
        if name != "llmfleet_router_replica_exclusive_blocks":
            continue
        d = dict(labels)
        if d.get("pool") == pool and "replica" in d:
            out[d["replica"]] = int(value)
    return out


def lost_blocks_of_pools(samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float],
                         pools: Sequence[str]) -> dict[str, int]:
    """`lost_blocks_from_metrics` of several pools in one map (replica keys are unique across pools)."""
    out: dict[str, int] = {}
    for pool in pools:
        out.update(lost_blocks_from_metrics(samples, pool))
    return out


async def scale_in(
    actuator: Actuator,
    pool: str,
    count: int,
    *,
    lost_blocks: Mapping[str, int] | None = None,
    in_flight: Mapping[str, float] | None = None,
    drain_timeout_s: float = 60.0,
) -> list[DrainResult]:
    """Drain-then-remove the `count` cheapest replicas of `pool`, one after the other."""
    replicas = await actuator.list_replicas(pool)
    results = []
    for victim in choose_victims(replicas, count, lost_blocks, in_flight):
        results.append(await actuator.drain_and_remove(victim, timeout_s=drain_timeout_s))
    return results
