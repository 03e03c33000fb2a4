"""The request log writes every string the router accepts, as JSON lines that read back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.router.request_log import RequestLog
from llmfleet.router.requests import parse_request


@pytest.mark.parametrize("content", ["\ud800", "caf\u00e9 \udfff \U0001f600", "plain"])
def test_any_accepted_string_is_logged_and_reads_back(tmp_path: Path, content: str) -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}], "stop": [content]}).encode()
    parsed = parse_request("chat", raw)  # the router accepts it (a lone surrogate is valid JSON)
    log = RequestLog(str(tmp_path / "r.jsonl"))
    log.write(tenant="t", model="m", parsed=parsed, input_tokens=1, output_tokens=2, pool="primary", degraded=False,
              ttft=None, e2e=0.01, status=200)
    log.write(tenant="t", model="m", parsed=parse_request("completions", b'{"model": "m", "prompt": "caf\xc3\xa9"}'),
              input_tokens=1, output_tokens=2, pool="primary", degraded=False, ttft=None, e2e=0.01, status=200)
    log.close()
    data = (tmp_path / "r.jsonl").read_bytes()
    data.decode("utf-8")  # the file stays valid UTF-8
    first, second = (json.loads(line) for line in data.splitlines())
    assert first["messages"][0]["content"] == content and first["params"]["stop"] == [content]
    assert second["prompt"] == "café" and "café".encode() in data  # non-ASCII stays readable when it can
