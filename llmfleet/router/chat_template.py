"""The served model's chat template, so that chat prefix keys are the engine's own prompt tokens.

vLLM renders a chat request with the model's Jinja chat template (from `tokenizer_config.json`, or a
`chat_template.jinja` file beside it) and tokenizes the result with `add_special_tokens=False`: the template
itself writes BOS. The router does the same render, then hashes blocks of those tokens, so its keys line up
with the engine's KV cache (and with vLLM's KV events) for chat as well as for completions.

Used only where it matters, for pools that tokenize (`prefixMode: tokens`, or `auto` with a tokenizer.json):
text blocks are a stand-in for prefix identity and the flattened messages serve that as well. Rendering follows
transformers' `apply_chat_template` environment (sandboxed Jinja, `trim_blocks`, `lstrip_blocks`, `tojson`,
`raise_exception`, `bos_token` / `eos_token` and the other special tokens of the config); message contents
that are lists of parts are joined to their text, as vLLM does for string-content templates. Limits: no tools
or documents are passed to the template, and a template that raises (e.g. "roles must alternate") falls back
to the flattened messages: vLLM will reject that request itself.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("llmfleet.router.chat_template")


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return str(v["content"])
    return None


class ChatTemplate:
    """render(messages) -> the prompt text the engine tokenizes, minus a BOS the tokenizer adds itself."""

    def __init__(self, source: str, special_tokens: dict[str, str], tokenizer: Any = None) -> None:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self._template = env.from_string(source)
        self._error = TemplateError
        self.special_tokens = special_tokens
        # The router encodes with add_special_tokens=True (as vLLM's completions path does). When that adds a
        # leading BOS, drop the template's own BOS text so the ids equal vLLM's chat encoding (no specials).
        self.strip_prefix = ""
        bos = special_tokens.get("bos_token")
        if tokenizer is not None and bos:
            added = tokenizer.encode("", add_special_tokens=True).ids
            if added and added[0] == tokenizer.token_to_id(bos):
                self.strip_prefix = bos

    @classmethod
    def from_tokenizer_dir(cls, path: str | None, tokenizer: Any = None) -> ChatTemplate | None:
        """The template beside a tokenizer.json (file or folder), or None when there is none or it is invalid."""
        if not path:
            return None
        folder = Path(path)
        if not folder.is_dir():  # the tokenizer.json file itself
            folder = folder.parent
        cfg: dict[str, Any] = {}
        try:
            cfg = json.loads((folder / "tokenizer_config.json").read_text())
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("%s/tokenizer_config.json unreadable (%s): chat prefix keys from flattened messages", folder, e)
        source = cfg.get("chat_template") if isinstance(cfg, dict) else None
        jinja_file = folder / "chat_template.jinja"
        if source is None and jinja_file.is_file():
            source = jinja_file.read_text()
        if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        if not isinstance(source, str):
            return None
        special = {k: t for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                   if (t := _token_text(cfg.get(k))) is not None}
        try:
            from jinja2.exceptions import TemplateError
        except ImportError:
            log.warning("jinja2 not installed: chat prefix keys from flattened messages")
            return None
        try:
            return cls(source, special, tokenizer)
        except TemplateError as e:
            log.warning("chat template in %s does not compile (%s): chat prefix keys from flattened messages",
                        folder, e)
            return None

    def render(self, messages: list[dict[str, Any]]) -> str | None:
        """The prompt for `messages` (with the generation prompt), or None when the template rejects them."""
        msgs = [{**m, "content": _content_text(m.get("content"))} for m in messages]
        try:
            text = self._template.render(messages=msgs, add_generation_prompt=True, **self.special_tokens)
        except (self._error, TypeError, ValueError) as e:  # a template's own errors, or messages it cannot take
            log.debug("chat template rejected the messages (%s): flattened messages instead", e)
            return None
        if self.strip_prefix and text.startswith(self.strip_prefix):
            text = text[len(self.strip_prefix):]
        return text


def _content_text(content: Any) -> Any:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


__all__ = ["ChatTemplate"]
