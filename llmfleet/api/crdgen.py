"""Generate CustomResourceDefinitions from the pydantic models.

pydantic's JSON Schema uses `$ref`, `anyOf` for optionals, `const` and titles; a Kubernetes structural
schema needs every type spelled out inline. This module converts one into the other, keeping descriptions
(for `kubectl explain`), enums, bounds, patterns, scalar defaults and the CEL rules attached to models.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from llmfleet.api.contracts import GROUP, INFERENCESERVICE_PLURAL, PART_OF_LABEL, TRAININGJOB_PLURAL, VERSION
from llmfleet.api.inferenceservice import InferenceServiceSpec, InferenceServiceStatus
from llmfleet.api.trainingjob import TrainingJobSpec, TrainingJobStatus

Schema = dict[str, Any]

# Keywords a structural schema may carry over from JSON Schema unchanged.
_KEEP = {
    "description", "type", "format", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "pattern", "minItems", "maxItems", "maxProperties", "x-kubernetes-validations",
}


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        # A description next to the $ref (the field's) wins over the model docstring.
        if "description" in node:
            target["description"] = node["description"]
        if "default" in node:
            target["default"] = node["default"]
        return target
    return node


def _int_or_string(options: list[Schema], description: str | None, default: Any) -> Schema:
    """int | Literal[...] (e.g. microBatch: 4 or "auto"): Kubernetes' int-or-string, with a CEL rule that
    keeps the integer's minimum and the string's allowed values."""
    num = next(o for o in options if o["type"] == "integer")
    text = next(o for o in options if o["type"] == "string")
    words = [text["const"]] if "const" in text else list(text.get("enum", []))
    int_rule = f"self >= {num['minimum']}" if "minimum" in num else "true"
    str_rule = " || ".join(f"self == '{w}'" for w in words) or "true"
    out: Schema = {"x-kubernetes-int-or-string": True, "x-kubernetes-validations": [
        {"rule": f"type(self) == int ? {int_rule} : ({str_rule})",
         "message": f"must be an integer{' >= ' + str(num['minimum']) if 'minimum' in num else ''}"
                    f" or " + " or ".join(repr(w) for w in words)}]}
    if description:
        out["description"] = description
    if default is not None:
        out["default"] = default
    return out


def _structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = _resolve(node, defs)
    description = node.get("description")
    default = node.get("default")

    # Optional[X] arrives as anyOf [X, null]: the CRD field is simply not required.
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if sorted(o.get("type", "") for o in options) == ["integer", "string"]:
            return _int_or_string(options, description, default)
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node}")
        inner = _structural(options[0], defs)
        # Constraints given on the optional field itself (json_schema_extra: enum, CEL rules) apply to X.
        inner.update({k: v for k, v in node.items() if k in _KEEP and k not in ("type", "description")})
        if description:
            inner["description"] = description
        if default is not None and isinstance(default, (str, int, float, bool)):
            inner["default"] = default
        return inner

    out: Schema = {k: v for k, v in node.items() if k in _KEEP}
    # JSON Schema 2020-12 exclusive bounds are numbers; OpenAPI v3 (Kubernetes) wants a bound plus a flag.
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if flag in out and not isinstance(out[flag], bool):
            out[bound] = out.pop(flag)
            out[flag] = True
    if "const" in node:
        out["enum"] = [node["const"]]
        out.setdefault("type", "string")
    if node.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        props = node.get("properties", {})
        if props:
            out["properties"] = {name: _structural(sub, defs) for name, sub in props.items()}
            required = [r for r in node.get("required", []) if r in props]
            if required:
                out["required"] = required
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = _structural(extra, defs)
        elif not props:
            # A free-form object (e.g. extra status fields).
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif node.get("type") == "array":
        out["items"] = _structural(node.get("items", {}), defs)
    if "format" in out and out["format"] not in ("date-time", "int32", "int64", "float", "double", "byte"):
        del out["format"]
    if isinstance(default, (str, int, float, bool)):
        out["default"] = default
    if "type" not in out and "x-kubernetes-preserve-unknown-fields" not in out:
        raise ValueError(f"schema node without a type: {node}")
    return out


def structural_schema(model: type[Any]) -> Schema:
    """The structural openAPIV3Schema of a pydantic model (aliases, inlined references)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)


def _strip_defaults(node: Schema) -> None:
    """Status is written by controllers: no defaulting there."""
    node.pop("default", None)
    for sub in node.get("properties", {}).values():
        _strip_defaults(sub)
    if isinstance(node.get("items"), dict):
        _strip_defaults(node["items"])


# A `kubectl get` column: name, type, jsonPath[, priority (1: only with -o wide)].
Column = tuple[str, str, str] | tuple[str, str, str, int]


def _printer_columns(own: list[Column]) -> list[dict[str, Any]]:
    """Phase, the kind's own columns, Age."""
    out = []
    for name, type_, path, *priority in [("Phase", "string", ".status.phase"), *own,
                                         ("Age", "date", ".metadata.creationTimestamp")]:
        column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
        if priority:
            column["priority"] = priority[0]
        out.append(column)
    return out


