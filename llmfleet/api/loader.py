"""Parse manifests into API models, with errors that name the field path."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from llmfleet.api.contracts import API_VERSION
from llmfleet.api.inferenceservice import InferenceService
from llmfleet.api.trainingjob import TrainingJob

KINDS: dict[str, type[TrainingJob] | type[InferenceService]] = {
    "TrainingJob": TrainingJob,
    "InferenceService": InferenceService,
}


class ManifestError(ValueError):
    """A manifest that is not a valid llmfleet resource; `problems` are (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "; ".join(f"{path}: {msg}" for path, msg in problems)
        super().__init__(f"{source}: {lines}")


def _path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out or "<root>"


def problems_from(err: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """(field path, message) for every error, paths in manifest (camelCase) spelling."""
    found = []
    for e in err.errors():
        # pydantic adds the model-validator name for 'after' validators as no loc; keep the path it has.
        loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        path = _path(loc)
        if prefix:
            path = f"{prefix}.{path}" if path != "<root>" else prefix
        msg = e["msg"].removeprefix("Value error, ")
        found.append((path, msg))
    return found


def parse_resource(doc: Any, source: str = "<manifest>") -> TrainingJob | InferenceService:
    """Validate one manifest dict; raises ManifestError naming each bad field."""
    if not isinstance(doc, dict):
        raise ManifestError(source, [("<root>", "a manifest must be a mapping")])
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if api_version != API_VERSION:
        raise ManifestError(source, [("apiVersion", f"expected {API_VERSION!r}, got {api_version!r}")])
    model = KINDS.get(str(kind))
    if model is None:
        raise ManifestError(source, [("kind", f"expected one of {sorted(KINDS)}, got {kind!r}")])
    try:
        return model.model_validate(doc)
    except ValidationError as err:
        raise ManifestError(source, problems_from(err)) from None


def load_manifests(text: str, source: str = "<manifest>") -> list[TrainingJob | InferenceService]:
    """All llmfleet resources in a (multi-document) YAML text."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise ManifestError(source, [("<yaml>", str(err).replace("\n", " "))]) from None
    return [parse_resource(d, f"{source}#{i}" if len(docs) > 1 else source) for i, d in enumerate(docs)]


def load_file(path: str | Path) -> list[TrainingJob | InferenceService]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ManifestError(str(p), [("<file>", err.strerror or str(err))]) from None
    return load_manifests(text, str(p))


def load_manifest(path: str | Path) -> TrainingJob | InferenceService:
    """Exactly one resource from a file."""
    found = load_file(path)
    if len(found) != 1:
        raise ManifestError(str(path), [("<file>", f"expected exactly one resource, found {len(found)}")])
    return found[0]
