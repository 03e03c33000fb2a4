"""BurstGPT CSV traces in the simulator: read by `load_burstgpt` and by `load_trace`'s header sniffing, failed
requests (0 response tokens) counted and not replayed, bad rows refused with their line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.sim.traces import load_burstgpt, load_trace
from llmfleet.sim.workload import WorkloadError

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
ROWS = [  # as the release writes them: seconds from the trace's start, failures with 0 response tokens
    "12,ChatGPT,472,18,490,Conversation log",
    "5,GPT-4,1013,0,1013,Conversation log",
    "7.5,ChatGPT,95,250,345,API log",
    "20,GPT-4,2000,31,2031,API log",
]


def _csv(tmp_path: Path, rows: list[str], header: str = HEADER, name: str = "BurstGPT_1.csv") -> Path:
    p = tmp_path / name
    p.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return p


def test_burstgpt_rows_become_requests_and_failures_are_counted(tmp_path: Path) -> None:
    w = load_burstgpt(_csv(tmp_path, ROWS))
    assert w.skipped_empty == 1
    # sorted by arrival, from the first replayed request on, numbered in that order
    assert [(r.rid, r.arrival, r.prompt_len, r.output_len) for r in w.requests] == [
        (0, 0.0, 95, 250), (1, 4.5, 472, 18), (2, 12.5, 2000, 31)]
    assert all(r.keys == () for r in w.requests)  # no content: nothing shared
    # the count survives the workload's copies
    assert w.scaled(2.0).skipped_empty == 1 and w.head(1).skipped_empty == 1


def test_load_trace_tells_burstgpt_from_azure_by_the_header(tmp_path: Path) -> None:
    assert load_trace(_csv(tmp_path, ROWS)).skipped_empty == 1
    assert len(load_trace(_csv(tmp_path, ROWS), "burstgpt").requests) == 3
    azure = _csv(tmp_path, ["2023-11-16 18:17:04.0000000,100,10"], header="TIMESTAMP,ContextTokens,GeneratedTokens",
                 name="azure.csv")
    assert len(load_trace(azure).requests) == 1
    with pytest.raises(WorkloadError, match="missing columns"):  # neither: Azure's loader names what is missing
        load_trace(_csv(tmp_path, ["1,2"], header="a,b", name="other.csv"))
    with pytest.raises(WorkloadError, match="unknown trace format 'splitwise'.*burstgpt"):
        load_trace(_csv(tmp_path, ROWS), "splitwise")


@pytest.mark.parametrize(("row", "match"), [
    ("x,ChatGPT,10,5,15,API log", "BurstGPT_1.csv:3: bad row"),  # timestamp not a number
    ("-1,ChatGPT,10,5,15,API log", "BurstGPT_1.csv:3: timestamp must be a finite number >= 0"),
    ("3,ChatGPT,-4,5,1,API log", "BurstGPT_1.csv:3: prompt length must be a whole number >= 0"),
    ("3,ChatGPT,x,0,0,API log", "BurstGPT_1.csv:3: bad row"),  # a failure's prompt is still read
    ("3,ChatGPT,10,-2,8,API log", "BurstGPT_1.csv:3: output length must be a whole number >= 0"),
    ("3,ChatGPT,10", "BurstGPT_1.csv:3: output length must be a number"),  # short row
])
def test_bad_burstgpt_rows_name_their_line(tmp_path: Path, row: str, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        load_burstgpt(_csv(tmp_path, [ROWS[0], row]))


def test_a_trace_of_only_failures_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError,
                       match=r"no requests \(1 with a 0-token prompt or output in the trace, not replayed\)"):
        load_burstgpt(_csv(tmp_path, [ROWS[1]]))


def test_cli_replays_burstgpt_and_says_what_it_skipped(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["sim", "run", "--trace", str(_csv(tmp_path, ROWS)), "--replicas", "1",
                                   "--router", "round-robin", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "3 requests (1 with a 0-token prompt or output in the trace, not replayed)" in " ".join(res.output.split())


_row = st.lists(st.sampled_from(["0", "1", "7", "2.5", "-3", "x", "", "1e309", "nan"]), min_size=3, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row.map(",".join), max_size=5), raw=st.binary(max_size=12))
def test_fuzz_burstgpt_loader(tmp_path: Path, rows: list[str], raw: bytes) -> None:
    p = tmp_path / "b.csv"
    p.write_bytes(("\n".join([HEADER, *rows])).encode() + raw)
    try:
        w = load_trace(p)
    except WorkloadError:
        return
    assert w.requests and all(r.prompt_len >= 1 and r.output_len >= 1 and r.arrival >= 0 for r in w.requests)
    assert [r.arrival for r in w.requests] == sorted(r.arrival for r in w.requests)
