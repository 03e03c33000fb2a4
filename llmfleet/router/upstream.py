"""Talking to replicas: one proxied request (streaming or not), the request log, feature-store responses."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import IO, Any

import aiohttp
from aiohttp import web

from llmfleet.router.config import LimitsConfig, RouterConfig, SLOConfig
from llmfleet.router.observer import RequestObserver
from llmfleet.router.plugins.base import ReplicaState, RequestInfo, release_prefill
from llmfleet.router.requests import ParsedRequest
from llmfleet.router.upstream_client import UpstreamClient, UpstreamError, UpstreamResponse, UpstreamTimeout

log = logging.getLogger("llmfleet.router.upstream")
_USAGE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT_USAGE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_JSON_HEADER = b"Content-Type: application/json\r\n"


def upstream_api_key(cfg: RouterConfig) -> str | None:
    """The replicas' key from the environment variable the config names; a clear error when it is missing."""
    if cfg.upstream_api_key_env is None:
        return None
    key = os.environ.get(cfg.upstream_api_key_env, "").strip()
    if not key:
        raise ValueError(f"upstreamApiKeyEnv: environment variable {cfg.upstream_api_key_env} is unset or empty")
    return key


class UpstreamFailed(Exception):
    """The replica failed before anything reached the client: safe to retry elsewhere. `overloaded` (HTTP 429)
    is back-pressure, not a failure of the replica: the pool's error rate leaves it out."""

    def __init__(self, message: str, mark_down: bool, overloaded: bool = False) -> None:
        super().__init__(message)
        self.mark_down = mark_down
        self.overloaded = overloaded


def first_byte_timeout(limits: LimitsConfig, slo: SLOConfig) -> float:
    """Deadline for the upstream's response headers: configured, else 4x the TTFT objective (at least 10 s)."""
    if limits.first_byte_timeout_seconds is not None:
        return limits.first_byte_timeout_seconds
    return max(10.0, 4 * slo.ttft_p95_ms / 1000)


