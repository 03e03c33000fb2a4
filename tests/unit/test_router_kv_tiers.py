"""Host KV tier at the router: per-medium KV events in the prefix index, host-tier capacity from cache_config_info."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from llmfleet.router.block_keys import BlockHasher
from llmfleet.router.config import LimitsConfig, PoolConfig
from llmfleet.router.kv_tiers import (
    HostTierUnknown,
    cached_capacity,
    count_add,
    count_sub,
    host_cache_blocks,
    kv_bytes_per_token,
    kv_element_bytes,
    medium_slot,
    offload_gib_from_label,
)
from llmfleet.router.prefix_index import PrefixIndex
from llmfleet.router.replicas import PoolReplicas, parse_vllm_metrics

BS = 4
TOKENS = list(range(1, 13))  # three blocks of 4


def stored(hashes: list[int], parent: int | None, tokens: list[int], medium: str | None = "GPU") -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
                          "token_ids": tokens, "block_size": BS}
    if medium is not None:
        ev["medium"] = medium
    return ev


def offloaded(hashes: list[int]) -> dict[str, Any]:
    """What vLLM's offloading connector publishes by default for a CPU store: the engine hash, no tokens."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": [],
            "block_size": 0, "medium": "CPU"}


def removed(hashes: list[int], medium: str | None = "GPU") -> dict[str, Any]:
    ev: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": hashes}
    if medium is not None:
        ev["medium"] = medium
    return ev


def indexed(*events: dict[str, Any]) -> tuple[PrefixIndex, list[int]]:
    idx = PrefixIndex()
    for ev in events:
        idx.apply_kv_event("r", ev, BS)
    return idx, BlockHasher(BS).keys(TOKENS)


def gpu_chain() -> list[dict[str, Any]]:
    return [stored([11, 12], None, TOKENS[:8]), stored([13], 12, TOKENS[8:])]


# -- prefix index ----------------------------------------------------------------------------------------------
def test_gpu_eviction_of_a_block_still_in_host_memory_keeps_it_matchable() -> None:
    idx, keys = indexed(*gpu_chain(), offloaded([11]), offloaded([12]), offloaded([13]))
    assert idx.match(keys) == {"r": 3}
    idx.apply_kv_event("r", removed([12, 13]), BS)  # GPU evicts; host memory still has them
    assert idx.match(keys) == {"r": 3}
    idx.apply_kv_event("r", removed([13], "CPU"), BS)  # host LRU drops the tail: no medium holds it
    assert idx.match(keys) == {"r": 2}
    idx.apply_kv_event("r", removed([11, 12], "CPU"), BS)  # 11 is still on the GPU, 12 nowhere
    assert idx.match(keys) == {"r": 1}
    idx.apply_kv_event("r", removed([11]), BS)
    assert idx.match(keys) == {} and len(idx) == 0


def test_host_store_with_tokens_and_reload_to_gpu() -> None:
    """Self-describing CPU stores carry tokens; a block loaded back to the GPU is stored there again."""
    idx, keys = indexed(stored([11, 12], None, TOKENS[:8], "CPU"), stored([13], 12, TOKENS[8:], "CPU"))
    assert idx.match(keys) == {"r": 3}  # only in host memory, still a hit (loaded, not recomputed)
    idx.apply_kv_event("r", stored([11, 12], None, TOKENS[:8], "GPU"), BS)  # H2D load of the first two
    idx.apply_kv_event("r", removed([11, 12, 13], "CPU"), BS)
    assert idx.match(keys) == {"r": 2}


def test_removal_from_a_medium_never_seen_storing_changes_nothing() -> None:
    idx, keys = indexed(*gpu_chain())
    idx.apply_kv_event("r", removed([13], "CPU"), BS)  # its CPU store was missed (e.g. before we subscribed)
    assert idx.match(keys) == {"r": 3}
    idx.apply_kv_event("r", removed([13]), BS)
    assert idx.match(keys) == {"r": 2}


