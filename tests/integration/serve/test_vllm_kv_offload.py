"""kvOffloadGiB against vLLM itself: its argument parser reads the rendered flags, and the router sizes the host
tier from the labels vLLM's own CacheConfig exports in vllm:cache_config_info. Imports vLLM (~10 s), no engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmfleet.api import InferenceService
from llmfleet.workers.serve.vllm_args import render_vllm_args

pytest.importorskip("vllm")
pytestmark = pytest.mark.integration

LLAMA3_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
             "head_dim": 128, "torch_dtype": "bfloat16"}


def _isvc(gib: float, tp: int) -> InferenceService:
    return InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
        "spec": {"model": {"path": "/models/llama", "maxModelLen": 8192},
                 "vllm": {"kvOffloadGiB": gib, "tensorParallelSize": tp, "blockSize": 16, "extraArgs": ["--seed", "1"]},
                 "resources": {"gpus": tp, "memory": "512Gi"}},
    })


@pytest.mark.parametrize(("gib", "tp"), [(200, 1), (12.5, 2)])
def test_vllm_parser_reads_the_rendered_offload_flags(gib: float, tp: int) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    isvc = _isvc(gib, tp)
    argv = render_vllm_args(isvc, isvc.pools()[0], kv_events_port=5557)
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)  # type: ignore[no-untyped-call]
    args = EngineArgs.from_cli_args(ns)
    assert args.kv_offloading_size == gib
    assert args.kv_offloading_backend == "native"
    assert args.tensor_parallel_size == tp and args.block_size == 16


def test_router_sizes_the_host_tier_from_vllms_own_cache_config_labels(tmp_path: Path) -> None:
    """vLLM's CacheConfig.metrics_info() -> a Prometheus gauge, as vLLM's logger exports it -> the router's scrape."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from vllm.config.cache import CacheConfig

    from llmfleet.router.config import LimitsConfig, PoolConfig
    from llmfleet.router.replicas import PoolReplicas, parse_vllm_metrics

    cache = CacheConfig(block_size=512, kv_offloading_size=200.0, cache_dtype="auto")
    cache.num_gpu_blocks = 1000
    labels = {**cache.metrics_info(), "engine": "0"}
    registry = CollectorRegistry()
    Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(labels),
          registry=registry).labels(**labels).set(1)
    Gauge("vllm:num_requests_running", "running", registry=registry).set(0)
    text = generate_latest(registry).decode()

    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    caps: dict[str, int] = {}
    pool = PoolReplicas(PoolConfig(name="primary", role="primary", served_names=["m"], endpoints=["http://a"],
                                   model_path=str(tmp_path)),
                        LimitsConfig(), on_capacity=lambda r, n: caps.__setitem__(r, n))
    info: dict[str, str] = {}
    values = parse_vllm_metrics(text, info)
    pool.apply_scrape(pool.replicas["http://a"], values, 1.0, info)
    assert caps == {"http://a": 3200}  # 200 GiB of 64 MiB blocks, more than the GPU's 1000


def test_vllms_own_tiered_events_keep_host_blocks_matchable() -> None:
    """KV events built with vLLM's structs (GPU store, the offload connector's token-less CPU store, GPU
    eviction), msgpack-encoded as vLLM publishes them, decoded and applied by the router without vLLM."""
    import msgspec
    from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_GPU, BlockRemoved, BlockStored, KVEventBatch

    from llmfleet.router.block_keys import BlockHasher
    from llmfleet.router.kv_events import apply_batch
    from llmfleet.router.prefix_index import PrefixIndex

    bs, tokens = 4, list(range(1, 13))

    def gpu_store(hashes: list[int], parent: int | None, toks: list[int]) -> BlockStored:
        return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks, block_size=bs,
                           lora_id=None, medium=MEDIUM_GPU, lora_name=None)

    def cpu_store(h: int) -> BlockStored:  # OffloadingEventsTracker._placeholder_stored
        return BlockStored(block_hashes=[h], parent_block_hash=None, token_ids=[], block_size=0, lora_id=None,
                           medium=MEDIUM_CPU, lora_name=None)

    batches = [
        [gpu_store([11, 12], None, tokens[:8]), gpu_store([13], 12, tokens[8:])],
        [cpu_store(11), cpu_store(12), cpu_store(13)],
        [BlockRemoved(block_hashes=[11, 12, 13], medium=MEDIUM_GPU)],
    ]
    index = PrefixIndex()
    keys = BlockHasher(bs).keys(tokens)
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
    for events in batches:
        wire = encoder.encode(KVEventBatch(ts=0.0, events=events))
        apply_batch(index, "r", decoder.decode(wire), bs)
    assert index.match(keys) == {"r": 3}  # evicted from the GPU, still in host memory
    wire = encoder.encode(KVEventBatch(ts=0.0, events=[BlockRemoved(block_hashes=[13], medium=MEDIUM_CPU)]))
    apply_batch(index, "r", decoder.decode(wire), bs)
    assert index.match(keys) == {"r": 2}
