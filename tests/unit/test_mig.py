"""MIG slices (resources.migProfile): the API's rule, the pod's resource, the GPU table's slice, the checks that
name the field, and the simulator's cost and GPU-seconds of a replica on a slice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from llmfleet.api import InferenceService, Resources
from llmfleet.autoscaler.seeds import seed_for_pool
from llmfleet.cli.main import app
from llmfleet.operator.builders import ServiceSpecError, build_inferenceservice
from llmfleet.operator.config import OperatorConfig
from llmfleet.plan.hardware import GPUS, get_gpu, mig_profile_problem, mig_slice
from llmfleet.sim.production import make_service, simulate_service
from llmfleet.sim.workload import SyntheticSpec, synthetic

from .test_crds import failed_cel_rules

runner = CliRunner()


def _isvc(student: dict[str, Any]) -> InferenceService:
    doc = {"apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "chat", "namespace": "ml", "uid": "uid-1"},
           "spec": {"model": {"path": "/models/llama"}, "resources": {"gpus": 1, "gpuType": "H200"},
                    "fallback": {"pools": [{"name": "small", "model": {"path": "/models/small"},
                                            "resources": student}]}}}
    return InferenceService.model_validate(doc)


def test_a_slice_has_its_share_of_compute_memory_and_bandwidth() -> None:
    h200 = GPUS["H200"]
    s = mig_slice(h200, "3g.71gb")
    assert s.bf16_tflops == pytest.approx(h200.bf16_tflops * 3 / 7)
    assert s.fp8_tflops == pytest.approx(1979.0 * 3 / 7)
    assert s.hbm_bandwidth_tbs == pytest.approx(h200.hbm_bandwidth_tbs / 2)
    assert s.hbm_gib == pytest.approx(h200.hbm_gib / 2)
    assert s.gpu_share == 0.5  # 4 of 8 memory slices outweigh 3 of 7 compute slices
    assert mig_slice(h200, "1g.18gb").gpu_share == pytest.approx(1 / 7)
    assert mig_slice(h200, "1g.35gb").gpu_share == 0.25  # two memory slices on one compute slice
    assert mig_slice(h200, "4g.71gb").gpu_share == pytest.approx(4 / 7)
    assert mig_slice(h200, "7g.141gb").bf16_tflops == pytest.approx(h200.bf16_tflops)
    assert GPUS["H200"].gpu_share == 1.0


def test_get_gpu_slices_after_overrides_and_refuses_profiles_the_gpu_lacks() -> None:
    g = get_gpu("h100", {"hbmBandwidthTBs": 4.0}, mig="3g.40gb")
    assert g.hbm_bandwidth_tbs == pytest.approx(2.0) and g.name == "H100 MIG 3g.40gb"
    with pytest.raises(ValueError, match="H200 has no MIG profile '3g.40gb'; its profiles: 1g.18gb"):
        get_gpu("H200", mig="3g.40gb")
    with pytest.raises(ValueError, match="L40S has no MIG profiles"):
        get_gpu("L40S", mig="1g.10gb")
    with pytest.raises(ValueError, match="unknown GPU field 'gpu_share'"):
        get_gpu("H200", {"gpu_share": 0.1})


@pytest.mark.parametrize("resources", [
    {"gpus": 2, "gpuType": "H200", "migProfile": "3g.71gb"},  # one process sees one MIG device
    {"gpus": 1, "migProfile": "3g.71gb"},  # the profile is the GPU type's
    {"gpus": 0, "gpuType": "H200", "migProfile": "3g.71gb"},
])
def test_mig_needs_one_gpu_and_a_type_in_pydantic_and_in_the_crd(resources: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="migProfile needs gpus: 1 and a gpuType"):
        Resources.model_validate(resources)
    spec = {"model": {"path": "/m"}, "resources": resources}
    assert any("migProfile" in f for f in failed_cel_rules("InferenceService", spec))
    ok = {"model": {"path": "/m"}, "resources": {"gpus": 1, "gpuType": "H200", "migProfile": "3g.71gb"}}
    assert failed_cel_rules("InferenceService", ok) == []


@pytest.mark.parametrize("profile", ["3g", "3g.71gb+me", "8g.141gb", "3G.71GB"])
def test_a_profile_that_is_no_resource_name_is_refused(profile: str) -> None:
    """A "+me" profile (media engines) cannot be part of a Kubernetes resource name; 8g is no MIG profile."""
    with pytest.raises(ValidationError, match="migProfile"):
        Resources.model_validate({"gpus": 1, "gpuType": "H200", "migProfile": profile})


def test_a_slice_takes_no_whole_gpu_from_arbitration() -> None:
    assert Resources(gpus=1, gpu_type="H200", mig_profile="3g.71gb").whole_gpus == 0
    assert Resources(gpus=2, gpu_type="H200").whole_gpus == 2


def test_a_pool_on_a_slice_asks_for_the_mig_resource_not_a_whole_gpu() -> None:
    isvc = _isvc({"gpus": 1, "gpuType": "H200", "migProfile": "2g.35gb"})
    deployments = {m["metadata"]["name"]: m for m in build_inferenceservice(isvc, OperatorConfig())
                   if m["kind"] == "Deployment"}
    pod = deployments["chat-small"]["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["requests"]["nvidia.com/mig-2g.35gb"] == res["limits"]["nvidia.com/mig-2g.35gb"] == "1"
    assert "nvidia.com/gpu" not in res["requests"] and "nvidia.com/gpu" not in res["limits"]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"  # GPU nodes' taint, MIG-partitioned ones too
    primary = deployments["chat-primary"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert primary["limits"]["nvidia.com/gpu"] == "1"


def test_a_profile_the_gpu_type_lacks_is_an_invalid_spec_naming_the_field(tmp_path: Path) -> None:
    isvc = _isvc({"gpus": 1, "gpuType": "H200", "migProfile": "3g.40gb"})
    with pytest.raises(ServiceSpecError, match=r"spec\.fallback\.pools\[name=small\]\.resources\.migProfile: H200 "
                                               r"has no MIG profile '3g\.40gb'"):
        build_inferenceservice(isvc, OperatorConfig())
    # a GPU type the table does not know is left to the cluster's device plugin
    assert mig_profile_problem(Resources(gpus=1, gpu_type="B300", mig_profile="1g.34gb")) is None
    manifest = tmp_path / "isvc.yaml"
    manifest.write_text(yaml.safe_dump(isvc.to_wire() | {"apiVersion": isvc.api_version, "kind": isvc.kind}))
    result = runner.invoke(app, ["validate", str(manifest)])
    assert result.exit_code == 1
    assert "spec.fallback.pools[name=small].resources.migProfile" in result.output
    assert "3g.40gb" in result.output


def test_planner_seed_of_a_slice_is_slower_than_a_whole_gpu() -> None:
    whole = _isvc({"gpus": 1, "gpuType": "H200"})
    sliced = _isvc({"gpus": 1, "gpuType": "H200", "migProfile": "3g.71gb"})
    a = seed_for_pool(whole.pools()[1], "llama-3.2-1b")
    b = seed_for_pool(sliced.pools()[1], "llama-3.2-1b")
    # 3 of 7 compute slices: a prefill step takes over twice as long (the step's fixed overhead is not sliced)
    assert b.prefill_tokens_per_s < 0.55 * a.prefill_tokens_per_s
    assert b.decode_tokens_per_s < a.decode_tokens_per_s


def test_simulated_student_on_a_slice_counts_its_share_of_gpu_seconds() -> None:
    w = synthetic(SyntheticSpec(duration_s=60, rate_rps=4.0, seed=3))
    runs = {}
    for mig in (None, "3g.71gb"):
        isvc = make_service(policy="static", replicas=1, model="llama-3-8b", student="llama-3.2-1b", student_min=1,
                            student_mig=mig)
        res, _ = simulate_service(w, isvc)
        by_pool = {p["name"]: p for p in res.config["pools"]}
        assert sum(r["gpuS"] for r in res.replicas) == pytest.approx(res.summary["gpuSeconds"], abs=1e-2)
        runs[mig] = {r["pool"]: r["gpuS"] for r in res.replicas}, by_pool["small"]["gpusPerReplica"]
    (whole, whole_share), (sliced, slice_share) = runs[None], runs["3g.71gb"]
    assert (whole_share, slice_share) == (1.0, 0.5)
    assert whole["small"] > 0 and sliced["small"] == pytest.approx(whole["small"] / 2, rel=1e-3)
    primary = next(p for p in whole if p != "small")
    assert sliced[primary] == pytest.approx(whole[primary], rel=1e-3)


def test_sim_run_student_mig_errors_are_one_line() -> None:
    bad = runner.invoke(app, ["sim", "run", "--duration", "10", "--student", "llama-3.2-1b:1",
                              "--student-mig", "3g.40gb"])
    assert bad.exit_code == 2 and "H200 has no MIG profile '3g.40gb'" in bad.output
    alone = runner.invoke(app, ["sim", "run", "--duration", "10", "--student-mig", "3g.71gb"])
    assert alone.exit_code == 2 and "--student-mig needs --student" in alone.output


def test_plan_prices_a_replica_on_a_slice() -> None:
    out = runner.invoke(app, ["plan", "--model", "llama-3.2-1b", "--mig", "3g.71gb", "--json", "-"])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output)
    assert rep["gpu"]["name"] == "H200 MIG 3g.71gb" and rep["gpu"]["gpu_share"] == 0.5
    bad = runner.invoke(app, ["plan", "--mig", "3g.40gb"])
    assert bad.exit_code == 2 and "H200 has no MIG profile '3g.40gb'" in bad.output
