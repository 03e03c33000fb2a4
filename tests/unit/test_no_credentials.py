"""No credential in anything llmfleet renders: every object the builders and `helm template` produce is scanned
for URLs with passwords and for credential variables given as plain values; the API refuses a password in a URL
field (with its field path), and a feature store URL with credentials travels from a Secret
(spec.featureStore.urlSecretRef) to the router and the generation CronJob as LLMFLEET_STORE_URL."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from rendered_objects import KITCHEN_SINK_ISVC, builder_objects, chart_objects
from typer.testing import CliRunner

from llmfleet.api import InferenceService
from llmfleet.api.contracts import STORE_URL_ENV
from llmfleet.api.loader import problems_from
from llmfleet.operator.builders import build_inferenceservice
from llmfleet.router.config import FeatureStoreConfig, RouterConfig

# A URL with a password in its user info anywhere in a string (ConfigMap data holds whole YAML documents), or
# a password query parameter.
PASSWORD_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s/?#@]*:[^\s/?#@]*@|[?&]password=", re.IGNORECASE)
# Variable names that hold secrets: their value must come from a Secret (valueFrom.secretKeyRef).
CREDENTIAL_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
# Variables that hold the names of Secrets, not their contents: each value must be a list of object names.
SECRET_NAME_LISTS = {"LLMFLEET_IMAGE_PULL_SECRETS"}
OBJECT_NAMES = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?(,[a-z0-9]([-a-z0-9.]*[a-z0-9])?)*)?$")


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def _envs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list):
                yield from (e for e in value if isinstance(e, dict))
            else:
                yield from _envs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _envs(value)


def credential_findings(obj: dict[str, Any]) -> list[str]:
    """Where `obj` carries a credential in the clear: a URL with a password anywhere (ConfigMap data, env values,
    arguments, annotations), or a credential-named variable with a plain value."""
    found = [f"{path}: URL with a password" for path, text in _strings(obj) if PASSWORD_IN_TEXT.search(text)]
    for env in _envs(obj):
        if env.get("name") in SECRET_NAME_LISTS and OBJECT_NAMES.match(str(env.get("value", ""))):
            continue
        if CREDENTIAL_NAME.search(str(env.get("name"))) and "secretKeyRef" not in (env.get("valueFrom") or {}):
            found.append(f"env {env.get('name')}: a credential not from a Secret")
    return found


def test_the_scan_finds_what_the_builders_rendered_before_url_secret_refs() -> None:
    """What a `featureStore.url` with a password became: the router's ConfigMap and the CronJob's env value."""
    configmap = {"kind": "ConfigMap", "data": {"router.yaml": "featureStore:\n  url: postgresql://app:s3cret@db/f\n"}}
    cronjob = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{
        "env": [{"name": STORE_URL_ENV, "value": "postgresql+psycopg://app:s3cret@db/f"},
                {"name": "HF_TOKEN", "value": "hf_abc"}]}]}}}}}}
    assert credential_findings(configmap) == [".data.router.yaml: URL with a password"]
    assert len(credential_findings(cronjob)) == 2
    ok = {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "HF_TOKEN"}}},
                  {"name": STORE_URL_ENV, "value": "postgresql+psycopg://app@db/f?sslmode=require"}]}
    assert credential_findings(ok) == []
    names = {"env": [{"name": "LLMFLEET_IMAGE_PULL_SECRETS", "value": "regcred,mirror"}]}
    assert credential_findings(names) == []  # Secret names, not their contents
    assert credential_findings({"env": [{"name": "LLMFLEET_IMAGE_PULL_SECRETS", "value": "user:pa ss"}]})


@pytest.mark.helm
def test_no_rendered_object_carries_a_credential() -> None:
    objects = builder_objects() + chart_objects()
    kinds = {o["kind"] for _, o in objects}
    assert {"ConfigMap", "Deployment", "Job", "CronJob", "StatefulSet", "Secret"} - kinds <= {"Secret"}
    for source, obj in objects:
        where = f"{source}: {obj['kind']}/{(obj.get('metadata') or {}).get('name')}"
        assert obj["kind"] != "Secret", where  # llmfleet references Secrets, it never writes one
        assert credential_findings(obj) == [], where


def _sink() -> dict[str, Any]:
    return copy.deepcopy(KITCHEN_SINK_ISVC)


def test_url_secret_ref_reaches_the_router_and_the_cronjob_from_the_secret() -> None:
    ms = build_inferenceservice(InferenceService.model_validate(_sink()), _config())
    by = {(m["kind"], m["metadata"]["name"]): m for m in ms}
    ref = {"secretKeyRef": {"name": "store-url", "key": "url"}}
    router_cfg = RouterConfig.from_yaml(by[("ConfigMap", "sink-router")]["data"]["router.yaml"])
    assert router_cfg.feature_store.url is None and router_cfg.feature_store.url_env == STORE_URL_ENV
    router = by[("Deployment", "sink-router")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": STORE_URL_ENV, "valueFrom": ref} in router["env"]
    cron = by[("CronJob", "sink-features")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": STORE_URL_ENV, "valueFrom": ref} in cron["env"]
    # The router resolves it from its environment; a missing variable is an error, not a silent empty store.
    assert router_cfg.feature_store.resolved_url({STORE_URL_ENV: "postgresql://a:b@db/f"}) == "postgresql://a:b@db/f"
    with pytest.raises(ValueError, match=f"{STORE_URL_ENV} is not set"):
        router_cfg.feature_store.resolved_url({})
    assert FeatureStoreConfig(url="sqlite:///x.db").resolved_url({}) == "sqlite:///x.db"


def _config() -> Any:
    from rendered_objects import CONFIG

    return CONFIG


@pytest.mark.parametrize(("section", "value", "path"), [
    ("featureStore", {"url": "postgresql+psycopg://app:s3cret@db.ml.svc/features"}, "spec.featureStore.url"),
    ("featureStore", {"url": "postgresql://db/features?sslmode=require&password=s3cret"}, "spec.featureStore.url"),
    ("storage", {"s3": {"endpoint": "https://AKIA:s3cret@minio.local"}}, "spec.storage.s3.endpoint"),
    ("storage", {"hf": {"endpoint": "https://user:hf_x@hub.mirror"}}, "spec.storage.hf.endpoint"),
    ("featureStore", {"url": "postgresql://db/f", "urlSecretRef": {"name": "s", "key": "url"}}, "spec.featureStore"),
])
def test_a_password_in_a_url_field_is_refused_with_its_field_path(section: str, value: Any, path: str) -> None:
    doc = _sink()
    doc["spec"][section] = value
    with pytest.raises(ValidationError) as err:
        InferenceService.model_validate(doc)
    paths = [p for p, _ in problems_from(err.value)]
    assert path in paths, paths
    assert "s3cret" not in str([m for _, m in problems_from(err.value)])


def test_llmfleet_up_with_a_url_secret_ref_needs_the_variable(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from llmfleet.cli.main import app

    manifest = tmp_path / "isvc.yaml"
    doc = _sink()
    doc["spec"]["model"]["path"] = "tiny://tiny-llama"
    doc["spec"].pop("fallback")
    manifest.write_text(yaml.safe_dump(doc))
    monkeypatch.delenv(STORE_URL_ENV, raising=False)
    monkeypatch.setattr("llmfleet.local.foreground.run_foreground", lambda *a, **k: 99)  # never start anything
    result = CliRunner().invoke(app, ["up", "-f", str(manifest), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code != 0 and f"set {STORE_URL_ENV}" in result.output, result.output
    assert "Traceback" not in result.output


def test_the_crd_refuses_what_pydantic_refuses() -> None:
    """The same regular expression as a CEL rule: the API server refuses a password in a URL field too."""
    from .test_crds import failed_cel_rules

    base = {"model": {"path": "/m"}}
    for store in ({"url": "postgresql://app:s3cret@db/f"}, {"url": "postgresql://db/f?password=x"},
                  {"url": "postgresql://db/f", "urlSecretRef": {"name": "s", "key": "url"}}):
        assert failed_cel_rules("InferenceService", {**base, "featureStore": store}), store
    assert failed_cel_rules("TrainingJob", {"model": {"hidden": 64, "heads": 4}, "data": {"path": "/d"},
                                            "storage": {"s3": {"endpoint": "http://a:b@minio"}}})
    for store in ({"url": "postgresql+psycopg://app@db:5432/f?sslmode=require"}, {"urlSecretRef": {"name": "s", "key": "url"}}):
        assert failed_cel_rules("InferenceService", {**base, "featureStore": store}) == [], store


def test_the_router_reads_the_store_url_from_its_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's config names the variable; without it the router exits 2 with one line instead of serving
    without its store."""
    from llmfleet.cli.main import app
    from llmfleet.router import cli as router_cli
    from llmfleet.router.config import router_config_from_service

    doc = _sink()
    doc["spec"]["model"]["path"] = "/models/llama"
    doc["spec"].pop("fallback")
    cfg = router_config_from_service(InferenceService.model_validate(doc), endpoints={"primary": ["http://127.0.0.1:1"]})
    path = tmp_path / "router.yaml"
    path.write_text(cfg.to_yaml())
    assert "store-url" not in path.read_text() and STORE_URL_ENV in path.read_text()
    monkeypatch.delenv(STORE_URL_ENV, raising=False)
    result = CliRunner().invoke(app, ["router", "--config", str(path), "--port", "0"])
    assert result.exit_code == 2 and f"{STORE_URL_ENV} is not set" in result.output, result.output
    seen: list[Any] = []
    monkeypatch.setenv(STORE_URL_ENV, "sqlite:///from-the-secret.db")
    monkeypatch.setattr("llmfleet.store.lookup.FeatureStoreLookup", lambda url, *a, **k: seen.append(url) or "lookup")
    assert router_cli._make_lookup(cfg) == "lookup" and seen == ["sqlite:///from-the-secret.db"]
