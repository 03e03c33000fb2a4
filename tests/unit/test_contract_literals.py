"""Label and annotation keys are written once, in llmfleet/api/contracts.py; code elsewhere imports them.

An AST check over llmfleet/: a string constant (not a docstring) that starts with an llmfleet or Kubernetes
label prefix is a copy of a contract. The one exception is the CRs' `apiVersion` field, whose type must be a
literal (`Literal["llmfleet.io/v1alpha1"]`); a test below pins it to contracts.API_VERSION.
"""

from __future__ import annotations

import ast
from pathlib import Path

from llmfleet.api.contracts import API_VERSION
from llmfleet.api.inferenceservice import InferenceService
from llmfleet.api.trainingjob import TrainingJob

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = ("llmfleet.io/", "app.kubernetes.io/")
ALLOWED = {API_VERSION}  # the apiVersion Literal of the two CR models


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def contract_copies(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "contracts.py" and path.parent.name == "api":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                    and node.value.startswith(PREFIXES) and node.value not in ALLOWED):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.value!r}")
    return found


def test_no_label_or_annotation_key_outside_contracts() -> None:
    copies = contract_copies(ROOT / "llmfleet")
    assert not copies, "import these from llmfleet.api.contracts:\n" + "\n".join(copies)


def test_a_copied_key_is_reported(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text('"""Mentions llmfleet.io/pool in prose: fine."""\nPOOL = "llmfleet.io/pool"\n')
    assert contract_copies(pkg) == ["pkg/mod.py:2: 'llmfleet.io/pool'"]


def test_cr_api_version_literals_match_the_contract() -> None:
    assert InferenceService.model_fields["api_version"].default == API_VERSION
    assert TrainingJob.model_fields["api_version"].default == API_VERSION