def test_host_store_of_an_unknown_hash_is_skipped() -> None:
    idx, keys = indexed(offloaded([77]), removed([77], "CPU"))
    assert len(idx) == 0 and idx.match(keys) == {}


def test_repeated_announcements_are_reference_counted() -> None:
    """vLLM can announce one hash twice per medium (duplicate GPU blocks; offload chunks sharing a block)."""
    idx, keys = indexed(*gpu_chain(), stored([13], 12, TOKENS[8:]))
    idx.apply_kv_event("r", removed([13]), BS)
    assert idx.match(keys) == {"r": 3}  # the other copy
    idx.apply_kv_event("r", removed([13]), BS)
    assert idx.match(keys) == {"r": 2}


def test_events_without_medium_behave_as_before() -> None:
    idx, keys = indexed(stored([11, 12], None, TOKENS[:8], None), stored([13], 12, TOKENS[8:], None))
    assert idx.match(keys) == {"r": 3}
    idx.apply_kv_event("r", removed([13], None), BS)
    assert idx.match(keys) == {"r": 2}
    idx.apply_kv_event("r", removed([12], "GPU"), BS)  # None and "GPU" are the same tier
    assert idx.match(keys) == {"r": 1}


def test_all_blocks_cleared_forgets_every_tier() -> None:
    """AllBlocksCleared has no medium (vLLM's GPU pool emits it; a host reset emits nothing): all tiers go."""
    idx, keys = indexed(*gpu_chain(), offloaded([11, 12, 13]), removed([13]), {"type": "AllBlocksCleared"})
    assert idx.match(keys) == {} and len(idx) == 0
    idx.apply_kv_event("r", removed([11, 12, 13], "CPU"), BS)  # late removals of forgotten blocks: no effect
    idx.apply_kv_event("r", offloaded([11]), BS)  # and a host store of a forgotten hash cannot be keyed
    assert len(idx) == 0
    for ev in gpu_chain():  # the engine fills again
        idx.apply_kv_event("r", ev, BS)
    assert idx.match(keys) == {"r": 3}


def test_remove_replica_forgets_its_media() -> None:
    idx, keys = indexed(*gpu_chain(), offloaded([11]))
    idx.remove_replica("r")
    assert idx.match(keys) == {}
    idx.apply_kv_event("r", removed([11], "CPU"), BS)  # a straggler event: no state left to touch
    assert len(idx) == 0


def test_medium_counts() -> None:
    gpu, cpu, other = medium_slot("GPU"), medium_slot("CPU"), medium_slot("NVME-NEXT-GEN")
    assert medium_slot(None) == gpu and len({gpu, cpu, medium_slot("STORAGE"), other}) == 4
    assert medium_slot(["not", "a", "medium"]) == other
    c = count_add(count_add(0, gpu), cpu)
    assert count_sub(count_sub(c, gpu), cpu) == 0
    assert count_sub(0, cpu) == 0  # never below zero
    full = 0
    for _ in range(70_000):  # saturates in its own field, never carries into the next medium's
        full = count_add(full, gpu)
    assert count_sub(full, cpu) == full and count_add(full, cpu) != full


# -- host-tier size --------------------------------------------------------------------------------------------
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 128, "torch_dtype": "bfloat16"}


def test_kv_bytes_per_token_llama3_8b() -> None:
    assert kv_bytes_per_token(LLAMA3_8B) == 2 * 32 * 8 * 128 * 2 == 131_072
    no_head_dim = {k: v for k, v in LLAMA3_8B.items() if k != "head_dim"}
    assert kv_bytes_per_token(no_head_dim) == 131_072  # hidden_size / num_attention_heads
    assert kv_bytes_per_token(LLAMA3_8B, cache_dtype="fp8") == 65_536
    assert kv_bytes_per_token(LLAMA3_8B, cache_dtype="fp8_e5m2") == 65_536
    assert kv_bytes_per_token(LLAMA3_8B, model_dtype="float32") == 262_144
    assert kv_bytes_per_token({**LLAMA3_8B, "torch_dtype": "float32"}) == 131_072  # vLLM serves fp32 in 16 bits
    assert kv_bytes_per_token(LLAMA3_8B, tensor_parallel_size=8) == 131_072  # one KV head per rank
    assert kv_bytes_per_token(LLAMA3_8B, tensor_parallel_size=16) == 262_144  # heads replicated over 16 ranks
    mha = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    assert kv_bytes_per_token(mha) == 4 * 131_072
    assert kv_bytes_per_token({"model_type": "llava", "text_config": LLAMA3_8B}) == 131_072


