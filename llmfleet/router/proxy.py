"""Talking to replicas: one proxied request (streaming or not), relayed to the client and accounted for."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable

import aiohttp

from llmfleet.router.accounting import Accounting, RequestContext
from llmfleet.router.config import LimitsConfig, RouterConfig, SLOConfig
from llmfleet.router.dispatch import on_done, on_first_byte
from llmfleet.router.plugins.base import AwaitingFirstByte, ReplicaState
from llmfleet.router.respond import error_body
from llmfleet.router.upstream_client import UpstreamClient, UpstreamError, UpstreamResponse, UpstreamTimeout

log = logging.getLogger("llmfleet.router.proxy")
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
        self.auth = b"authorization: Bearer " + api_key.encode() + b"\r\n" if api_key else b""
        self.headers = _JSON_HEADER + self.auth
        self.first_byte = min(first_byte_timeout(limits, slo), limits.request_timeout_seconds)
        # aiohttp for LoRA adapter loads and model lists; the lean client for the proxied requests, health checks and
        # /metrics scrapes (`self.auth` rides on those too: a guarded server may guard /metrics).
        conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, keepalive_timeout=30)
        # The key also rides on this session's calls: LoRA adapter loads and model lists (/v1: guarded).
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.session = aiohttp.ClientSession(connector=conn, auto_decompress=False, headers=auth)
        # Idle connections are dropped after 4 s, before uvicorn's (vLLM's server) default 5 s keep-alive closes
        # them under us; the client still retries once when that race happens.
        self.client = UpstreamClient(limits.connect_timeout_seconds, keepalive=4.0)

    async def close(self) -> None:
        self.client.close()
        await self.session.close()

    async def proxy(self, ctx: RequestContext, replica: ReplicaState, accounting: Accounting,
                    after_send: Callable[[], None] | None = None) -> None:
        """Send the request to `replica` and relay the answer to `ctx.out`. `ctx.info` carries the prefill charged at routing
        (estimated-ttft scorer): released on the first streamed byte, and in any case when the request ends.
        `after_send`: the router's bookkeeping for this routing decision, run once the request is on the wire.
        Metrics of a non-streaming response are recorded after it is written (not before)."""
        parsed = ctx.parsed
        path = "/v1/chat/completions" if parsed.endpoint == "chat" else "/v1/completions"
        up_headers = self.headers
        rid = ctx.request.headers.get("x-request-id")
        if rid and rid.isprintable():
            up_headers += b"x-request-id: " + rid.encode("utf-8") + b"\r\n"
        replica.in_flight += 1
        awaiting = AwaitingFirstByte(replica if parsed.stream else None)
        t_send = ctx.t_sent = time.perf_counter()
        ctx.replica = replica.id
        resp: UpstreamResponse | None = None
        try:
            try:
                resp = await self.client.post(replica.id, path, ctx.body, up_headers, self.first_byte,
                                              self.limits.request_timeout_seconds, after_send)
                accounting.metrics.overhead.observe(t_send - ctx.t0)
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
            out_headers = {**ctx.headers, "x-llmfleet-replica": replica.id,
                           "Content-Type": resp.content_type or "application/json"}
            if parsed.stream and resp.status == 200:
                await self._stream(ctx, resp, out_headers, accounting, awaiting)
                return
            try:
                data = await resp.read()
            except UpstreamError as e:
                raise UpstreamFailed(f"response body failed: {e}", mark_down=False) from None
            e2e = time.perf_counter() - ctx.t0
            ctx.out.send(resp.status, out_headers, data)
            # Recorded once the response is on its way: the router's server has written it already; aiohttp
            # writes it when the handler returns, before the next loop iteration.
            if ctx.out.written_on_send:
                _observe_body(accounting, ctx, resp.status, data, e2e)
            else:
                asyncio.get_running_loop().call_soon(_observe_body, accounting, ctx, resp.status, data, e2e)
        except asyncio.CancelledError:
            accounting.client_gone(ctx.pool)
            raise
        finally:
            if resp is not None:
                resp.close()  # unread data (client gone, error) closes the connection: vLLM aborts the request
            replica.in_flight -= 1
            awaiting.release()  # no-op after the first byte
            on_done(ctx.info)  # no-op when the first byte already released the prefill charge

    async def _stream(self, ctx: RequestContext, resp: UpstreamResponse, out_headers: dict[str, str],
                      accounting: Accounting, awaiting: AwaitingFirstByte) -> None:
        out_headers["Cache-Control"] = "no-cache"
        out, t0 = ctx.out, ctx.t0
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
                    awaiting.release()
                    on_first_byte(ctx.info)  # the replica is through this prompt's prefill
                last = now
                events += chunk.count(b"data: ")
                if b"completion_tokens" in chunk:
                    mt = _USAGE.search(chunk)
                    if mt:
                        usage_tokens = int(mt.group(1))
                if not prepared:
                    await out.start(200, out_headers)
                    prepared = True
                if resp.complete:  # the last bytes: one write with the end-of-stream chunk (and the headers)
                    await out.end(chunk)
                    break
                await out.write(chunk)
            else:
                if not prepared:
                    await out.start(200, out_headers)
                await out.end()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            accounting.client_gone(ctx.pool)
            status = 499
        except UpstreamError as e:
            if not prepared:
                raise UpstreamFailed(f"stream failed before the first byte: {e}", mark_down=False) from None
            replica = out_headers["x-llmfleet-replica"]
            log.warning("pool %s: the stream from %s broke mid-response (ended with an error event): %s",
                        ctx.pool, replica, e)
            m = accounting.metrics
            m.child(m.stream_errors, ctx.pool, replica).inc()
            status = 502
            # An explicit error event (OpenAI clients raise on it) instead of a stream that just stops.
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
                await out.end(stream_error_event(f"the replica's stream broke mid-response: {e}"))
        e2e = time.perf_counter() - t0
        tokens = usage_tokens if usage_tokens is not None else max(0, events - 2)  # minus role chunk and [DONE]
        ttft = None if first is None else first - t0
        tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
        accounting.finish(ctx, status, ctx.input_tokens, tokens, ttft, tpot, e2e)


def stream_error_event(message: str, type_: str = "upstream_error", code: int = 502) -> bytes:
    """An SSE event carrying an OpenAI-shaped error; no [DONE] follows it."""
    return b"data: " + json.dumps(error_body(message, type_, code)).encode() + b"\n\n"


def _observe_body(accounting: Accounting, ctx: RequestContext, status: int, data: bytes, e2e: float) -> None:
    out_tokens, in_tokens = _usage(data, ctx.input_tokens)
    accounting.finish(ctx, status, in_tokens, out_tokens, None, None, e2e)


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
    except (ValueError, AttributeError, TypeError, RecursionError):
        return 0, input_tokens
