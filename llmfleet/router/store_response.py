"""Answering a request from the feature store instead of a replica (streamed or whole, OpenAI-shaped)."""

from __future__ import annotations

import json
import time
from typing import Any

from llmfleet.router.accounting import Accounting, RequestContext
from llmfleet.router.respond import send_json


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


async def lookup_response(ctx: RequestContext, hit: Any, accounting: Accounting) -> None:
    """Answer from the feature store (pool `feature-store`, never degraded)."""
    parsed = ctx.parsed
    headers = {"x-llmfleet-pool": "feature-store", "x-llmfleet-degraded": "false",
               "x-llmfleet-lookup": str(getattr(hit, "kind", "exact"))}
    resp: dict[str, Any] = dict(hit.response)
    usage = resp.get("usage") or {}
    out_tokens = int(usage.get("completion_tokens") or 0)
    if parsed.stream:
        await ctx.out.start(200, {**headers, "Content-Type": "text/event-stream"})
        await ctx.out.end(_as_sse(resp, parsed.endpoint))
    else:
        send_json(ctx.out, 200, resp, headers)
    e2e = time.perf_counter() - ctx.t0
    ctx.pool, ctx.degraded = "feature-store", False
    accounting.finish(ctx, 200, int(usage.get("prompt_tokens") or 0), out_tokens, e2e if parsed.stream else None,
                      None, e2e)
