"""What real trace files hold that the loaders used to refuse. Records of 0 output tokens (requests that failed or were
cancelled in the traced service) or a 0-token prompt, in every format the simulator reads: not replayed, counted
within the replayed window and named by the CLI and the autoscaling benchmark, while a negative, fractional or
non-numeric length is still an error (one of them used to make a whole Azure or Mooncake trace unreadable). A
byte-order mark and CRLF line ends, as spreadsheet tools write them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.sim.traces import load_azure, load_bailian, load_mooncake, load_trace
from llmfleet.sim.workload import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_ROWS = [  # 2024's timestamp format; seconds 0, 1, 2, 3, 10
    "2024-05-10 00:00:00.000000+00:00,2162,5",
    "2024-05-10 00:00:01.000000+00:00,2399,0",
    "2024-05-10 00:00:02+00:00,76,15",
    "2024-05-10 00:00:03.000000+00:00,2376,0",
    "2024-05-10 00:00:10.000000+00:00,7670,8",
]


def _azure(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "AzureLLMInferenceTrace_code_1week.csv"
    p.write_text("\n".join([AZURE_HEADER, *rows]) + "\n", encoding="utf-8")
    return p


def test_azure_zero_output_rows_are_counted_not_replayed(tmp_path: Path) -> None:
    w = load_azure(_azure(tmp_path, AZURE_ROWS))
    assert [(r.arrival, r.prompt_len, r.output_len) for r in w.requests] == [(0.0, 2162, 5), (2.0, 76, 15),
                                                                             (10.0, 7670, 8)]
    assert w.skipped_empty == 2
    assert w.scaled(2.0).skipped_empty == 2  # the count survives the workload's copies


@pytest.mark.parametrize(("seconds", "requests", "skipped"), [
    (2.5, None, 1),   # the second zero row (at 3 s) lies after the window
    (None, 2, 1),     # the two earliest replayed requests end at 2 s
    (None, 1, 0),
    (20.0, None, 2),
])
def test_the_count_covers_the_replayed_window_only(tmp_path: Path, seconds: float | None, requests: int | None,
                                                   skipped: int) -> None:
    w = load_trace(_azure(tmp_path, AZURE_ROWS), seconds=seconds, requests=requests)
    assert w.skipped_empty == skipped
    # a cut of the whole workload (`autoscale_eval.py --quick`, `sim run --max-requests` on a synthetic one) counts
    # what the loader's own cut does, not the whole trace's records
    assert load_trace(_azure(tmp_path, AZURE_ROWS)).head(requests, seconds).skipped_empty == skipped


def test_skipped_records_keep_their_arrival_on_the_workload_clock(tmp_path: Path) -> None:
    w = load_azure(_azure(tmp_path, AZURE_ROWS))
    assert w.skipped_at == (1.0, 3.0)
    assert w.scaled(2.0).skipped_at == (0.5, 1.5)  # twice as dense: the skipped records too
    assert w.scaled(2.0).head(seconds=1.25).skipped_empty == 1
    assert w.fresh().skipped_at == w.skipped_at and w.reblocked(w.block_size * 2).skipped_at == w.skipped_at


def test_a_zero_prompt_is_skipped_too_and_a_bad_length_is_still_an_error(tmp_path: Path) -> None:
    w = load_azure(_azure(tmp_path, [*AZURE_ROWS, "2024-05-10 00:00:11+00:00,0,40", "2024-05-10 00:00:12+00:00,0,0"]))
    assert len(w.requests) == 3 and w.skipped_empty == 4
    with pytest.raises(WorkloadError, match=r"_1week.csv:3: prompt length must be a whole number >= 0"):
        load_azure(_azure(tmp_path, [AZURE_ROWS[0], "2024-05-10 00:00:01+00:00,-3,0"]))
    with pytest.raises(WorkloadError, match=r"_1week.csv:3: bad row"):
        load_azure(_azure(tmp_path, [AZURE_ROWS[0], "2024-05-10 00:00:01+00:00,n/a,0"]))
    with pytest.raises(WorkloadError, match=r"_1week.csv:3: output length must be a whole number >= 0"):
        load_azure(_azure(tmp_path, [AZURE_ROWS[0], "2024-05-10 00:00:01+00:00,10,-1"]))
    with pytest.raises(WorkloadError,
                       match=r"no requests \(2 with a 0-token prompt or output in the trace, not replayed\)"):
        load_azure(_azure(tmp_path, [AZURE_ROWS[1], AZURE_ROWS[3]]))


def _jsonl(p: Path, records: list[dict[str, object]]) -> Path:
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return p


def test_mooncake_zero_output_records_are_counted_not_replayed(tmp_path: Path) -> None:
    recs = [{"timestamp": 1000 * i, "input_length": 600, "output_length": 0 if i == 1 else 7, "hash_ids": [1, i]}
            for i in range(4)]
    w = load_mooncake(_jsonl(tmp_path / "m.jsonl", recs))
    assert [(r.arrival, r.output_len) for r in w.requests] == [(0.0, 7), (2.0, 7), (3.0, 7)]
    assert w.skipped_empty == 1
    bad = [*recs[:1], {"timestamp": 5, "input_length": -600, "output_length": 0, "hash_ids": []}]
    with pytest.raises(WorkloadError, match=r"m.jsonl:2: prompt length"):
        load_mooncake(_jsonl(tmp_path / "m.jsonl", bad))


def test_a_skipped_bailian_turn_still_links_its_conversation(tmp_path: Path) -> None:
    """Turn 2 of chat 7's conversation produced nothing; turn 3 (parent 9) is still in chat 7's conversation."""
    recs = [
        {"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40, "output_length": 12,
         "hash_ids": [1, 2, 3]},
        {"chat_id": 9, "parent_chat_id": 7, "timestamp": 30.0, "input_length": 60, "output_length": 0,
         "hash_ids": [1, 2, 3, 4]},
        {"chat_id": 11, "parent_chat_id": 9, "timestamp": 60.0, "input_length": 70, "output_length": 5,
         "hash_ids": [1, 2, 3, 4, 5]},
    ]
    w = load_bailian(_jsonl(tmp_path / "q.jsonl", recs))
    assert [r.session for r in w.requests] == ["chat-7", "chat-7"]
    assert w.skipped_empty == 1


def test_the_cli_and_the_autoscaling_benchmark_say_how_many_were_skipped(tmp_path: Path) -> None:
    p = _azure(tmp_path, AZURE_ROWS)
    res = CliRunner().invoke(app, ["sim", "run", "--trace", str(p), "--replicas", "1", "--router", "round-robin",
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "3 requests (2 with a 0-token prompt or output in the trace, not replayed)" in " ".join(res.output.split())
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autoscale_eval.py"), "--trace", str(p),
                        "--workload", p.stem, "--seeds", "1", "--out", str(tmp_path / "a.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (f"{p.stem}: 3 requests (2 with a 0-token prompt or output in the trace, not replayed) over 10 s"
            in r.stderr)
    # then a line per finished step (a long trace takes minutes per step)
    assert f"{p.stem}: static-at-peak fleet of 1, 100.00%" in r.stderr and f"{p.stem}: slo 100.00%" in r.stderr


def test_empty_records_do_not_sway_the_block_size(tmp_path: Path) -> None:
    """A trace cut into 64-token blocks whose every third record produced no output: the block size is still told
    from the records that are replayed (an empty record's prompt is not read, so its ids fit no block size)."""
    recs = [{"timestamp": 1000 * i, "input_length": 2048, "output_length": 0 if i % 3 == 0 else 8,
             "hash_ids": list(range(32 * i, 32 * i + 32))} for i in range(30)]
    w = load_trace(_jsonl(tmp_path / "fine64.jsonl", recs))
    assert w.block_size == 64 and len(w.requests) == 20 and w.skipped_empty == 10


def test_a_byte_order_mark_and_crlf_lines_read_like_plain_utf8(tmp_path: Path) -> None:
    """Spreadsheet tools and pandas' utf-8-sig write a byte-order mark (and Windows tools CRLF line ends): read as
    text it renamed a CSV's first column ("missing columns TIMESTAMP") and made a JSONL's first line invalid."""
    plain = _azure(tmp_path, AZURE_ROWS)
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    assert [(r.arrival, r.prompt_len) for r in load_trace(marked).requests] == [
        (r.arrival, r.prompt_len) for r in load_trace(plain).requests]
    burst = tmp_path / "BurstGPT_1.csv"  # told from Azure by its header, which the mark would have hidden
    burst.write_bytes(b"\xef\xbb\xbfTimestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n"
                      b"5,GPT-4,1013,10,1023,API log\r\n")
    assert load_trace(burst).requests[0].prompt_len == 1013
    recs = [{"timestamp": 1000 * i, "input_length": 600, "output_length": 7, "hash_ids": [1, i]} for i in range(3)]
    jsonl = _jsonl(tmp_path / "m.jsonl", recs)
    jsonl.write_bytes(b"\xef\xbb\xbf" + jsonl.read_bytes().replace(b"\n", b"\r\n"))
    assert len(load_trace(jsonl).requests) == 3
