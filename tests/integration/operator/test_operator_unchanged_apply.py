"""The operator with unchanged applies skipped (llmfleet/kube/applied.py) and a timer too slow to rescue anything
within the test: what someone else does to a child must still reach the child and the CR's status at once."""

from __future__ import annotations

from typing import Any

import pytest
from operator_testkit import eventually, isvc_manifest

from llmfleet.operator.config import OperatorConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"
DEPLOY = "apps/v1/deployments"


async def test_child_changes_by_others_are_acted_on_while_unchanged_applies_are_skipped(
    cluster: Any, operators: Any
) -> None:
    emu, _ = cluster
    op = await operators(config=OperatorConfig(timer_interval_seconds=120.0))
    await emu.put(ISVC, isvc_manifest())
    await eventually(lambda: emu.get(DEPLOY, "ml", "chat-router") and emu.get(DEPLOY, "ml", "chat-student"))
    await eventually(lambda: (emu.get(ISVC, "ml", "chat").get("status") or {}).get("observedGeneration") == 1)

    # A controller's status update: a child-triggered reconcile re-sends that Deployment (the status comes
    # from its answer) and skips the unchanged siblings.
    client = op.runtime.client
    for name, n in (("chat-primary", 2), ("chat-student", 1), ("chat-router", 1)):
        await emu.patch(DEPLOY, "ml", name, {"status": {"replicas": n, "readyReplicas": n}}, "status")
    await eventually(lambda: emu.get(ISVC, "ml", "chat")["status"]["phase"] == "Ready")
    assert client is not None and client.applied_cache().hits > 0

    # A child deleted by hand comes back at once, not after the 120 s interval.
    old_uid = emu.get(DEPLOY, "ml", "chat-router")["metadata"]["uid"]
    await emu.remove(DEPLOY, "ml", "chat-router")
    recreated = await eventually(lambda: emu.get(DEPLOY, "ml", "chat-router"), timeout=5)
    assert recreated["metadata"]["uid"] != old_uid
