"""Fleet simulator: vLLM-like replicas behind a router, driven by traces or synthetic workloads."""

from llmfleet.sim.engine import simulate
from llmfleet.sim.report import oracle_hit_rate, plot
from llmfleet.sim.routers import ROUTERS, make_router
from llmfleet.sim.types import Fleet, PoolSpec, Router, SimConfig, SimPoolSignals, SimResult
from llmfleet.sim.workload import (
    Request,
    SyntheticSpec,
    Workload,
    WorkloadError,
    load_azure,
    load_mooncake,
    load_trace,
    synthetic,
)

__all__ = [
    "ROUTERS", "Fleet", "PoolSpec", "Request", "Router", "SimConfig", "SimPoolSignals", "SimResult",
    "SyntheticSpec", "Workload", "WorkloadError", "load_azure", "load_mooncake", "load_trace", "make_router",
    "oracle_hit_rate", "plot", "simulate", "synthetic",
]
