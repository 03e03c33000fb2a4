"""A hash-block trace's block size is told from its records: a trace in Mooncake's schema cut into 64-token blocks is
read at 64 tokens (before, as 512-token blocks: every prompt cut to the first eighth of its ids, silently), the
published traces at their documented sizes, and a record's `session_id` becomes its session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.sim.engine import simulate
from llmfleet.sim.report import oracle_hit_rate
from llmfleet.sim.traces import BLOCK_SIZES, infer_block_size, load_bailian, load_mooncake, load_trace
from llmfleet.sim.types import PoolSpec, SimConfig
from llmfleet.sim.workload import BlockSizeError, Workload, WorkloadError

HEAD300 = Path(__file__).parent / "sim_data" / "mooncake_head300.jsonl"


def _recut(records: list[dict[str, Any]], block: int, extra: dict[str, Any] | None = None) -> str:
    """The same trace cut into `block`-token blocks (each 512-token id split into its 512 / block sub-blocks, as many
    as the prompt has blocks, the partial last one included)."""
    k = 512 // block
    out = []
    for r in records:
        ids = [h * k + j for h in r["hash_ids"] for j in range(k)][: -(-int(r["input_length"]) // block)]
        out.append(json.dumps({**r, "hash_ids": ids, **(extra or {})}))
    return "\n".join(out) + "\n"


def _records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in HEAD300.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("block", [16, 64, 128])
def test_a_mooncake_schema_trace_is_read_at_the_block_size_it_was_cut_with(tmp_path: Path, block: int) -> None:
    p = tmp_path / f"recut{block}.jsonl"
    p.write_text(_recut(_records(), block))
    original = load_mooncake(HEAD300)
    w = load_trace(p)
    assert original.block_size == 512 and w.block_size == block
    # the same prompts: each full 512-token block is now 512 / block keys, and the sharing is the same or finer
    assert sum(len(r.keys) for r in w.requests) >= (512 // block) * sum(len(r.keys) for r in original.requests)
    assert oracle_hit_rate(w) == pytest.approx(oracle_hit_rate(original), abs=0.02)


def test_read_at_the_documented_size_a_finer_trace_was_wrong(tmp_path: Path) -> None:
    """Requests of 2,048 tokens sharing their first 1,024 in 64-token blocks: half of every later prompt is cached.
    Read as 512-token blocks (what the loader assumed before), each prompt kept only its first 4 ids, all inside the
    shared part, so every later prompt looked cached but for the last block (one token is always computed): 0.675."""
    shared = list(range(16))
    recs = [{"timestamp": 1000 * i, "input_length": 2048, "output_length": 8,
             "hash_ids": shared + [100 * (i + 1) + j for j in range(16)]} for i in range(10)]
    p = tmp_path / "fine.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    w = load_trace(p)
    assert w.block_size == 64 and oracle_hit_rate(w) == pytest.approx(0.5 * 9 / 10, abs=0.01)
    assert oracle_hit_rate(load_mooncake(p, block_size=512)) == pytest.approx(0.75 * 9 / 10)


def test_the_published_sizes_are_kept_and_undecidable_records_fall_back_to_them(tmp_path: Path) -> None:
    assert infer_block_size([(6758, 14), (2290, 5), (7322, 15)], 512) == 512
    assert infer_block_size([(40, 3), (70, 5), (33, 3)], 16) == 16
    assert infer_block_size([(300, 1), (20, 1)], 512) == 512  # one id per prompt tells nothing
    assert infer_block_size([], 16) == 16
    # ids that are not the prompt's blocks at any size (a third do not fit the best one): the documented size
    assert infer_block_size([(1000, 2), (1000, 7), (1000, 40)], 512) == 512
    # equal evidence for two sizes: the documented one if it is among them, else the smaller
    assert infer_block_size([(1000, 2)], 512) == 512 and infer_block_size([(1000, 2)], 16) == 512
    assert set(BLOCK_SIZES) >= {16, 64, 512}
    # an explicit size is used as given
    p = tmp_path / "recut64.jsonl"
    p.write_text(_recut(_records(), 64))
    assert load_mooncake(p, block_size=32).block_size == 32
    bailian = tmp_path / "bailian.jsonl"
    bailian.write_text("".join(json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": i, "input_length": 100,
                                           "output_length": 5, "hash_ids": [1, 2, 3, 4, 5, 6, 7]}) + "\n"
                               for i in range(3)))
    assert load_bailian(bailian).block_size == 16 and load_trace(bailian).block_size == 16


def test_session_ids_become_sessions_and_bad_ones_name_their_line(tmp_path: Path) -> None:
    p = tmp_path / "sessions.jsonl"
    recs = _records()[:4]
    p.write_text("".join(json.dumps({**r, "session_id": s}) + "\n" for r, s in zip(recs, ["a", "a", 7, None],
                                                                                      strict=True)))
    w = load_trace(p)
    assert [r.session for r in w.requests] == ["a", "a", "7", None]
    p.write_text(json.dumps({**recs[0], "session_id": [1]}) + "\n")
    with pytest.raises(WorkloadError, match=r"sessions.jsonl:1: session_id must be"):
        load_trace(p)
    p.write_text(json.dumps({**recs[0], "hash_ids": [1, True]}) + "\n")
    with pytest.raises(WorkloadError, match=r"sessions.jsonl:1: hash_ids must be a list of integers"):
        load_trace(p)


def test_the_cli_names_the_block_size_it_simulates(tmp_path: Path) -> None:
    p = tmp_path / "recut64.jsonl"
    p.write_text(_recut(_records()[:60], 64))
    res = CliRunner().invoke(app, ["sim", "run", "--trace", str(p), "--replicas", "2", "--router", "least-request"])
    assert res.exit_code == 0, res.output
    assert "64-token blocks" in res.output


def _sharing(w: Workload) -> list[tuple[int, ...]]:
    """Each request's keys as the order in which the workload first used them: equal where the keys are."""
    first: dict[int, int] = {}
    return [tuple(first.setdefault(k, len(first)) for k in r.keys) for r in w.requests]


