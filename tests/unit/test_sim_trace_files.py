"""Trace files as they are published: compressed (.gz, .bz2, .xz: the Azure 2025 multimodal trace ships as .csv.gz)
and read decompressed, their format told by the suffix before; a damaged archive is a one-line error naming the file;
the benchmarks' trace-directory scan picks them up under their plain names."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmfleet.sim.traces import is_trace_file, load_trace, trace_stem
from llmfleet.sim.workload import WorkloadError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import autoscale_setup  # noqa: E402

# The Azure 2025 multimodal trace's schema and time format (ISO 8601 with `T` and `Z`), an extra column (NumImages)
MULTIMODAL = ("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
              "2024-10-15T12:00:00.269Z,0,770,491\n2024-10-15T12:00:05.819Z,1,949,126\n"
              "2024-10-15T12:00:06.513Z,1,964,79\n")
BAILIAN = "".join(json.dumps(r) + "\n" for r in [
    {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]},
    {"chat_id": 2, "parent_chat_id": 1, "timestamp": 9.0, "input_length": 50, "output_length": 3,
     "hash_ids": [1, 2, 3, 4]},
])
WRITERS: dict[str, Callable[..., Any]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


@pytest.mark.parametrize("suffix", sorted(WRITERS))
def test_compressed_traces_read_like_the_plain_file(tmp_path: Path, suffix: str) -> None:
    plain = tmp_path / "AzureLMMInferenceTrace_multimodal.csv"
    plain.write_text(MULTIMODAL, encoding="utf-8")
    packed = tmp_path / f"packed_{suffix[1:]}" / f"{plain.name}{suffix}"
    packed.parent.mkdir()
    with WRITERS[suffix](packed, "wt", encoding="utf-8") as f:
        f.write(MULTIMODAL)
    a, b = load_trace(plain), load_trace(packed)
    assert b.name == a.name == "AzureLMMInferenceTrace_multimodal"
    assert [(r.arrival, r.prompt_len, r.output_len) for r in b.requests] == [
        (r.arrival, r.prompt_len, r.output_len) for r in a.requests]
    assert [round(r.arrival, 3) for r in a.requests] == [0.0, 5.55, 6.244]
    # a compressed JSONL is told by its first record, as a plain one
    jsonl = tmp_path / f"qwen_traceA_blksz_16.jsonl{suffix}"
    with WRITERS[suffix](jsonl, "wt", encoding="utf-8") as f:
        f.write(BAILIAN)
    w = load_trace(jsonl)
    # seconds (as milliseconds 8.5 s would be 0.0085), from the first request
    assert w.block_size == 16 and [r.arrival for r in w.requests] == [0.0, 8.5] and w.name == "qwen_traceA_blksz_16"


def test_damaged_or_mislabelled_archives_are_one_line_errors(tmp_path: Path) -> None:
    whole = gzip.compress(MULTIMODAL.encode())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(WorkloadError, match=r"cut.csv.gz: damaged compressed file"):
        load_trace(cut)
    for suffix in WRITERS:
        fake = tmp_path / f"fake.csv{suffix}"
        fake.write_text(MULTIMODAL, encoding="utf-8")  # not compressed at all
        with pytest.raises(WorkloadError, match=rf"fake.csv\{suffix}: "):
            load_trace(fake)


def test_a_trace_directory_scan_finds_compressed_traces_under_plain_names(tmp_path: Path) -> None:
    assert [is_trace_file(Path(n)) for n in ("a.csv.gz", "a.jsonl.xz", "a.jsonl", "README.md", "a.gz", "a.csv.zip")] \
        == [True, True, True, False, False, False]
    assert trace_stem(Path("x/AzureLLMInferenceTrace_code_1week.csv.bz2")) == "AzureLLMInferenceTrace_code_1week"
    packed = tmp_path / "azure_2025.csv.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write(MULTIMODAL)
    assert autoscale_setup.trace_names([packed]) == ["azure_2025"]
    assert len(autoscale_setup.workloads([packed], quick=False, spike_factor=None)["azure_2025"].requests) == 3


def _formats(tmp_path: Path, bad_tail: bool) -> dict[str, Path]:
    """One file per format: a request a second for 10 s, in time order, and (`bad_tail`) a malformed last record."""
    files = {
        "azure.csv": ("TIMESTAMP,ContextTokens,GeneratedTokens\n",
                      [f"2024-05-10 00:00:{t:02d}.000000+00:00,100,10" for t in range(10)], "2024-05-10 00:00:11,x,1"),
        "burst.csv": ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
                      [f"{t},ChatGPT,100,10,110,API log" for t in range(10)], "11,ChatGPT,x,1,1,API log"),
        "moon.jsonl": ("", [json.dumps({"timestamp": 1000 * t, "input_length": 100, "output_length": 10,
                                        "hash_ids": [t]}) for t in range(10)], "{not json"),
        "qwen.jsonl": ("", [json.dumps({"chat_id": t, "parent_chat_id": -1, "timestamp": t, "input_length": 100,
                                        "output_length": 10, "hash_ids": [t]}) for t in range(10)], "{not json"),
    }
    out = {}
    for name, (header, rows, bad) in files.items():
        out[name] = tmp_path / name
        out[name].write_text(header + "\n".join(rows + ([bad] if bad_tail else [])) + "\n", encoding="utf-8")
    return out


def test_a_cut_holds_only_the_window_in_every_format(tmp_path: Path) -> None:
    """`seconds` / `requests`: the requests within that many seconds of the first, or the first that many, in each
    format; a malformed record anywhere is still an error naming its line (the whole file is read)."""
    for name, p in _formats(tmp_path, bad_tail=False).items():
        assert [r.arrival for r in load_trace(p, seconds=3.5).requests] == pytest.approx([0, 1, 2, 3]), name
        assert [r.arrival for r in load_trace(p, requests=4).requests] == pytest.approx([0, 1, 2, 3]), name
        assert len(load_trace(p, seconds=5, requests=2).requests) == 2, name  # both: whichever is fewer
    for name, p in _formats(tmp_path, bad_tail=True).items():
        with pytest.raises(WorkloadError, match=rf"{name}:1?[12]:"):
            load_trace(p, seconds=3.5)
    for bad in ({"seconds": 0.0}, {"seconds": float("nan")}, {"requests": 0}):
        with pytest.raises(WorkloadError, match="to read must be"):
            load_trace(_formats(tmp_path, bad_tail=False)["azure.csv"], **bad)


def test_a_cut_of_a_file_out_of_order_is_exact(tmp_path: Path) -> None:
    """Out of time order, the cut is the one `Workload.head` makes on the whole trace: the earliest request may come
    last in the file, and equal times keep their order in the file."""
    p = tmp_path / "shuffled.jsonl"
    times = [4, 9, 1, 2, 3, 8, 5, 2, 0]
    p.write_text("".join(json.dumps({"timestamp": 1000 * t, "input_length": 64 + i, "output_length": 4}) + "\n"
                         for i, t in enumerate(times)), encoding="utf-8")
    whole = load_trace(p)
    cut = load_trace(p, seconds=3.0)
    # (the two requests at 2 s are spread over that second: spread_clock_ties)
    assert [r.prompt_len for r in cut.requests] == [r.prompt_len for r in whole.head(seconds=3.0).requests] == [
        72, 66, 67, 71, 68]
    assert [round(r.arrival) for r in cut.requests[:2]] == [0, 1] and cut.requests[-1].arrival == 3
    assert [r.arrival for r in cut.requests[2:4]] == [r.arrival for r in whole.requests[2:4]] == pytest.approx(
        [2.5, 2.5], abs=0.5)
    assert [r.prompt_len for r in load_trace(p, requests=4).requests] == [
        r.prompt_len for r in whole.head(4).requests] == [72, 66, 67, 71]
    assert [r.rid for r in cut.requests] == [0, 1, 2, 3, 4]


def test_cli_and_benchmark_hold_only_what_they_replay(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmfleet.cli.main import app

    files = _formats(tmp_path, bad_tail=False)
    res = CliRunner().invoke(app, ["sim", "run", "--trace", str(files["qwen.jsonl"]), "--max-requests", "3",
                                   "--replicas", "1", "--router", "round-robin", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "qwen: 3 requests" in res.output
    res = CliRunner().invoke(app, ["sim", "run", "--trace", str(files["azure.csv"]), "--trace-seconds", "2.5",
                                   "--replicas", "1", "--router", "round-robin", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "azure: 3 requests" in res.output
    for args, match in ((["--trace", str(files["azure.csv"]), "--trace-seconds", "0"], "--trace-seconds must be"),
                        (["--trace-seconds", "5"], "--trace-seconds cuts a trace: give --trace")):
        res = CliRunner().invoke(app, ["sim", "run", *args])
        assert res.exit_code == 2 and match in res.output, res.output
    loaded = autoscale_setup.workloads([files["azure.csv"]], quick=False, spike_factor=None, trace_seconds=4)
    assert len(loaded["azure"].requests) == 5


def test_a_cut_holds_the_window_even_when_the_file_runs_backwards() -> None:
    """Records the earliest has moved away from are dropped as reading goes on, so memory stays near the window's
    size in any file order, and the result is still exactly the window."""
    from llmfleet.sim.traces import PRUNE_MIN, _Cut
    from llmfleet.sim.workload import Request

    cut, held = _Cut(seconds=10.0, requests=None), 0
    for i in range(20 * PRUNE_MIN):  # one request a second, latest first
        cut.add(Request(0, float(20 * PRUNE_MIN - i), 16, 1))
        held = max(held, len(cut._kept))
    assert held <= 2 * PRUNE_MIN
    assert sorted(r.arrival for r in cut.kept()) == [float(t) for t in range(1, 12)]
