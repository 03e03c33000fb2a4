"""The router's small endpoints: models, metrics, health, replica debug view, admin (drain, held requests).

Served by both front ends (the router's own HTTP server calls them with a stand-in for aiohttp's request).
`Router` (server.py) inherits them and provides the state they read.
"""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llmfleet.router.held import HeldRequests
from llmfleet.router.metrics import RouterMetrics
from llmfleet.router.requests import RequestError, decode_json_body
from llmfleet.router.respond import error_body


def error_response(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(message, type_, code), status=status, headers=headers)


class SmallEndpoints:
    """The non-proxied routes, as aiohttp handlers."""

    pools: dict[str, Any]  # server.PoolRuntime
    model_to_pool: dict[str, str]
    adapters: dict[str, tuple[str, str]]
    metrics: RouterMetrics
    held: HeldRequests
    async def _models(self, request: web.Request) -> web.Response:
        data = []
        for name, pool in self.model_to_pool.items():
            card = {"id": name, "object": "model", "created": 0, "owned_by": "llmfleet", "root": name, "pool": pool}
            if name in self.adapters:  # a LoRA adapter: its base model is the pool's, as vLLM lists it
                card |= {"root": self.adapters[name][1], "parent": self.pools[pool].served_name}
            data.append(card)
        return web.json_response({"object": "list", "data": data})

    async def _metrics(self, request: web.Request) -> web.Response:
        for pool in self.pools.values():
            for r in pool.replicas.replicas.values():
                self.metrics.child(self.metrics.exclusive_blocks, pool.name, r.id).set(pool.index.hot_blocks_lost_if_removed(r.id))
                # Set at scrape time from the replica's own counter: no gauge update on the request path.
                self.metrics.child(self.metrics.in_flight, pool.name, r.id).set(r.in_flight)
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, request: web.Request) -> web.Response:
        # `routable` is each pool's count as the router sees it: a supervisor waits for the pools it wants,
        # since the router's health checks lag the replicas' own readiness by up to a scrape interval.
        routable = {name: len(p.replicas.routable()) for name, p in self.pools.items()}
        if any(routable.values()):
            return web.json_response({"status": "ok", "routable": routable})
        # A pool at zero replicas that scales from zero is not an outage: the router must stay ready (in its
        # Service) to take the requests that wake the autoscaler, and holds them.
        if any(p.replicas.pool.scales_from_zero for p in self.pools.values()):
            return web.json_response({"status": "scaling from zero", "routable": routable})
        return web.json_response({"status": "no routable replica", "routable": routable}, status=503)

    async def _debug_replicas(self, request: web.Request) -> web.Response:
        out = []
        for pool in self.pools.values():
            for r in pool.replicas.replicas.values():
                out.append({"pool": pool.name, "replica": r.id, "healthy": r.healthy, "draining": r.draining,
                            "ejected": r.id in pool.replicas.outliers.ejected,
                            "stale": r.stale, "running": r.running, "waiting": r.waiting, "kvUsage": r.kv_usage,
                            "inFlight": r.in_flight, "adapters": sorted(r.adapters),
                            "indexedBlocks": pool.index.blocks_of(r.id),
                            "exclusiveBlocks": pool.index.hot_blocks_lost_if_removed(r.id)})
        return web.json_response({"replicas": out})

    async def _admin_drain(self, request: web.Request) -> web.Response:
        token = os.environ.get("LLMFLEET_ROUTER_ADMIN_TOKEN")
        if token is not None:
            if request.headers.get("x-llmfleet-admin-token") != token:
                return error_response(403, "admin token required", "permission_error")
        elif request.remote not in ("127.0.0.1", "::1"):
            return error_response(403, "admin endpoints are loopback-only without LLMFLEET_ROUTER_ADMIN_TOKEN",
                                  "permission_error")
        try:
            body = decode_json_body(await request.read())
            url, draining = str(body["replica"]), bool(body.get("draining", True))
        except (RequestError, KeyError, TypeError, AttributeError):
            return error_response(400, 'body must be {"replica": "<url>", "draining": true|false}')
        if not any(p.replicas.set_draining(url, draining) for p in self.pools.values()):
            return error_response(404, f"no replica {url}", code="replica_not_found")
        return web.json_response({"replica": url, "draining": draining})

    async def _admin_held(self, request: web.Request) -> web.Response:
        """Long poll for the autoscaler (llmfleet.router.held): {"held": {pool: n}, "episode": e}, and "burst":
        {"rate": r, "windowS": w} when an arrival burst began after episode `since`."""
        try:
            wait = min(max(float(request.query.get("wait", "0")), 0.0), 60.0)
            since = int(request.query.get("since", "-1"))
        except ValueError:
            return error_response(400, "wait (seconds) and since (an episode number) must be numbers")
        held, episode = await self.held.wait_held(since, wait)
        burst = self.held.burst_since(since)
        return web.json_response({"held": held, "episode": episode} | ({"burst": burst} if burst else {}))

    async def not_found(self, request: web.Request) -> web.Response:
        known = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health"}
        if request.path in known:
            return error_response(405, f"method {request.method} not allowed on {request.path}")
        return error_response(404, f"no route {request.method} {request.path}", code="not_found")


__all__ = ["SmallEndpoints", "error_response"]
