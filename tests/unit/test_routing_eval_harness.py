"""benchmarks/routing_eval.py's trace options: other traces on chosen fleet sizes, alone, and their tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import routing_eval  # noqa: E402

MOONCAKE = ROOT / "tests/unit/sim_data/mooncake_head300.jsonl"
SCRIPT = ROOT / "benchmarks/routing_eval.py"


def _azure_csv(path: Path, n: int) -> Path:
    rows = [f"2023-11-16 18:00:{i // 4:02d}.{(i % 4) * 25:02d}00000,{512 + 37 * i},{8 + i % 5}" for i in range(n)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def test_a_trace_runs_on_each_fleet_size_and_alone_when_asked() -> None:
    alone = routing_eval.scenarios(True, [MOONCAKE], (2, 4), only_traces=True)
    assert [(reps, host) for _, reps, _, host in alone] == [(2, 0.0), (4, 0.0)]
    assert len({name for name, *_ in alone}) == 1
    with_standard = routing_eval.scenarios(True, [MOONCAKE])
    assert len(with_standard) == 5 + 1 and with_standard[-1][1] == 8  # the standard five, then the trace on 8


def test_a_long_trace_is_cut_to_its_first_seconds() -> None:
    whole = routing_eval.scenarios(False, [MOONCAKE], (2,), only_traces=True)[0][2]
    head = routing_eval.scenarios(False, [MOONCAKE], (2,), only_traces=True, trace_seconds=20.0)[0][2]
    t0 = whole.requests[0].arrival
    assert 0 < len(head.requests) < len(whole.requests)
    assert [r.arrival for r in head.requests] == [r.arrival for r in whole.requests if r.arrival - t0 <= 20.0]


def test_kv_block_size_merges_only_the_finer_traces(tmp_path: Path) -> None:
    """--kv-block-size 128: a trace of 64-token blocks is merged; Mooncake's 512-token one is left as it is."""
    fine = tmp_path / "fine64.jsonl"
    recs = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    fine.write_text("".join(json.dumps({**r, "hash_ids": [h * 8 + j for h in r["hash_ids"] for j in range(8)][
        : -(-r["input_length"] // 64)]}) + "\n" for r in recs))
    got = {name: w for name, _, w, _ in routing_eval.scenarios(False, [fine, MOONCAKE], (2,), only_traces=True,
                                                               kv_block_size=128)}
    assert got["fine64"].block_size == 128 and got["mooncake_head300"].block_size == 512
    assert all(len(r.keys) == r.prompt_len // 128 for r in got["fine64"].requests)


def test_bad_trace_options_are_one_line_errors() -> None:
    for argv, msg in ((["--only-traces"], "--only-traces needs at least one --trace"),
                      (["--trace", str(MOONCAKE), "--trace-seconds", "0"], "--trace-seconds 0: it must be > 0"),
                      (["--trace", str(MOONCAKE), "--trace-replicas", "0"], "fleet sizes must be >= 1"),
                      (["--trace", str(MOONCAKE), "--kv-block-size", "0"], "--kv-block-size 0: it must be >= 1"),
                      (["--trace", str(ROOT / "tests/unit/sim_data/mooncake_head300.jsonl"), "--kv-block-size", "768"],
                       "KV block size 768 is not a multiple of the workload's 512-token blocks")):
        r = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr


def test_a_trace_without_prefix_information_runs_and_renders(tmp_path: Path) -> None:
    """An Azure CSV shares nothing cacheable: every hit rate and the oracle are 0, and the tables still render.
    With its own --out (outside benchmarks/results) and no --img, the plots go beside the results file, not into
    docs/img, where a trace named like a documented scenario would replace its plots."""
    trace, out = _azure_csv(tmp_path / "azure-tiny.csv", 40), tmp_path / "out.json"
    subprocess.run([sys.executable, str(SCRIPT), "--trace", str(trace), "--trace-replicas", "1", "2", "--only-traces",
                    "--out", str(out)], check=True, capture_output=True, timeout=600)
    plots = sorted(p.name for p in tmp_path.glob("routing_eval_azure-tiny_*.png"))
    assert any(n.startswith("routing_eval_azure-tiny_1_") for n in plots)
    assert any(n.startswith("routing_eval_azure-tiny_2_") for n in plots)
    assert not list((ROOT / "docs/img").glob("routing_eval_azure-tiny_*"))
    doc = json.loads(out.read_text())
    assert [(s["scenario"], s["replicas"]) for s in doc["scenarios"]] == [("azure-tiny", 1), ("azure-tiny", 2)]
    assert all(s["oracleHitRate"] == 0 for s in doc["scenarios"])
    md = routing_eval.render_markdown(str(out))
    assert "**azure-tiny, 1 replicas**" in md and "**azure-tiny, 2 replicas**" in md
