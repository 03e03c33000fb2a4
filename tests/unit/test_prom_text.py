"""llmfleet.util.prom_text reads sample lines as prometheus_client's parser does (the equivalence target)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmfleet.util.prom_text import label_key, parse_labels, parse_samples

REAL_PAGE = Path(__file__).parents[1] / "data" / "vllm_0.32_metrics.txt"


def reference(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def test_a_real_vllm_page_reads_like_prometheus_client() -> None:
    text = REAL_PAGE.read_text()
    samples = parse_samples(text)
    assert samples == reference(text) and len(samples) == 430
    assert samples[("vllm:prefix_cache_queries_total", (("engine", "0"), ("model_name", "tiny-llama")))] == 85
    ttft_inf = ("vllm:time_to_first_token_seconds_bucket", (("engine", "0"), ("le", "+Inf"), ("model_name", "tiny-llama")))
    assert samples[ttft_inf] == 5  # the five requests


def test_hand_written_lines() -> None:
    text = ('# HELP a_total help with "quotes" and \\\\ escapes\n# TYPE a_total counter\n'
            'a_total{x="1",y="a \\"b\\" {c}, d\\\\e\\nf",} 3 1700000000000\n'
            '  b{} +Inf\nc NaN\n\nd{le="0.5"} -1.5e-3\r\n# EOF\n')
    samples = parse_samples(text)
    assert samples[("a_total", (("x", "1"), ("y", 'a "b" {c}, d\\e\nf')))] == 3  # timestamp not read
    assert samples[("b", ())] == math.inf and math.isnan(samples[("c", ())]) and samples[("d", (("le", "0.5"),))] == -0.0015
    assert len(samples) == 4


@pytest.mark.parametrize("line", ["a{x=1} 2", "a{x=\"1\" y=\"2\"} 3", "a{x=\"1\"} lots", "{x=\"1\"} 2", "a", "9a 1"])
def test_malformed_lines_raise(line: str) -> None:
    with pytest.raises(ValueError):
        parse_samples(f"ok 1\n{line}\n")
    with pytest.raises(ValueError):  # so does prometheus_client's parser
        reference(f"ok 1\n{line}\n")


def test_label_sets_are_parsed_once_per_distinct_text() -> None:
    label_key.cache_clear()
    page = "".join(f'm_bucket{{le="{le}",engine="0"}} {i}\n' for i, le in enumerate(("1", "2", "+Inf")))
    parse_samples(page)
    parse_samples(page)
    info = label_key.cache_info()
    assert (info.misses, info.hits) == (3, 3)
    assert label_key('b="2",a="1"') == (("a", "1"), ("b", "2"))  # sorted by name
    assert parse_labels(' a = "x" , b="y\\"z" ') == {"a": "x", "b": 'y"z'}


label_value = st.text(st.sampled_from(list('ab {}=,"\\\n\tü:._0')), max_size=12)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.tuples(label_value, label_value), min_size=1, max_size=4),
       amounts=st.lists(st.floats(min_value=0, max_value=1e12, allow_nan=False), min_size=1, max_size=4))
def test_pages_rendered_by_prometheus_client_read_the_same(values: list[tuple[str, str]], amounts: list[float]) -> None:
    reg = CollectorRegistry()
    g = Gauge("vllm:num_requests_running", "running", ["engine", "note"], registry=reg)
    c = Counter("vllm:prefix_cache_hits", "hits", ["engine", "note"], registry=reg)
    h = Histogram("vllm:time_to_first_token_seconds", "ttft", ["engine", "note"], registry=reg, buckets=[0.1, 1, 10])
    for (engine, note), x in zip(values, amounts * len(values), strict=False):
        g.labels(engine, note).set(x)
        c.labels(engine, note).inc(x)
        h.labels(engine, note).observe(x)
    text = generate_latest(reg).decode()
    assert parse_samples(text) == reference(text)
