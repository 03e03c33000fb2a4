"""The prefill price of a pool (llmfleet.router.prefill_price): from the planner's roofline for the pool's model and
GPU, through the router config and the server into the estimated-ttft scorer, and the simulator's same mapping."""

from __future__ import annotations

import pytest

from llmfleet.api import InferenceService
from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION
from llmfleet.router.config import PoolConfig, RouterConfig, router_config_from_service
from llmfleet.router.plugins import EstimatedTTFTScorer, PrefixIndex, ReplicaState, RequestInfo
from llmfleet.router.prefill_price import (
    DEFAULT_PREFILL_TOKENS_PER_S,
    pool_prefill_rate,
    pool_prefill_speedup,
)
from llmfleet.router.server import Router
from llmfleet.sim.engine import simulate
from llmfleet.sim.production import make_service, simulate_service
from llmfleet.sim.routers import LlmfleetRouter
from llmfleet.sim.types import PoolSpec, SimConfig
from llmfleet.sim.workload import Request, Workload


def test_the_reference_keeps_the_default_and_other_hardware_scales_by_its_roofline() -> None:
    ref = pool_prefill_rate("llama-3-8b", "H200")
    assert ref == DEFAULT_PREFILL_TOKENS_PER_S  # exactly: every result priced at the default stays as it was
    assert pool_prefill_rate("llama-3.1-8b", "h200") == ref  # the same layers (a longer context only)
    big = pool_prefill_rate("llama-3-70b", "H100")
    assert big is not None and ref / 12 < big < ref / 6  # ~9x the FLOPs per token, the same bf16 peak
    assert pool_prefill_rate("llama-3-70b", "H100", tensor_parallel=4) == pytest.approx(4 * big)
    l4 = pool_prefill_rate("llama-3-8b", "L4")
    assert l4 is not None and l4 < ref / 6
    sliced = pool_prefill_rate("llama-3-8b", "H200", mig_profile="3g.71gb")
    assert sliced == pytest.approx(ref * 3 / 7)  # a MIG slice's share of the compute
    # never above the default: a faster pool (a small student, a newer GPU) keeps it
    assert pool_prefill_rate("llama-3.2-1b", "H200") == ref and pool_prefill_rate("llama-3-8b", "B200") == ref
    assert pool_prefill_rate("llama-3.2-1b", "H200", mig_profile="3g.71gb") == ref
    # what the planner cannot price: measured instead (or the default)
    assert pool_prefill_rate(None, "H200") is None  # no preset
    assert pool_prefill_rate("llama-3-8b", None) is None and pool_prefill_rate("llama-3-8b", "H200", gpus=0) is None
    assert pool_prefill_rate("mystery-9b", "H200") is None and pool_prefill_rate("llama-3-8b", "TPU") is None



def test_a_pool_faster_than_its_capped_price_has_a_speedup_of_its_roofline_ratio() -> None:
    """price x speedup = the default x the roofline's ratio to the reference, for every pool the planner knows: the
    capped ones (a small student, a newer GPU) carry the rest of their speed in the speedup, the others none."""
    assert pool_prefill_speedup("llama-3-8b", "H200") == 1.0 and pool_prefill_speedup("llama-3-70b", "H100") == 1.0
    small = pool_prefill_speedup("llama-3.2-1b", "H200")
    assert 5.0 < small < 7.0  # ~6.1: a sixth of the FLOPs per token on the same GPU
    assert pool_prefill_speedup("llama-3.2-1b", "H200", mig_profile="3g.71gb") == pytest.approx(small * 3 / 7)
    # not capped on an L4: all of its speed is in the price, relative to the 8B's there as on the H200
    l4_small, l4_big = pool_prefill_rate("llama-3.2-1b", "L4"), pool_prefill_rate("llama-3-8b", "L4")
    assert pool_prefill_speedup("llama-3.2-1b", "L4") == 1.0 and l4_small is not None and l4_big is not None
    assert l4_small / l4_big == pytest.approx(small, rel=1e-6)
    assert pool_prefill_speedup(None, "H200") == 1.0 and pool_prefill_speedup("llama-3-8b", "TPU") == 1.0

