"""Parse manifests into API models, with errors that name the field path; read input files for every CLI
command with one-line errors (`InputFileError`) instead of decoder tracebacks."""

from __future__ import annotations

import hashlib
import json
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


def problems_line(problems: Iterable[tuple[str, str]]) -> str:
    """(field path, message) pairs as the one line every error about a spec shows: `path: message; path: message`."""
    return "; ".join(f"{path}: {message}" for path, message in problems)


class ManifestError(ValueError):
    """A manifest that is not a valid llmfleet resource; `problems` are (field path, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {problems_line(problems)}")


class InputFileError(ManifestError):
    """A file that cannot be read as text, YAML or JSON (missing, not UTF-8, syntax error, nested too deeply).

    str() is one line, `FILE[:LINE]: message`; the CLI root prints it and exits with status 2.
    """

    def __init__(self, source: str, message: str, line: int | None = None, kind: str = "<file>") -> None:
        self.line = line
        self.message = message
        super().__init__(source, [(kind, message)])

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.message}"


def read_text(path: str | Path) -> str:
    """A file's UTF-8 text; InputFileError (with the line of the first bad byte) instead of OSError or
    UnicodeDecodeError."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise InputFileError(str(p), err.strerror or str(err)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputFileError(str(p), f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
                             line) from None


# libyaml (when built in) is faster and stops at 1,000 nesting levels with a marked error; the pure-Python
# loader recurses until RecursionError, caught below.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# libyaml's emitter writes the same text as the pure-Python one, faster.
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


# YAML texts remembered by dump_yaml, by a digest of the data's JSON text; the oldest goes first when full.
_YAML_TEXTS: dict[bytes, str] = {}
_YAML_TEXTS_MAX = 4096


def dump_yaml(data: Any) -> str:
    """`yaml.safe_dump(data, sort_keys=False)` (keys in insertion order, block style), remembered for JSON data.

    The operator renders the same router config and TrainingJob spec as YAML on every reconcile of an
    unchanged object, and PyYAML's representer (pure Python, also with libyaml) costs milliseconds each;
    the JSON text of the data (insertion order kept, 1 and 1.0 and true told apart) identifies it."""
    try:
        text = json.dumps(data, allow_nan=True)
    except (TypeError, ValueError):  # not JSON data (e.g. a date): dumped as it is, not remembered
        return _dump_yaml(data)
    key = hashlib.blake2b(text.encode(), digest_size=16).digest()
    if (known := _YAML_TEXTS.get(key)) is not None:
        return known
    dumped = _dump_yaml(data)
    if len(_YAML_TEXTS) >= _YAML_TEXTS_MAX:
        _YAML_TEXTS.pop(next(iter(_YAML_TEXTS)), None)
    _YAML_TEXTS[key] = dumped
    return dumped


def _dump_yaml(data: Any) -> str:
    return str(yaml.dump(data, Dumper=_YAML_DUMPER, sort_keys=False))


def _too_deep(source: str) -> InputFileError:
    return InputFileError(source, "nested too deeply to parse")


def parse_yaml_all(text: str, source: str) -> list[Any]:
    """Every non-empty document of a YAML text; InputFileError naming the line on a syntax error."""
    try:
        return [d for d in yaml.load_all(text, Loader=_YAML_LOADER) if d is not None]
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = " ".join(str(x) for x in (err.context, err.problem) if x) or "invalid YAML"
        raise InputFileError(source, f"invalid YAML: {what}", mark.line + 1 if mark else None, "<yaml>") from None
    except yaml.YAMLError as err:
        raise InputFileError(source, f"invalid YAML: {' '.join(str(err).split())}", None, "<yaml>") from None
    except RecursionError:
        raise _too_deep(source) from None
    except ValueError as err:  # a scalar the constructor cannot convert (a 5,000-digit int, a bad date)
        raise InputFileError(source, f"invalid YAML value: {err}", None, "<yaml>") from None


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document (None when empty); errors as `parse_yaml_all`."""
    docs = parse_yaml_all(text, source)
    if len(docs) > 1:
        raise InputFileError(source, f"expected one YAML document, found {len(docs)}", None, "<yaml>")
    return docs[0] if docs else None


def parse_json(text: str, source: str) -> Any:
    """A JSON text; InputFileError naming the line on a syntax error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputFileError(source, f"invalid JSON: {err.msg} (column {err.colno})", err.lineno, "<json>") from None
    except RecursionError:
        raise _too_deep(source) from None
    except ValueError as err:  # e.g. an integer longer than Python converts (4,300 digits)
        raise InputFileError(source, f"invalid JSON value: {err}", None, "<json>") from None


def load_yaml_file(path: str | Path) -> Any:
    """One YAML document from a file (see `parse_yaml`)."""
    return parse_yaml(read_text(path), str(path))


def load_json_file(path: str | Path) -> Any:
    """A JSON file (see `parse_json`)."""
    return parse_json(read_text(path), str(path))


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
    except RecursionError:
        raise ManifestError(source, [("<root>", "nested too deeply")]) from None


def load_manifests(text: str, source: str = "<manifest>") -> list[TrainingJob | InferenceService]:
    """All llmfleet resources in a (multi-document) YAML text."""
    docs = parse_yaml_all(text, source)
    return [parse_resource(d, f"{source}#{i}" if len(docs) > 1 else source) for i, d in enumerate(docs)]


def load_file(path: str | Path) -> list[TrainingJob | InferenceService]:
    return load_manifests(read_text(path), str(path))


def load_manifest(path: str | Path) -> TrainingJob | InferenceService:
    """Exactly one resource from a file."""
    found = load_file(path)
    if len(found) != 1:
        raise ManifestError(str(path), [("<file>", f"expected exactly one resource, found {len(found)}")])
    return found[0]
