"""A simulation's per-request records: slotted objects read as the mapping (and JSON) they always were."""

from __future__ import annotations

import json

from llmfleet.plan.roofline import StepCostModel
from llmfleet.sim.engine import PoolSpec, SimConfig, simulate
from llmfleet.sim.types import RECORD_KEYS, RequestRecord
from llmfleet.sim.workload import Request, Workload

UNIT = StepCostModel(flops_per_token=1.0, attn_flops_per_ctx=0.0, weight_bytes=0.0, kv_bytes=0.0,
                     peak_flops=1000.0, bandwidth=1e30, compute_eff=1.0, bandwidth_eff=1.0, overhead_s=0.0)


def _run() -> list[RequestRecord]:
    w = Workload("w", [Request(0, 0.0, 16, 3, (1, 2, 3, 4)), Request(1, 1.0, 16, 2, (1, 2, 5, 6)),
                       Request(2, 2.0, 400, 1, ())], block_size=4)  # the third exceeds the 100-block cache
    return simulate(w, SimConfig(pools=[PoolSpec(replicas=1, kv_blocks=100, cost=UNIT)])).records


def test_records_read_as_mappings_with_the_json_keys() -> None:
    first, second, too_big = _run()
    # slotted, no per-object dict: what keeps a run's records small (benchmarks/sim_long_trace.py measures the bytes)
    assert isinstance(first, RequestRecord) and not hasattr(first, "__dict__")
    assert list(first) == list(RECORD_KEYS) and len(first) == 13
    assert second["hitTokens"] == second.hit_tokens == 8 and second.get("rejected") is None
    assert too_big["rejected"] == "kv" and too_big["ttft"] is None
    assert first.get("no such key", "absent") == "absent"
    assert dict(first) == {"rid": 0, "arrival": 0.0, "prompt": 16, "output": 3, "pool": "primary", "replica": 0,
                           "degraded": False, "hitTokens": 0, "ttft": first.ttft, "e2e": first.e2e,
                           "preemptions": 0, "tenant": "default", "rejected": None}
    assert first == dict(first) and first != second  # compares as the mapping it is


def test_to_json_writes_plain_objects() -> None:
    w = Workload("w", [Request(0, 0.0, 16, 3, (1, 2, 3, 4))], block_size=4)
    res = simulate(w, SimConfig(pools=[PoolSpec(replicas=1, kv_blocks=100, cost=UNIT)]))
    doc = json.loads(json.dumps(res.to_json(records=True)))
    assert doc["records"][0]["hitTokens"] == 0 and set(doc["records"][0]) == set(RECORD_KEYS)

