"""The autoscaler's data types: what a policy reads (signals, config) and what it returns (decisions).

Below `policy.py` and `stabilize.py`, which both use them; pure data, no behaviour beyond building a config
from an InferenceService.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError

from llmfleet.api.trainingjob import ModelShape
from llmfleet.autoscaler.capacity import DEFAULT_SEED, CapacitySeed
from llmfleet.autoscaler.state import Action, PolicyState

if TYPE_CHECKING:
    from llmfleet.api.inferenceservice import InferenceService

Role = Literal["primary", "student"]
PolicyName = Literal["slo", "queue", "static"]

# Fraction of the TTFT SLO the model plans for; the rest is headroom for noise and model error.
TTFT_TARGET_FRACTION = 0.7
# Highest utilization (prefill plus decode replica-seconds per second, at the seed's full-batch throughputs) a plan may
# reach. 1.0: no cap of its own. The TTFT budget above is the headroom: Erlang C's p95 wait (capacity.py) diverges as
# utilization nears 1, so the plan stops short of it by as much as the budget needs, and a second margin would
# count the same headroom twice (at 0.85, one replica that serves a chat mix within the SLO up to its knee was
# planned as two: docs/autoscaler.md, "Queueing estimate of TTFT").
MAX_UTILIZATION = 1.0
BURST_FORECAST_CAP = 2.0
IDLE_FRACTION = 0.5

# PoolSignals' field types carry their ranges, so the JSON reader (`signals_from_json`) refuses a value out of range
# by the field's own declaration and a field added later is checked as soon as it is typed: a sign slip in a
# hand-written signals file would otherwise be planned from (a negative kv_full_sequences falls to the planner's lower
# bound, a negative rate reads as none). The dataclass itself does not check them (the policy's own code builds it).
Count = Annotated[int, Field(ge=0)]
Measured = Annotated[float, Field(ge=0)]  # a rate, a length, a latency, a count of requests: never negative
Fraction = Annotated[float, Field(ge=0, le=1)]
# ModelShape's own defaults are a tiny training model's (a 4,096-token vocabulary, a 256-token context): a shape in
# signals JSON names every field they would otherwise fill in wrongly.
SHAPE_FIELDS_REQUIRED = ("layers", "hidden", "heads", "vocab", "seq_len")


def _whole_shape(value: object) -> object:
    if isinstance(value, Mapping):
        camel = {"seq_len": "seqLen"}
        if missing := [k for k in SHAPE_FIELDS_REQUIRED if k not in value and camel.get(k) not in value]:
            raise ValueError(f"a model shape needs {', '.join(missing)}")
    return value


ReportedShape = Annotated[ModelShape, BeforeValidator(_whole_shape)]


@dataclass(frozen=True)
class PoolSignals:
    """What the autoscaler knows about one pool at `now` (None = not measured).

    `arrival_rate` of the primary is the demand of the whole service (requests/s reaching the router,
    degraded ones included: they are load the primary should have served); a student pool's is the
    traffic it actually receives.
    """

    pool: str
    role: Role
    now: float
    replicas: Count
    ready_replicas: Count
    arrival_rate: Measured | None = None
    mean_input_tokens: Measured | None = None
    mean_output_tokens: Measured | None = None
    # E[L^2], E[L^3], E[L^4] of the prompt lengths L of the same requests as mean_input_tokens: the spread of their
    # prefill times (capacity.prefill_time_scv).
    input_tokens_moments: tuple[Measured, Measured, Measured] | None = None
    ttft_p95_ms: Measured | None = None
    tpot_p95_ms: Measured | None = None
    # 95th percentile of the time requests waited in the engines' queues before their prefill started (vLLM's
    # vllm:request_queue_time_seconds): the part of TTFT more replicas shorten.
    queue_time_p95_ms: Measured | None = None
    queue_depth: Measured | None = None
    running: Measured | None = None
    kv_utilization: Fraction | None = None
    # Running sequences per full KV cache at the running sequences' measured footprint: sum of the engines' running
    # requests over the sum of their KV cache usage (vllm:num_requests_running / vllm:kv_cache_usage_perc, both
    # summed over the pool). What a replica's cache holds is measured this way, prompt blocks that concurrent
    # requests share counted once, at any load; the planner's figure (its full-context sequences) cannot see sharing.
    kv_full_sequences: Measured | None = None
    prefix_hit_rate: Fraction | None = None
    degraded_fraction: Fraction | None = None
    prefill_tokens_per_s: Measured | None = None
    decode_tokens_per_s: Measured | None = None
    error_rate: Fraction | None = None  # failed tries / all tries on this pool's replicas (router-measured)
    held_requests: Measured | None = None  # requests the router holds for this pool while it has no replica
    # The shortest waiting queue any ready replica had over the interval (Prometheus: min of
    # min_over_time(vllm:num_requests_waiting)): >= 1 means every replica had work waiting all along (saturated).
    min_queue_depth: Measured | None = None
    # The served model's shape as its replicas report it (the serving wrapper's llmfleet:model_shape, read from the
    # model's config.json); None where they report none or disagree. The capacity seed of a pool that names no
    # model preset comes from it (seeds.seeds_for_service).
    model_shape: ReportedShape | None = None
    # Seconds the rates above were measured over; None: the policy's interval. A decision the router's wake-up
    # brings forward measures over the seconds since the last one (shorter: its counts are fewer).
    window_s: Annotated[float, Field(gt=0)] | None = None
    stale: bool = False

    @property
    def usable(self) -> bool:
        return not self.stale and self.arrival_rate is not None


# Signals read from JSON (`llmfleet autoscaler decide --signals`): every field's type checked, unknown fields and
# non-finite numbers refused, so a typo or a string where a number belongs names its field instead of failing later.
_SIGNALS_JSON = TypeAdapter(list[PoolSignals], config=ConfigDict(extra="forbid", allow_inf_nan=False))


def signals_from_json(raw: object) -> list[PoolSignals]:
    """A JSON list of objects with PoolSignals' snake_case fields -> PoolSignals. ValueError names the item and
    field of each problem (a missing field, a wrong type, a moments list that is not three numbers, an unknown
    field, a negative replica count or measurement, a fraction above 1)."""
    try:
        return _SIGNALS_JSON.validate_python(raw)
    except ValidationError as err:
        problems = ["/".join(str(part) for part in e["loc"]) + f": {e['msg']}" + _got(e) for e in err.errors()]
        raise ValueError("invalid signals: " + "; ".join(problems)) from None


def _got(error: Mapping[str, object]) -> str:
    """` (got -3)` for a number out of range: the value that broke it, beside the rule."""
    value = error.get("input")
    return f" (got {value:g})" if isinstance(value, int | float) and not isinstance(value, bool) else ""


@dataclass(frozen=True)
class PoolBounds:
    """One pool's bounds and capacity seed."""

    name: str
    role: Role
    min_replicas: int
    max_replicas: int
    static_replicas: int
    gpus_per_replica: int = 1
    seed: CapacitySeed = DEFAULT_SEED
    cold_start_s: float | None = None


