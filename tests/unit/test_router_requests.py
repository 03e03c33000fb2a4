"""Request parser: table of cases plus hypothesis fuzzing (never anything but ParsedRequest or a 4xx)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmfleet.router.requests import ParsedRequest, RequestError, parse_request


@pytest.mark.parametrize(
    "endpoint, body, text",
    [
        ("chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "<|user|>\nhi\n"),
        ("chat", {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                           {"type": "image_url", "image_url": {}},
                                                                           {"type": "text", "text": "b"}]}]},
         "<|user|>\nab\n"),
        ("chat", {"model": "m", "messages": [{"role": "assistant", "content": None}], "stream": None}, "<|assistant|>\n\n"),
        ("completions", {"model": "m", "prompt": "abc", "stream": True}, "abc"),
        ("completions", {"model": "m", "prompt": ["a", "b"]}, "a\nb"),
        ("completions", {"model": "m", "prompt": [1, 2, 3]}, "1 2 3"),
    ],
)
def test_valid(endpoint, body, text) -> None:  # type: ignore[no-untyped-def]
    p = parse_request(endpoint, json.dumps(body).encode())
    assert p.prompt_text == text and p.model == "m" and p.stream is bool(body.get("stream"))


@pytest.mark.parametrize(
    "endpoint, raw, param",
    [
        ("chat", b"", None),
        ("chat", b"\xff\xfe", None),
        ("chat", b'"str"', None),
        ("chat", b'{"model": 3, "messages": []}', "model"),
        ("chat", b'{"model": "m"}', "messages"),
        ("chat", b'{"model": "m", "messages": [1]}', "messages"),
        ("chat", b'{"model": "m", "messages": [{"content": "x"}]}', "messages"),
        ("chat", b'{"model": "m", "messages": [{"role": "u", "content": 5}]}', "messages[0].content"),
        ("chat", b'{"model": "m", "messages": [{"role": "u", "content": [1]}]}', "messages[0].content"),
        ("chat", b'{"model": "m", "messages": [{"role": "u", "content": "x"}], "max_tokens": -1}', "max_tokens"),
        ("chat", b'{"model": "m", "messages": [{"role": "u", "content": "x"}], "n": true}', "n"),
        ("completions", b'{"model": "m"}', "prompt"),
        ("completions", b'{"model": "m", "prompt": [1, "a"]}', "prompt"),
        ("completions", b'{"model": "m", "prompt": []}', "prompt"),
    ],
)
def test_invalid(endpoint, raw, param) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RequestError) as ei:
        parse_request(endpoint, raw)
    assert ei.value.status == 400 and ei.value.param == param
    assert ei.value.body()["error"]["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", ""]) | json_values},
                                optional={"content": json_values | st.lists(
                                    st.fixed_dictionaries({"type": st.sampled_from(["text", "x"]), "text": json_values}),
                                    max_size=3)})
request = st.fixed_dictionaries(
    {},
    optional={"model": st.sampled_from(["m", ""]) | json_values, "messages": st.lists(message, max_size=3) | json_values,
              "prompt": json_values, "stream": json_values, "max_tokens": json_values},
)


def _check(endpoint: str, raw: bytes) -> None:
    try:
        out = parse_request(endpoint, raw)  # type: ignore[arg-type]
    except RequestError as e:
        assert 400 <= e.status < 500 and e.message
        json.dumps(e.body())
    else:
        assert isinstance(out, ParsedRequest) and isinstance(out.prompt_text, str) and out.model


@settings(max_examples=300, deadline=None)
@given(endpoint=st.sampled_from(["chat", "completions"]), body=request)
def test_fuzz_structured(endpoint: str, body: dict) -> None:
    _check(endpoint, json.dumps(body).encode())


@settings(max_examples=200, deadline=None)
@given(endpoint=st.sampled_from(["chat", "completions"]), raw=st.binary(max_size=200))
def test_fuzz_bytes(endpoint: str, raw: bytes) -> None:
    _check(endpoint, raw)
