"""LoRA at the router: the adapter-loaded scorer, adapter-aware prefix keys, the model-list parser, the config."""

from __future__ import annotations

from llmfleet.api import InferenceService
from llmfleet.router.adapters import adapters_in_model_list
from llmfleet.router.block_keys import BlockHasher, adapter_seed
from llmfleet.router.config import router_config_from_service
from llmfleet.router.plugins import AdapterLoadedScorer, ReplicaState, RequestInfo, build_pipeline
from llmfleet.router.prefix_index import PrefixIndex
from llmfleet.router.prompt_tokens import PromptBlocks


def rep(rid: str, adapters: set[str] = frozenset(), slots: int = 4, **kw: float) -> ReplicaState:  # type: ignore[assignment]
    return ReplicaState(id=rid, pool="primary", models=("m",), stale=False, adapters=set(adapters),
                        adapter_slots=slots, **kw)


def test_scorer_prefers_holders_then_free_slots() -> None:
    s = AdapterLoadedScorer()
    reps = [rep("a", {"sql"}), rep("b", set()), rep("c", {"x", "y", "z", "w"}), rep("d", {"x", "y"}, slots=0)]
    assert s.score(RequestInfo(model="m", adapter="sql"), reps) == [1.0, 0.5, 0.0, 0.5]
    assert rep("e", {"x", "y"}).adapters == {"x", "y"}
    assert s.score(RequestInfo(model="m", adapter="sql"), [rep("e", {"x", "y"})]) == [0.25]
    assert s.score(RequestInfo(model="m"), reps) == [1.0] * 4  # base-model requests: neutral


def test_pipeline_keeps_an_adapter_where_it_is_warm_and_spreads_it_when_busy() -> None:
    pipe = build_pipeline({"adapter-loaded": 1.0, "queue-depth": 0.1, "running-requests": 1.0}, seed=1)
    holder, other = rep("a", {"sql"}), rep("b")
    req = RequestInfo(model="m", adapter="sql")
    assert all(pipe.pick(req, [holder, other]).replica is holder for _ in range(20))
    # the holder is loaded with work, the other idle: the adapter goes to a second replica
    holder.running, holder.waiting = 8.0, 4.0
    assert pipe.pick(req, [holder, other]).replica is other


def test_prefix_keys_differ_per_adapter_and_kv_events_agree() -> None:
    pb = PromptBlocks(4)
    text = "the same prompt text, long enough for several blocks " * 4
    base, _ = pb(text)
    sql, _ = pb(text, "sql")
    fr, _ = pb(text, "fr")
    assert len(base) == len(sql) > 2
    assert not set(base) & set(sql) and not set(sql) & set(fr)
    assert pb(text, "sql")[0] == sql  # deterministic
    assert adapter_seed(None) == 0 and adapter_seed("sql") == adapter_seed("sql") != adapter_seed("fr")
    # an engine's BlockStored for the adapter's blocks (vLLM's lora_name) keys them as the router does
    h = BlockHasher(4)
    toks = list(range(1, 13))
    idx = PrefixIndex()
    idx.apply_kv_event("r", {"type": "BlockStored", "block_hashes": [1, 2, 3], "parent_block_hash": None,
                             "token_ids": toks, "lora_name": "sql"}, 4)
    assert idx.match(h.keys(toks, adapter_seed("sql"))) == {"r": 3}
    assert idx.match(h.keys(toks)) == {}


def test_model_list_parser() -> None:
    body = {"data": [{"id": "m", "parent": None}, {"id": "sql", "parent": "m", "root": "/a/sql"},
                     {"id": "fr", "parent": "m"}, "junk", {"parent": "m"}]}
    assert adapters_in_model_list(body, ["m"]) == {"sql", "fr"}
    assert adapters_in_model_list({"data": "x"}, ["m"]) == set()
    assert adapters_in_model_list([1], ["m"]) == set()


def test_router_config_carries_adapters_slots_and_the_scorer() -> None:
    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
        "spec": {"model": {"path": "/m"}, "lora": {"maxLoras": 2, "maxCpuLoras": 5},
                 "adapters": [{"name": "sql", "uri": "file:///ad/sql"}, {"name": "fr", "uri": "/ad/fr"}],
                 "fallback": {"pools": [{"name": "small", "model": {"path": "/s"}}]}}})
    cfg = router_config_from_service(isvc, endpoints={"primary": ["http://x:1"], "small": ["http://y:1"]})
    primary, student = cfg.pools
    assert [(a.name, a.path) for a in primary.adapters] == [("sql", "/ad/sql"), ("fr", "/ad/fr")]
    assert primary.adapter_slots == 5 and student.adapters == [] and student.adapter_slots == 0
    assert cfg.scorers["adapter-loaded"] == 1.0
    again = type(cfg).from_yaml(cfg.to_yaml())
    assert again == cfg
    plain = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
        "spec": {"model": {"path": "/m"}}})
    assert "adapter-loaded" not in router_config_from_service(plain, endpoints={"primary": []}).scorers