class Upstream:
    def __init__(self, limits: LimitsConfig, slo: SLOConfig, api_key: str | None = None) -> None:
        self.limits = limits
        # The replicas' key (spec.router.upstreamKeySecret) on every proxied request.
        self.headers = _JSON_HEADER + (b"authorization: Bearer " + api_key.encode() + b"\r\n" if api_key else b"")
        self.first_byte = min(first_byte_timeout(limits, slo), limits.request_timeout_seconds)
        # aiohttp for health checks and /metrics scraping; the lean client for the proxied requests.
        conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, keepalive_timeout=30)
        # The key also rides on this session's calls: health checks, scrapes, LoRA adapter loads (/v1: guarded).
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.session = aiohttp.ClientSession(connector=conn, auto_decompress=False, headers=auth)
        # Idle connections are dropped after 4 s, before uvicorn's (vLLM's server) default 5 s keep-alive closes
        # them under us; the client still retries once when that race happens.
        self.client = UpstreamClient(limits.connect_timeout_seconds, keepalive=4.0)

    async def close(self) -> None:
        self.client.close()
        await self.session.close()

    async def proxy(self, request: web.Request, parsed: ParsedRequest, body: bytes, replica: ReplicaState,
                    pool: str, headers: dict[str, str], router: RequestObserver, tenant: str, degraded: bool,
                    input_tokens: int, t0: float, info: RequestInfo | None = None,
                    after_send: Callable[[], None] | None = None) -> web.StreamResponse:
        """Send the request to `replica` and relay the answer. `info` carries the prefill charged at routing
        (estimated-ttft scorer): released on the first streamed byte, and in any case when the request ends.
        `after_send`: the router's bookkeeping for this routing decision, run once the request is on the wire.
        Metrics of a non-streaming response are recorded after it is written (not before)."""
        path = "/v1/chat/completions" if parsed.endpoint == "chat" else "/v1/completions"
        up_headers = self.headers
        rid = request.headers.get("x-request-id")
        if rid and rid.isprintable():
            up_headers += b"x-request-id: " + rid.encode("utf-8") + b"\r\n"
        replica.in_flight += 1
        t_send = time.perf_counter()
        resp: UpstreamResponse | None = None
        try:
            try:
                resp = await self.client.post(replica.id, path, body, up_headers, self.first_byte,
                                              self.limits.request_timeout_seconds, after_send)
                router.metrics.overhead.observe(t_send - t0)
            except UpstreamTimeout as e:
                raise UpstreamFailed(str(e), mark_down=False) from None
            except UpstreamError as e:  # refused, reset, closed before the headers, not HTTP
                raise UpstreamFailed(f"connection failed: {e}", mark_down=True) from None
            if resp.status >= 500 or resp.status == 429:
                try:
                    text = (await resp.read())[:300].decode(errors="replace")
                except UpstreamError as e:
                    text = f"(body unreadable: {e})"
                raise UpstreamFailed(f"HTTP {resp.status}: {text}", mark_down=False, overloaded=resp.status == 429)
            out_headers = {**headers, "x-llmfleet-replica": replica.id,
                           "Content-Type": resp.content_type or "application/json"}
            if parsed.stream and resp.status == 200:
                return await self._stream(request, parsed, resp, out_headers, router, pool, tenant, degraded,
                                          input_tokens, t0, info)
            try:
                data = await resp.read()
            except UpstreamError as e:
                raise UpstreamFailed(f"response body failed: {e}", mark_down=False) from None
            e2e = time.perf_counter() - t0
            # recorded on the next loop iteration: after aiohttp has written this response
            asyncio.get_running_loop().call_soon(_observe_body, router, pool, parsed, resp.status, tenant, degraded,
                                                 data, input_tokens, e2e)
            return web.Response(body=data, status=resp.status, headers=out_headers)
        except asyncio.CancelledError:
            router.metrics.child(router.metrics.client_disconnects, pool).inc()
            raise
        finally:
            if resp is not None:
                resp.close()  # unread data (client gone, error) closes the connection: vLLM aborts the request
            replica.in_flight -= 1
            if info is not None:
                release_prefill(info, first_byte=False)  # no-op when the first byte already released it

    async def _stream(self, request: web.Request, parsed: ParsedRequest, resp: UpstreamResponse,
                      out_headers: dict[str, str], router: RequestObserver, pool: str, tenant: str,
                      degraded: bool, input_tokens: int, t0: float, info: RequestInfo | None) -> web.StreamResponse:
        out_headers["Cache-Control"] = "no-cache"
        out = web.StreamResponse(status=200, headers=out_headers)
        first: float | None = None
        last = 0.0
        events = 0
        usage_tokens: int | None = None
        prepared = False
        status = 200
        try:
            while chunk := await resp.next_data():
                now = time.perf_counter()
                if first is None:
                    first = now
                    if info is not None:
                        release_prefill(info)  # the replica is through this prompt's prefill
                last = now
                events += chunk.count(b"data: ")
                if b"completion_tokens" in chunk:
                    mt = _USAGE.search(chunk)
                    if mt:
                        usage_tokens = int(mt.group(1))
                if not prepared:
                    await out.prepare(request)
                    prepared = True
                if resp.complete:  # the last bytes: one write with the end-of-stream chunk (and the headers)
                    await out.write_eof(chunk)
                    break
                await out.write(chunk)
            if not prepared:
                await out.prepare(request)
            await out.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            router.metrics.child(router.metrics.client_disconnects, pool).inc()
            status = 499
        except UpstreamError as e:
            if not prepared:
                raise UpstreamFailed(f"stream failed before the first byte: {e}", mark_down=False) from None
            log.warning("upstream stream from %s broke mid-response: %s", out_headers["x-llmfleet-replica"], e)
            status = 502
        e2e = time.perf_counter() - t0
        tokens = usage_tokens if usage_tokens is not None else max(0, events - 2)  # minus role chunk and [DONE]
        ttft = None if first is None else first - t0
        tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
        router.observe(pool, parsed.model, parsed.endpoint, status, tenant, degraded, parsed, input_tokens, tokens,
                       ttft, tpot, e2e)
        return out


def _observe_body(router: RequestObserver, pool: str, parsed: ParsedRequest, status: int, tenant: str, degraded: bool,
                  data: bytes, input_tokens: int, e2e: float) -> None:
    out_tokens, in_tokens = _usage(data, input_tokens)
    router.observe(pool, parsed.model, parsed.endpoint, status, tenant, degraded, parsed, in_tokens, out_tokens,
                   None, None, e2e)