CFG = SimConfig(pools=[PoolSpec(replicas=2)])


def test_merged_blocks_are_the_coarser_trace_exactly(tmp_path: Path) -> None:
    """A trace cut into 16-token blocks, merged into 512-token ones (`Workload.reblocked`, `--kv-block-size`), is the
    512-token trace: keys equal exactly where that trace's are (the values differ: other ids were chained), so the
    same simulation; merged into 64-token ones, its hits lie in between."""
    p = tmp_path / "fine16.jsonl"
    p.write_text(_recut(_records(), 16))
    fine, coarse = load_trace(p), load_mooncake(HEAD300)
    merged = fine.reblocked(512)
    assert merged.block_size == 512 and _sharing(merged) == _sharing(coarse)
    assert simulate(merged, CFG).summary == simulate(coarse.fresh(), CFG).summary
    assert fine.reblocked(16) is fine
    mid = fine.reblocked(64)
    assert mid.block_size == 64 and all(len(r.keys) == r.prompt_len // 64 for r in mid.requests)
    assert oracle_hit_rate(coarse) <= oracle_hit_rate(mid) <= oracle_hit_rate(fine)
    for bad in (24, 8, 0, -16, True):
        with pytest.raises(WorkloadError, match="KV block size"):
            fine.reblocked(bad)


def test_the_cli_merges_blocks_or_says_why_not(tmp_path: Path) -> None:
    p = tmp_path / "fine16.jsonl"
    p.write_text(_recut(_records()[:60], 16))
    ok = CliRunner().invoke(app, ["sim", "run", "--trace", str(p), "--replicas", "2", "--router", "least-request",
                                  "--kv-block-size", "128"])
    assert ok.exit_code == 0, ok.output
    assert "128-token blocks" in ok.output
    bad = CliRunner().invoke(app, ["sim", "run", "--trace", str(p), "--kv-block-size", "24"])
    assert bad.exit_code == 2 and "not a multiple of the workload's 16-token blocks" in bad.output
    assert "Traceback" not in bad.output


def test_merging_while_reading_is_merging_after_and_holds_only_the_merged_keys(tmp_path: Path) -> None:
    p = tmp_path / "fine16.jsonl"
    p.write_text(_recut(_records(), 16))
    after = load_trace(p).reblocked(128)
    during = load_trace(p, kv_block_size=128)
    assert during.block_size == 128 and [r.keys for r in during.requests] == [r.keys for r in after.requests]
    assert load_trace(p, kv_block_size=8).block_size == 16  # a finer size leaves a trace as it is (merge_blocks)
    with pytest.raises(BlockSizeError, match="fine16: KV block size 24 is not a multiple of the workload's 16-token"):
        load_trace(p, kv_block_size=24)
    with pytest.raises(WorkloadError, match="KV block size must be >= 1"):
        load_trace(p, kv_block_size=0)
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,100,5\n2023-11-16 18:00:01.0,90,5\n")
    assert load_trace(csv, kv_block_size=64).block_size == 64 and load_trace(csv).block_size == 16
