"""Simulator host KV tier (vLLM's native CPU offloading): hand-computed loads, LRU order, invariants, sizing."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec, SimConfig, simulate
from llmfleet.sim.traces import load_mooncake
from llmfleet.sim.workload import Request, Workload

HEAD300 = Path(__file__).parent / "sim_data" / "mooncake_head300.jsonl"
# step time = tokens / 1000 s: no overhead, no memory term, no attention term
UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)
BLOCK_BYTES = 131_072 * 4  # Llama-3-8B bf16 KV per token x 4-token blocks = 512 KiB
ONE_MS_LINK = {"hostLinkGBs": BLOCK_BYTES / 1e9 / 1e-3}  # a host link that loads one block per millisecond


def _pool(host_blocks: int) -> PoolSpec:
    return PoolSpec(replicas=1, kv_blocks=5, cost=UNIT, gpu_overrides=ONE_MS_LINK,
                    host_kv_gib=host_blocks * BLOCK_BYTES / 2**30)


def _trace() -> Workload:
    a = (1, 2, 3, 4)
    return Workload("evict-and-return", [
        Request(0, 0.0, 16, 1, a),  # 4 blocks; the GPU holds 5
        Request(1, 1.0, 16, 1, (5, 6, 7, 8)),  # evicts a's tail blocks 4, 3, 2 from the GPU (tails go first)
        Request(2, 2.0, 16, 1, a),  # GPU still has block 1; blocks 2, 3 come back from the host tier
    ], block_size=4)


def test_host_tier_sizing_from_the_model() -> None:
    # Llama-3-8B bf16 KV: 131,072 bytes/token; 512-token blocks are 64 MiB; 256 GiB hold 4,096 of them
    blocks, load_s = PoolSpec(host_kv_gib=256.0).host_tier(512)
    assert blocks == 4096
    assert load_s == pytest.approx(64 * 2**20 / 52.5e9)  # the measured H200 host link
    assert PoolSpec().host_tier(512) == (0, 0.0)


def test_blocks_evicted_from_the_gpu_are_loaded_back_from_host_memory() -> None:
    res = simulate(_trace(), SimConfig(pools=[_pool(host_blocks=8)], check_invariants=True))
    rec = {r["rid"]: r for r in res.records}
    # r2: GPU hit 1 block, host hit blocks 2 and 3 (the 4th block is recomputed: at least one token is),
    # so 12 hit tokens; TTFT = 4 computed tokens (4 ms) + 2 blocks loaded (2 ms)
    assert rec[2]["hitTokens"] == 12
    assert rec[2]["ttft"] == pytest.approx(0.006)
    assert res.replicas[0]["hostHitTokens"] == 8
    assert res.summary["hostHitRate"] == pytest.approx(8 / 48)
    assert res.summary["prefixHitRate"] == pytest.approx(12 / 48)


def test_without_a_host_tier_the_evicted_blocks_are_recomputed() -> None:
    res = simulate(_trace(), SimConfig(pools=[_pool(host_blocks=0)], check_invariants=True))
    rec = {r["rid"]: r for r in res.records}
    assert rec[2]["hitTokens"] == 4 and rec[2]["ttft"] == pytest.approx(0.012)
    assert res.summary["hostHitRate"] == 0.0


def test_host_lru_drops_the_least_recently_used_blocks() -> None:
    # 6 host blocks: r0's finish left its blocks in the order 4, 3, 2, 1 (prefix most recent), so r1's four
    # stores push out 4 and 3; r2 loads block 2 only and recomputes 8 tokens
    res = simulate(_trace(), SimConfig(pools=[_pool(host_blocks=6)], check_invariants=True))
    rec = {r["rid"]: r for r in res.records}
    assert rec[2]["hitTokens"] == 8 and res.replicas[0]["hostHitTokens"] == 4
    assert rec[2]["ttft"] == pytest.approx(0.009)


def test_finished_requests_refresh_their_blocks_prefix_last() -> None:
    from llmfleet.sim.replica import SimReplica

    rep = SimReplica(0, "primary", 100, 4, UNIT, host_blocks=5)
    rep._host_store([1, 2, 3, 4, 5])
    r = Request(0, 0.0, 12, 1, (2, 3, 4))
    r.registered = 3
    rep._host_touch(r)  # tails first: 4, 3, then 2 ends most recent
    assert list(rep.host) == [1, 5, 4, 3, 2]
    rep._host_store([6, 7])  # overflow drops the least recently used: 1 and 5
    assert list(rep.host) == [4, 3, 2, 6, 7]


def test_host_tier_keeps_block_accounting_under_preemption_and_only_adds_hits() -> None:
    w = load_mooncake(HEAD300).scaled(4)
    base = simulate(w, SimConfig(pools=[PoolSpec(replicas=2, kv_blocks=300, max_model_len=131072)], check_invariants=True),
                    router="llmfleet")
    host = simulate(w, SimConfig(pools=[PoolSpec(replicas=2, kv_blocks=300, host_kv_gib=64.0, max_model_len=131072)],
                                  check_invariants=True),
                    router="llmfleet")
    s = host.summary
    assert s["completed"] + s["rejected"] == 300 and s["pending"] == 0
    assert s["preemptions"] > 0 and s["hostHitRate"] > 0
    assert s["prefixHitRate"] > base.summary["prefixHitRate"]


def test_cli_host_tier_option(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from llmfleet.cli.main import app

    args = ["sim", "run", "--trace", str(HEAD300), "--max-requests", "80", "--replicas", "2", "--router", "llmfleet"]
    r = CliRunner().invoke(app, [*args, "--host-kv-gib", "256", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    pool = json.loads((tmp_path / "result.json").read_text())["results"][0]["config"]["pools"][0]
    assert pool["hostKvBlocks"] == 4096 and pool["host_kv_gib"] == 256.0
    r = CliRunner().invoke(app, [*args, "--host-kv-gib", "-1"])
    assert r.exit_code == 2 and "--host-kv-gib must be >= 0" in r.output
