"""status.metrics of an InferenceService (LiveMetrics) from the signals the autoscaler collected for its pools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmfleet.autoscaler.types import PoolSignals


def _rounded(values: dict[str, float | None]) -> dict[str, Any]:
    return {k: round(v, 4) for k, v in values.items() if v is not None}


def live_metrics(signals: Sequence[PoolSignals], now_iso: str) -> dict[str, Any] | None:
    """status.metrics (LiveMetrics, camelCase) from the primary pool's signals, plus every pool's own latency
    and error rate under `pools`; None without a primary.

    The service's qps is the primary's arrival rate (the router's whole demand, degraded requests included).
    The promotion rollback (operator and local runtime) reads the promoted pool's entry, and
    `kubectl get lis -o wide` shows TTFT p95.
    """
    primary = next((s for s in signals if s.role == "primary"), None)
    if primary is None:
        return None
    out: dict[str, Any] = _rounded({
        "ttftP95Ms": primary.ttft_p95_ms, "tpotP95Ms": primary.tpot_p95_ms, "errorRate": primary.error_rate,
        "prefixCacheHitRate": primary.prefix_hit_rate, "kvCacheUtilization": primary.kv_utilization,
        "kvFullSequences": primary.kv_full_sequences, "qps": primary.arrival_rate, "degradedFraction": primary.degraded_fraction,
    })
    out.update(stale=primary.stale, updatedAt=now_iso)
    out["pools"] = [
        {"name": s.pool, **_rounded({"ttftP95Ms": s.ttft_p95_ms, "tpotP95Ms": s.tpot_p95_ms, "errorRate": s.error_rate,
                                     "qps": s.arrival_rate}), "stale": s.stale}
        for s in signals
    ]
    return out
