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


CORPUS = __import__("pathlib").Path(__file__).resolve().parents[1] / "hostile" / "router"


@pytest.mark.parametrize("path", sorted(CORPUS.iterdir()), ids=lambda p: p.name)
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_hostile_corpus_parses_or_is_a_400(endpoint: str, path) -> None:  # type: ignore[no-untyped-def]
    _check(endpoint, path.read_bytes())


@pytest.mark.parametrize("depth, ok", [(63, True), (64, True), (65, False), (2000, False), (200000, False)])
def test_nesting_bound(depth: int, ok: bool) -> None:
    # The body itself is one level; `x` adds depth - 1.
    raw = b'{"model": "m", "prompt": "p", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    if ok:
        assert parse_request("completions", raw).model == "m"
    else:
        with pytest.raises(RequestError, match="nested deeper than 64") as ei:
            parse_request("completions", raw)
        assert ei.value.status == 400


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_standard_json_constants_rejected(constant: bytes) -> None:
    with pytest.raises(RequestError, match="not valid JSON") as ei:
        parse_request("completions", b'{"model": "m", "prompt": "p", "temperature": ' + constant + b"}")
    assert ei.value.status == 400


nested = st.recursive(st.integers() | st.text(max_size=3), lambda inner: st.lists(inner, max_size=2)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=200)


def _depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(extra=nested, wrap=st.integers(0, 80))
def test_fuzz_nesting_bound_matches_depth(extra: object, wrap: int) -> None:
    for _ in range(wrap):
        extra = [extra]
    body = {"model": "m", "prompt": "p", "x": extra}
    try:
        parse_request("completions", json.dumps(body).encode())
    except RequestError as e:
        assert e.status == 400 and _depth(body) > 64
    else:
        assert _depth(body) <= 64


CHAT_BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize("raw, what", [
    (b"\xff\xfe" + CHAT_BODY.encode("utf-16-le"), "UTF-16 with a BOM"),
    (CHAT_BODY.encode("utf-16-be"), "UTF-16 without a BOM"),
    (CHAT_BODY.encode("utf-32"), "UTF-32"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "a\xed\xa0\x80b"}]}', "a UTF-8-encoded surrogate"),
])
def test_only_utf8_bodies_are_decoded(raw: bytes, what: str) -> None:
    """json.loads(bytes) would guess the encoding (and pass encoded surrogates): the router must not, since
    the body goes upstream as the client's bytes."""
    with pytest.raises(RequestError) as ei:
        parse_request("chat", raw)
    assert ei.value.status == 400, what
    assert "not UTF-8" in ei.value.message or "not valid JSON" in ei.value.message  # NUL bytes are UTF-8


def test_a_utf8_bom_is_not_json() -> None:
    with pytest.raises(RequestError) as ei:
        parse_request("chat", b"\xef\xbb\xbf" + CHAT_BODY.encode())
    assert ei.value.status == 400 and "not valid JSON" in ei.value.message


def test_an_escaped_lone_surrogate_is_valid_json() -> None:
    p = parse_request("chat", b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}')
    assert p.messages == [{"role": "user", "content": "\ud800"}]
