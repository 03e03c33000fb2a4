"""Qwen-Bailian JSONL traces (alibaba-edu/qwen-bailian-usagetraces-anon) in the simulator: timestamps in seconds and
16-token hash blocks (read as a Mooncake trace they would be 1,000x compressed and their blocks 32x too long),
conversations as sessions, `load_trace` telling them from Mooncake's by the first record, bad records refused with
their line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import app
from llmfleet.sim.cli import FORMAT_HELP
from llmfleet.sim.report import oracle_hit_rate
from llmfleet.sim.traces import TRACE_FORMATS, load_bailian, load_mooncake, load_trace
from llmfleet.sim.workload import WorkloadError

# As the release writes them: a conversation (chat 7, then 9 whose prompt extends 7's and 7's answer), a
# conversation whose first turn the file does not hold (12's parent 3), and an unrelated request.
RECORDS = [
    {"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40, "output_length": 12, "type": "text",
     "turn": 1, "hash_ids": [1, 2, 3]},
    {"chat_id": 5, "parent_chat_id": -1, "timestamp": 1.5, "input_length": 33, "output_length": 4, "type": "search",
     "turn": 1, "hash_ids": [1, 10, 11]},
    {"chat_id": 9, "parent_chat_id": 7, "timestamp": 61.114, "input_length": 70, "output_length": 30, "type": "text",
     "turn": 2, "hash_ids": [1, 2, 3, 4, 5]},
    {"chat_id": 12, "parent_chat_id": 3, "timestamp": 62.0, "input_length": 16, "output_length": 1, "type": "image",
     "turn": 4, "hash_ids": [20]},
]


def _jsonl(tmp_path: Path, records: list[dict[str, object]], name: str = "qwen_traceA_blksz_16.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return p


def test_bailian_records_keep_seconds_16_token_blocks_and_conversations(tmp_path: Path) -> None:
    w = load_bailian(_jsonl(tmp_path, RECORDS))
    assert w.block_size == 16
    assert [(r.arrival, r.prompt_len, r.output_len) for r in w.requests] == [
        (0.0, 40, 12), (1.5, 33, 4), (61.114, 70, 30), (62.0, 16, 1)]
    first, other, second, orphan = w.requests
    # full 16-token blocks only: 40 tokens are 2 blocks, 70 are 4; the second turn extends the first's prefix
    assert len(first.keys) == 2 and len(second.keys) == 4 and second.keys[:2] == first.keys
    # one shared first block, then different content: the chains part there
    assert other.keys[0] == first.keys[0] and other.keys[1] != first.keys[1]
    assert orphan.keys and orphan.keys[0] not in first.keys
    # a conversation is a session; a turn whose parent the file lacks starts its own under that parent's id
    assert (first.session, second.session, other.session, orphan.session) == ("chat-7", "chat-7", "chat-5", "chat-3")
    # reuse in tokens: the other request finds the first's first block, the second turn its two (of 159 prompt tokens)
    assert oracle_hit_rate(w) == pytest.approx((16 + 32) / 159)


def test_load_trace_tells_bailian_from_mooncake_by_the_first_record(tmp_path: Path) -> None:
    bailian = _jsonl(tmp_path, RECORDS)
    # blank lines before the first record do not hide it
    bailian.write_text("\n" + bailian.read_text(encoding="utf-8"), encoding="utf-8")
    w = load_trace(bailian)
    assert w.block_size == 16 and w.requests[2].arrival == pytest.approx(61.114)
    mooncake = _jsonl(tmp_path, [{"timestamp": t, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]}
                                 for t in (1000, 4052)], name="mooncake.jsonl")
    m = load_trace(mooncake)
    assert m.block_size == 512 and m.requests[1].arrival == pytest.approx(3.052) and len(m.requests[0].keys) == 2
    # the format named explicitly wins over the sniffing, either way
    assert load_trace(bailian, "mooncake").requests[2].arrival == pytest.approx(0.061114)
    assert load_trace(bailian, "bailian").block_size == 16
    with pytest.raises(WorkloadError, match=r"\.jsonl:1: not a Qwen-Bailian record \(no 'chat_id'\)"):
        load_trace(mooncake, "bailian")
    # what the first line is not JSON goes to the Mooncake loader, which names it
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n", encoding="utf-8")
    with pytest.raises(WorkloadError, match=r"junk.jsonl:1: not a Mooncake record"):
        load_trace(junk)


def test_a_bailian_trace_reads_like_the_same_trace_in_mooncake_units(tmp_path: Path) -> None:
    """The same requests written both ways (ms and 512-token blocks, seconds and 16-token blocks: each Mooncake
    block as 32 Bailian blocks) arrive at the same times and share the same tokens."""
    moon, qwen = [], []
    for i, (ts_ms, prompt, ids) in enumerate([(0, 1100, [0, 1, 2]), (2500, 1600, [0, 1, 3, 4]),
                                              (4000, 600, [0, 5]), (4000, 1030, [0, 1, 6])]):
        moon.append({"timestamp": ts_ms, "input_length": prompt, "output_length": 10, "hash_ids": ids})
        qwen.append({"chat_id": i, "parent_chat_id": -1, "timestamp": ts_ms / 1000, "input_length": prompt,
                     "output_length": 10, "hash_ids": [32 * h + j for h in ids for j in range(32)]})
    m = load_mooncake(_jsonl(tmp_path, moon, "m.jsonl"))
    q = load_trace(_jsonl(tmp_path, qwen, "q.jsonl"))
    assert [r.arrival for r in q.requests] == [r.arrival for r in m.requests]
    assert [(r.prompt_len, r.output_len) for r in q.requests] == [(r.prompt_len, r.output_len) for r in m.requests]
    # 1,024 + 512 + 1,024 of the 4,330 prompt tokens were computed before, in both units
    assert oracle_hit_rate(q) == oracle_hit_rate(m) == pytest.approx(2560 / 4330)


@pytest.mark.parametrize(("record", "match"), [
    ({"chat_id": None}, r"q.jsonl:2: not a Qwen-Bailian record \(no 'chat_id'\)"),  # None: the key left out
    ({"chat_id": "7"}, "q.jsonl:2: chat_id and parent_chat_id must be integers"),
    ({"parent_chat_id": True}, "q.jsonl:2: chat_id and parent_chat_id must be integers"),
    ({"timestamp": -1}, "q.jsonl:2: timestamp must be a finite number >= 0"),
    ({"input_length": -16}, "q.jsonl:2: prompt length must be a whole number >= 0"),
    ({"hash_ids": [1, "x"]}, "q.jsonl:2: hash_ids must be a list of integers"),
])
def test_bad_bailian_records_name_their_line(tmp_path: Path, record: dict[str, object], match: str) -> None:
    bad = {k: v for k, v in {**RECORDS[1], **record}.items() if v is not None}
    with pytest.raises(WorkloadError, match=match):
        load_bailian(_jsonl(tmp_path, [RECORDS[0], bad], "q.jsonl"))


def test_cli_names_every_trace_format_and_replays_bailian(tmp_path: Path) -> None:
    assert all(f in FORMAT_HELP for f in TRACE_FORMATS)
    res = CliRunner().invoke(app, ["sim", "run", "--trace", str(_jsonl(tmp_path, RECORDS)), "--replicas", "1",
                                   "--router", "round-robin", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "qwen_traceA_blksz_16: 4 requests" in res.output


def test_conversations_are_found_whatever_the_order_of_the_records(tmp_path: Path) -> None:
    """A file grouped by conversation or shuffled (not in time order) still puts every turn under its first turn;
    a cycle of parents (a damaged file) ends where it closes instead of looping."""
    turns = [  # chat 30's third turn (32) comes first in the file, its first (30) last
        {**RECORDS[0], "chat_id": 32, "parent_chat_id": 31, "timestamp": 9.0},
        {**RECORDS[0], "chat_id": 31, "parent_chat_id": 30, "timestamp": 5.0},
        {**RECORDS[0], "chat_id": 40, "parent_chat_id": 41, "timestamp": 6.0},  # 40 and 41: each the other's parent
        {**RECORDS[0], "chat_id": 41, "parent_chat_id": 40, "timestamp": 7.0},
        {**RECORDS[0], "chat_id": 30, "parent_chat_id": -1, "timestamp": 1.0},
    ]
    w = load_bailian(_jsonl(tmp_path, turns, "shuffled.jsonl"))
    assert [(r.arrival, r.session) for r in w.requests] == [  # from the earliest (1.0 s), not the file's first
        (0.0, "chat-30"), (4.0, "chat-30"), (5.0, "chat-40"), (6.0, "chat-40"), (8.0, "chat-30")]
