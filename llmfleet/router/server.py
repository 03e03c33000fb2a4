"""The router: OpenAI API in, the chosen replica out, metrics and a request log.

Per request: API key + token bucket -> size limit -> parse -> model -> pool (feature-store lookup, fallback
policy) -> prefix keys -> plugin pipeline -> upstream, retried on another replica while nothing has been sent
to the client. `serve` is the proxy path for both front ends: the router's own HTTP server (`http_server.py`,
what `llmfleet router` runs) and `app`, an aiohttp application with the same routes. The handler is cancelled
when the client goes away, which closes the upstream connection, so vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llmfleet.kube.client import KubeClient, NoClusterConfig
from llmfleet.router import dispatch
from llmfleet.router.accounting import Accounting, RequestContext
from llmfleet.router.adapters import AdapterLoader, AdapterLoadFailed, ConfigFile, adapter_table
from llmfleet.router.block_keys import load_tokenizer
from llmfleet.router.burst import ArrivalBurst
from llmfleet.router.chat_template import ChatTemplate
from llmfleet.router.config import RouterConfig
from llmfleet.router.endpoints import SmallEndpoints, error_response
from llmfleet.router.fallback import FallbackPolicy, FallbackSignals, pool_prefill_wait_ms
from llmfleet.router.held import HeldRequests, HoldRejected
from llmfleet.router.kv_events import KVEventSubscribers
from llmfleet.router.metrics import RouterMetrics
from llmfleet.router.plugins import build_pipeline
from llmfleet.router.plugins.base import Pipeline, ReplicaState, RequestInfo
from llmfleet.router.prefix_index import PrefixIndex
from llmfleet.router.prompt_tokens import PromptBlocks
from llmfleet.router.proxy import Upstream, UpstreamFailed, upstream_api_key
from llmfleet.router.replicas import PoolReplicas
from llmfleet.router.request_log import RequestLog
from llmfleet.router.requests import Endpoint, ParsedRequest, RequestError, parse_request
from llmfleet.router.respond import AiohttpResponder, ClientRequest, Responder, error_body, send_json
from llmfleet.router.store_response import lookup_response
from llmfleet.router.tenants import AuthError, Tenants

log = logging.getLogger("llmfleet.router")
LONG_PROMPT_CHARS = 4096
PREFIX_SCORERS = ("prefix-cache", "estimated-ttft")  # scorers that read the prompt's prefix-index keys
PROXIED: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}  # POST
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class PoolRuntime:
    name: str
    role: str
    served_name: str
    max_model_len: int | None
    replicas: PoolReplicas
    index: PrefixIndex
    blocks: PromptBlocks
    pipeline: Pipeline
    kv_events: KVEventSubscribers | None = None
    chat_template: ChatTemplate | None = None  # with a tokenizer: chat keys from the engine's own prompt
    # Looked up once for the hot path: (affinity hits, prefix blocks hit, prefix blocks missed) counter children,
    # and the session scorer (which replica it pinned).
    affinity_counters: tuple[Any, Any, Any] = (None, None, None)
    session_scorer: Any = None

    def __post_init__(self) -> None:
        self.session_scorer = next((s for s, _ in self.pipeline.scorers if s.name == "session-affinity"), None)


class Router(SmallEndpoints):
    def __init__(self, cfg: RouterConfig, lookup: Any | None = None, config_path: str | None = None) -> None:
        self.cfg = cfg
        # header names as the proxy path looks them up (ClientRequest: lower-case)
        self._class_header = cfg.fallback.class_header.lower()
        self._session_header = cfg.session_affinity_header.lower() if cfg.session_affinity_header else None
        self._opt_out_header = cfg.feature_store.opt_out_header.lower()
        self._upstream_key = upstream_api_key(cfg)  # first: a missing key stops the router before it listens
        # re-read for adapter changes (a ConfigMap update, `llmfleet up`)
        self._config_file = ConfigFile(config_path) if config_path else None
        self.metrics = RouterMetrics()
        self.held = HeldRequests(cfg.limits.max_held_requests,
                                 gauge=lambda pool: self.metrics.child(self.metrics.held_requests, pool))
        self.burst = ArrivalBurst(rearm_s=cfg.burst_rearm_seconds)  # wakes the autoscaler too (held.burst)
        self.tenants = Tenants(cfg.tenants)
        self.policy = FallbackPolicy(cfg.fallback, cfg.slo, self.tenants.caps())
        self._tenants_version = self.tenants.version
        self.lookup = lookup
        self.pools: dict[str, PoolRuntime] = {}
        self.model_to_pool: dict[str, str] = {}
        use_prefix = any(cfg.scorers.get(name, 0) > 0 for name in PREFIX_SCORERS)
        for i, p in enumerate(cfg.pools):
            index = PrefixIndex(max_blocks=cfg.max_index_blocks)
            tok = load_tokenizer(p.tokenizer_path or p.model_path) if use_prefix and p.prefix_mode != "text" else None
            if p.prefix_mode == "tokens" and tok is None:
                raise ValueError(f"pool {p.name}: prefixMode tokens but no tokenizer.json at "
                                 f"{p.tokenizer_path or p.model_path}")
            m = self.metrics
            self.pools[p.name] = PoolRuntime(
                name=p.name, role=p.role, served_name=p.served_names[0], max_model_len=p.max_model_len,
                replicas=PoolReplicas(p, cfg.limits, on_removed=self._replica_removed_hook(index),
                                      on_capacity=index.set_capacity, outliers=cfg.outliers),
                index=index, blocks=PromptBlocks(p.block_size, tok),
                pipeline=build_pipeline(cfg.scorers, index, seed=cfg.seed + i, session_bytes=cfg.session_affinity_bytes,
                                        measure_prefill_rate=cfg.measure_prefill_rate,
                                        pool_prefill_rates={p.name: p.prefill_tokens_per_s}
                                        if p.prefill_tokens_per_s else None,
                                        sole_holder_discount=cfg.sole_holder_discount,
                                        eviction_cost=cfg.eviction_cost,
                                        ttft_objective_s=cfg.slo.ttft_p95_ms / 1e3),
                chat_template=ChatTemplate.from_tokenizer_dir(p.tokenizer_path or p.model_path, tok) if tok else None,
                affinity_counters=(m.child(m.affinity_hits, p.name), m.child(m.prefix_blocks, p.name, "true"),
                                   m.child(m.prefix_blocks, p.name, "false")),
            )
            if (p.kv_events_port is not None or p.kv_events_endpoints) and use_prefix:
                self.pools[p.name].kv_events = KVEventSubscribers(
                    index, p.kv_events_port, p.block_size,
                    on_events=self.metrics.child(self.metrics.kv_events, p.name).inc, endpoints=p.kv_events_endpoints)
            for name in p.served_names:
                self.model_to_pool.setdefault(name, p.name)
        self.adapters: dict[str, tuple[str, str]] = {}  # adapter name -> (pool, lora_path)
        self.adapter_loader = AdapterLoader(cfg.limits.request_timeout_seconds,
                                            on_load=lambda a, o: self.metrics.child(self.metrics.adapter_loads, a, o).inc())
        self.set_adapters(cfg)
        self.use_prefix = use_prefix
        self.request_log = RequestLog(cfg.request_log, cfg.log_prompts) if cfg.request_log else None
        self.accounting = Accounting(self.metrics, self.policy, self.request_log,
                                     primary_pools=[p.name for p in cfg.pools if p.role == "primary"],
                                     replica_pools=[p.name for p in cfg.pools],
                                     outliers={name: p.replicas.outliers for name, p in self.pools.items()})
        self.upstream: Upstream | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.app = self._build_app()

    def _replica_removed_hook(self, index: PrefixIndex) -> Callable[[str], None]:
        def removed(replica_id: str) -> None:
            index.remove_replica(replica_id)
            self.adapter_loader.forget(replica_id)
            if self.upstream is not None:
                self.upstream.client.forget(replica_id)  # close its idle keep-alive connections

        return removed

    # -- lifecycle ----------------------------------------------------------------------------------------
    def small_routes(self) -> dict[str, tuple[str, Handler]]:
        """path -> (method, handler) of every route but the proxied ones (PROXIED); `not_found` answers the rest."""
        return {"/v1/models": ("GET", self._models), "/metrics": ("GET", self._metrics), "/health": ("GET", self._health),
                "/debug/replicas": ("GET", self._debug_replicas), "/admin/drain": ("POST", self._admin_drain),
                "/admin/held": ("GET", self._admin_held)}

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.limits.max_request_bytes)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        for path, (method, handler) in self.small_routes().items():
            app.router.add_route(method, path, handler)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        await self.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the upstream client and the background loops (health checks, discovery)."""
        lim = self.cfg.limits
        self.upstream = Upstream(lim, self.cfg.slo, self._upstream_key)
        self._tasks.append(asyncio.create_task(self._health_loop()))
        if any(p.replicas.pool.discovery for p in self.pools.values()):
            self._tasks.append(asyncio.create_task(self._discovery_loop()))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pool in self.pools.values():
            if pool.kv_events is not None:
                await pool.kv_events.close()
        if self.upstream is not None:
            await self.upstream.close()
        if self.lookup is not None and hasattr(self.lookup, "close"):
            await self.lookup.close()
        if self.request_log is not None:
            self.request_log.close()

    async def _health_loop(self) -> None:
        upstream = self.upstream
        if upstream is None:
            return
        while True:
            for pool in self.pools.values():
                await pool.replicas.check_all(upstream.session, upstream.client, upstream.auth)
                for replica in pool.replicas.outliers.release_due(time.monotonic()):
                    log.info("pool %s: replica %s back in rotation after its ejection", pool.name, replica)
                self._update_gauges(pool)
                if pool.replicas.routable():
                    self.held.replica_ready(pool.name)
                if pool.kv_events is not None:
                    pool.kv_events.reconcile(list(pool.replicas.replicas))
            await self._reload_adapters()
            await asyncio.sleep(self.cfg.limits.scrape_interval_seconds)

    def set_adapters(self, cfg: RouterConfig) -> None:
        """Serve the adapters `cfg` lists (added ones become model names, removed ones 404)."""
        table = adapter_table(cfg)
        for name in set(self.adapters) - set(table):
            if self.model_to_pool.get(name) == self.adapters[name][0]:
                del self.model_to_pool[name]
        for name, (pool, _path) in table.items():
            self.model_to_pool.setdefault(name, pool)
        self.adapters = {n: v for n, v in table.items() if self.model_to_pool.get(n) == v[0]}

    async def _reload_adapters(self) -> None:
        """Pick up adapter changes in the config file (the only settings applied without a restart); unload
        removed adapters, and those whose path changed (reloaded from the new path when next asked for)."""
        cfg = self._config_file.changed() if self._config_file is not None else None
        if cfg is None or self.upstream is None:
            return
        before = dict(self.adapters)
        self.set_adapters(cfg)
        gone = {n for n, v in before.items() if self.adapters.get(n) != v}
        await asyncio.gather(*(self.adapter_loader.unload(self.upstream.session, r, name) for p in self.pools.values()
                               for r in p.replicas.replicas.values() for name in gone & r.adapters))

    async def _discovery_loop(self) -> None:
        try:
            client = KubeClient.from_env()
        except NoClusterConfig as err:
            log.error("Kubernetes discovery is configured but %s; keeping the configured replicas", err)
            return
        try:
            while True:
                intervals = []
                for pool in self.pools.values():
                    d = pool.replicas.pool.discovery
                    if d is not None:
                        await pool.replicas.discover_once(client)
                        intervals.append(d.interval_seconds)
                await asyncio.sleep(min(intervals or [5.0]))
        finally:
            await client.close()

    def _update_gauges(self, pool: PoolRuntime) -> None:
        m = self.metrics
        ejected = pool.replicas.outliers.ejected
        for r in pool.replicas.replicas.values():
            m.child(m.replica_up, pool.name, r.id).set(1 if r.healthy else 0)
            m.child(m.replica_ejected, pool.name, r.id).set(1 if r.id in ejected else 0)
            m.child(m.replica_draining, pool.name, r.id).set(1 if r.draining else 0)
            m.child(m.replica_stale, pool.name, r.id).set(1 if r.stale else 0)
        m.child(m.index_blocks, pool.name).set(len(pool.index))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_aiohttp(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve_aiohttp(request, "completions")

    async def _serve_aiohttp(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        """`app`'s proxied endpoints: `serve` through an aiohttp response."""
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            headers.setdefault(name.lower(), value)  # the first of repeated headers, as headers.get gives
        too_large, raw = False, b""
        if request.content_length is not None and request.content_length > self.cfg.limits.max_request_bytes:
            too_large = True
        else:
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                too_large = True
        out = AiohttpResponder(request)
        await self.serve(ClientRequest(headers, raw, too_large), endpoint, out)
        if out.response is None:
            raise RuntimeError("the proxy path ended without a response")
        return out.response

    # -- the proxy -------------------------------------------------------------------------------------------
    async def serve(self, request: ClientRequest, endpoint: Endpoint, out: Responder) -> None:
        """Answer one proxied request (`endpoint`) through `out`: exactly one response, whatever happens."""
        t0 = time.perf_counter()
        m = self.metrics
        try:
            tenant = self.tenants.authenticate(request.headers.get("authorization"))
        except AuthError as e:
            m.child(m.rejected, "auth" if e.status == 401 else "rate-limit").inc()
            hdr = {"Retry-After": f"{max(1, round(e.retry_after or 1))}"} if e.status == 429 else None
            send_json(out, e.status, error_body(e.message, "authentication_error" if e.status == 401 else "rate_limit_error"),
                      hdr)
            return
        try:
            if request.too_large:
                raise RequestError(413, f"request body larger than {self.cfg.limits.max_request_bytes} bytes")
            raw = request.body
            parsed = parse_request(endpoint, raw)
            pool_name = self.model_to_pool.get(parsed.model)
            if pool_name is None:
                raise RequestError(404, f"The model `{parsed.model}` does not exist. Known: {sorted(self.model_to_pool)}",
                                   code="model_not_found", param="model")
        except RequestError as e:
            m.child(m.rejected, f"http-{e.status}").inc()
            send_json(out, e.status, e.body())
            return

        ctx = RequestContext(request, out, parsed, tenant, t0, body=raw)
        if self.lookup is not None and self.cfg.feature_store.enabled:
            if self._opt_out_header in request.headers:
                m.child(m.lookups, "skipped").inc()
            else:
                hit = await self._lookup(tenant, parsed)
                if hit is not None:
                    await lookup_response(ctx, hit, self.accounting)
                    return

        await self._route_and_proxy(ctx, pool_name)

    async def _lookup(self, tenant: str, parsed: ParsedRequest) -> Any:
        lookup = self.lookup
        if lookup is None:
            return None
        try:
            hit = await asyncio.wait_for(lookup.lookup(tenant, parsed.endpoint, parsed.body),
                                         timeout=self.cfg.feature_store.lookup_timeout_ms / 1000 * 2)
        except (TimeoutError, OSError, RuntimeError, ValueError) as e:  # fail open
            log.debug("feature-store lookup failed open: %s", e)
            self.metrics.child(self.metrics.lookups, "error").inc()
            return None
        self.metrics.child(self.metrics.lookups, "hit" if hit is not None else "miss").inc()
        return hit

    def _signals(self, pool: PoolRuntime, now: float) -> FallbackSignals:
        routable = pool.replicas.routable()
        wait_ms = pool_prefill_wait_ms((r.prefill_wait_s(now) for r in routable), pool.replicas.pool.prefill_speedup)
        return FallbackSignals(pool.name, len(routable), waiting=sum(r.queued for r in routable),
                           running=sum(r.generating for r in routable), prefill_wait_ms=wait_ms,
                           scales_from_zero=pool.replicas.pool.scales_from_zero)

    async def _route_and_proxy(self, ctx: RequestContext, pool_name: str) -> None:
        m = self.metrics
        request, parsed, tenant = ctx.request, ctx.parsed, ctx.tenant
        t_route = time.perf_counter()
        if self.burst.observe(time.monotonic()):
            self.held.burst(self.burst.rate, self.burst.window_s)
        pool = self.pools[pool_name]
        adapter, adapter_path = (parsed.model, self.adapters[parsed.model][1]) if parsed.model in self.adapters else (None, "")
        keys_now = self._keys_now(pool, parsed, adapter)
        keys, n_tokens = keys_now if isinstance(keys_now, tuple) else await keys_now
        degraded, reason = False, "primary"
        # An adapter request never goes to a student pool: a student does not hold the adapter (another base).
        if pool.role == "primary" and len(self.pools) > 1 and adapter is None:
            now = time.monotonic()
            if self.tenants.version != self._tenants_version:  # the Secret file changed: new per-tenant caps
                self.policy.tenant_caps, self._tenants_version = self.tenants.caps(), self.tenants.version
            students = [self._signals(p, now) for p in self.pools.values() if p.role == "student"]
            dec = dispatch.pick_pool(self.policy, now, self._signals(pool, now), students, tenant=tenant,
                                     input_tokens=n_tokens,
                                     request_class=request.headers.get(self._class_header))
            if dec.pool != pool.name:
                pool, degraded, reason = self.pools[dec.pool], dec.degraded, dec.reason
                keys, n_tokens = await self._keys(pool, parsed)
                m.child(m.fallbacks, pool.name, reason).inc()
                m.child(m.degraded, tenant).inc()
        if pool.replicas.pool.scales_from_zero and not pool.replicas.routable():
            try:  # scale from zero: wait for the autoscaler's replica (it is woken through /admin/held)
                await self.held.wait_for_replica(pool.name, pool.replicas.routable,
                                                 self.cfg.limits.hold_timeout_seconds or self.cfg.limits.request_timeout_seconds)
            except HoldRejected as e:
                m.child(m.requests, pool.name, parsed.model, parsed.endpoint, "503", "true" if degraded else "false").inc()
                send_json(ctx.out, 503, error_body(str(e), "service_unavailable"), {"Retry-After": f"{e.retry_after_s:.0f}"})
                return
            t_route = time.perf_counter()
        sh = self._session_header
        info = RequestInfo(model=pool.served_name, block_hashes=keys, input_tokens=n_tokens,
                           session_id=request.headers.get(sh) if sh else None, tenant=tenant, stream=parsed.stream,
                           block_size=pool.blocks.block_size, adapter=adapter)
        if parsed.model != pool.served_name and adapter is None:
            ctx.body = json.dumps({**parsed.body, "model": pool.served_name}).encode()
        headers = {"x-llmfleet-pool": pool.name, "x-llmfleet-degraded": "true" if degraded else "false"}
        if degraded:
            headers["x-llmfleet-fallback-reason"] = reason
        ctx.pool, ctx.degraded, ctx.input_tokens, ctx.info, ctx.headers = pool.name, degraded, n_tokens, info, headers
        tried: set[str] = set()
        last_error = "no routable replica"
        upstream = self.upstream
        if upstream is None:
            send_json(ctx.out, 503, error_body("router is starting", "service_unavailable"))
            return
        for attempt in range(self.cfg.limits.max_retries + 1):
            decision = dispatch.pick_replica(pool.pipeline, info, pool.replicas.replicas.values(), tried,
                                             pool.replicas.outliers)
            replica = decision.replica
            if replica is None:
                last_error = decision.reason if not tried else last_error
                break
            tried.add(replica.id)
            route_s = time.perf_counter() - t_route

            def routed(pool: PoolRuntime = pool, replica: ReplicaState = replica, retry: bool = attempt > 0,
                       route_s: float = route_s) -> None:
                # Runs as soon as the request is on the wire, in the same step (no other request is routed
                # in between): the replica works on it while the index learns and the metrics record.
                self._count_affinity(pool, replica, keys)  # before the commit teaches the index this prompt
                dispatch.commit(pool.pipeline, info, replica)
                m.route_decision.observe(route_s)
                if retry:
                    m.child(m.retries, pool.name).inc()

            if adapter is not None:
                try:
                    await self.adapter_loader.ensure(upstream.session, replica, adapter, adapter_path)
                except AdapterLoadFailed as e:
                    last_error = str(e)
                    log.warning("retrying after %s", last_error)
                    continue
                self.adapter_loader.begin(replica, adapter)
            try:
                await upstream.proxy(ctx, replica, self.accounting, after_send=routed)
                return
            except UpstreamFailed as e:
                m.child(m.upstream_attempts, pool.name, "overloaded" if e.overloaded else "error").inc()
                if not e.overloaded and not e.mark_down:  # a refused connection: down until a health check passes
                    self.accounting.attempt_ended(pool.name, replica.id, failed=True)
                last_error = f"replica {replica.id}: {e}"
                if e.mark_down:
                    pool.replicas.mark_failed(replica.id)
                log.warning("retrying after %s", last_error)
            finally:
                if adapter is not None:
                    self.adapter_loader.end(replica, adapter)
            t_route = time.perf_counter()
        m.child(m.requests, pool.name, parsed.model, parsed.endpoint, "503", "true" if degraded else "false").inc()
        send_json(ctx.out, 503, error_body(f"no replica could serve the request ({last_error})", "service_unavailable"),
                  headers)

    def _keys_now(self, pool: PoolRuntime, parsed: ParsedRequest,
                  adapter: str | None = None) -> tuple[Sequence[int], int] | Awaitable[tuple[Sequence[int], int]]:
        """The prompt's prefix keys and token count, or (a long prompt with a tokenizer) an awaitable of them."""
        if not self.use_prefix:
            return [], max(1, len(parsed.prompt_text) // 4)
        tokens = pool.blocks.prompt_tokens
        if tokens is not None and len(parsed.prompt_text) > LONG_PROMPT_CHARS:
            text = self._prompt_text(pool, parsed)
            plan = tokens.plan(text)  # most of a conversation's next turn was tokenized with its last one
            if plan.new_chars > LONG_PROMPT_CHARS:
                # Tokenizing thousands of new tokens takes milliseconds; the tokenizer lets go of the GIL, so in a
                # worker thread it leaves the event loop serving other requests meanwhile.
                return asyncio.to_thread(pool.blocks, text, adapter, plan)
            return pool.blocks(text, adapter, plan)
        return pool.blocks(self._prompt_text(pool, parsed), adapter)  # no coroutine for the usual, short prompt

    async def _keys(self, pool: PoolRuntime, parsed: ParsedRequest,
                    adapter: str | None = None) -> tuple[Sequence[int], int]:
        keys = self._keys_now(pool, parsed, adapter)
        return keys if isinstance(keys, tuple) else await keys

    @staticmethod
    def _prompt_text(pool: PoolRuntime, parsed: ParsedRequest) -> str:
        """The text the engine tokenizes: a chat request rendered with the model's template (the flattened messages
        without one, or when it rejects them)."""
        if parsed.messages is not None and pool.chat_template is not None:
            return pool.chat_template.render(parsed.messages) or parsed.prompt_text
        return parsed.prompt_text

    def _count_affinity(self, pool: PoolRuntime, replica: ReplicaState, keys: Sequence[int]) -> None:
        sess = pool.session_scorer
        if sess is not None and getattr(sess, "last_pinned", None) == replica.id:
            self.metrics.child(self.metrics.session_hits, pool.name).inc()
        if not keys:
            return
        matched = pool.index.match(keys).get(replica.id, 0)  # memoized: the scorers just looked these keys up
        hit, blocks_hit, blocks_miss = pool.affinity_counters
        if matched:
            hit.inc()
        blocks_hit.inc(matched)
        blocks_miss.inc(len(keys) - matched)


__all__ = ["Router", "error_response"]
