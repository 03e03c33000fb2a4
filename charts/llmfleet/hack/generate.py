#!/usr/bin/env python3
"""Generate the chart's derived files, or check that they are fresh (`--check`).

- README.md: the values table, parsed from the `# --` comments in values.yaml (helm-docs' convention:
  a `# -- text` block right above a key documents it; `# (type) text` overrides the type column).
- files/operator-rbac.yaml: the operator's RBAC rules from llmfleet.operator.rbac.OPERATOR_RULES, split
  into cluster-scoped and namespaced rules (templates/rbac.yaml turns them into (Cluster)Roles).

Run from anywhere: `python charts/llmfleet/hack/generate.py [--check]` (also `make chart-docs`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART_DIR = Path(__file__).resolve().parents[1]
README = CHART_DIR / "README.md"
README_HEADER = CHART_DIR / "hack" / "README.header.md"
RBAC_FILE = CHART_DIR / "files" / "operator-rbac.yaml"

_KEY_RE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+|\"[^\"]+\"):(?: |$)")
_DOC_RE = re.compile(r"^ *# -- ?(?P<text>.*)$")
_CONT_RE = re.compile(r"^ *#(?: (?P<text>.*))?$")
_TYPE_RE = re.compile(r"^\((?P<type>[a-z]+)\) ?(?P<text>.*)$")


@dataclass
class ValueDoc:
    """One key of values.yaml: its dotted path, default, type and `# --` description (None if absent)."""

    path: tuple[str, ...]
    line: int
    description: str | None
    type_override: str | None
    default: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def type(self) -> str:
        if self.type_override:
            return self.type_override
        return _type_name(self.default)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "null"


def _lookup(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def parse_values(text: str) -> list[ValueDoc]:
    """Every mapping key of values.yaml (in file order), with the `# --` comment block right above it."""
    data = yaml.safe_load(text) or {}
    docs: list[ValueDoc] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mapping keys
    pending: list[str] | None = None  # lines of the `# --` block being read
    in_block_scalar_indent: int | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if in_block_scalar_indent is not None:
            if stripped and len(line) - len(line.lstrip(" ")) <= in_block_scalar_indent:
                in_block_scalar_indent = None
            else:
                continue
        if not stripped:
            pending = None
            continue
        doc = _DOC_RE.match(line)
        if doc:
            pending = [doc.group("text")]
            continue
        if stripped.startswith("#"):
            cont = _CONT_RE.match(line)
            if pending is not None and cont:
                pending.append(cont.group("text") or "")
            continue
        m = _KEY_RE.match(line)
        if not m or stripped.startswith("-"):
            pending = None
            continue
        indent = len(m.group("indent"))
        key = m.group("key").strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*[k for _, k in stack], key)
        try:
            default = _lookup(data, path)
        except (KeyError, TypeError):
            # A key inside a list item (e.g. extraEnv entries): part of its parent's value.
            pending = None
            continue
        description = type_override = None
        if pending is not None:
            description = " ".join(p.strip() for p in pending).strip()
            t = _TYPE_RE.match(description)
            if t:
                type_override, description = t.group("type"), t.group("text")
        docs.append(ValueDoc(path, lineno, description, type_override, default))
        stack.append((indent, key))
        pending = None
        rest = line[m.end() :].strip()
        if rest in ("|", "|-", ">", ">-"):
            in_block_scalar_indent = indent
    return docs


def undocumented(docs: list[ValueDoc]) -> list[str]:
    """Keys that break the rule: every leaf value carries a `# --` comment, either on itself or on an ancestor
    map that is documented as a whole (none of whose descendants has a comment of its own)."""
    by_path = {d.path: d for d in docs}

    def children(path: tuple[str, ...]) -> list[ValueDoc]:
        return [d for d in docs if len(d.path) == len(path) + 1 and d.path[: len(path)] == path]

    def descendants_documented(path: tuple[str, ...]) -> bool:
        return any(d.description for d in docs if len(d.path) > len(path) and d.path[: len(path)] == path)

    bad: list[str] = []

    def check(path: tuple[str, ...]) -> None:
        d = by_path[path]
        if d.description and not descendants_documented(path):
            return  # documented as a whole
        kids = children(path)
        if not kids:
            if not d.description:
                bad.append(d.key)
            return
        if d.description and not all(k.description or children(k.path) for k in kids):
            bad.append(d.key + " (documented, but only some children are)")
        for k in kids:
            check(k.path)

    for d in docs:
        if len(d.path) == 1:
            check(d.path)
    return bad


def _cell(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), sort_keys=False)
    return "`" + text.replace("|", "\\|") + "`"


def render_readme(values_text: str) -> str:
    docs = [d for d in parse_values(values_text) if d.description]
    header = README_HEADER.read_text()
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for d in docs:
        desc = (d.description or "").replace("|", "\\|")
        rows.append(f"| `{d.key}` | {d.type} | {_cell(d.default)} | {desc} |")
    return (
        "<!-- Generated by charts/llmfleet/hack/generate.py from values.yaml and hack/README.header.md. "
        "Do not edit; run `make chart-docs`. -->\n"
        + header.rstrip("\n")
        + "\n\n## Values\n\n"
        + "\n".join(rows)
        + "\n"
    )


# Cluster-scoped resources an operator may need; everything else is namespaced.
CLUSTER_SCOPED = {
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("kopf.dev", "clusterkopfpeerings"),
    ("zalando.org", "clusterkopfpeerings"),
    ("", "namespaces"),
    ("", "nodes"),
    ("", "persistentvolumes"),
    ("scheduling.k8s.io", "priorityclasses"),
    ("storage.k8s.io", "storageclasses"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ("apiregistration.k8s.io", "apiservices"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
}


def _normalize_rule(rule: Any) -> dict[str, list[str]]:
    """A PolicyRule as a plain dict with camelCase keys, from a dict or an object with the same fields."""
    if not isinstance(rule, dict):
        rule = {k: getattr(rule, k) for k in ("api_groups", "resources", "verbs") if hasattr(rule, k)}
    out: dict[str, list[str]] = {}
    for key, alias in (
        ("apiGroups", "api_groups"),
        ("resources", "resources"),
        ("verbs", "verbs"),
        ("resourceNames", "resource_names"),
    ):
        value = rule.get(key, rule.get(alias))
        if value:
            out[key] = [str(v) for v in value]
    return out


def split_rules(rules: list[Any]) -> dict[str, list[dict[str, list[str]]]]:
    """Split rules into cluster-scoped and namespaced ones (a rule is split per resource when mixed)."""
    cluster: list[dict[str, list[str]]] = []
    namespaced: list[dict[str, list[str]]] = []
    for raw in rules:
        rule = _normalize_rule(raw)
        groups = rule.get("apiGroups", [""])
        kinds = {
            res: all((g, res.split("/")[0]) in CLUSTER_SCOPED for g in groups)
            for res in rule.get("resources", [])
        }
        c_res = [r for r, is_cluster in kinds.items() if is_cluster]
        n_res = [r for r, is_cluster in kinds.items() if not is_cluster]
        # Fresh lists per rule: shared ones would come out of yaml.safe_dump as anchors and aliases.
        if c_res:
            cluster.append({**{k: list(v) for k, v in rule.items()}, "resources": c_res})
        if n_res:
            namespaced.append({**{k: list(v) for k, v in rule.items()}, "resources": n_res})
    return {"cluster": cluster, "namespaced": namespaced}


def render_rbac() -> str:
    from llmfleet.operator.rbac import OPERATOR_RULES

    body = yaml.safe_dump(
        split_rules(list(OPERATOR_RULES)), sort_keys=False, default_flow_style=None, width=120
    )
    return (
        "# Generated by charts/llmfleet/hack/generate.py from llmfleet/operator/rbac.py (OPERATOR_RULES).\n"
        "# Do not edit; run `make chart-docs`.\n" + body
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    values_text = (CHART_DIR / "values.yaml").read_text()
    bad = undocumented(parse_values(values_text))
    if bad:
        print(f"values.yaml: keys without a `# --` comment: {', '.join(bad)}", file=sys.stderr)
        return 1
    outputs = {README: render_readme(values_text), RBAC_FILE: render_rbac()}
    stale = []
    for path, text in outputs.items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(CHART_DIR.parents[1])))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(CHART_DIR.parents[1])}")
    if stale:
        print(f"stale (run `make chart-docs`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
