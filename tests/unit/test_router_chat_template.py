"""Chat prefix keys from the served model's chat template (as vLLM renders and tokenizes chat requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.local.tinymodel import CHAT_TEMPLATE, train_tokenizer
from llmfleet.router.block_keys import BlockHasher
from llmfleet.router.chat_template import ChatTemplate
from llmfleet.router.config import PoolConfig, RouterConfig
from llmfleet.router.requests import parse_request

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]}]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(d, vocab_size=400, corpus_bytes=30_000)  # the tiny models' tokenizer + chat template, small
    return d


def vllm_chat_ids(tok_dir: Path, messages: list[dict[str, object]]) -> list[int]:
    """What vLLM feeds the engine for a chat request: the template rendered, encoded without special tokens."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from tokenizers import Tokenizer

    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    msgs = [{**m, "content": m["content"] if isinstance(m["content"], str)
             else "".join(p["text"] for p in m["content"])} for m in messages]  # type: ignore[index, union-attr]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(cfg["chat_template"]).render(messages=msgs, add_generation_prompt=True,
                                                         bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
    return tok.encode(text, add_special_tokens=False).ids


def test_render_matches_the_template(tok_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    ct = ChatTemplate.from_tokenizer_dir(str(tok_dir), tok)
    assert ct is not None and ct.strip_prefix == ""  # this tokenizer adds no BOS itself: the template's stays
    assert ct.render(MESSAGES) == "<|begin_of_text|><|system|>\nYou are terse.\n<|user|>\nhello there\n<|assistant|>\n"
    assert tok.encode(ct.render(MESSAGES) or "", add_special_tokens=True).ids == vllm_chat_ids(tok_dir, MESSAGES)


def test_tokenizer_that_adds_bos_gets_no_second_one(tok_dir: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    ct = ChatTemplate(CHAT_TEMPLATE, {"bos_token": bos, "eos_token": "<|end_of_text|>"}, tok)
    assert ct.strip_prefix == bos
    text = ct.render(MESSAGES) or ""
    ids = tok.encode(text, add_special_tokens=True).ids
    assert ids == vllm_chat_ids(tok_dir, MESSAGES) and ids.count(tok.token_to_id(bos)) == 1


def test_rejecting_template_and_missing_or_invalid_files(tmp_path: Path) -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}x"
    ct = ChatTemplate(strict, {})
    assert ct.render([{"role": "system", "content": "s"}]) is None  # falls back to flattened messages
    assert ct.render([{"role": "user", "content": "u"}]) == "x"
    assert ChatTemplate.from_tokenizer_dir(str(tmp_path)) is None  # no config, no template file
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}")
    from_file = ChatTemplate.from_tokenizer_dir(str(tmp_path / "tokenizer.json"))
    assert from_file is not None and from_file.render([{"role": "user", "content": "a"}]) == "[user]"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for %}"}))
    assert ChatTemplate.from_tokenizer_dir(str(tmp_path)) is None  # does not compile: logged, not fatal
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
         "bos_token": {"content": "<s>"}}))
    named = ChatTemplate.from_tokenizer_dir(str(tmp_path))
    assert named is not None and named.render([]) == "D" and named.special_tokens == {"bos_token": "<s>"}


async def test_router_chat_keys_are_the_engine_prompt_blocks(tok_dir: Path) -> None:
    from llmfleet.router.server import Router

    cfg = RouterConfig(service="s", pools=[PoolConfig(name="p", role="primary", served_names=["m"],
                                                      endpoints=["http://127.0.0.1:9"], block_size=4,
                                                      tokenizer_path=str(tok_dir), prefix_mode="tokens")])
    router = Router(cfg)
    pool = router.pools["p"]
    assert pool.chat_template is not None
    parsed = parse_request("chat", json.dumps({"model": "m", "messages": MESSAGES}).encode())
    keys, n_tokens = await router._keys(pool, parsed)
    ids = vllm_chat_ids(tok_dir, MESSAGES)
    import numpy as np

    assert n_tokens == len(ids) and keys == BlockHasher(4).keys(np.asarray(ids, dtype=np.uint64))
    flat_keys, _ = pool.blocks(parsed.prompt_text)
    assert flat_keys != keys  # the flattened messages would not have matched the engine's blocks
    # a lone surrogate (valid JSON) is no text the tokenizer takes: keyed as U+FFFD, the request goes on
    odd = parse_request("chat", json.dumps({"model": "m", "messages": [{"role": "user", "content": "a \ud800"}]}).encode())
    keys, n_tokens = await router._keys(pool, odd)
    assert n_tokens == len(vllm_chat_ids(tok_dir, [{"role": "user", "content": "a \ufffd"}]))


async def test_long_conversations_next_turn_is_keyed_on_the_loop(tok_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A long prompt with much new text is tokenized in a worker thread; the next turn of the same conversation
    # has most of its ids already (PromptTokenizer), so it is keyed right away. Keys are the engine's either way.
    import asyncio

    import numpy as np

    from llmfleet.router import server
    from llmfleet.router.server import Router

    threaded: list[int] = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        threaded.append(len(args[0]))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(server.asyncio, "to_thread", counting_to_thread)
    cfg = RouterConfig(service="s", pools=[PoolConfig(name="p", role="primary", served_names=["m"],
                                                      endpoints=["http://127.0.0.1:9"], block_size=4,
                                                      tokenizer_path=str(tok_dir), prefix_mode="tokens")])
    router = Router(cfg)
    pool = router.pools["p"]
    words = Path(json.__file__).read_text().split()
    messages: list[dict[str, object]] = [{"role": "system", "content": " ".join(words[:2000])},
                                         {"role": "user", "content": "first question"}]
    assert len(" ".join(words[:2000])) > 2 * server.LONG_PROMPT_CHARS
    for turn in range(3):
        parsed = parse_request("chat", json.dumps({"model": "m", "messages": messages}).encode())
        keys, n_tokens = await router._keys(pool, parsed)
        ids = vllm_chat_ids(tok_dir, messages)
        assert n_tokens == len(ids) and keys == BlockHasher(4).keys(np.asarray(ids, dtype=np.uint64))
        assert len(threaded) == 1  # only the first turn: all of it was new
        messages += [{"role": "assistant", "content": f"answer {turn} " + " ".join(words[50:90])},
                     {"role": "user", "content": f"question {turn + 2}"}]
