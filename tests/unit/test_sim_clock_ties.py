"""Traces that log arrivals on a coarse clock (BurstGPT's whole seconds, Mooncake's conversation trace on a 3-second
grid): the requests of one stamp are spread over its tick, in file order, the same way every time; a trace whose
stamps are distinct, or whose clock is finer than an engine step, is replayed as written."""

from __future__ import annotations

import json
from pathlib import Path

from llmfleet.sim.traces import load_burstgpt, load_mooncake
from llmfleet.sim.workload import STEP_RESOLUTION_S, Request, spread_clock_ties

HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def _burstgpt(tmp_path: Path, stamps: list[int]) -> Path:
    p = tmp_path / "BurstGPT_1.csv"
    # prompt lengths 100, 101, ... tell the rows' file order apart
    rows = [f"{t},ChatGPT,{100 + i},20,{120 + i},Conversation log" for i, t in enumerate(stamps)]
    p.write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    return p


def test_whole_second_stamps_are_spread_over_their_second_in_file_order(tmp_path: Path) -> None:
    stamps = [5, 5, 5, 6, 8, 8, 9]
    w = load_burstgpt(_burstgpt(tmp_path, stamps))
    arrivals = [r.arrival for r in w.requests]
    assert len(set(arrivals)) == len(arrivals)  # no two requests at the same instant any more
    # file order is kept, within a stamp too (a conversation's turns stay in order)
    assert [r.prompt_len for r in w.requests] == [100 + i for i in range(len(stamps))]
    # each request stays within its own second: any two are as far apart as their stamps, give or take under 1 s
    for a, s in zip(arrivals, stamps, strict=True):
        for b, t in zip(arrivals, stamps, strict=True):
            assert abs((b - a) - (t - s)) < 1
    # the same file replays the same way
    assert [r.arrival for r in load_burstgpt(_burstgpt(tmp_path, stamps)).requests] == arrivals


def test_a_failed_row_at_the_first_stamp_stays_at_the_start(tmp_path: Path) -> None:
    p = _burstgpt(tmp_path, [5, 5, 5, 6])
    rows = p.read_text(encoding="utf-8").splitlines()
    rows.insert(1, "5,ChatGPT,90,0,90,Conversation log")  # failed (0 response tokens): counted, not replayed
    p.write_text("\n".join(rows) + "\n", encoding="utf-8")
    w = load_burstgpt(p)
    assert len(w.requests) == 4 and w.skipped_empty == 1
    assert min(w.skipped_at) >= 0.0 and w.requests[0].arrival == 0.0


def test_distinct_stamps_are_replayed_as_written(tmp_path: Path) -> None:
    w = load_burstgpt(_burstgpt(tmp_path, [5, 6, 8, 9]))
    assert [r.arrival for r in w.requests] == [0.0, 1.0, 3.0, 4.0]


def test_a_three_second_grid_is_spread_over_three_seconds(tmp_path: Path) -> None:
    p = tmp_path / "conversation_trace.jsonl"
    stamps_ms = [0] * 10 + [3000] * 10 + [5999] * 10  # Mooncake's conversation trace: ~10 requests a stamp
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": 1024, "output_length": 10, "hash_ids": [i, i + 1]})
                         + "\n" for i, t in enumerate(stamps_ms)), encoding="utf-8")
    arrivals = [r.arrival for r in load_mooncake(p).requests]
    assert len(set(arrivals)) == 30 and arrivals == sorted(arrivals)
    # the tick is the smallest gap between stamps (2.999 s): each stamp's ten requests spread over most of it, and
    # any two stay as far apart as their stamps, give or take less than the tick
    for k in range(3):
        assert 1.5 < arrivals[10 * k + 9] - arrivals[10 * k] < 2.999
    for a, s in zip(arrivals, stamps_ms, strict=True):
        for b, t in zip(arrivals, stamps_ms, strict=True):
            assert abs((b - a) - (t - s) / 1000) < 2.999


def test_a_clock_finer_than_an_engine_step_is_left_as_written() -> None:
    tick = STEP_RESOLUTION_S / 10  # e.g. Mooncake's millisecond stamps: two requests in one millisecond stay there
    reqs = [Request(0, 0.0, 10, 1), Request(1, 0.0, 10, 1), Request(2, tick, 10, 1)]
    spread_clock_ties(reqs)
    assert [r.arrival for r in reqs] == [0.0, 0.0, tick]
