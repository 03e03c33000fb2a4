"""The Grafana dashboard's PromQL only uses metric names the code exports.

The exported names are derived from the source, not listed here: every prometheus_client metric
constructor (Counter/Gauge/Histogram/Summary, or vLLM's `_counter_cls`-style aliases) in llmfleet/ and in
the installed vllm package, including names built by a small helper (`g("loss", ...)` around
f"llmfleet_train_{name}"), expanded with the suffixes Prometheus adds (_total, _bucket, _sum, _count).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "llmfleet" / "dashboards" / "llmfleet.json"
KINDS = ("counter", "gauge", "histogram", "summary", "info", "enum")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "enum": ("",),
}


def _kind(func: ast.expr) -> str | None:
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    low = name.lower()
    return next((k for k in KINDS if k in low), None)


def _name_arg(call: ast.Call) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "name":
            return kw.value
    return call.args[0] if call.args else None


def metric_definitions(source: str) -> set[tuple[str, str]]:
    """(kind, base name) of every metric constructed in one module."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not (kind := _kind(node.func)):
            continue
        arg = _name_arg(node)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.add((kind, arg.value))
        elif isinstance(arg, ast.JoinedStr):
            found |= {(kind, n) for n in _expand_fstring(arg, node, parents, tree)}
    return found


def _expand_fstring(
    arg: ast.JoinedStr, call: ast.Call, parents: dict[ast.AST, ast.AST], tree: ast.AST
) -> set[str]:
    """f"prefix_{param}" inside `def helper(param, ...)`: the names are the literal arguments of helper's calls."""
    parts = arg.values
    holes = [p for p in parts if isinstance(p, ast.FormattedValue)]
    if len(holes) != 1 or not isinstance(holes[0].value, ast.Name):
        return set()
    param = holes[0].value.id
    func: ast.AST | None = call
    while func is not None and not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        func = parents.get(func)
    if func is None:
        return set()
    params = [a.arg for a in func.args.args]
    if param not in params:
        return set()
    index = params.index(param)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == func.name:
            if len(node.args) > index and isinstance(node.args[index], ast.Constant):
                value = "".join(
                    str(node.args[index].value) if p is holes[0] else str(p.value)  # type: ignore[union-attr]
                    for p in parts
                )
                names.add(value)
    return names


def exported_series(root: Path, prefix: str) -> set[str]:
    series: set[str] = set()
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if prefix not in text:
            continue
        for kind, name in metric_definitions(text):
            if not name.startswith(prefix):
                continue
            base = name.removesuffix("_total") if kind == "counter" else name
            series |= {base + s for s in SUFFIXES[kind]}
    return series


def vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed: cannot derive its metric names")
    return Path(next(iter(spec.submodule_search_locations)))


KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "le",
    "inf",
    "nan",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (functions, labels, keywords and variables removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    # Grafana's label_values(metric, label): the second argument is a label name.
    text = re.sub(r"label_values\(([^,()]+),\s*\w+\s*\)", r"(\1)", text)
    names = set()
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        ident, call = m.group(1), m.group(2)
        if call or ident.lower() in KEYWORDS:
            continue
        names.add(ident)
    return names


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


@pytest.fixture(scope="module")
def exported() -> set[str]:
    names = exported_series(ROOT / "llmfleet", "llmfleet_") | exported_series(vllm_root(), "vllm:")
    # Sanity: the derivation finds the known families (fails if it silently breaks).
    assert {"llmfleet_router_requests_total", "llmfleet_router_ttft_seconds_bucket"} <= names
    assert {"llmfleet_train_loss", "llmfleet_train_mfu", "vllm:kv_cache_usage_perc"} <= names
    return names


def test_promql_parser() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, pool) (rate(a_b_bucket{ns=~"$x",s!~"2.."}[$__rate_interval]))) '
        "/ clamp_min(sum(rate(vllm:c_total[5m])), 1e-9) + label_values(d_total, namespace)"
    )
    assert promql_metric_names(expr) == {"a_b_bucket", "vllm:c_total", "d_total"}
    assert promql_metric_names("vector($ttft_slo_ms / 1000)") == set()


def test_derivation_follows_helper_functions() -> None:
    src = (
        "from prometheus_client import Gauge, Histogram\n"
        "def make():\n"
        "    def g(name, doc):\n"
        "        return Gauge(f'llmfleet_x_{name}', doc)\n"
        "    g('loss', 'd'); g('mfu', 'd')\n"
        "    Histogram(name='vllm:lat_seconds', documentation='d')\n"
    )
    assert metric_definitions(src) == {
        ("gauge", "llmfleet_x_loss"),
        ("gauge", "llmfleet_x_mfu"),
        ("histogram", "vllm:lat_seconds"),
    }


def test_dashboard_uses_only_exported_metrics(exported: set[str]) -> None:
    used = set().union(*(promql_metric_names(e) for e in dashboard_exprs()))
    assert used, "no metric names found in the dashboard"
    unknown = sorted(used - exported)
    assert not unknown, f"dashboard PromQL uses metrics the code does not export: {unknown}"


def test_a_renamed_metric_would_be_caught(exported: set[str]) -> None:
    assert "llmfleet_router_ttft_ms_bucket" not in exported
    assert promql_metric_names("rate(llmfleet_router_ttft_ms_bucket[5m])") - exported


def test_dashboard_covers_the_required_views() -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = " ".join(dashboard_exprs())
    for needle in (
        "llmfleet_router_replica_up",
        "llmfleet_router_requests_total",
        "llmfleet_router_ttft_seconds_bucket",
        "llmfleet_router_tpot_seconds_bucket",
        "$ttft_slo_ms",
        "$tpot_slo_ms",
        "vllm:prefix_cache_hits_total",
        "vllm:kv_cache_usage_perc",
        "llmfleet_router_degraded_requests_total",
        "llmfleet_train_loss",
        "llmfleet_train_tokens_per_second",
        "llmfleet_train_mfu",
    ):
        assert needle in exprs, needle
    assert board["uid"] and {v["name"] for v in board["templating"]["list"]} >= {"datasource", "namespace"}


def test_dashboard_json_is_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "charts/llmfleet/hack/dashboard.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
