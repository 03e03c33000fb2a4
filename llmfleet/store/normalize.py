"""How a request becomes a key: normalized prompt text, its hash, the sampling-parameter hash, prefix blocks.

The router (online) and the offline generator must compute the same keys, so both call these functions.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

ENDPOINTS = ("chat", "completions")

# Request parameters that change the output: only these take part in the response key. Everything else
# (stream, user, stream_options, ...) does not, so a streaming and a non-streaming request share a response.
SAMPLING_PARAMS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
)

_WS = re.compile(r"\s+")


class BadRequestError(ValueError):
    """The request cannot be keyed (no prompt, unknown endpoint)."""


def normalize_text(text: str) -> str:
    """NFC, whitespace runs collapsed to one space, ends stripped. Case is kept: it can change the answer."""
    if not text.isascii():  # ASCII is already NFC; skipping the call keeps the router's hot path cheap
        text = unicodedata.normalize("NFC", text)
    return _WS.sub(" ", text).strip()


def _content_text(content: Any) -> str:
    # OpenAI content is a string or a list of parts ({"type": "text", "text": ...}).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def normalized_prompt(endpoint: str, prompt: str | None, messages: Sequence[Any] | None) -> str:
    """The canonical text of a request: the prompt, or `role: content` lines of the chat messages."""
    if endpoint not in ENDPOINTS:
        raise BadRequestError(f"endpoint must be one of {ENDPOINTS}, got {endpoint!r}")
    if messages:
        lines = []
        for m in messages:
            if not isinstance(m, dict):
                raise BadRequestError("each message must be an object with role and content")
            lines.append(f"{m.get('role', 'user')}: {normalize_text(_content_text(m.get('content')))}")
        return "\n".join(lines)
    if isinstance(prompt, list):  # completions accept a list of prompts; keyed as one joined text
        prompt = "\n".join(str(p) for p in prompt)
    if not prompt:
        raise BadRequestError("request has neither messages nor prompt")
    return normalize_text(prompt)


def prompt_hash(endpoint: str, text: str) -> str:
    """sha256 hex of endpoint + normalized text (chat and completions responses have different shapes)."""
    return hashlib.sha256(f"{endpoint}\n{text}".encode()).hexdigest()


def sampling_params(params: dict[str, Any] | None) -> dict[str, Any]:
    return {k: params[k] for k in SAMPLING_PARAMS if params and k in params and params[k] is not None}


def params_hash(params: dict[str, Any] | None) -> str:
    """Short hash of the sampling parameters, canonical JSON (sorted keys)."""
    canon = json.dumps(sampling_params(params), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:32]


def split_request(endpoint: str, body: dict[str, Any]) -> tuple[str | None, list[Any] | None, dict[str, Any]]:
    """(prompt, messages, params) of an OpenAI request body, as the request log stores them."""
    params = {k: v for k, v in body.items() if k not in ("model", "messages", "prompt")}
    messages = body.get("messages") if endpoint == "chat" else None
    prompt = body.get("prompt") if endpoint == "completions" else None
    return prompt, messages, params


def approx_tokens(text: str) -> list[str]:
    """A tokenizer-free stand-in: ~4 characters per token (used when no tokenizer is configured)."""
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def prefix_block_hashes(
    text: str, block_size: int = 16, tokenize: Callable[[str], Sequence[Any]] = approx_tokens
) -> list[str]:
    """Chained hashes of the full `block_size`-token blocks of the prompt (as a prefix cache keys its blocks).

    Block i's hash covers tokens [0, (i+1)*block_size): two prompts share block i iff they share that prefix.
    """
    tokens = list(tokenize(text))
    out: list[str] = []
    parent = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = "\x1f".join(str(t) for t in tokens[start : start + block_size]).encode()
        parent = hashlib.sha256(parent + block).digest()[:8]
        out.append(parent.hex())
    return out
