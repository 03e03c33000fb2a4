"""Planner: the host-memory KV tier (capacity, load vs recompute) and its CLI option."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.plan.hardware import get_gpu
from llmfleet.plan.models import get_model, matmul_params
from llmfleet.plan.roofline import host_kv_tier


def test_llama3_8b_host_tier_by_hand() -> None:
    m, g = get_model("llama-3-8b"), get_gpu("H200")
    t = host_kv_tier(m, g, 320.0, block_size=512)
    # 2·32·8·128·2 = 131,072 bytes/token; a 512-token block is 64 MiB; 320 GiB hold 5,120 of them
    assert t.block_bytes == 64 * 2**20 and t.blocks == 5120 and t.tokens == 5120 * 512
    assert t.load_s_per_token == pytest.approx(131_072 / 52.5e9)
    assert t.recompute_s_per_token == pytest.approx(2 * matmul_params(m) / 989e12)
    assert t.recompute_over_load == pytest.approx(t.recompute_s_per_token / t.load_s_per_token)
    assert 5 < t.recompute_over_load < 7  # ~15 us of dense prefill work vs 2.5 us over PCIe Gen5
    # fp8 KV halves the bytes: twice the tokens, half the load time
    f8 = host_kv_tier(m, g, 320.0, block_size=512, kv_dtype="fp8")
    assert f8.blocks == 2 * t.blocks and f8.load_s_per_token == pytest.approx(t.load_s_per_token / 2)
    with pytest.raises(ValueError, match="> 0 GiB"):
        host_kv_tier(m, g, 0.0)


def test_plan_cli_reports_the_host_tier(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(app, ["plan", "--host-kv-gib", "256", "--block-size", "512", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "host KV tier 256 GiB: 2,097,152 tokens" in r.output
    assert json.loads(out.read_text())["kvCache"]["hostTier"]["blocks"] == 4096
    r = CliRunner().invoke(app, ["plan", "--host-kv-gib", "-5"])
    assert r.exit_code == 2 and "host KV tier size must be > 0 GiB" in r.output
    r = CliRunner().invoke(app, ["plan", "--json", str(out)])
    assert json.loads(out.read_text())["kvCache"]["hostTier"] is None
