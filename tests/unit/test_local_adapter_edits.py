"""`llmfleet up` applies edits of spec.adapters in its manifest file live, and reports any other edit."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from llmfleet.local.manifest import load_service
from llmfleet.local.runtime import Supervisor
from llmfleet.router.config import load_router_config


def write(path: Path, adapters: list[str], tmp: Path, replicas: int = 1) -> None:
    for name in adapters:
        (tmp / name).mkdir(exist_ok=True)
        (tmp / name / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    doc: dict[str, Any] = {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "lo"},
        "spec": {"model": {"path": str(tmp)}, "vllm": {"blockSize": 32}, "replicas": replicas,
                 "lora": {"maxLoras": 2, "maxLoraRank": 8},
                 "adapters": [{"name": n, "uri": str(tmp / n)} for n in adapters]}}
    path.write_text(yaml.safe_dump(doc))
    bump = time.time_ns() + 10**9 * (1 + len(adapters) + replicas)  # a distinct mtime per edit
    os.utime(path, ns=(bump, bump))


def test_adapter_edit_rewrites_router_config_and_restarts_nothing(tmp_path: Path) -> None:
    manifest = tmp_path / "isvc.yaml"
    write(manifest, ["a", "b"], tmp_path)
    sup = Supervisor(load_service(manifest), tmp_path / "run", manifest=manifest, prometheus=False)
    sup.write_router_config()
    argv_before = sup.replica_command(sup.slots["primary"][0])
    write(manifest, ["a", "b", "c"], tmp_path)
    sup.apply_manifest_edits()
    cfg = load_router_config(tmp_path / "run" / "router.yaml")
    assert [a.name for a in cfg.pools[0].adapters] == ["a", "b", "c"]
    assert sup.replica_command(sup.slots["primary"][0]) == argv_before  # same engine command: nothing restarts
    assert "adapters now a, b, c" in sup.events[-1][1]
    assert "c" in (tmp_path / "run" / "manifest.yaml").read_text()

    write(manifest, ["a", "b", "c"], tmp_path, replicas=2)  # not an adapter edit
    sup.apply_manifest_edits()
    assert "changed outside spec.adapters: not applied" in sup.events[-1][1]
    assert sup.isvc.spec.replicas == 1

    manifest.write_text("kind: [broken")
    os.utime(manifest, ns=(time.time_ns() + 10**10, time.time_ns() + 10**10))
    sup.apply_manifest_edits()
    assert "manifest edit not applied" in sup.events[-1][1]
    assert [a.name for a in sup.isvc.spec.adapters] == ["a", "b", "c"]