@pytest.mark.parametrize(
    ("config", "kwargs", "needle"),
    [
        ({**LLAMA3_8B, "kv_lora_rank": 512}, {}, "MLA"),
        ({**LLAMA3_8B, "mamba_d_state": 16}, {}, "state-space"),
        ({"hidden_size": 4096}, {}, "lacks num_hidden_layers"),
        (LLAMA3_8B, {"cache_dtype": "int8_per_token_head"}, "int8_per_token_head"),
    ],
)
def test_kv_bytes_per_token_refuses_what_it_cannot_size(config: dict[str, Any], kwargs: dict[str, Any],
                                                        needle: str) -> None:
    with pytest.raises(HostTierUnknown, match=needle):
        kv_bytes_per_token(config, **kwargs)


def test_host_cache_blocks_worked_example() -> None:
    """docs: Llama-3-8B bf16, 512-token blocks of 64 MiB: 200 GiB hold 3,200 blocks (1.6M tokens)."""
    assert host_cache_blocks(200, 512, 131_072) == 3_200
    assert host_cache_blocks(200, 16, 131_072) == 102_400
    assert host_cache_blocks(0.5, 16, 10) == (1 << 29) // 4096  # 160-byte blocks take a whole page each
    assert kv_element_bytes() == 2 and kv_element_bytes("fp8_inc") == 1


def test_offload_label() -> None:
    assert offload_gib_from_label("None", "native") is None
    assert offload_gib_from_label(None, None) is None
    assert offload_gib_from_label("200.0", "native") == 200.0
    with pytest.raises(HostTierUnknown, match="lmcache"):
        offload_gib_from_label("200.0", "lmcache")
    with pytest.raises(HostTierUnknown, match="not a number"):
        offload_gib_from_label("lots", "native")


# -- capacity callback -------------------------------------------------------------------------------------------
def metrics(num_gpu_blocks: int = 1000, block_size: int = 512, offload: str = "200.0", cache_dtype: str = "auto",
            backend: str = "native") -> str:
    info = (f'vllm:cache_config_info{{block_size="{block_size}",cache_dtype="{cache_dtype}",engine="0",'
            f'kv_offloading_backend="{backend}",kv_offloading_size="{offload}",num_gpu_blocks="{num_gpu_blocks}"}} 1.0')
    return f"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n{info}\n"


def pool_with(tmp_path: Path, caps: dict[str, int], config: dict[str, Any] | None = LLAMA3_8B,
              **fields: Any) -> PoolReplicas:
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    pc = PoolConfig(name="primary", role="primary", served_names=["m"], endpoints=["http://a"],
                    model_path=str(tmp_path), **fields)
    return PoolReplicas(pc, LimitsConfig(), on_capacity=lambda r, n: caps.__setitem__(r, n))


def scrape(pool: PoolReplicas, text: str, now: float = 1.0) -> None:
    info: dict[str, str] = {}
    values = parse_vllm_metrics(text, info)
    pool.apply_scrape(pool.replicas["http://a"], values, now, info)


def test_cached_capacity_is_the_larger_tier() -> None:
    """Write-through: the host tier already holds most of the GPU's blocks, so the union is ~max, not the sum
    (the simulator's Replica.cached_capacity uses the same rule)."""
    assert cached_capacity(1000, 3200) == 3200
    assert cached_capacity(1000, 160) == 1000
    assert cached_capacity(1000, 0) == 1000