def _crd(
    kind: str,
    plural: str,
    short_names: list[str],
    spec_model: type[Any],
    status_model: type[Any],
    description: str,
    columns: list[Column],
    scale: dict[str, str] | None = None,
) -> dict[str, Any]:
    status = structural_schema(status_model)
    _strip_defaults(status)
    # Newer controllers may add status fields; keep them rather than pruning.
    status["x-kubernetes-preserve-unknown-fields"] = True
    schema: Schema = {
        "type": "object",
        "description": description,
        "properties": {
            "apiVersion": {"type": "string", "description": "API version: llmfleet.io/v1alpha1."},
            "kind": {"type": "string", "description": f"Kind: {kind}."},
            "metadata": {"type": "object"},
            "spec": structural_schema(spec_model),
            "status": status,
        },
        "required": ["spec"],
    }
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = scale
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {PART_OF_LABEL: "llmfleet"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["llmfleet", "all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": _printer_columns(columns),
                }
            ],
        },
    }


def trainingjob_crd() -> dict[str, Any]:
    return _crd(
        "TrainingJob",
        TRAININGJOB_PLURAL,
        ["tj"],
        TrainingJobSpec,
        TrainingJobStatus,
        "FSDP2 training or distillation of a Llama-style decoder on N GPU workers.",
        [
            ("Workers", "integer", ".spec.workers.count"),
            ("Step", "integer", ".status.step"),
            ("Loss", "number", ".status.loss"),
            ("MFU", "number", ".status.mfu"),
            ("Restarts", "integer", ".status.restarts", 1),
        ],
    )


def inferenceservice_crd() -> dict[str, Any]:
    return _crd(
        "InferenceService",
        INFERENCESERVICE_PLURAL,
        ["lis", "llmisvc"],
        InferenceServiceSpec,
        InferenceServiceStatus,
        "Pools of vLLM (or Ray Serve) replicas behind the llmfleet router, scaled on SLO metrics.",
        [
            ("Replicas", "integer", ".spec.replicas"),
            ("Ready", "integer", ".status.pools[0].readyReplicas"),
            ("URL", "string", ".status.url"),
            ("TTFT-p95", "number", ".status.metrics.ttftP95Ms", 1),
        ],
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD."""
    return {
        f"{GROUP}_{TRAININGJOB_PLURAL}.yaml": trainingjob_crd(),
        f"{GROUP}_{INFERENCESERVICE_PLURAL}.yaml": inferenceservice_crd(),
    }


def render(crd: dict[str, Any]) -> str:
    header = "# Generated by `llmfleet crds generate` from llmfleet/api. Do not edit.\n"
    return header + yaml.safe_dump(crd, sort_keys=False, width=120, allow_unicode=True)


def _md_rows(node: Schema, path: str, rows: list[tuple[str, str, str, str]]) -> None:
    for name, sub in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        kind = sub.get("type", "integer or string" if sub.get("x-kubernetes-int-or-string") else "object")
        if kind == "array" and isinstance(sub.get("items"), dict):
            kind = f"[]{sub['items'].get('type', 'object')}"
        extra = []
        if "enum" in sub:
            extra.append("one of " + ", ".join(f"`{v}`" for v in sub["enum"]))
        if "default" in sub:
            extra.append(f"default `{sub['default']}`")
        for key, inclusive, exclusive in (("minimum", "≥", ">"), ("maximum", "≤", "<")):
            if key in sub:
                word = exclusive if sub.get(f"exclusive{key.title()}") else inclusive
                extra.append(f"{word} {sub[key]}")
        desc = sub.get("description", "").replace("|", "\\|")
        rows.append((here, kind, desc, "; ".join(extra)))
        if sub.get("type") == "object":
            _md_rows(sub, here, rows)
        elif sub.get("type") == "array" and isinstance(sub.get("items"), dict):
            _md_rows(sub["items"], here + "[]", rows)


def api_reference() -> str:
    """Markdown reference of both kinds, generated from the same schemas as the CRDs."""
    out = [
        "# API reference (llmfleet.io/v1alpha1)",
        "",
        "Generated by `llmfleet crds generate` from `llmfleet/api`; do not edit. `kubectl explain` shows the same text.",
        "",
    ]
    for crd in all_crds().values():
        version = crd["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        kind = crd["spec"]["names"]["kind"]
        out += [f"## {kind}", "", schema["description"], ""]
        for part in ("spec", "status"):
            rows: list[tuple[str, str, str, str]] = []
            _md_rows(schema["properties"][part], "", rows)
            out += [f"### {kind}.{part}", "", "| field | type | description | constraints |", "|---|---|---|---|"]
            out += [f"| `{p}` | {t} | {d} | {c} |" for p, t, d, c in rows]
            out.append("")
    return "\n".join(out)