def _isvc(gpu: dict[str, object] | None, annotations: dict[str, str]) -> InferenceService:
    spec: dict[str, object] = {"model": {"path": "/models/big"},
                               "fallback": {"pools": [{"name": "small", "model": {"path": "/models/small"},
                                                       **({"resources": gpu} if gpu else {})}]}}
    if gpu:
        spec["resources"] = gpu
    return InferenceService.model_validate({"metadata": {"name": "chat", "annotations": annotations}, "spec": spec})


def test_the_router_config_prices_the_pools_the_planner_knows() -> None:
    presets = {MODEL_PRESET_ANNOTATION: "llama-3-70b", f"{MODEL_PRESET_ANNOTATION}.small": "llama-3.2-1b"}
    cfg = router_config_from_service(_isvc({"gpus": 1, "gpuType": "H100"}, presets), endpoints={})
    rates = {p.name: p.prefill_tokens_per_s for p in cfg.pools}
    assert rates == {"primary": pool_prefill_rate("llama-3-70b", "H100"),
                     "small": pool_prefill_rate("llama-3.2-1b", "H100")}
    assert cfg.measure_prefill_rate is None  # unset: the priced pools keep their price
    assert [p.prefill_speedup for p in cfg.pools] == [1.0, pool_prefill_speedup("llama-3.2-1b", "H100")]
    assert cfg.pools[1].prefill_speedup > 5.0
    assert "prefillTokensPerS" in cfg.to_yaml()
    # CPU replicas, or no preset: no price, so the router measures them
    for isvc in (_isvc(None, presets), _isvc({"gpus": 1, "gpuType": "H100"}, {})):
        assert [p.prefill_tokens_per_s for p in router_config_from_service(isvc, endpoints={}).pools] == [None, None]


def _slow_holder_request() -> tuple[RequestInfo, ReplicaState, ReplicaState, PrefixIndex]:
    keys = list(range(1, 33))  # 32 blocks of 32 tokens; replica a holds 30 of them and has 0.3 s of work queued
    index = PrefixIndex()
    index.insert("a", keys[:30])
    a = ReplicaState(id="a", pool="p", models=("m",), stale=False, in_flight=1, prefill_tokens=200.0,
                     prefill_busy_until=10.3)
    b = ReplicaState(id="b", pool="p", models=("m",), stale=False)
    return RequestInfo(model="m", block_hashes=keys, input_tokens=1024, block_size=32, now=10.0), a, b, index


async def test_the_server_prices_each_pool_and_the_price_decides_a_prefix_hit() -> None:
    """Replicas of Llama-3-70B on an H100 prefill ~3,200 tokens/s: recomputing a 1,024-token prompt there takes
    ~0.3 s. Priced at the H200-class default it costs 34 ms, less than the holder's 0.3 s queue, and the hit is
    given up; at the pool's price the holder keeps it."""
    rate = pool_prefill_rate("llama-3-70b", "H100")
    assert rate is not None
    pool = dict(name="p", role="primary", served_names=["m"], endpoints=["http://127.0.0.1:9"])
    priced = Router(RouterConfig(service="s", pools=[PoolConfig(**pool, prefill_tokens_per_s=rate)],  # type: ignore[arg-type]
                                 scorers={"estimated-ttft": 1.0}, sole_holder_discount=False))
    unpriced = Router(RouterConfig(service="s", pools=[PoolConfig(**pool)], scorers={"estimated-ttft": 1.0},  # type: ignore[arg-type]
                                   sole_holder_discount=False, measure_prefill_rate=False))
    decisions = []
    for router in (priced, unpriced):
        (scorer, _), = router.pools["p"].pipeline.scorers
        assert isinstance(scorer, EstimatedTTFTScorer)
        req, a, b, index = _slow_holder_request()
        scorer.index = index
        scorer.work_externality = 0.0
        costs = scorer.score(req, [a, b])
        decisions.append("a" if costs[0] > costs[1] else "b")
    assert decisions == ["a", "b"]