def test_capacity_from_gpu_and_derived_host_blocks(tmp_path: Path) -> None:
    caps: dict[str, int] = {}
    pool = pool_with(tmp_path, caps)
    scrape(pool, metrics())
    assert caps == {"http://a": 3200}  # 200 GiB of 64 MiB blocks outnumber the GPU's 1000
    assert pool.replicas["http://a"].cache_capacity_blocks == 1000  # the replica state keeps GPU blocks
    scrape(pool, metrics(cache_dtype="fp8"))  # half the bytes per block: twice the blocks
    assert caps == {"http://a": 6400}
    scrape(pool, metrics(offload="10.0"))  # 160 host blocks: the GPU tier is the larger
    assert caps == {"http://a": 1000}
    scrape(pool, metrics(offload="None", num_gpu_blocks=1100))  # offloading off
    assert caps == {"http://a": 1100}


def test_explicit_host_blocks_override(tmp_path: Path) -> None:
    caps: dict[str, int] = {}
    pool = pool_with(tmp_path, caps, config=None, cache_capacity_blocks=500, host_cache_blocks=700)
    assert caps == {"http://a": 700}  # known before any scrape
    scrape(pool, metrics())
    assert caps == {"http://a": 700}


def test_configured_gpu_blocks_plus_derived_host(tmp_path: Path) -> None:
    caps: dict[str, int] = {}
    pool = pool_with(tmp_path, caps, cache_capacity_blocks=500, tensor_parallel_size=2)
    assert caps == {"http://a": 500}
    scrape(pool, metrics(num_gpu_blocks=9999))  # the configured 500 GPU blocks win over the engine's
    assert caps == {"http://a": 3200} and pool.replicas["http://a"].cache_capacity_blocks == 500


def test_underivable_host_tier_logs_once_and_counts_gpu_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caps: dict[str, int] = {}
    pool = pool_with(tmp_path, caps, config=None)  # no config.json in the model folder
    with caplog.at_level(logging.WARNING, logger="llmfleet.router.replicas"):
        scrape(pool, metrics())
        scrape(pool, metrics(num_gpu_blocks=1200), now=2.0)
        scrape(pool, metrics(backend="lmcache"), now=3.0)
    assert caps == {"http://a": 1000}
    warnings = [r for r in caplog.records if "host tier" in r.getMessage()]
    assert len(warnings) == 1 and "config.json" in warnings[0].getMessage()


def test_spec_size_when_the_engine_reports_none(tmp_path: Path) -> None:
    caps: dict[str, int] = {}
    pool = pool_with(tmp_path, caps, kv_offload_gib=100)
    text = metrics().replace('kv_offloading_backend="native",kv_offloading_size="200.0",', "")
    scrape(pool, text)
    assert caps == {"http://a": 1600}


def test_index_is_bounded_by_the_host_tier_when_it_is_larger(tmp_path: Path) -> None:
    index = PrefixIndex()
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    pc = PoolConfig(name="primary", role="primary", served_names=["m"], endpoints=["http://a"],
                    model_path=str(tmp_path))
    pool = PoolReplicas(pc, LimitsConfig(), on_capacity=index.set_capacity)
    scrape(pool, metrics(num_gpu_blocks=10, offload="2.0"))  # 2 GiB of 64 MiB blocks = 32 host blocks
    index.insert("http://a", list(range(1, 501)))
    assert index.blocks_of("http://a") == 32


def test_bytes_per_token_from_the_serving_wrapper_needs_no_config_json(tmp_path: Path) -> None:
    # In a cluster the router pod has no model folder; the replica's wrapper reports the figure on /metrics
    caps: dict[str, int] = {}
    pool = pool_with(tmp_path, caps, config=None)
    wrapper = "# TYPE llmfleet:kv_cache_bytes_per_token gauge\nllmfleet:kv_cache_bytes_per_token 131072\n"
    values = parse_vllm_metrics(metrics() + wrapper)
    assert values["kv_bytes_per_token"] == 131072
    scrape(pool, metrics() + wrapper)
    assert caps == {"http://a": 3200}
    scrape(pool, metrics() + wrapper.replace("131072", "65536"), now=2.0)  # e.g. an fp8 cache on the replica
    assert caps == {"http://a": 6400}
