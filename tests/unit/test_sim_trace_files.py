"""Trace files as they are published: compressed (.gz, .bz2, .xz: the Azure 2025 multimodal trace ships as .csv.gz)
and read decompressed, their format told by the suffix before; a damaged archive is a one-line error naming the file;
the benchmarks' trace-directory scan picks them up under their plain names."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import sys
from pathlib import Path

import pytest

from llmfleet.sim.workload import WorkloadError, is_trace_file, load_trace, trace_stem

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
WRITERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


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
    assert w.block_size == 16 and [r.arrival for r in w.requests] == [0.5, 9.0] and w.name == "qwen_traceA_blksz_16"


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
