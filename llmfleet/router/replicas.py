"""Replica discovery (static list or Kubernetes EndpointSlices), health checks and /metrics scraping.

Every network call has a timeout. A replica whose scrape is older than `stale_after_seconds` is marked stale
(its load scores are damped by the pipeline); a replica failing `health_failures_to_down` checks in a row,
or refusing a proxied connection, is marked unhealthy until a check passes. EndpointSlice endpoints that are
terminating or not ready are marked draining: they finish what they have and get nothing new.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from llmfleet.api.contracts import KV_BYTES_PER_TOKEN_METRIC
from llmfleet.kube.client import ApiError, KubeClient
from llmfleet.router.adapters import scrape_adapters
from llmfleet.router.config import LimitsConfig, OutlierConfig, PoolConfig
from llmfleet.router.kv_tiers import (
    HostTierUnknown,
    cached_capacity,
    host_cache_blocks,
    kv_bytes_per_token,
    load_model_config,
    offload_gib_from_label,
)
from llmfleet.router.outliers import OutlierDetector
from llmfleet.router.plugins.base import ReplicaState
from llmfleet.router.upstream_client import UpstreamClient, UpstreamError
from llmfleet.util.prom_text import label_key

log = logging.getLogger("llmfleet.router.replicas")

_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",  # older vLLM name
}
_COUNTERS = {"vllm:prefix_cache_hits": "prefix_hits", "vllm:prefix_cache_queries": "prefix_queries"}
_CACHE_INFO = "vllm:cache_config_info"
# One sample line of a series the router reads: name, labels (without braces), value. vLLM's /metrics page is
# ~50 KB (600 lines, mostly histogram buckets) of which the router needs a dozen lines: a full Prometheus
# parse took ~9-12 ms of the router's event loop per replica and scrape, this one regex pass ~0.04 ms. The pattern
# starts with a literal newline (searched in "\n" + page) rather than a multiline `^`, so the regex engine jumps
# from line to line instead of testing every character as a line start (that took 0.24 ms a page); and vLLM's
# names (all of them "vllm:...") share that prefix in one branch, since re tries an alternation's branches one by
# one on every line (one branch per full name took 0.06 ms).
_VLLM = "vllm:"
_SAMPLE = re.compile(
    "\n(" + re.escape(_VLLM) + "(?:"
    + "|".join(re.escape(n.removeprefix(_VLLM)) for n in (*_GAUGES, _CACHE_INFO))
    + "|" + "|".join(re.escape(n.removeprefix(_VLLM)) + "(?:_total)?" for n in _COUNTERS)
    + ")|" + re.escape(KV_BYTES_PER_TOKEN_METRIC) + r")(?:\{(.*)\})?[ \t]+(\S+)")


def block_tokens(cache_info: Mapping[str, str]) -> int | None:
    """Tokens per KV block: cache_config_info's `block_size` label (vLLM's --block-size); None when it is absent or
    not a positive integer."""
    raw = cache_info.get("block_size", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def parse_vllm_metrics(text: str, cache_info: dict[str, str] | None = None) -> dict[str, float]:
    """Sum vLLM's load series over label sets (one replica may report several engines).

    Reads only the sample lines of the series the router uses (one regex pass; comments, other series and
    histogram buckets are skipped unparsed). `cache_info`, when given, receives the labels of
    vllm:cache_config_info (block_size, cache_dtype, kv_offloading_size, ...), from which the host tier's
    capacity is derived. Raises ValueError on a sample value that is not a number or labels that are not
    label pairs.
    """
    out: dict[str, float] = {}
    for name, labels, value in _SAMPLE.findall("\n" + text):
        if name == KV_BYTES_PER_TOKEN_METRIC:
            out["kv_bytes_per_token"] = float(value)
        elif name == _CACHE_INFO:
            info = dict(label_key(labels))  # parsed once per distinct label text (prom_text)
            if cache_info is not None:
                cache_info.update(info)
            blocks = info.get("num_gpu_blocks")
            if blocks and blocks.isdigit():
                out["cache_capacity_blocks"] = float(blocks)
        else:
            attr = _GAUGES.get(name) or _COUNTERS[name.removesuffix("_total")]
            out[attr] = out.get(attr, 0.0) + float(value)
    return out


class PoolReplicas:
    """The replicas of one pool and the background tasks that keep them current."""

    def __init__(self, pool: PoolConfig, limits: LimitsConfig, on_removed: Callable[[str], None] | None = None,
                 on_capacity: Callable[[str, int], None] | None = None, outliers: OutlierConfig | None = None) -> None:
        self.pool = pool
        self.limits = limits
        self.replicas: dict[str, ReplicaState] = {}
        self.outliers = OutlierDetector(outliers or OutlierConfig(enabled=False))  # passive health (outliers.py)
        self.on_removed = on_removed
        self.on_capacity = on_capacity
        self._failures: dict[str, int] = {}
        self._scraped_at: dict[str, float] = {}
        self._reported_capacity: dict[str, int] = {}  # replica -> cached_capacity last given to on_capacity
        self._host_blocks: dict[tuple[str | None, ...], int] = {}  # cache_config_info labels -> host-tier blocks
        self._model_config: dict[str, Any] | None = None
        self._host_unknown_logged = False
        self.discovery_error: str | None = None
        if pool.endpoints is not None:
            self.set_endpoints({u.rstrip("/"): False for u in pool.endpoints})

    # -- membership ---------------------------------------------------------------------------------------
    def set_endpoints(self, endpoints: dict[str, bool]) -> None:
        """url -> draining. New URLs join (healthy until a check fails), missing ones leave."""
        for url, draining in endpoints.items():
            r = self.replicas.get(url)
            if r is None:
                r = self.replicas[url] = ReplicaState(
                    id=url, pool=self.pool.name, models=tuple(self.pool.served_names),
                    cache_capacity_blocks=self.pool.cache_capacity_blocks, adapter_slots=self.pool.adapter_slots,
                )
                if self.pool.cache_capacity_blocks:
                    self._report_capacity(url, self.pool.cache_capacity_blocks, self.pool.host_cache_blocks or 0)
            r.draining = draining
        for url in [u for u in self.replicas if u not in endpoints]:
            del self.replicas[url]
            self._failures.pop(url, None)
            self._reported_capacity.pop(url, None)
            self.outliers.forget(url)
            if self.on_removed:
                self.on_removed(url)
        self.outliers.pool_size = len(self.replicas)

    def set_draining(self, url: str, draining: bool) -> bool:
        r = self.replicas.get(url.rstrip("/"))
        if r is None:
            return False
        r.draining = draining
        return True

    def routable(self) -> list[ReplicaState]:
        """Healthy, not draining and not ejected as an outlier."""
        ejected = self.outliers.ejected
        return [r for r in self.replicas.values() if r.healthy and not r.draining and r.id not in ejected]

    def mark_failed(self, url: str) -> None:
        """A proxied request could not reach the replica: out of rotation until a health check passes."""
        r = self.replicas.get(url)
        if r is not None:
            r.healthy = False
            self._failures[url] = max(self._failures.get(url, 0), self.limits.health_failures_to_down)

    # -- health + scrape ------------------------------------------------------------------------------------
    async def check(self, session: aiohttp.ClientSession, client: UpstreamClient, auth: bytes, r: ReplicaState) -> None:
        """Health check, then (healthy) /metrics scrape of `r`, each within `limits.scrape_timeout_seconds`. Both go
        through the router's lean client (`client`, with `auth` header lines): aiohttp's took ~0.15 ms of the event
        loop per GET, two per replica every scrape interval. `session` (aiohttp) lists a LoRA pool's adapters."""
        timeout = self.limits.scrape_timeout_seconds
        try:
            status, _ = await client.get(r.id, "/health", auth, timeout)
            ok = status == 200
        except (UpstreamError, ValueError, OSError):
            ok = False
        if ok:
            self._failures[r.id] = 0
            r.healthy = True
        else:
            n = self._failures[r.id] = self._failures.get(r.id, 0) + 1
            if n >= self.limits.health_failures_to_down:
                r.healthy = False
        if not ok:
            return
        if self.pool.adapter_slots or self.pool.adapters:  # LoRA on: which adapters does the engine hold?
            await scrape_adapters(session, r, self.pool.served_names, aiohttp.ClientTimeout(total=timeout))
        try:
            status, body = await client.get(r.id, "/metrics", auth, timeout)
            if status != 200:
                return
            text = body.decode()
        except (UpstreamError, ValueError, OSError):  # ValueError: UnicodeDecodeError too
            return
        cache_info: dict[str, str] = {}
        try:
            values = parse_vllm_metrics(text, cache_info)
        except ValueError as e:
            log.debug("unparseable /metrics from %s: %s", r.id, e)
            return
        self.apply_scrape(r, values, time.monotonic(), cache_info)

    # -- KV capacity: GPU blocks and host (CPU offload) blocks -------------------------------------------------
    def _report_capacity(self, replica: str, gpu_blocks: int, host_blocks: int) -> None:
        capacity = cached_capacity(gpu_blocks, host_blocks)
        if self._reported_capacity.get(replica) != capacity:
            self._reported_capacity[replica] = capacity
            if self.on_capacity:
                self.on_capacity(replica, capacity)

    def host_blocks(self, cache_info: Mapping[str, str] | None) -> int:
        """Blocks of the replica's host tier: PoolConfig.host_cache_blocks, else derived from the engine's
        cache_config_info labels (kv_offloading_size GiB, block_size, cache_dtype) and the KV bytes per token that
        llmfleet's serving wrapper adds to /metrics (else the model's config.json, when the router can read it).
        0 without offloading; 0 with a warning (once per pool) when offloading is on but the size is unknown."""
        if self.pool.host_cache_blocks is not None:
            return self.pool.host_cache_blocks
        info = cache_info or {}
        labels = (info.get("kv_offloading_size"), info.get("kv_offloading_backend"), info.get("block_size"),
                  info.get("cache_dtype"), info.get("llmfleet_kv_bytes_per_token"))
        cached = self._host_blocks.get(labels)
        if cached is not None:
            return cached
        try:
            blocks = self._derive_host_blocks(info)
        except HostTierUnknown as e:
            if not self._host_unknown_logged:
                self._host_unknown_logged = True
                log.warning("pool %s: KV offloading is on but the host tier's size is unknown (%s); the prefix "
                            "index counts GPU blocks only (hostCacheBlocks in router.yaml sets it)", self.pool.name, e)
            blocks = 0
        self._host_blocks[labels] = blocks
        return blocks

    def _derive_host_blocks(self, info: Mapping[str, str]) -> int:
        gib = offload_gib_from_label(info.get("kv_offloading_size"), info.get("kv_offloading_backend"))
        if gib is None and "kv_offloading_size" not in info:
            gib = self.pool.kv_offload_gib  # an engine that does not report it: the spec's size
        if gib is None:
            return 0
        block_size = block_tokens(info)
        if block_size is None:
            raise HostTierUnknown(f"cache_config_info has no block_size (got {info.get('block_size', '')!r})")
        reported = info.get("llmfleet_kv_bytes_per_token", "")
        if reported.isdigit() and int(reported) > 0:  # the serving wrapper read the replica's own config.json
            return host_cache_blocks(gib, block_size, int(reported))
        if self._model_config is None:
            self._model_config = load_model_config(self.pool.model_path)
        per_token = kv_bytes_per_token(
            self._model_config, cache_dtype=info.get("cache_dtype") or "auto", model_dtype=self.pool.dtype,
            tensor_parallel_size=self.pool.tensor_parallel_size,
        )
        return host_cache_blocks(gib, block_size, per_token)

    def apply_scrape(self, r: ReplicaState, values: dict[str, float], now: float,
                     cache_info: Mapping[str, str] | None = None) -> None:
        if not any(k in values for k in ("running", "waiting", "kv_usage")):
            return  # not a vLLM /metrics: keep the data stale
        r.running = values.get("running", 0.0)
        r.waiting = values.get("waiting", 0.0)
        r.kv_usage = min(1.0, max(0.0, values.get("kv_usage", 0.0)))
        r.prefix_hits = values.get("prefix_hits", r.prefix_hits)
        r.prefix_queries = values.get("prefix_queries", r.prefix_queries)
        # GPU blocks: the config's, else the engine's num_gpu_blocks; the index gets cached_capacity(GPU, host).
        gpu = self.pool.cache_capacity_blocks or int(values.get("cache_capacity_blocks", 0))
        if gpu:
            r.cache_capacity_blocks = gpu
            info = dict(cache_info or {})
            if values.get("kv_bytes_per_token"):  # the serving wrapper's figure: no config.json needed here
                info["llmfleet_kv_bytes_per_token"] = str(int(values["kv_bytes_per_token"]))
            self._report_capacity(r.id, gpu, self.host_blocks(info))
        if (block := block_tokens(cache_info or {})) is not None:
            r.kv_block_tokens = block
        self._scraped_at[r.id] = now
        r.stale = False

    def mark_stale(self, now: float) -> None:
        for r in self.replicas.values():
            if now - self._scraped_at.get(r.id, -1e18) > self.limits.stale_after_seconds:
                r.stale = True

    async def check_all(self, session: aiohttp.ClientSession, client: UpstreamClient, auth: bytes = b"") -> None:
        await asyncio.gather(*(self.check(session, client, auth, r) for r in list(self.replicas.values())))
        self.mark_stale(time.monotonic())

    # -- Kubernetes -----------------------------------------------------------------------------------------
    async def discover_once(self, client: KubeClient) -> None:
        """List the pool's EndpointSlices, with a timeout; on failure keep the last known replicas."""
        d = self.pool.discovery
        if d is None:
            return
        try:
            slices = await asyncio.wait_for(
                client.list("discovery.k8s.io/v1", "EndpointSlice", d.namespace, selector=d.selector),
                timeout=d.timeout_seconds,
            )
        except (TimeoutError, ApiError, ValueError) as e:
            self.discovery_error = f"EndpointSlice list failed: {e}"
            log.warning("pool %s: %s (keeping the last known replicas)", self.pool.name, self.discovery_error)
            return
        self.discovery_error = None
        self.set_endpoints(endpoints_from_slices(slices, d.port))


def endpoints_from_slices(items: list[dict[str, Any]], default_port: int) -> dict[str, bool]:
    """EndpointSlice objects -> {url: draining}. Not ready or terminating = draining."""
    out: dict[str, bool] = {}
    for s in items:
        port = default_port
        ports = s.get("ports") or []
        for p in ports:
            if p.get("port") and (p.get("name") in (None, "", "http") or len(ports) == 1):
                port = p["port"]
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            ready = cond.get("ready") is not False
            terminating = bool(cond.get("terminating"))
            for addr in ep.get("addresses") or []:
                host = f"[{addr}]" if ":" in addr else addr
                url = f"http://{host}:{port}"
                out[url] = out.get(url, False) or terminating or not ready
    return out
