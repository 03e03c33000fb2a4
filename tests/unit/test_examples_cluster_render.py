"""Every example as it would reach a cluster: the operator configured by the chart (`helm template`: images,
defaults file), the builders applied, and every object accepted by kubernetes-validate --strict, with the
storage pieces (claim volumes, fetch init containers, Secret refs) the example's locations need."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import kubernetes_validate
import pytest
from helmchart import render

from llmfleet.api import InferenceService, TrainingJob, load_file
from llmfleet.api.storage import parse_uri
from llmfleet.operator.builders import build_inferenceservice, build_trainingjob
from llmfleet.operator.builders.storage import fetch_image
from llmfleet.operator.config import Capabilities, OperatorConfig, with_spec_defaults

pytestmark = pytest.mark.helm

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = [(p.name, r) for p in sorted(ROOT.glob("examples/*.yaml")) for r in load_file(p)]
CRD_KINDS = {"PodGroup", "PodMonitor"}
K8S_VERSION = "1.34.0"  # the kind node image in e2e/kind.yaml


@pytest.fixture(scope="module")
def chart_config(tmp_path_factory: pytest.TempPathFactory) -> OperatorConfig:
    """The OperatorConfig the chart's operator pod would build: its env and its mounted defaults file."""
    docs = render()
    operator = next(d for d in docs if d["kind"] == "StatefulSet")
    env = {e["name"]: e["value"] for e in operator["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    defaults = next((d for d in docs if d["kind"] == "ConfigMap" and "defaults.yaml" in d.get("data", {})), None)
    if defaults is not None:
        path = tmp_path_factory.mktemp("chart") / "defaults.yaml"
        path.write_text(defaults["data"]["defaults.yaml"])
        env["LLMFLEET_DEFAULTS_FILE"] = str(path)
    else:
        env.pop("LLMFLEET_DEFAULTS_FILE", None)
    with pytest.MonkeyPatch.context() as mp:
        for name in [k for k in env if k.startswith("LLMFLEET_")]:
            mp.setenv(name, env[name])
        return OperatorConfig.from_env(Capabilities(pod_group=True, pod_monitor=True))


def _build(resource: InferenceService | TrainingJob, config: OperatorConfig) -> list[dict[str, Any]]:
    cr = resource.model_copy(deep=True)
    cr.metadata.uid = "uid-example"
    if isinstance(cr, InferenceService):
        # As the reconcile does: the chart's cluster-wide defaults under the CR's own values.
        doc = cr.model_dump(by_alias=True, exclude_none=True, mode="json")
        doc["spec"] = with_spec_defaults(doc["spec"], config.spec_defaults)
        return build_inferenceservice(InferenceService.model_validate(doc), config)
    return build_trainingjob(cr, config)


def _pod_specs(ms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in ms:
        spec = m.get("spec") or {}
        if m["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec:
            out.append(spec["template"]["spec"])
    return out


def _locations(resource: InferenceService | TrainingJob) -> list[str]:
    if isinstance(resource, InferenceService):
        return [p.model.path for p in resource.pools()]
    s = resource.spec
    found = [s.data.path, *([s.data.tokenizer] if s.data.tokenizer else [])]
    found += [s.distillation.teacher] if s.distillation else []
    return found


@pytest.mark.parametrize(("name", "resource"), EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_renders_valid_objects_with_its_storage(
    name: str, resource: InferenceService | TrainingJob, chart_config: OperatorConfig
) -> None:
    ms = _build(resource, chart_config)
    for m in ms:
        if m["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(copy.deepcopy(m), K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{name}: {m['kind']}/{m['metadata']['name']}: {err}") from err
    pods = _pod_specs(ms)
    inits = [c for p in pods for c in p.get("initContainers", [])]
    claims = {v["persistentVolumeClaim"]["claimName"] for p in pods for v in p["volumes"] if "persistentVolumeClaim" in v}
    for raw in _locations(resource):
        uri = parse_uri(raw)
        if uri.scheme == "pvc":
            assert uri.location in claims, (name, raw)
        elif uri.is_remote:
            fetches = [c for c in inits if c["command"][:3] == ["llmfleet", "fetch", str(uri)]]
            assert fetches, (name, raw)
            assert all(c["image"] == fetch_image(chart_config) == chart_config.train_image for c in fetches)
            if isinstance(resource, InferenceService) and resource.spec.storage.cache.claim:
                assert resource.spec.storage.cache.claim in claims
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for c in inits for e in c.get("env", []) if "valueFrom" in e}
    storage = resource.spec.storage
    for secret, scheme in ((storage.s3.credentials_secret, "s3"), (storage.hf.token_secret, "hf")):
        if secret and any(parse_uri(r).scheme == scheme for r in _locations(resource)):
            assert secret in secrets, (name, secret)


def test_the_real_model_examples_exist_and_use_remote_storage() -> None:
    by_name = dict(EXAMPLES)
    hf = by_name["inferenceservice-hf-gpu.yaml"]
    assert isinstance(hf, InferenceService) and hf.spec.resources.gpus >= 1
    assert parse_uri(hf.spec.model.path).scheme == "hf" and hf.spec.storage.cache.claim
    s3 = by_name["trainingjob-s3.yaml"]
    assert isinstance(s3, TrainingJob) and s3.spec.output and s3.spec.output.promote_to
    assert parse_uri(s3.spec.data.path).scheme == "s3" and parse_uri(s3.spec.output.path).scheme == "s3"
    assert s3.spec.output.promote_to.inference_service == hf.metadata.name
