"""The request log: one JSON line per request (DEVELOPERS.md format), the feature store's training data."""

from __future__ import annotations

import json
import logging
import time
from typing import IO

from llmfleet.router.requests import ParsedRequest

log = logging.getLogger("llmfleet.router.request_log")


class RequestLog:
    """JSON lines in the DEVELOPERS.md format, UTF-8; one flushed append per request.

    Every string the router accepted can be written: a lone surrogate (valid JSON `"\\ud800"`, but not
    encodable as UTF-8) is written as its JSON escape, so the line still reads back as the same string.
    """

    def __init__(self, path: str, log_prompts: bool = True) -> None:
        self.path = path
        self.log_prompts = log_prompts
        self._f: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - kept open for the process

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
            line = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: \uXXXX escapes for everything outside ASCII
            line = (json.dumps(rec) + "\n").encode("ascii")
        try:
            self._f.write(line)
            self._f.flush()
        except OSError as e:
            log.error("request log write failed: %s", e)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
