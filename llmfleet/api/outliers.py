"""Outlier ejection settings: the router's passive health (llmfleet.router.outliers). One definition, with
its defaults, for both the InferenceService API (`spec.router.outliers`) and the router's own configuration
(`RouterConfig.outliers` is this model), so the operator passes the spec through unchanged."""

from __future__ import annotations

from pydantic import Field

from llmfleet.api.common import ApiModel


class OutlierEjection(ApiModel):
    """Outlier ejection (llmfleet.router.outliers): replicas whose requests fail in a row or run far slower than
    their peers' leave rotation for a back-off period, although their health checks pass."""

    enabled: bool = Field(default=True, description="Eject outliers at all.")
    consecutive_failures: int = Field(
        default=3, ge=1,
        description="Failed attempts in a row that eject a replica: timeouts, HTTP 5xx and streams broken "
        "mid-response (HTTP 429 is back-pressure; a refused connection marks the replica down instead).",
    )
    slow_factor: float = Field(
        default=3.0, gt=1,
        description="A replica whose seconds per output token (moving average of attempt time / (1 + output "
        "tokens)) exceeds this multiple of the median of its peers' is ejected as slow.",
    )
    slow_min_seconds_per_token: float = Field(
        default=0.02, ge=0,
        description="Below this many seconds per output token no replica counts as slow (noise among fast ones).",
    )
    min_requests: int = Field(
        default=10, ge=1, description="Successful attempts a replica needs before its speed is judged or compared.",
    )
    window_requests: int = Field(
        default=20, ge=1, description="Span of the moving average of seconds per token, in requests.",
    )
    interval_seconds: float = Field(default=5.0, gt=0, description="Seconds between two judgements of speed.")
    base_ejection_seconds: float = Field(
        default=30.0, gt=0, description="First ejection's length; the n-th ejection lasts n times as long.",
    )
    max_ejection_seconds: float = Field(
        default=300.0, gt=0,
        description="Bound on one ejection's length; each such period back in rotation lowers the multiplier by one.",
    )
    max_ejection_percent: float = Field(
        default=50.0, ge=0, le=100,
        description="Most of a pool's replicas (percent, rounded down) ejected at once; its last replica never is.",
    )
