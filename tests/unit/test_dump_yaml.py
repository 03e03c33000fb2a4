"""dump_yaml: the same text as yaml.safe_dump(sort_keys=False), remembered per JSON value."""

from __future__ import annotations

import datetime
import math

import yaml

from llmfleet.api.loader import dump_yaml


def test_same_text_as_safe_dump() -> None:
    doc = {"b": 1, "a": [1.5, "x: y", "", None, True, {"nested": ["- dash", "#hash"]}], "long": "word " * 40,
           "multi": "line one\nline two\n", "unicode": "naïve", "num_like": "0123", "yes": "yes"}
    assert dump_yaml(doc) == yaml.safe_dump(doc, sort_keys=False)
    assert dump_yaml(doc) == yaml.safe_dump(doc, sort_keys=False)  # the remembered text too


def test_equal_json_text_only() -> None:
    # 1, 1.0 and true are equal in Python (and as dict keys) but not as YAML: each keeps its own text.
    assert [dump_yaml({"v": v}) for v in (1, 1.0, True)] == ["v: 1\n", "v: 1.0\n", "v: true\n"]
    assert dump_yaml({"a": 1, "b": 2}) != dump_yaml({"b": 2, "a": 1})  # insertion order kept
    assert "nan" in dump_yaml({"v": math.nan})


def test_non_json_data_is_dumped_as_is() -> None:
    doc = {"when": datetime.date(2026, 1, 2)}
    assert dump_yaml(doc) == yaml.safe_dump(doc, sort_keys=False) == "when: 2026-01-02\n"
