"""The real kopf operator against the emulator: InferenceService create, update, prune, delete, invalid spec."""

from __future__ import annotations

from typing import Any

import pytest
from operator_testkit import eventually, isvc_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ISVC = "llmfleet.io/v1alpha1/inferenceservices"


def _events(emu: Any, reason: str) -> list[dict[str, Any]]:
    return [e for e in emu.list("v1/events") if e.get("reason") == reason]


async def test_create_update_prune_delete(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    await emu.put(ISVC, isvc_manifest())

    def children() -> bool:
        return all(
            emu.get(res, "ml", name)
            for res, name in [
                ("apps/v1/deployments", "chat-primary"), ("apps/v1/deployments", "chat-student"),
                ("apps/v1/deployments", "chat-router"), ("v1/services", "chat-router"), ("v1/configmaps", "chat-router"),
                ("policy/v1/poddisruptionbudgets", "chat-primary"), ("v1/services", "chat-student"),
            ]
        )

    await eventually(children)
    isvc = emu.get(ISVC, "ml", "chat")
    dep = emu.get("apps/v1/deployments", "ml", "chat-primary")
    assert dep["metadata"]["ownerReferences"][0]["uid"] == isvc["metadata"]["uid"]
    assert dep["spec"]["replicas"] == 2
    assert "router.yaml" in emu.get("v1/configmaps", "ml", "chat-router")["data"]
    st = await eventually(lambda: (emu.get(ISVC, "ml", "chat").get("status") or {}).get("observedGeneration") == 1
                          and emu.get(ISVC, "ml", "chat")["status"])
    assert st["phase"] == "Progressing" and st["url"] == "http://chat-router.ml.svc:8080/v1"
    assert st["selector"] == "llmfleet.io/inferenceservice=chat,llmfleet.io/pool=primary,llmfleet.io/component=replica"
    assert {c["type"] for c in st["conditions"]} == {"Ready", "Progressing", "Degraded"}

    # Scale (what `kubectl scale` and the autoscaler do) and change a vLLM argument.
    await emu.patch(ISVC, "ml", "chat", {"spec": {"replicas": 3, "vllm": {"maxNumSeqs": 64}}})

    def scaled() -> bool:
        d = emu.get("apps/v1/deployments", "ml", "chat-primary")
        cmd = d["spec"]["template"]["spec"]["containers"][0]["command"]
        return d["spec"]["replicas"] == 3 and cmd[cmd.index("--max-num-seqs") + 1] == "64"

    await eventually(scaled)

    # Replicas become ready (as the Deployment controller would report): the service becomes Ready.
    for name, n in (("chat-primary", 3), ("chat-student", 1), ("chat-router", 1)):
        await emu.patch("apps/v1/deployments", "ml", name, {"status": {"replicas": n, "readyReplicas": n}}, "status")
    await eventually(lambda: emu.get(ISVC, "ml", "chat")["status"]["phase"] == "Ready")
    assert emu.get(ISVC, "ml", "chat")["status"]["replicas"] == 3

    # Removing the student pool prunes its children.
    await emu.patch(ISVC, "ml", "chat", {"spec": {"fallback": {"pools": []}}})
    await eventually(lambda: emu.get("apps/v1/deployments", "ml", "chat-student") is None)
    await eventually(lambda: emu.get("v1/services", "ml", "chat-student") is None)
    await eventually(lambda: emu.get("policy/v1/poddisruptionbudgets", "ml", "chat-student") is None)
    assert emu.get("apps/v1/deployments", "ml", "chat-primary") is not None

    # Deleting the CR removes every child (owner references; no finalizer was added).
    assert not emu.get(ISVC, "ml", "chat")["metadata"].get("finalizers")
    await emu.remove(ISVC, "ml", "chat")
    await eventually(lambda: not [d for d in emu.list("apps/v1/deployments", "ml")])
    assert not emu.list("v1/configmaps", "ml")


async def test_invalid_spec_then_fixed(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    bad = isvc_manifest(vllm={"blockSize": 17})  # an integer, so the CRD schema accepts it; pydantic does not
    await emu.put(ISVC, bad)

    def invalid() -> Any:
        st = emu.get(ISVC, "ml", "chat").get("status") or {}
        ready = [c for c in st.get("conditions", []) if c["type"] == "Ready"]
        return st.get("phase") == "Invalid" and ready and ready[0]

    ready = await eventually(invalid)
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.vllm" in ready["message"] and "blockSize" in ready["message"]
    assert emu.get("apps/v1/deployments", "ml", "chat-primary") is None
    await eventually(lambda: _events(emu, "InvalidSpec"))

    # A builder-level error (valid for pydantic, impossible for the engine) names its field too.
    await emu.patch(ISVC, "ml", "chat", {"spec": {"vllm": {"blockSize": 16, "maxNumSeqs": 64,
                                                            "maxNumBatchedTokens": 32}}})
    await eventually(lambda: "maxNumBatchedTokens" in str(emu.get(ISVC, "ml", "chat")["status"]["conditions"]))

    # The operator keeps running and reconciles the fixed spec.
    await emu.patch(ISVC, "ml", "chat", {"spec": {"vllm": {"maxNumBatchedTokens": 4096}}})
    await eventually(lambda: emu.get("apps/v1/deployments", "ml", "chat-primary"))
    await eventually(lambda: emu.get(ISVC, "ml", "chat")["status"]["phase"] == "Progressing")


async def test_child_deleted_by_hand_is_recreated(cluster: Any, operators: Any) -> None:
    emu, _ = cluster
    await operators()
    await emu.put(ISVC, isvc_manifest())
    await eventually(lambda: emu.get("apps/v1/deployments", "ml", "chat-router"))
    old_uid = emu.get("apps/v1/deployments", "ml", "chat-router")["metadata"]["uid"]
    await emu.remove("apps/v1/deployments", "ml", "chat-router")
    recreated = await eventually(lambda: emu.get("apps/v1/deployments", "ml", "chat-router"), timeout=5)
    assert recreated["metadata"]["uid"] != old_uid
