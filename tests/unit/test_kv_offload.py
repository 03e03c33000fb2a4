"""vllm.kvOffloadGiB: schema, rendered vLLM flags, validation (and how the operator reports it), router config."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llmfleet.api import InferenceService
from llmfleet.workers.serve.vllm_args import InvalidServeSpec, kv_offload_headroom_gib, render_vllm_args


def body(vllm: dict[str, Any] | None = None, resources: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
        "spec": {"model": {"path": "/models/llama"}, "vllm": vllm or {}, "resources": resources or {}, **spec},
    }


def make(vllm: dict[str, Any] | None = None, resources: dict[str, Any] | None = None, **spec: Any) -> InferenceService:
    return InferenceService.model_validate(body(vllm, resources, **spec))


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_wire_name_is_kvOffloadGiB_and_must_be_positive() -> None:
    isvc = make({"kvOffloadGiB": 12.5}, {"gpus": 1, "memory": "64Gi"})
    assert isvc.spec.vllm.kv_offload_gib == 12.5
    assert isvc.spec.vllm.to_wire()["kvOffloadGiB"] == 12.5
    with pytest.raises(ValidationError, match="greater than 0"):
        make({"kvOffloadGiB": 0}, {"gpus": 1})
    with pytest.raises(ValidationError, match="kvOffloadGib"):  # the generated camelCase spelling is not the field
        make({"kvOffloadGib": 4}, {"gpus": 1})


@pytest.mark.parametrize(("gib", "rendered"), [(200, "200"), (12.5, "12.5"), (0.25, "0.25"), (1234567.5, "1234567.5")])
def test_renders_native_offload_flags(gib: float, rendered: str) -> None:
    isvc = make({"kvOffloadGiB": gib}, {"gpus": 1, "memory": f"{int(gib) + 8}Gi"})
    argv = render_vllm_args(isvc, isvc.pools()[0])
    assert flag(argv, "--kv-offloading-size") == rendered
    assert flag(argv, "--kv-offloading-backend") == "native"
    assert float(rendered) == gib


def test_no_offload_flags_when_unset_and_extra_args_may_pick_another_backend() -> None:
    isvc = make({}, {"gpus": 1})
    argv = render_vllm_args(isvc, isvc.pools()[0])
    assert "--kv-offloading-size" not in argv and "--kv-offloading-backend" not in argv
    lm = make({"extraArgs": ["--kv-offloading-backend", "lmcache", "--kv-offloading-size", "4"]}, {"gpus": 1})
    assert render_vllm_args(lm, lm.pools()[0])[-4:] == ["--kv-offloading-backend", "lmcache", "--kv-offloading-size", "4"]


def test_cpu_pool_is_rejected() -> None:
    isvc = make({"kvOffloadGiB": 4, "blockSize": 32}, {"gpus": 0, "memory": "64Gi"})
    with pytest.raises(InvalidServeSpec, match=r"^spec\.vllm\.kvOffloadGiB needs GPUs \(spec\.resources\.gpus is 0\)"):
        render_vllm_args(isvc, isvc.pools()[0])


@pytest.mark.parametrize(
    ("memory", "tp", "ok"),
    [
        ("200Gi", 1, False),  # exactly the buffer: nothing left for the engine
        ("203Gi", 1, False),  # 4 GiB headroom needed at TP 1
        ("204Gi", 1, True),
        ("219223140352", 1, True),  # 204 GiB in bytes
        ("214G", 1, False),  # 214e9 bytes = 199.3 GiB: decimal suffixes are not GiB
        ("205Gi", 2, False),  # TP 2: 6 GiB headroom
        ("206Gi", 2, True),
        ("0.2Ti", 1, True),  # 204.8 GiB
    ],
)
def test_memory_must_cover_buffer_plus_headroom(memory: str, tp: int, ok: bool) -> None:
    isvc = make({"kvOffloadGiB": 200, "tensorParallelSize": tp}, {"gpus": tp, "memory": memory})
    pool = isvc.pools()[0]
    assert kv_offload_headroom_gib(pool) == 2.0 * (tp + 1)
    if ok:
        assert flag(render_vllm_args(isvc, pool), "--kv-offloading-size") == "200"
    else:
        with pytest.raises(InvalidServeSpec, match=r"^spec\.resources\.memory .* must cover spec\.vllm\.kvOffloadGiB"):
            render_vllm_args(isvc, pool)


def test_default_memory_is_too_small_for_any_real_buffer() -> None:
    isvc = make({"kvOffloadGiB": 8}, {"gpus": 1})  # resources.memory defaults to 8Gi
    with pytest.raises(InvalidServeSpec, match="at least 12Gi"):
        render_vllm_args(isvc, isvc.pools()[0])


def test_extra_args_may_not_repeat_rendered_offload_flags() -> None:
    isvc = make({"kvOffloadGiB": 4, "extraArgs": ["--kv-offloading-size=8"]}, {"gpus": 1, "memory": "32Gi"})
    with pytest.raises(InvalidServeSpec, match="extraArgs sets --kv-offloading-size"):
        render_vllm_args(isvc, isvc.pools()[0])


def test_student_inheriting_offload_is_checked_against_its_own_resources() -> None:
    isvc = make(
        {"kvOffloadGiB": 16}, {"gpus": 1, "memory": "64Gi"},
        fallback={"pools": [
            {"name": "cpu", "model": {"path": "/m/s"}, "resources": {"gpus": 0, "memory": "64Gi"}},
            {"name": "small", "model": {"path": "/m/s"}, "resources": {"gpus": 1, "memory": "16Gi"}},
        ]},
    )
    render_vllm_args(isvc, isvc.pools()[0])
    with pytest.raises(InvalidServeSpec, match=r"spec\.vllm\.kvOffloadGiB needs GPUs \(spec\.fallback\.pools\[name=cpu\]"):
        render_vllm_args(isvc, isvc.pool("cpu"))
    with pytest.raises(InvalidServeSpec, match=r"^spec\.fallback\.pools\[name=small\]\.resources\.memory \(16Gi"):
        render_vllm_args(isvc, isvc.pool("small"))


@pytest.mark.parametrize(
    ("vllm", "resources", "needle"),
    [
        ({"kvOffloadGiB": 4}, {"gpus": 0, "memory": "64Gi"}, "spec.vllm.kvOffloadGiB needs GPUs"),
        ({"kvOffloadGiB": 100}, {"gpus": 1, "memory": "64Gi"}, "spec.resources.memory (64Gi = 64 GiB) must cover"),
    ],
)
async def test_operator_reports_invalid_offload_as_condition_and_event(
    vllm: dict[str, Any], resources: dict[str, Any], needle: str
) -> None:
    """The same path as every spec error: phase Invalid, Ready=False/InvalidSpec with the field, one Warning Event,
    and no API call (the client is None)."""
    from llmfleet.operator.config import OperatorConfig
    from llmfleet.operator.reconcile_isvc import reconcile_inferenceservice

    doc = body(vllm, resources)
    doc["metadata"].update({"uid": "u", "generation": 2})
    out = await reconcile_inferenceservice(doc, None, OperatorConfig(), "t")  # type: ignore[arg-type]
    ready = out.status["conditions"][0]
    assert out.status["phase"] == "Invalid"
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert needle in ready["message"]
    assert [(e.type, e.reason) for e in out.events] == [("Warning", "InvalidSpec")]
    assert needle in out.events[0].message


def test_router_config_carries_what_sizes_the_host_tier() -> None:
    from llmfleet.operator.builders.inferenceservice import router_config_yaml
    from llmfleet.router.config import RouterConfig, router_config_from_service

    isvc = make(
        {"kvOffloadGiB": 200, "tensorParallelSize": 2}, {"gpus": 2, "memory": "256Gi"},
        model={"path": "/models/llama", "dtype": "bfloat16"},
        fallback={"pools": [{"name": "small", "model": {"path": "/m/s"}, "resources": {"gpus": 1, "memory": "16Gi"},
                             "vllm": {}}]},
    )
    cfg = router_config_from_service(isvc)
    primary, small = cfg.pools
    assert (primary.kv_offload_gib, primary.tensor_parallel_size, primary.dtype) == (200, 2, "bfloat16")
    assert primary.model_path == "/models/llama" and primary.host_cache_blocks is None
    assert (small.kv_offload_gib, small.tensor_parallel_size, small.dtype) == (None, 1, "auto")
    # The operator's ConfigMap carries the same (camelCase) and reads back.
    text = router_config_yaml(isvc)
    assert "kvOffloadGiB: 200.0" in text and "tensorParallelSize: 2" in text
    assert RouterConfig.from_yaml(text).pools[0].kv_offload_gib == 200


@pytest.mark.parametrize(("quantity", "expected"), [
    ("64Gi", 64 * 2**30), ("1.5Gi", 1.5 * 2**30), ("512Mi", 512 * 2**20), ("1Ki", 1024), ("8G", 8e9),
    ("500M", 5e8), ("2Ti", 2 * 2**40), ("1024", 1024),
])
def test_memory_bytes_reads_kubernetes_quantities(quantity: str, expected: float) -> None:
    from llmfleet.api.common import memory_bytes

    assert memory_bytes(quantity) == expected


def test_memory_bytes_rejects_what_kubernetes_rejects() -> None:
    from llmfleet.api.common import memory_bytes

    for bad in ("1K", "64GB", "", "Gi"):  # a bare K is no Kubernetes suffix (k is, but not for memory here)
        with pytest.raises(ValueError, match="not a memory quantity"):
            memory_bytes(bad)
