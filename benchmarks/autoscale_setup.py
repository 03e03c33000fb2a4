"""The workloads, service and runs of the autoscaler benchmark (autoscale_eval.py), and the processes that run
the other router seeds (SeedRuns).

The fleet is an InferenceService (`llmfleet.sim.production.make_service`) simulated by the production router,
fallback and autoscaler (`llmfleet.sim.production.simulate_service`): primary Llama-3.1-8B (Llama-3-8B's shape,
128k context) on H200 with a 60 s cold start, student Llama-3.2-1B with a 20 s cold start, scaled to zero
when idle. Workloads: every trace in ../shared/data/traces/ (any format `llmfleet.sim.traces.load_trace`
knows) and the synthetic spike.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Callable, Container
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal

from results_paths import RESULTS

from llmfleet.api import InferenceService
from llmfleet.plan.hardware import get_gpu
from llmfleet.sim.oracle import attainment as ttft_attainment  # requests within the TTFT SLO / servable ones
from llmfleet.sim.planning import over_slo_alone
from llmfleet.sim.production import DEFAULT_COLD_START_S, Fallback, PolicyHook, make_service, simulate_service
from llmfleet.sim.traces import TimeUnitError, is_trace_file, load_trace, trace_stem
from llmfleet.sim.types import PoolSpec, SimResult
from llmfleet.sim.workload import BlockSizeError, SyntheticSpec, Workload, WorkloadError, synthetic

__all__ = ["GPU", "MAX_REPLICAS", "PRIMARY_COLD_S", "PRIMARY_MODEL", "ROOT", "ROUTER_SEEDS", "STUDENT_COLD_S",
           "STUDENT_MODEL", "STUDENT_WARM", "TRACES", "PolicyHook", "SeedRuns", "default_jobs", "misses", "run_policy",
           "run_static", "service", "rate_variant", "shapes", "student_hardware", "student_mig", "summary_row",
           "ttft_attainment", "unavoidable_misses", "use_student_mig", "workloads"]

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "data" / "traces"
if not TRACES.exists():  # a worktree beside the main checkout
    TRACES = Path("/work/shared/data/traces")
PRIMARY_MODEL, STUDENT_MODEL, GPU = "llama-3.1-8b", "llama-3.2-1b", "H200"
CONTEXT = 131072  # both models' context (Llama-3.2-1B's release has 128k; its preset's seq_len is a training length)
PRIMARY_COLD_S, STUDENT_COLD_S, MAX_REPLICAS = DEFAULT_COLD_START_S["primary"], DEFAULT_COLD_START_S["student"], 64
STUDENT_WARM = 0  # student replicas kept warm (minReplicas of the student pool): none, it scales to zero
# The MIG profile of GPU each student replica runs on (resources.migProfile; autoscale_eval.py --student-mig);
# None: a whole GPU. Set with use_student_mig before any run (forked seed runs inherit it).
STUDENT_MIG: str | None = None
STUDENT_MAX_GPUS = 8  # the student pool's maxReplicas in GPUs' worth (more slices on MIG)
# Router fallback thresholds (spec.fallback): the degraded-fraction cap lets a tenant's traffic onto the student up
# to two thirds over the 60 s window, since during the first primary cold start after a 4-10x jump the ready
# primaries carry about a third of the demand (docs/benchmarks/autoscale_eval.md).
FALLBACK = Fallback(queue_delay_fraction=0.5, max_degraded=0.65, burn_rate=2.0)
# Router seeds per policy run: the seed only breaks routing ties, yet it moves a policy's misses by tens of
# requests on a trace (a different replica per request changes what the policy sees next).
ROUTER_SEEDS = 3


def use_student_mig(profile: str | None) -> None:
    """Run the student pool on one MIG instance of `profile` per replica (ValueError: GPU has no such profile)."""
    global STUDENT_MIG  # noqa: PLW0603 - the benchmark's one fleet setting chosen on its command line
    if profile is not None:
        get_gpu(GPU, mig=profile)
    STUDENT_MIG = profile


def student_mig() -> str | None:
    """The MIG profile the student runs on (use_student_mig), None on whole GPUs."""
    return STUDENT_MIG


def slices_per_gpu() -> int:
    """Student replicas per GPU: one on a whole GPU, the slices of its profile one GPU holds on MIG (2 of 3g.71gb,
    3 of 2g.35gb, 7 of 1g.18gb)."""
    return int(1 / get_gpu(GPU, mig=STUDENT_MIG).gpu_share + 1e-9) if STUDENT_MIG else 1


def student_hardware() -> str:
    """What a student replica runs on, for the results: "H200" or "H200 MIG 3g.71gb"."""
    return f"{GPU} MIG {STUDENT_MIG}" if STUDENT_MIG else GPU


def service(policy: str, ttft_slo_s: float, replicas: int, with_student: bool = True,
            target_queue_depth: float | None = None, student_warm: int = STUDENT_WARM,
            model: str | None = PRIMARY_MODEL) -> InferenceService:
    """The benchmark's service; `model` None: a primary no preset names (`simulate_service`'s `shapes` gives it)."""
    return make_service(policy=policy, ttft_slo_ms=ttft_slo_s * 1e3, replicas=replicas, model=model, gpu=GPU,
                        max_replicas=MAX_REPLICAS, max_model_len=CONTEXT,
                        student=STUDENT_MODEL if with_student else None, student_min=student_warm,
                        student_max=max(STUDENT_MAX_GPUS * slices_per_gpu(), student_warm),
                        student_max_model_len=CONTEXT, student_mig=STUDENT_MIG, fallback=FALLBACK,
                        target_queue_depth=target_queue_depth, name="bench")


def add_replay_options(ap: argparse.ArgumentParser, out: Path) -> None:
    """The options of a script that replays autoscale_eval.py's recorded workloads (autoscale_phase.py,
    autoscale_seed_source.py): --recorded, --out (default `out`), --jobs and --render."""
    ap.add_argument("--recorded", type=Path, default=RESULTS / "autoscale_eval.json",
                    help="autoscale_eval.py's results: each workload's TTFT SLO and starting fleet come from there")
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--render", action="store_true", help="print the markdown table of --out and exit")


def run_static(w: Workload, n: int, slo_s: float, students: int = 0, stop_below: float | None = None) -> SimResult:
    """`n` primaries and `students` always-warm student replicas (the router's fallback sends overflow there).
    `stop_below`: stop once the run cannot reach that attainment (SimConfig.stop_below_attainment)."""
    return simulate_service(w, service("static", slo_s, n, with_student=students > 0, student_warm=students),
                            stop_below_attainment=stop_below)[0]


def run_policy(w: Workload, policy: str, slo_s: float, initial: int, target_queue_depth: float | None = None,
               seed: int = 0, scale_in: Literal["cache-aware", "least-loaded"] = "cache-aware",
               phase_s: float = 0.0) -> tuple[SimResult, PolicyHook]:
    """`seed`: the router's tie-breaking seed (the only randomness); `phase_s`: the autoscaler's regular decisions
    that many seconds later (their phase against the traffic; autoscale_phase.py)."""
    res, hook = simulate_service(w, service(policy, slo_s, initial, target_queue_depth=target_queue_depth),
                                 seed=seed, scale_in=scale_in, decision_phase_s=phase_s)
    assert hook is not None  # noqa: S101 - slo/queue always have a hook (benchmark script, not runtime code)
    return res, hook


def unavoidable_misses(w: Workload, slo_s: float) -> dict[str, int]:
    """The requests no fleet serves within `slo_s` (`unavoidableMisses`), beside the servable requests the 99 % is
    taken over (`servableRequests`): `llmfleet.sim.planning.over_slo_alone` on the primary pool at the benchmark's
    context."""
    over, servable = over_slo_alone(w, PoolSpec(model=PRIMARY_MODEL, gpu=GPU, max_model_len=CONTEXT), slo_s)
    return {"unavoidableMisses": over, "servableRequests": servable}


def misses(res: SimResult, slo_s: float) -> int:
    return sum(1 for r in res.records if r.get("rejected") != "context" and (r["ttft"] is None or r["ttft"] > slo_s))


def gpu_breakdown(res: SimResult) -> dict[str, dict[str, float]]:
    """Where each pool's GPU-seconds went: replicas starting (cold start), ready and busy (computing an engine
    step), ready and idle. From the result's replica records and its time series (sampled every few seconds, so
    starting + ready is within a sample of the pool's GPU-seconds); replica-seconds count at the GPUs a replica
    occupies (a MIG slice's share)."""
    out: dict[str, dict[str, float]] = {}
    gpus = {p["name"]: p["gpusPerReplica"] for p in res.config["pools"]}
    for pool in {r["pool"] for r in res.replicas}:
        starting = ready = 0.0
        for a, b in zip(res.series, res.series[1:], strict=False):
            if pool in a:
                starting += (a[pool]["replicas"] - a[pool]["ready"]) * (b["t"] - a["t"]) * gpus[pool]
                ready += a[pool]["ready"] * (b["t"] - a["t"]) * gpus[pool]
        busy = sum(r["busyS"] for r in res.replicas if r["pool"] == pool) * gpus[pool]
        out[pool] = {"starting": round(starting, 1), "readyBusy": round(busy, 1), "readyIdle": round(ready - busy, 1),
                     "replicasStarted": sum(1 for r in res.replicas if r["pool"] == pool)}
    return out


def summary_row(res: SimResult, slo_s: float, *, actions: int, replicas: int) -> dict[str, Any]:
    gpu_by_pool: dict[str, float] = {}
    for rep in res.replicas:
        gpu_by_pool[rep["pool"]] = gpu_by_pool.get(rep["pool"], 0.0) + rep["gpuS"]
    return {"attainment": round(ttft_attainment(res, slo_s), 5), "misses": misses(res, slo_s),
            "gpuSeconds": round(res.summary["gpuSeconds"], 1),
            "gpuSecondsByPool": {k: round(v, 1) for k, v in gpu_by_pool.items()},
            "gpuSecondsBreakdown": gpu_breakdown(res),
            "rejectedContext": res.summary.get("rejectedContext", 0),
            "degradedFraction": round(res.summary["degradedFraction"], 4), "scalingActions": actions,
            "peakPrimaryReplicas": replicas, "ttftP95S": res.summary["ttft"]["p95"],
            "ttftP99S": res.summary["ttft"]["p99"]}


def spike(factor: float, quick: bool) -> tuple[str, Workload]:
    spec = SyntheticSpec(duration_s=1200.0 if quick else 2400.0, rate_rps=12.0, diurnal_amplitude=0.0,
                         bursts=[(600.0, 300.0, factor)], seed=1)
    return f"bursty-{factor:g}x", synthetic(spec)


def steady(rate: float, quick: bool) -> tuple[str, Workload]:
    """Steady multi-tenant sessions at `rate` req/s, no burst: at a few requests per 15 s interval the counts alone
    jump past 1.5x their smoothed level now and then, which must not read as bursts."""
    spec = SyntheticSpec(duration_s=900.0 if quick else 1800.0, rate_rps=rate, diurnal_amplitude=0.0, seed=5)
    return f"steady-{rate:g}", synthetic(spec)


def shapes() -> dict[str, Workload]:
    """Synthetic traffic shapes no policy constant was chosen on (a check of generality, not a target set): a daily
    cycle compressed into 30 minutes, 30 s bursts every 5 minutes, long multi-turn prompts, two 3-minute 12x
    bursts on near-idle traffic, long outputs (1,000 tokens on 200-token turns), 40 req/s, short chat turns
    with a 4-minute 3x burst, two where rises shorter than a cold start come before a long one (4x for 400 s)
    or a large one (8x for 200 s), reasoning-style 4,000-token answers, and API-style single requests that arrive in
    clumps (gamma gaps with CV 3, as BurstGPT's fit) with heavy-tailed prompts on one replica's worth of traffic, at 2,
    4 and 8 req/s. Multi-tenant sessions as in `spike`, one generator seed for all thirteen."""
    base: dict[str, Any] = dict(tenants=8, warmup_s=120.0, seed=11)
    specs = {
        "shape-diurnal": SyntheticSpec(duration_s=1800.0, rate_rps=12.0, diurnal_amplitude=0.8,
                                       diurnal_period_s=1800.0, **base),
        "shape-periodic": SyntheticSpec(duration_s=1500.0, rate_rps=8.0, diurnal_amplitude=0.0,
                                        bursts=[(float(t), 30.0, 4.0) for t in range(300, 1500, 300)], **base),
        "shape-longprompt": SyntheticSpec(duration_s=1500.0, rate_rps=1.5, diurnal_amplitude=0.0,
                                          user_tokens_mean=6000.0, output_tokens_mean=150.0, **base),
        "shape-onoff": SyntheticSpec(duration_s=1800.0, rate_rps=0.5, diurnal_amplitude=0.0,
                                     bursts=[(400.0, 180.0, 12.0), (1200.0, 180.0, 12.0)], **base),
        "shape-decode": SyntheticSpec(duration_s=1500.0, rate_rps=6.0, diurnal_amplitude=0.5, diurnal_period_s=1500.0,
                                      user_tokens_mean=200.0, output_tokens_mean=1000.0, **base),
        "shape-highrate": SyntheticSpec(duration_s=1200.0, rate_rps=40.0, diurnal_amplitude=0.3,
                                        diurnal_period_s=1200.0, **base),
        "shape-shortchat": SyntheticSpec(duration_s=1500.0, rate_rps=15.0, diurnal_amplitude=0.0,
                                         system_prompt_tokens=(64, 256), user_tokens_mean=100.0,
                                         output_tokens_mean=100.0, bursts=[(500.0, 240.0, 3.0)], **base),
        # rises shorter than a cold start, then one that is not: what waiting after a late scale-up risks
        "shape-shortlong": SyntheticSpec(duration_s=1800.0, rate_rps=8.0, diurnal_amplitude=0.0,
                                         bursts=[(300.0, 30.0, 4.0), (600.0, 30.0, 4.0), (900.0, 30.0, 4.0),
                                                 (1200.0, 400.0, 4.0)], **base),
        "shape-shortbig": SyntheticSpec(duration_s=1500.0, rate_rps=8.0, diurnal_amplitude=0.0,
                                        bursts=[(300.0, 30.0, 3.0), (600.0, 30.0, 3.0), (900.0, 200.0, 8.0)], **base),
        # reasoning-style answers: 4,000-token outputs that later turns carry as context (KV cache, not compute,
        # bounds a replica)
        "shape-reasoning": SyntheticSpec(duration_s=1800.0, rate_rps=2.0, diurnal_amplitude=0.5,
                                         diurnal_period_s=1800.0, user_tokens_mean=300.0, output_tokens_mean=4000.0,
                                         **base),
        # API traffic: single requests in clumps (arrivals of the same second queue on a lightly loaded replica),
        # prompts with a heavy tail; one replica carries the mean rate several times over, and still carries the same
        # clumps at 2x and 4x the rate (static meets 99 % with one)
        **{name: SyntheticSpec(duration_s=1800.0, rate_rps=rate, diurnal_amplitude=0.0, turns_mean=1.0,
                               user_tokens_mean=700.0, output_tokens_mean=150.0, length_sigma=(1.0, 1.0),
                               arrival_cv=3.0, **base)
           for name, rate in (("shape-api", 2.0), ("shape-api4", 4.0), ("shape-api8", 8.0))},
    }
    return {name: synthetic(spec) for name, spec in specs.items()}


def rate_variant(name: str, k: float) -> str:
    """The name of workload `name` replayed at k x its rate (`Workload.scaled(k)`): azure-rate2x, mooncake-rate0.5x."""
    return f"{name}-rate{k:g}x"


def check_trace_seconds(seconds: float | None) -> None:
    """`--trace-seconds`: None (whole traces) or a window > 0 (NaN and 0 would leave no request)."""
    if seconds is not None and not seconds > 0:
        raise WorkloadError(f"--trace-seconds {seconds:g}: it must be > 0")


def trace_name(path: Path, taken: Container[str] = ()) -> str:
    """A trace's workload name: the shared traces (TRACES) keep the short names their results are recorded under
    (`mooncake`, `azure`: the file name up to its first `_`) unless an earlier trace took it; any other file its whole
    name without the extension, so a trace given with --trace never takes a recorded workload's name, and with it
    that workload's results row and plot (`mooncake_conversation_trace.jsonl` is not `mooncake`)."""
    stem = trace_stem(path)
    short = stem.split("_")[0]
    shared = TRACES.exists() and path.resolve().parent == TRACES.resolve()
    return short if shared and short not in taken else stem


def trace_names(traces: list[Path]) -> list[str]:
    """Each trace's workload name, in order (`trace_name`). Two traces with one name would write one results row
    and plot: a one-line error instead."""
    seen: dict[str, Path] = {}
    for p in traces:
        name = trace_name(p, seen)
        if name in seen:
            raise WorkloadError(f"traces {seen[name]} and {p} are both named {name!r}: rename one")
        seen[name] = p
    return list(seen)


def workloads(traces: list[Path] | None, quick: bool, spike_factor: float | None = 10.0,
              steady_rates: list[float] | None = None, with_shapes: bool = False,
              trace_seconds: float | None = None, kv_block_size: int | None = None,
              time_unit: str | None = None) -> dict[str, Workload]:
    """Each trace (any known format), then the synthetic spike (unless `spike_factor` is None), then a steady
    synthetic workload per rate in `steady_rates`, then (`with_shapes`) the synthetic shapes. `traces` None: every
    trace file in TRACES. `trace_seconds`: only each trace's first that many seconds (a day- or week-long trace is
    hours of simulation per policy run; the static-at-peak search replays it a dozen times). `kv_block_size`: the
    traces with smaller blocks are merged into blocks of that many tokens as they are read (`load_trace`);
    `time_unit`: the JSONL traces' timestamp unit (`load_trace`; a CSV trace is then a TimeUnitError)."""
    check_trace_seconds(trace_seconds)
    if traces is None:
        found = sorted(p for p in TRACES.glob("*") if p.is_file()) if TRACES.exists() else []
        traces = [p for p in found if is_trace_file(p)]
        for p in found:  # a trace in another format is named, not passed over in silence (the README is no trace)
            if not is_trace_file(p) and p.suffix.lower() != ".md":
                print(f"not read: {p.name} (a trace is .jsonl or .csv, or either .gz, .bz2 or .xz)", file=sys.stderr)
    out: dict[str, Workload] = {}
    for p, name in zip(traces, trace_names(traces), strict=True):
        try:  # read no further than the first S seconds; merge finer blocks as they are read
            w = load_trace(p, seconds=trace_seconds, kv_block_size=kv_block_size, time_unit=time_unit)
        except (BlockSizeError, TimeUnitError):
            raise  # an option is wrong, not the file: an error, not a skipped trace
        except WorkloadError as e:
            print(f"skipping trace: {e}", file=sys.stderr)
            continue
        out[name] = w.head(1500) if quick else w
    if spike_factor is not None:
        name, w = spike(spike_factor, quick)
        out[name] = w
    for rate in steady_rates or []:
        name, w = steady(rate, quick)
        out[name] = w
    if with_shapes:
        out.update(shapes())
    return out


# The workload the seed-run processes replay: set before they are forked, so they inherit it instead of each task
# pickling a whole trace.
_FORKED_WORKLOAD: Workload | None = None


def _seed_run(policy: str, slo_s: float, initial: int, seed: int) -> tuple[float, int, float]:
    """One policy run with router seed `seed` on the inherited workload: its attainment, misses and GPU-seconds
    (what the results keep of a seed other than 0)."""
    if _FORKED_WORKLOAD is None:
        raise RuntimeError("no workload: a seed run outside SeedRuns")
    res = run_policy(_FORKED_WORKLOAD, policy, slo_s, initial, seed=seed)[0]
    return round(ttft_attainment(res, slo_s), 5), misses(res, slo_s), round(res.summary["gpuSeconds"], 1)


class SeedRuns:
    """`_seed_run`s in `jobs` forked processes (0: each run here, when its result is asked for; None: `default_jobs`
    for this workload, said on stderr when memory rather than the CPUs sets it). `submit` returns a function that
    gives the result."""

    def __init__(self, w: Workload, jobs: int | None) -> None:
        if jobs is None:
            jobs, cpus = default_jobs(len(w.requests), available_memory()), default_jobs()
            if jobs < cpus:
                print(f"{w.name}: {jobs} process(es) for the other router seeds instead of {cpus}: each holds "
                      f"~{len(w.requests) * FORK_BYTES_PER_REQUEST / 2**30:.1f} GiB of this workload's run "
                      f"(--jobs N to choose)", file=sys.stderr, flush=True)
        self.w, self.jobs = w, jobs
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> SeedRuns:
        global _FORKED_WORKLOAD
        _FORKED_WORKLOAD = self.w
        if self.jobs > 0:
            self.pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"))
        return self

    def __exit__(self, *exc: object) -> None:
        global _FORKED_WORKLOAD
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        _FORKED_WORKLOAD = None

    def submit(self, policy: str, slo_s: float, initial: int, seed: int) -> Callable[[], tuple[float, int, float]]:
        if self.pool is None:
            return lambda: _seed_run(policy, slo_s, initial, seed)
        return self.pool.submit(_seed_run, policy, slo_s, initial, seed).result


# Bytes one run of a workload holds per request: its per-request records and simulation state, and, in a forked
# process, the workload's pages it copies as it touches them. benchmarks/sim_long_trace.py: peak memory grows
# ~0.9 KB a request for one `sim run` and for autoscale_eval.py (whose own process holds at most two runs).
FORK_BYTES_PER_REQUEST = 1024
MAIN_RUNS_HELD = 2  # this process: the static search's best run and its trial


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where it cannot be read (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_jobs(requests: int | None = None, available: int | None = None) -> int:
    """Processes for the other router seeds' runs: every CPU but the one running seed 0, and, for a workload of
    `requests` requests with `available` bytes of memory free, no more than fit beside this process's own runs
    (FORK_BYTES_PER_REQUEST a request each): on a many-core machine a week-long trace's forks would otherwise
    multiply its memory past the machine's."""
    cpus = max((os.cpu_count() or 1) - 1, 0)
    if not requests or available is None:
        return cpus
    per_run = requests * FORK_BYTES_PER_REQUEST
    return min(cpus, max(0, (available - MAIN_RUNS_HELD * per_run) // per_run))