def test_the_simulated_router_prices_pools_as_production_does(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmfleet.sim import production

    cfg = SimConfig(pools=[PoolSpec(model="llama-3-8b", gpu="L4", replicas=1),
                           PoolSpec(name="student", role="student", model="llama-3.2-1b", gpu="H200", replicas=1)])
    w = Workload(name="one", requests=[Request(0, 0.0, 64, 2)], block_size=16)
    router = LlmfleetRouter()
    simulate(w, cfg, router=router)

    def prices(r: LlmfleetRouter) -> dict[str, float]:
        (scorer,) = [s for s, _ in r.pipeline.scorers if isinstance(s, EstimatedTTFTScorer)]
        return scorer.pool_rates

    assert prices(router) == {"primary": pool_prefill_rate("llama-3-8b", "L4"),
                              "student": pool_prefill_rate("llama-3.2-1b", "H200")}
    assert router.speedups == {"primary": 1.0, "student": pool_prefill_speedup("llama-3.2-1b", "H200")}
    # simulate_service hands over the router config's prices, which the production router reads
    made: list[LlmfleetRouter] = []
    given: list[object] = []

    class Recorded(LlmfleetRouter):
        def __init__(self, **kw: object) -> None:
            super().__init__(**kw)  # type: ignore[arg-type]
            made.append(self)
            given.append(kw.get("pool_prefill_rates"))
            given.append(kw.get("pool_prefill_speedups"))

    monkeypatch.setattr(production, "LlmfleetRouter", Recorded)
    isvc = make_service(policy="static", replicas=1, model="llama-3-8b", gpu="L4", student="llama-3.2-1b")
    simulate_service(w, isvc)
    rc = router_config_from_service(isvc, endpoints={})
    expected = {"primary": pool_prefill_rate("llama-3-8b", "L4"), "small": pool_prefill_rate("llama-3.2-1b", "L4")}
    assert {p.name: p.prefill_tokens_per_s for p in rc.pools} == expected
    speedups = {p.name: p.prefill_speedup for p in rc.pools}
    assert given == [expected, speedups] and [prices(r) for r in made] == [expected]  # the config's, not derived again
    assert [r.speedups for r in made] == [speedups]


def test_fp8_weights_double_a_slower_pools_price_and_its_seed() -> None:
    """model.quantization fp8 runs the matmuls on fp8 tensor cores (twice bf16's peak): the planner's price and the
    autoscaler's seed follow, in production and in the simulator. A GPU without fp8 cores, a 16-bit-compute method
    (AWQ) and a pool already at the default keep their price."""
    from llmfleet.autoscaler.seeds import seeds_for_service
    from llmfleet.sim.production import pool_specs

    bf16 = pool_prefill_rate("llama-3-70b", "H200", tensor_parallel=2)
    fp8 = pool_prefill_rate("llama-3-70b", "H200", tensor_parallel=2, quantization="fp8")
    assert bf16 is not None and fp8 == pytest.approx(2 * bf16, rel=0.02)  # compute-bound: ~2x, not exactly
    assert pool_prefill_rate("llama-3-70b", "H200", tensor_parallel=2, quantization="awq") == bf16
    assert pool_prefill_rate("llama-3-8b", "A100", quantization="fp8") == pool_prefill_rate("llama-3-8b", "A100")
    assert pool_prefill_rate("llama-3-8b", "H200", quantization="fp8") == DEFAULT_PREFILL_TOKENS_PER_S  # the cap

    def service(quantization: str | None) -> InferenceService:
        model = {"path": "/models/big", **({"quantization": quantization} if quantization else {})}
        doc = {"metadata": {"name": "chat", "annotations": {MODEL_PRESET_ANNOTATION: "llama-3-70b"}},
               "spec": {"model": model, "resources": {"gpus": 2, "gpuType": "H200"}, "vllm": {"tensorParallelSize": 2}}}
        return InferenceService.model_validate(doc)

    rates = [router_config_from_service(service(q), endpoints={}).pools[0].prefill_tokens_per_s for q in (None, "fp8")]
    assert rates == [bf16, fp8]
    seeds = [seeds_for_service(service(q))["primary"].prefill_tokens_per_s for q in (None, "fp8")]
    assert seeds[1] > 1.5 * seeds[0]
    (spec,) = pool_specs(service("fp8"))
    assert spec.weight_dtype == "fp8"
    router = LlmfleetRouter()
    w = Workload(name="one", requests=[Request(0, 0.0, 64, 2)], block_size=16)
    simulate(w, SimConfig(pools=[spec]), router=router)
    (scorer,) = [s for s, _ in router.pipeline.scorers if isinstance(s, EstimatedTTFTScorer)]
    assert scorer.pool_rates == {"primary": fp8}