@dataclass(frozen=True)
class PolicyConfig:
    """Policy parameters, normally from an InferenceService's spec.autoscaling and spec.slo."""

    policy: PolicyName
    pools: tuple[PoolBounds, ...]
    ttft_slo_ms: float = 1000.0
    tpot_slo_ms: float = 100.0
    interval_s: float = 15.0
    up_window_s: float = 0.0
    down_window_s: float = 300.0
    cooldown_s: float = 60.0
    max_up_step: int = 4
    max_down_step: int = 1
    target_queue_depth: float = 4.0
    cold_start_s: float | None = None
    ttft_target_fraction: float = TTFT_TARGET_FRACTION
    max_utilization: float = MAX_UTILIZATION
    # Student pools are sized for the demand one primary cold start ahead with the last jump's slope kept,
    # up to this multiple of the current rate (they start fast and shrink fast, so overshoot is cheap).
    burst_forecast_cap: float = BURST_FORECAST_CAP
    # Scale-down by the excess (halving the gap per cooldown) when, over a short window, the forecast
    # needs at most this fraction of the current replicas ("clearly idle"); 0 disables. See _stabilize.
    idle_fraction: float = IDLE_FRACTION
    # After a primary scale-up that arrived after its rise, the next rise waits while the ready replicas carry it
    # (stabilize.py); False: every rise buys at once (the benchmark's comparison).
    hold_after_short_rise: bool = True

    def pool(self, name: str) -> PoolBounds:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    @classmethod
    def from_service(
        cls, isvc: InferenceService, seeds: Mapping[str, CapacitySeed] | None = None, **overrides: object
    ) -> PolicyConfig:
        """Build the config of `isvc`; `seeds` maps pool name to its capacity seed (planner estimate)."""
        spec, auto = isvc.spec, isvc.spec.autoscaling
        pools = tuple(
            PoolBounds(
                name=p.name,
                role=p.role,
                min_replicas=p.min_replicas,
                max_replicas=p.max_replicas,
                static_replicas=p.replicas,
                gpus_per_replica=max(p.resources.gpus, 1),
                seed=(seeds or {}).get(p.name, DEFAULT_SEED),
            )
            for p in isvc.pools()
        )
        values: dict[str, object] = dict(
            policy=auto.policy,
            pools=pools,
            ttft_slo_ms=spec.slo.ttft_p95_ms,
            tpot_slo_ms=spec.slo.tpot_p95_ms,
            interval_s=auto.interval_seconds,
            up_window_s=auto.scale_up_stabilization_seconds,
            down_window_s=auto.scale_down_stabilization_seconds,
            cooldown_s=auto.cooldown_seconds,
            max_up_step=auto.max_scale_up_step,
            max_down_step=auto.max_scale_down_step,
            target_queue_depth=auto.target_queue_depth,
            cold_start_s=auto.cold_start_seconds,
        )
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PoolDecision:
    """The outcome for one pool."""

    pool: str
    current: int
    desired: int
    recommended: int  # raw recommendation before stabilization/steps/cooldown
    action: Action
    reasons: tuple[str, ...]
    predicted_ttft_ms: float | None = None
    capacity_rps: float | None = None  # per replica, at the observed mix


@dataclass(frozen=True)
class ScalingDecision:
    """Desired replicas for every pool, why, and the state for the next call."""

    now: float
    policy: PolicyName
    pools: dict[str, PoolDecision]
    state: PolicyState

    def desired(self) -> dict[str, int]:
        return {name: d.desired for name, d in self.pools.items()}

    def changed(self) -> dict[str, int]:
        return {name: d.desired for name, d in self.pools.items() if d.desired != d.current}