def _usage(data: bytes, input_tokens: int) -> tuple[int, int]:
    """(completion_tokens, prompt_tokens) of a response body; input_tokens when the body has no usage."""
    # Fast path: engines put "usage" last; read it there instead of parsing the whole (possibly long) body.
    # An occurrence inside generated text is escaped (\"usage\") and is skipped by the backslash check.
    i = data.rfind(b'"usage"')
    if i > 0 and data[i - 1] != 0x5C:
        tail = data[i:i + 400]
        out, prompt = _USAGE.search(tail), _PROMPT_USAGE.search(tail)
        if out is not None and prompt is not None:
            return int(out.group(1)), int(prompt.group(1))
    try:
        doc = json.loads(data)
        usage = doc.get("usage") or {}
        return int(usage.get("completion_tokens") or 0), int(usage.get("prompt_tokens") or input_tokens)
    except (ValueError, AttributeError, TypeError):
        return 0, input_tokens


class RequestLog:
    """JSON lines in the DEVELOPERS.md format; line-buffered appends (one write per request)."""

    def __init__(self, path: str, log_prompts: bool = True) -> None:
        self.path = path
        self.log_prompts = log_prompts
        self._f: IO[str] | None = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the process

    def write(self, *, tenant: str, model: str, parsed: ParsedRequest, input_tokens: int, output_tokens: int,
              pool: str, degraded: bool, ttft: float | None, e2e: float, status: int) -> None:
        if self._f is None:
            return
        params = {k: v for k, v in parsed.body.items() if k not in ("model", "messages", "prompt")}
        rec = {
            "ts": time.time(), "tenant": tenant, "model": model, "endpoint": parsed.endpoint,
            "prompt": (parsed.prompt if parsed.prompt is not None else parsed.prompt_text) if self.log_prompts else "",
            "messages": parsed.messages if self.log_prompts else None, "params": params,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "pool": pool, "degraded": degraded,
            "ttft_ms": None if ttft is None else round(ttft * 1000, 3), "e2e_ms": round(e2e * 1000, 3),
            "status": status,
        }
        try:
            self._f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        except OSError as e:
            log.error("request log write failed: %s", e)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _as_sse(resp: dict[str, Any], endpoint: str) -> bytes:
    """One complete response as an OpenAI-style stream (one content chunk, then [DONE])."""
    choices = []
    for c in resp.get("choices") or []:
        if endpoint == "chat":
            msg = c.get("message") or {}
            choices.append({"index": c.get("index", 0), "delta": {"role": "assistant", "content": msg.get("content")},
                            "finish_reason": c.get("finish_reason")})
        else:
            choices.append({"index": c.get("index", 0), "text": c.get("text"), "finish_reason": c.get("finish_reason")})
    obj = "chat.completion.chunk" if endpoint == "chat" else "text_completion"
    chunk = {**{k: v for k, v in resp.items() if k not in ("choices", "object")}, "object": obj, "choices": choices}
    return b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"


async def lookup_response(request: web.Request, parsed: ParsedRequest, hit: Any, t0: float, router: RequestObserver,
                          tenant: str) -> web.StreamResponse:
    """Answer from the feature store (pool `feature-store`, never degraded)."""
    headers = {"x-llmfleet-pool": "feature-store", "x-llmfleet-degraded": "false",
               "x-llmfleet-lookup": str(getattr(hit, "kind", "exact"))}
    resp: dict[str, Any] = dict(hit.response)
    usage = resp.get("usage") or {}
    out_tokens = int(usage.get("completion_tokens") or 0)
    if parsed.stream:
        out = web.StreamResponse(status=200, headers={**headers, "Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(_as_sse(resp, parsed.endpoint))
        await out.write_eof()
    else:
        out = web.json_response(resp, headers=headers)
    e2e = time.perf_counter() - t0
    router.observe("feature-store", parsed.model, parsed.endpoint, 200, tenant, False, parsed,
                   int(usage.get("prompt_tokens") or 0), out_tokens, e2e if parsed.stream else None, None, e2e)
    return out
