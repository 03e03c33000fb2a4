"""Parse and validate OpenAI request bodies (pure; fuzzed with hypothesis). Errors -> 4xx, never 5xx."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Endpoint = Literal["chat", "completions"]

# Deepest JSON nesting accepted in a request body (OpenAI bodies, tool schemas included, stay far below).
# Deeper bodies get 400 before anything recursive (the JSON decoder, re-encoding, the feature store) sees them.
MAX_JSON_DEPTH = 64


def error_body(message: str, type_: str = "invalid_request_error", code: str | int | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class RequestError(Exception):
    """A client error with an OpenAI-shaped JSON body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


@dataclass
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    prompt_text: str  # what the prefix index hashes (chat: messages flattened with role markers)
    prompt: str | None  # completions prompt as logged
    messages: list[Any] | None


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise RequestError(400, f"messages[{i}].content[{j}] must be an object", param=f"messages[{i}].content")
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise RequestError(400, f"messages[{i}].content[{j}].text must be a string",
                                       param=f"messages[{i}].content")
                parts.append(text)
        return "".join(parts)
    raise RequestError(400, f"messages[{i}].content must be a string, a list of parts or null", param=f"messages[{i}].content")


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(400, f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise RequestError(400, f"messages[{i}].role must be a non-empty string", param="messages")
        out.append(f"<|{role}|>\n{_content_text(m.get('content'), i)}\n")
    return "".join(out)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return " ".join(map(str, prompt))  # token ids: stable text stand-in
    raise RequestError(400, "'prompt' must be a string, a list of strings or a list of token ids", param="prompt")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every body: json.loads(text, parse_constant=...) builds a new one (and its scanner) per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` levels (iterative: no recursion on hostile input)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _too_deep(max_depth: int) -> RequestError:
    return RequestError(400, f"request body is nested deeper than {max_depth} levels")


def decode_json_body(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """UTF-8 JSON (RFC 8259: no BOM, no other encoding; no NaN/Infinity) nested at most `max_depth` levels,
    else RequestError 400.

    Decoded here once, strictly: `json.loads(bytes)` would guess UTF-16/32 from the first bytes and let
    UTF-8-encoded surrogates through, and such a body, forwarded as is, fails at every replica instead.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"request body is not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        body = _DECODER.decode(text)  # a UTF-8 BOM is refused too ("Expecting value")
    except RecursionError:  # the decoder's own recursion guard: far deeper than max_depth
        raise _too_deep(max_depth) from None
    except ValueError as e:
        raise RequestError(400, f"request body is not valid JSON: {e}") from None
    # Only bodies with more brackets than the limit can be too deep: skip the walk for everything else.
    if isinstance(body, (dict, list)) and raw.count(b"[") + raw.count(b"{") > max_depth and _deeper_than(body, max_depth):
        raise _too_deep(max_depth)
    return body


def parse_request(endpoint: Endpoint, raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> ParsedRequest:
    """Validate what the router relies on; everything else passes through to the engine untouched."""
    body = decode_json_body(raw, max_depth)
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' is required and must be a string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be a boolean", param="stream")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise RequestError(400, f"'{key}' must be a non-negative integer", param=key)
    if endpoint == "chat":
        messages = body.get("messages")
        text = _messages_text(messages)
        return ParsedRequest(endpoint, body, model, stream, text, None, messages)
    if "prompt" not in body:
        raise RequestError(400, "'prompt' is required", param="prompt")
    text = _prompt_text(body["prompt"])
    prompt = body["prompt"] if isinstance(body["prompt"], str) else text
    return ParsedRequest(endpoint, body, model, stream, text, prompt, None)
