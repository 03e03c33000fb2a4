"""RouterConfig and router_config_from_service."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmfleet.api import InferenceService
from llmfleet.api.contracts import KV_EVENTS_PORT
from llmfleet.router.config import RouterConfig, load_router_config, router_config_from_service


def _isvc(**spec: object) -> InferenceService:
    base: dict[str, object] = {"model": {"path": "/models/big", "maxModelLen": 4096}}
    base.update(spec)
    return InferenceService.model_validate({"metadata": {"name": "chat", "namespace": "ml"}, "spec": base})


def test_discovery_when_no_endpoints() -> None:
    cfg = router_config_from_service(_isvc(fallback={"pools": [{"name": "small", "model": {"path": "s3://bkt/m"}}]}))
    assert [p.name for p in cfg.pools] == ["primary", "small"]
    assert cfg.pools[0].discovery is not None and cfg.pools[0].endpoints is None
    assert cfg.pools[0].discovery.selector == "llmfleet.io/inferenceservice=chat,llmfleet.io/pool=primary"
    assert cfg.pools[0].discovery.namespace == "ml" and cfg.pools[0].discovery.port == 8000
    assert cfg.pools[1].served_names == ["chat-small"] and cfg.pools[1].tokenizer_path is None
    assert cfg.pools[0].tokenizer_path == "/models/big" and cfg.pools[0].max_model_len == 4096
    assert cfg.fallback.enabled
    # vLLM replicas publish KV-cache events by default; the router subscribes on the port the engine is given.
    assert cfg.pools[0].kv_events_port == KV_EVENTS_PORT and cfg.pools[0].kv_events_endpoints is None
    assert router_config_from_service(_isvc(), kv_events_port=5600).pools[0].kv_events_port == 5600
    off = _isvc(router={"kvEvents": False})
    assert [(p.kv_events_port, p.kv_events_endpoints) for p in router_config_from_service(off).pools] == [(None, None)]
    assert router_config_from_service(_isvc(engine="ray-serve")).pools[0].kv_events_port == KV_EVENTS_PORT
    # Replicas sharing a host (llmfleet up): one endpoint per replica, no common port.
    events = {"primary": {"http://127.0.0.1:9001": "tcp://127.0.0.1:9101"}}
    local = router_config_from_service(_isvc(), endpoints={"primary": ["http://127.0.0.1:9001"]}, kv_events_endpoints=events)
    assert local.pools[0].kv_events_port is None and local.pools[0].kv_events_endpoints == events["primary"]


def test_model_folders_give_the_router_its_tokenizer() -> None:
    """A pool whose model is a URI reads the tokenizer from the folder the operator put it in."""
    isvc = _isvc(model={"path": "hf://org/model@v1"}, fallback={"pools": [{"name": "small", "model": {"path": "pvc://m/s"}}]})
    bare = router_config_from_service(isvc)
    assert [p.tokenizer_path for p in bare.pools] == [None, None]
    cfg = router_config_from_service(isvc, model_folders={"primary": "/mnt/a", "small": "/mnt/b"})
    assert [(p.model_path, p.tokenizer_path) for p in cfg.pools] == [("/mnt/a", "/mnt/a"), ("/mnt/b", "/mnt/b")]


def test_static_endpoints_and_roundtrip(tmp_path) -> None:
    isvc = _isvc(router={"apiKeysSecret": "keys", "scorers": {"prefix-cache": 3, "session-affinity": 1}},
                 slo={"ttftP95Ms": 300})
    cfg = router_config_from_service(isvc, {"primary": ["http://127.0.0.1:9"]})
    assert cfg.pools[0].endpoints == ["http://127.0.0.1:9"] and cfg.pools[0].discovery is None
    assert cfg.tenants.require_api_key and cfg.tenants.secret_name == "keys"
    assert cfg.slo.ttft_p95_ms == 300 and cfg.scorers == {"prefix-cache": 3, "session-affinity": 1}
    assert not cfg.fallback.enabled
    f = tmp_path / "router.yaml"
    f.write_text(cfg.to_yaml())
    assert load_router_config(f) == cfg
    assert "servedNames" in cfg.to_yaml()
    assert not cfg.sole_holder_discount and cfg.measure_prefill_rate is None  # the spec's defaults
    assert not cfg.eviction_cost
    spec_on = router_config_from_service(
        _isvc(router={"soleHolderDiscount": True, "measurePrefillRate": True, "evictionCost": True}),
        {"primary": ["http://127.0.0.1:9"]})
    assert spec_on.sole_holder_discount and spec_on.measure_prefill_rate  # spec.router reaches the router
    assert spec_on.eviction_cost and "evictionCost: true" in spec_on.to_yaml()
    on = RouterConfig.model_validate({**cfg.model_dump(by_alias=True), "soleHolderDiscount": True})
    assert on.sole_holder_discount and "soleHolderDiscount: true" in on.to_yaml()


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"service": "x", "pools": []}, "at least 1"),
        ({"service": "x", "pools": [{"name": "p", "role": "student", "servedNames": ["m"], "endpoints": []}]}, "primary"),
        ({"service": "x", "pools": [{"name": "p", "role": "primary", "servedNames": ["m"]}]}, "endpoints or discovery"),
        ({"service": "x", "scorers": {"magic": 1},
          "pools": [{"name": "p", "role": "primary", "servedNames": ["m"], "endpoints": []}]}, "unknown scorer"),
        ({"service": "x", "bogus": 1,
          "pools": [{"name": "p", "role": "primary", "servedNames": ["m"], "endpoints": []}]}, "Extra inputs"),
    ],
)
def test_invalid_configs(doc: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RouterConfig.model_validate(doc)


def test_from_yaml_rejects_non_mapping() -> None:
    with pytest.raises(ValueError, match="mapping"):
        RouterConfig.from_yaml("- a\n- b\n")
