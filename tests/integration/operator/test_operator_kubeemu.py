"""The emulator's additions to kmock (tests/kubeemu.py), which other components' kopf tests reuse."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from operator_testkit import CRDS, kubeemu

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

APPLY = {"Content-Type": "application/apply-patch+yaml"}
MERGE = {"Content-Type": "application/merge-patch+json"}


async def test_emulator_api_semantics() -> None:
    async with kubeemu.serve(CRDS) as (emu, url), aiohttp.ClientSession() as http:

        async def call(method: str, path: str, body: Any = None, headers: Any = None) -> tuple[int, Any]:
            data = None if body is None else json.dumps(body)
            async with http.request(method, url + path, data=data, headers=headers) as r:
                return r.status, await r.json()

        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns1",
                                                                     "labels": {"app": "x"}},
              "data": {"k": "1", "old": "2"}}
        path = "/api/v1/namespaces/ns1/configmaps/a?fieldManager=me&force=true"
        status, created = await call("PATCH", path, cm, APPLY)  # server-side apply creates
        assert status == 200 and created["metadata"]["uid"] and created["metadata"]["generation"] == 1
        rv = created["metadata"]["resourceVersion"]
        del cm["data"]["old"]
        _, applied = await call("PATCH", path, cm, APPLY)  # a field the manager dropped is removed
        assert applied["data"] == {"k": "1"} and applied["metadata"]["generation"] == 2
        _, again = await call("PATCH", path, cm, APPLY)  # no-op: same resourceVersion
        assert again["metadata"]["resourceVersion"] == applied["metadata"]["resourceVersion"] != rv

        # Namespaces are listed (kmock 0.8 crashes on this URL) and were created on first use.
        status, nss = await call("GET", "/api/v1/namespaces")
        assert status == 200 and [n["metadata"]["name"] for n in nss["items"]] == ["ns1"]

        # Label selectors, optimistic concurrency, status subresource.
        _, listed = await call("GET", "/api/v1/namespaces/ns1/configmaps?labelSelector=app%3Dy")
        assert listed["items"] == []
        status, _ = await call("PATCH", "/api/v1/namespaces/ns1/configmaps/a",
                               {"metadata": {"resourceVersion": rv}, "data": {"k": "2"}}, MERGE)
        assert status == 409
        isvc = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
                "metadata": {"name": "s", "namespace": "ns1"}, "spec": {"replicas": 1}}
        status, body = await call("POST", "/apis/llmfleet.io/v1alpha1/namespaces/ns1/inferenceservices", isvc)
        assert status == 201
        base = "/apis/llmfleet.io/v1alpha1/namespaces/ns1/inferenceservices/s"
        _, body = await call("PATCH", base, {"spec": {"replicas": 2}, "status": {"phase": "x"}}, MERGE)
        assert body["metadata"]["generation"] == 2 and "status" not in body
        _, body = await call("PATCH", base + "/status", {"status": {"phase": "Ready"}}, MERGE)
        assert body["status"] == {"phase": "Ready"} and body["metadata"]["generation"] == 2
        _, scale = await call("GET", base + "/scale")
        assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2

        # Owner references cascade on deletion.
        owner = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "name": "s",
                 "uid": body["metadata"]["uid"], "controller": True}
        child = {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": "c", "namespace": "ns1", "ownerReferences": [owner]}, "spec": {}}
        await call("PATCH", "/api/v1/namespaces/ns1/services/c?fieldManager=me", child, APPLY)
        status, _ = await call("DELETE", base)
        assert status == 200
        assert emu.get("v1/services", "ns1", "c") is None
        assert emu.counts().get("v1/configmaps") == 1
