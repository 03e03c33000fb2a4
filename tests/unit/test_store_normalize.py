"""Keys of the feature store: normalization, prompt and parameter hashes, prefix blocks."""

from __future__ import annotations

import pytest

from llmfleet.store.normalize import (
    BadRequestError,
    normalized_prompt,
    params_hash,
    prefix_block_hashes,
    prompt_hash,
    split_request,
)


def test_whitespace_and_unicode_normalize_but_case_does_not() -> None:
    a = normalized_prompt("completions", "  Hello\n\tworld  ", None)
    b = normalized_prompt("completions", "Hello world", None)
    c = normalized_prompt("completions", "hello world", None)
    assert a == b == "Hello world" and c != b
    assert normalized_prompt("completions", "cafe\u0301", None) == normalized_prompt("completions", "caf\u00e9", None)


def test_chat_messages_roles_and_parts() -> None:
    m1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi  there"}]
    m2 = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
          {"role": "user", "content": "Hi there"}]
    assert normalized_prompt("chat", None, m1) == normalized_prompt("chat", None, m2) == "system: Be brief.\nuser: Hi there"
    swapped = [{"role": "user", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert normalized_prompt("chat", None, swapped) != normalized_prompt("chat", None, m1)


def test_prompt_hash_depends_on_endpoint() -> None:
    assert prompt_hash("chat", "x") != prompt_hash("completions", "x")
    assert len(prompt_hash("chat", "x")) == 64


@pytest.mark.parametrize(
    ("endpoint", "prompt", "messages"),
    [("chat", None, None), ("completions", "", None), ("embeddings", "x", None), ("chat", None, ["not a dict"])],
)
def test_unkeyable_requests(endpoint: str, prompt: str | None, messages: list | None) -> None:  # type: ignore[type-arg]
    with pytest.raises(BadRequestError):
        normalized_prompt(endpoint, prompt, messages)


def test_params_hash_ignores_non_sampling_params() -> None:
    base = {"max_tokens": 16, "temperature": 0}
    assert params_hash(base) == params_hash({**base, "stream": True, "user": "u1"})
    assert params_hash({"temperature": 0, "max_tokens": 16}) == params_hash(base)  # order-free
    assert params_hash(base) != params_hash({**base, "max_tokens": 17})
    assert params_hash({}) == params_hash(None) == params_hash({"top_p": None})


def test_split_request() -> None:
    prompt, messages, params = split_request("chat", {"model": "m", "messages": [{"role": "user", "content": "q"}],
                                                       "temperature": 0.5})
    assert prompt is None and messages == [{"role": "user", "content": "q"}] and params == {"temperature": 0.5}
    prompt, messages, params = split_request("completions", {"model": "m", "prompt": "p", "max_tokens": 3})
    assert prompt == "p" and messages is None and params == {"max_tokens": 3}


def test_prefix_blocks_are_a_chain() -> None:
    a = prefix_block_hashes("x" * 64 * 4 + "tail A", block_size=16)
    b = prefix_block_hashes("x" * 64 * 4 + "tail B", block_size=16)
    c = prefix_block_hashes("y" + "x" * 64 * 4, block_size=16)
    assert len(a) == 4 and a == b  # the partial last block is not hashed
    assert a[0] != c[0] and not set(a) & set(c)  # a different first token changes every block
    d = prefix_block_hashes("x" * 32 * 4 + "z" * 32 * 4, block_size=16)
    assert d[:2] == a[:2] and d[2:] != a[2:]
    words = prefix_block_hashes("a b c d e f", block_size=2, tokenize=str.split)
    assert len(words) == 3
