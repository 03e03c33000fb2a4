"""`llmfleet sim run` / `llmfleet sim hindsight` / `llmfleet sim plan`: replay a trace or a synthetic workload through
simulated replicas, routers and (optionally) the production autoscaler; the cheapest schedule a clairvoyant scaler
finds; the planner's fleet for a trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from llmfleet.api.cli import require_number
from llmfleet.api.loader import InputFileError

if TYPE_CHECKING:
    from llmfleet.api.trainingjob import ModelShape
    from llmfleet.sim.types import PoolSpec, SimResult
    from llmfleet.sim.workload import Workload

AUTOSCALERS = ("slo", "queue", "static")
# trace options shared by `run`, `hindsight` and `plan` (the formats: llmfleet.sim.traces.TRACE_FORMATS, not imported
# here so that `llmfleet --help` does not load numpy)
TRACE_HELP = "Trace file (Mooncake or Qwen-Bailian JSONL, Azure or BurstGPT CSV); synthetic when omitted."
FORMAT_HELP = "auto, mooncake, bailian, azure, burstgpt."
# workload options shared by `run` and `hindsight`
KvBlockSize = Annotated[int | None, typer.Option(
    "--kv-block-size", help="The simulated engine's KV block size in tokens, a multiple of the workload's: its blocks "
    "are merged into blocks of this size (vLLM's --block-size; a 16-token-block trace simulates several times faster "
    "at 64 or 128). Default: the workload's own.")]
TimeUnit = Annotated[str | None, typer.Option(
    "--time-unit", help="A JSONL trace's timestamp unit, ms or s. Default: the format's (Mooncake ms, Qwen-Bailian s), "
    "or s where sub-unit gaps between stamps tell seconds.")]
TimeScale = Annotated[float, typer.Option(help="Replay at k x the workload's rate (arrival times divided by k: 2 "
                                                 "doubles the rate, 0.5 halves it); k > 0.")]
MaxRequests = Annotated[int | None, typer.Option(help="Use the first N requests.")]
TraceSeconds = Annotated[float | None, typer.Option(help="Use a trace's first S seconds (from its earliest request; "
                                                         "only those are held in memory).")]
Duration = Annotated[float, typer.Option(help="Synthetic workload length, s.")]
Rate = Annotated[float, typer.Option(help="Synthetic mean rate, requests/s.")]
Tenants = Annotated[int, typer.Option(help="Synthetic tenants.")]
# `run`, `hindsight` and `plan`: a model no preset names
SHAPE_HELP = ("The model as a Hugging Face config.json (or the model folder holding one) or a YAML/JSON ModelShape, "
              "for a model no preset names; overrides --model.")
ShapeFile = Annotated[Path | None, typer.Option("--shape", help=SHAPE_HELP)]


def _model(model: str, shape: Path | None, flag: str = "--shape") -> ModelShape:
    """`shape`'s shape (plan.models.load_shape), else `model`'s preset; a bad file is a ValueError naming `flag`."""
    from llmfleet.plan.models import get_model, load_shape

    try:
        return load_shape(shape) if shape else get_model(model)
    except ValueError as e:
        raise ValueError(f"{flag} {e}" if shape else str(e)) from None


def _fail(e: BaseException) -> typer.Exit:
    typer.echo(f"llmfleet sim: {str(e).splitlines()[0] if str(e) else type(e).__name__}", err=True)
    return typer.Exit(2)


def _workload(trace: Path | None, fmt: str, duration: float, rate: float, tenants: int, seed: int,
              max_requests: int | None, time_scale: float, trace_seconds: float | None = None,
              kv_block_size: int | None = None, time_unit: str | None = None) -> Workload:
    from llmfleet.sim.traces import load_trace
    from llmfleet.sim.workload import SyntheticSpec, rate_scale, synthetic

    rate_scale(time_scale, "--time-scale")  # before loading a trace: a bad flag fails at once
    if kv_block_size is not None:
        require_number("--kv-block-size", kv_block_size, 1, inclusive=True)
    require_number("--seed", seed, inclusive=True)
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"--max-requests must be >= 1, got {max_requests}")
    if trace_seconds is not None:
        require_number("--trace-seconds", trace_seconds)
        if trace is None:
            raise ValueError("--trace-seconds cuts a trace: give --trace (a synthetic workload has --duration)")
    if time_unit is not None and trace is None:
        raise ValueError("--time-unit reads a trace's timestamps: give --trace")
    if trace is None:
        require_number("--duration", duration)
        require_number("--rate", rate)
        require_number("--tenants", tenants, 1, inclusive=True)
        w = synthetic(SyntheticSpec(duration_s=duration, rate_rps=rate, tenants=tenants, seed=seed))
        if max_requests is not None:
            w = w.head(max_requests)
    else:  # only the first N requests (or S seconds) are held: a week-long trace's first hour takes an hour's memory
        w = load_trace(trace, fmt, seconds=trace_seconds, requests=max_requests, kv_block_size=kv_block_size,
                       time_unit=time_unit)
    if time_scale != 1.0:
        w = w.scaled(time_scale)
    if kv_block_size is not None:
        w = w.reblocked(kv_block_size)
    if not w.requests:
        raise ValueError("the workload has no requests")
    return w


def _fewest_static(w: Workload, pool: PoolSpec, ttft_slo_s: float, target: float, seed: int,
                   upper: int = 64) -> tuple[int, SimResult]:
    """Fewest static replicas of `pool` behind the llmfleet router that meet `target` (oracle.fewest_static)."""
    from dataclasses import replace

    from llmfleet.sim.engine import simulate
    from llmfleet.sim.oracle import fewest_static
    from llmfleet.sim.routers import LlmfleetRouter
    from llmfleet.sim.types import SimConfig

    def run(n: int, stop_below: float | None) -> SimResult:
        cfg = SimConfig(pools=[replace(pool, replicas=n, min_replicas=n, max_replicas=n)], ttft_slo_s=ttft_slo_s,
                        seed=seed, stop_below_attainment=stop_below)
        return simulate(w, cfg, router=LlmfleetRouter(seed=seed))

    return fewest_static(run, ttft_slo_s, target=target, upper=upper)


def engine_kv_cache_dtype(kv_dtype: str) -> str:
    """`--kv-dtype` as the InferenceService's vllm.kvCacheDtype (the fleet `--autoscaler` runs): a 16-bit dtype
    is the engine's auto (the model's), fp8 is itself; the engine has no other KV dtype, so anything else is a
    ValueError naming the option."""
    from llmfleet.api.inferenceservice import KV_CACHE_DTYPES
    from llmfleet.plan.models import dtype_bytes

    if kv_dtype.lower() in KV_CACHE_DTYPES and kv_dtype.lower() != "auto":
        return kv_dtype.lower()
    if dtype_bytes(kv_dtype) == 2.0:
        return "auto"
    raise ValueError(f"--kv-dtype {kv_dtype} with --autoscaler: the engine's KV cache is 16-bit (auto) or fp8")


def register(app: typer.Typer) -> None:
    sim = typer.Typer(help="Fleet simulator: vLLM-like replicas behind routing policies.", no_args_is_help=True)
    app.add_typer(sim, name="sim")

    @sim.command("run", help="Simulate a workload on a fleet with one or more routers, or with the production "
                             "autoscaler (--autoscaler); print a table, write JSON/PNG.")
    def run(
        trace: Path | None = typer.Option(None, help=TRACE_HELP),
        fmt: str = typer.Option("auto", "--format", help=FORMAT_HELP),
        router: list[str] | None = typer.Option(None, help="Routers to compare (repeatable): round-robin, "
                                                "least-request, power-of-two, sglang, llm-d, llmfleet (default: "
                                                "least-request and llmfleet). With --autoscaler: llmfleet only."),
        autoscaler: str | None = typer.Option(None, help="Run the production autoscaler: slo, queue or static "
                                                         "(the InferenceService's spec.autoscaling.policy)."),
        replicas: int = typer.Option(8, help="Primary replicas (the start size with --autoscaler)."),
        min_replicas: int | None = typer.Option(None, help="With --autoscaler: primary minReplicas (default 1)."),
        max_replicas: int | None = typer.Option(None, help="With --autoscaler: primary maxReplicas (default 64)."),
        decision_phase: float = typer.Option(0.0, help="With --autoscaler: seconds after the first arrival, below the "
                                                       "decision interval, at which the regular decisions fall (one "
                                                       "result is one phase of the timer; compare several)."),
        model: str = typer.Option("llama-3-8b", help="Model preset of the primary pool."),
        shape: Path | None = typer.Option(None, help=SHAPE_HELP + " With --autoscaler the pool has no preset: the "
                                          "autoscaler seeds it from this shape, as from the shape its replicas "
                                          "report, and the router measures its prefill rate."),
        max_model_len: int | None = typer.Option(None, help="Context the engine accepts (prompt + output tokens); "
                                                            "default: the model's. Longer requests are rejected."),
        clip_context: bool = typer.Option(False, help="Clip requests longer than the context instead of rejecting them."),
        gpu: str = typer.Option("H200", help="GPU profile."),
        kv_dtype: str = typer.Option("bf16", help="KV-cache dtype."),
        quantization: str | None = typer.Option(None, help="The primary's weight quantization (the "
                                                "InferenceService's model.quantization): fp8 computes at the GPU's "
                                                "fp8 peak; awq, gptq, bitsandbytes and compressed-tensors as bf16."),
        tp: int = typer.Option(1, help="Tensor parallelism per replica."),
        host_kv_gib: float = typer.Option(0.0, help="Host-memory KV tier per replica, GiB (vLLM CPU offloading); 0 = none."),
        student: str | None = typer.Option(None, help="Add a student pool: MODEL:REPLICAS, e.g. llama-3.2-1b:2 "
                                                      "(MODEL a preset, or a shape file or model folder as --shape "
                                                      "takes: a distilled student no preset names) "
                                                      "(with --autoscaler: REPLICAS is its minReplicas, 0 = scale to zero)."),
        student_mig: str | None = typer.Option(None, help="Run each student replica on one MIG instance of this "
                                                          "profile of --gpu (e.g. 3g.71gb on H200); its GPU-seconds "
                                                          "count at the slice's share of the GPU."),
        time_scale: TimeScale = 1.0,
        max_requests: MaxRequests = None,
        trace_seconds: TraceSeconds = None,
        kv_block_size: KvBlockSize = None,
        time_unit: TimeUnit = None,
        duration: Duration = 600.0,
        rate: Rate = 10.0,
        tenants: Tenants = 8,
        ttft_slo_ms: float = typer.Option(2000.0, help="TTFT SLO for attainment/goodput, ms."),
        tpot_slo_ms: float = typer.Option(100.0, help="TPOT SLO, ms."),
        calibration: Path | None = typer.Option(None, help="Step-time calibration JSON (see docs/simulator.md)."),
        seed: int = typer.Option(0, help="Random seed (synthetic workload, randomized routers)."),
        out: Path | None = typer.Option(None, help="Folder for result.json and PNG plots."),
    ) -> None:
        from llmfleet.api.inferenceservice import QUANTIZATION_METHODS
        from llmfleet.plan.hardware import get_gpu
        from llmfleet.plan.models import tensor_parallel_problem, weight_dtype_for
        from llmfleet.sim.engine import simulate
        from llmfleet.sim.production import make_service, simulate_service
        from llmfleet.sim.report import oracle_hit_rate, plot, print_table
        from llmfleet.sim.routers import make_router
        from llmfleet.sim.types import PoolSpec, SimConfig
        from llmfleet.sim.workload import WorkloadError

        timeline = None
        try:
            if replicas < 1:
                raise ValueError(f"--replicas must be >= 1, got {replicas}")
            if host_kv_gib < 0:
                raise ValueError(f"--host-kv-gib must be >= 0, got {host_kv_gib:g}")
            require_number("--ttft-slo-ms", ttft_slo_ms)
            require_number("--tpot-slo-ms", tpot_slo_ms)
            require_number("--tp", tp, 1, inclusive=True)
            if quantization is not None and quantization not in QUANTIZATION_METHODS:
                raise ValueError(f"unknown --quantization {quantization!r}; known: {', '.join(QUANTIZATION_METHODS)}")
            primary = _model(model, shape)
            if tp_problem := tensor_parallel_problem(primary, tp):
                raise ValueError(f"--tp: {tp_problem}")
            if max_model_len is not None and max_model_len < 2:
                raise ValueError(f"--max-model-len must be >= 2, got {max_model_len}")
            sm: str | ModelShape | None = None
            sn = 0
            if student:
                name, _, count = student.partition(":")
                # a file or folder: the student's shape (a model no preset names: a distilled one); else a preset
                sm = _model("", Path(name), "--student") if Path(name).exists() else name
                try:
                    sn = int(count or 1)
                except ValueError:
                    raise ValueError(f"--student must be MODEL:REPLICAS, got {student!r}") from None
                if sn < 0:
                    raise ValueError(f"--student replicas must be >= 0, got {sn}")
            require_number("--decision-phase", decision_phase, 0.0, inclusive=True)
            for flag, value in (("--decision-phase", decision_phase or None), ("--min-replicas", min_replicas),
                                ("--max-replicas", max_replicas)):
                if value is not None and autoscaler is None:
                    raise ValueError(f"{flag} needs --autoscaler (a fleet without it keeps --replicas)")
            if student_mig and not sm:
                raise ValueError("--student-mig needs --student")
            if student_mig:
                get_gpu(gpu, mig=student_mig)  # a profile --gpu does not have: one line before the trace loads
            w = _workload(trace, fmt, duration, rate, tenants, seed, max_requests, time_scale, trace_seconds,
                          kv_block_size, time_unit)
            overflow: Literal["reject", "clip"] = "clip" if clip_context else "reject"
            if autoscaler is not None:
                if autoscaler not in AUTOSCALERS:
                    raise ValueError(f"unknown --autoscaler {autoscaler!r}; known: {', '.join(AUTOSCALERS)}")
                if router and set(router) != {"llmfleet"}:
                    raise ValueError("--autoscaler runs the production router (llmfleet); drop --router")
                # unset bounds: make_service's (1 and 64)
                bounds: dict[str, Any] = {k: v for k, v in (("min_replicas", min_replicas),
                                                            ("max_replicas", max_replicas)) if v is not None}
                isvc = make_service(policy=autoscaler, ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=tpot_slo_ms,
                                    replicas=replicas, model=None if shape else model, gpu=gpu,
                                    max_model_len=max_model_len,
                                    quantization=quantization, tensor_parallel=tp,
                                    kv_cache_dtype=engine_kv_cache_dtype(kv_dtype), kv_offload_gib=host_kv_gib,
                                    student=sm, student_min=sn, student_mig=student_mig, **bounds)
                interval = isvc.spec.autoscaling.interval_seconds
                if decision_phase >= interval:
                    raise ValueError(f"--decision-phase must be below the decision interval ({interval:g} s), "
                                     f"got {decision_phase:g}")
                shapes = {k: v for k, v in (("primary", primary if shape else None), ("small", sm))
                          if v is not None and not isinstance(v, str)}
                res, hook = simulate_service(w, isvc, seed=seed, context_overflow=overflow,
                                             decision_phase_s=decision_phase,
                                             calibration=str(calibration) if calibration else None, shapes=shapes)
                res.router = f"llmfleet + {autoscaler}"
                results = [res]
                timeline = hook.timeline if hook else None
            else:
                pools = [PoolSpec(replicas=replicas, model=primary if shape else model, gpu=gpu, kv_dtype=kv_dtype,
                                  tensor_parallel=tp,
                                  weight_dtype=weight_dtype_for(quantization),
                                  host_kv_gib=host_kv_gib, max_model_len=max_model_len,
                                  calibration=str(calibration) if calibration else None)]
                if sm:
                    pools.append(PoolSpec(name="student", role="student", model=sm, gpu=gpu, mig=student_mig,
                                          replicas=sn))
                cfg = SimConfig(pools=pools, ttft_slo_s=ttft_slo_ms / 1e3, tpot_slo_s=tpot_slo_ms / 1e3, seed=seed,
                                context_overflow=overflow)
                results = [simulate(w, cfg, router=make_router(r, seed)) for r in router or ("least-request", "llmfleet")]
        except RecursionError:  # a trace line nested deeper than the JSON decoder goes: one line, exit 2
            raise InputFileError(str(trace), "nested too deeply to parse") from None
        except (ValueError, OSError, WorkloadError) as e:
            raise _fail(e) from None
        oracle = oracle_hit_rate(w)
        scaled = f", {autoscaler} autoscaler from {replicas}" if autoscaler else ""
        if autoscaler and decision_phase:
            scaled += f" (decisions at phase {decision_phase:g} s)"
        # the span shows a trace's timestamps read in the wrong unit (1,000x off) at a glance
        served = f"{shape} ({primary.layers} layers, width {primary.hidden})" if shape else model
        print_table(f"{w.name}: {len(w.requests)} requests{w.skipped_note} over {w.duration:,.1f} s, "
                    f"{replicas} x {served} on {gpu}{scaled}, {w.block_size}-token blocks, oracle hit rate {oracle:.3f}",
                    results, ttft_slo_ms / 1e3)
        if timeline:
            peak = {k: max(x[k] for x in timeline) for k in timeline[0] if k not in ("t", "why")}
            actions = sum(1 for a, b in zip(timeline, timeline[1:], strict=False)
                          if any(a[k] != b[k] for k in peak))
            typer.echo("autoscaler: peak replicas " + ", ".join(f"{k} {v}" for k, v in peak.items())
                       + f"; {actions} changes of the desired sizes")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            doc = {"oracleHitRate": oracle, "results": [r.to_json() for r in results]}
            if timeline:
                doc["autoscalerTimeline"] = timeline
            (out / "result.json").write_text(json.dumps(doc, indent=1))
            for p in plot(results, out, w.name):
                typer.echo(f"wrote {p}")
            typer.echo(f"wrote {out / 'result.json'}")

    @sim.command("hindsight", help="The cheapest replica schedule a clairvoyant scaler finds for a workload "
                                   "(llmfleet.sim.oracle): a replica count per window meeting the TTFT target.")
    def hindsight(
        trace: Path | None = typer.Option(None, help=TRACE_HELP),
        fmt: str = typer.Option("auto", "--format", help=FORMAT_HELP),
        start_replicas: int | None = typer.Option(None, help="Replicas in every window to start from; must meet the "
                                                            "target. Default: the fewest static replicas that do "
                                                            "(found by simulation, up to 64)."),
        model: str = typer.Option("llama-3-8b", help="Model preset."),
        shape: ShapeFile = None,
        max_model_len: int | None = typer.Option(None, help="Context the engine accepts; default: the model's."),
        gpu: str = typer.Option("H200", help="GPU profile."),
        cold_start_s: float = typer.Option(60.0, help="Replica start time, s."),
        window_s: float = typer.Option(60.0, help="Schedule window, s."),
        target: float = typer.Option(0.99, help="TTFT attainment to keep over the whole run."),
        ttft_slo_ms: float = typer.Option(2000.0, help="TTFT SLO, ms."),
        instant: bool = typer.Option(False, help="Replicas ready at once (no cold start): a looser estimate."),
        order: list[str] = typer.Option(["highest"], help="Window orders, one descent each: highest, forward, backward."),
        time_scale: TimeScale = 1.0,
        max_requests: MaxRequests = None,
        trace_seconds: TraceSeconds = None,
        kv_block_size: KvBlockSize = None,
        time_unit: TimeUnit = None,
        duration: Duration = 600.0,
        rate: Rate = 10.0,
        tenants: Tenants = 8,
        seed: int = typer.Option(0, help="Random seed (synthetic workload, router ties)."),
        out: Path | None = typer.Option(None, help="Write the schedule as JSON here."),
    ) -> None:
        from dataclasses import replace
        from functools import partial

        from llmfleet.sim.oracle import hindsight_schedule
        from llmfleet.sim.routers import LlmfleetRouter
        from llmfleet.sim.types import PoolSpec
        from llmfleet.sim.workload import WorkloadError

        try:
            if start_replicas is not None and start_replicas < 1:
                raise ValueError(f"--start-replicas must be >= 1, got {start_replicas}")
            if not 0 < target <= 1:
                raise ValueError(f"--target must be in (0, 1], got {target:g}")
            require_number("--ttft-slo-ms", ttft_slo_ms)
            require_number("--window-s", window_s)
            require_number("--cold-start-s", cold_start_s, inclusive=True)
            if bad := [o for o in order if o not in ("highest", "forward", "backward")]:
                raise ValueError(f"unknown --order {bad[0]!r}; known: highest, forward, backward")
            w = _workload(trace, fmt, duration, rate, tenants, seed, max_requests, time_scale, trace_seconds,
                          kv_block_size, time_unit)
            pool = PoolSpec(model=_model(model, shape) if shape else model, gpu=gpu, cold_start_s=cold_start_s,
                            max_model_len=max_model_len)
            if start_replicas is None:
                start_replicas, _ = _fewest_static(w, pool, ttft_slo_ms / 1e3, target, seed)
                typer.echo(f"start: {start_replicas} static replicas, the fewest that meet {target:g} of the TTFT SLO")
            pool = replace(pool, max_replicas=start_replicas)
            found = hindsight_schedule(w, pool, ttft_slo_ms / 1e3, start_replicas,
                                       router=partial(LlmfleetRouter, seed=seed), target=target, window_s=window_s,
                                       instant=instant, orders=tuple(order))  # type: ignore[arg-type]
        except RecursionError:  # a trace line nested deeper than the JSON decoder goes: one line, exit 2
            raise InputFileError(str(trace), "nested too deeply to parse") from None
        except (ValueError, OSError, WorkloadError) as e:
            raise _fail(e) from None
        typer.echo(f"{w.name}: {len(w.requests)} requests; schedule per {window_s:g} s from {start_replicas}: "
                   f"{' '.join(map(str, found.replicas))}")
        typer.echo(f"attainment {found.attainment:.4f} (target {target:g}), {found.gpu_seconds:.0f} GPU-s, "
                   f"{found.simulations} replays")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"workload": w.name, "windowS": window_s, "instant": instant,
                                       "replicas": list(found.replicas), "attainment": found.attainment,
                                       "gpuSeconds": found.gpu_seconds, "simulations": found.simulations,
                                       "startReplicas": start_replicas, "ttftSloMs": ttft_slo_ms}, indent=1))
            typer.echo(f"wrote {out}")

    @sim.command("plan", help="The planner's replicas for a trace: its busiest minute's rate, its mean output and "
                              "its prompts, each priced on its own (llmfleet plan, fed from the trace).")
    def plan(
        trace: Path | None = typer.Option(None, help=TRACE_HELP),
        fmt: str = typer.Option("auto", "--format", help=FORMAT_HELP),
        model: str = typer.Option("llama-3-8b", help="Model preset."),
        shape: ShapeFile = None,
        gpu: str = typer.Option("H200", help="GPU profile."),
        kv_dtype: str = typer.Option("bf16", help="KV-cache dtype."),
        tp: int = typer.Option(1, help="Tensor parallelism per replica."),
        ttft_ms: float = typer.Option(1000.0, help="TTFT p95 SLO, ms."),
        tpot_ms: float = typer.Option(100.0, help="TPOT p95 SLO, ms."),
        hit_rate: float = typer.Option(0.0, help="Prefix-cache hit rate of prompt tokens to plan with, 0-1."),
        reuse: bool = typer.Option(False, help="Plan with the hit rate the trace's own prefix reuse gives the planned "
                                               "fleet (one pooled LRU cache of its replicas' KV: an upper bound on "
                                               "hits, so the fewest replicas); instead of --hit-rate."),
        first_minute: bool = typer.Option(False, help="Plan for the first minute's rate and requests (what is known "
                                                      "before any history) instead of the busiest minute's."),
        simulate_fleet: bool = typer.Option(False, "--simulate", help="Also replay the trace on static fleets and "
                                            "report the fewest replicas that meet --target of the TTFT SLO (the "
                                            "llmfleet router, the model's context; up to 64 replicas)."),
        target: float = typer.Option(0.99, help="With --simulate: the share of requests within the TTFT SLO."),
        max_model_len: int | None = typer.Option(None, help="Context the engine accepts (--simulate; and which "
                                                            "requests are servable); default: "
                                                            "the model's. Longer requests are rejected."),
        time_scale: TimeScale = 1.0,
        max_requests: MaxRequests = None,
        trace_seconds: TraceSeconds = None,
        kv_block_size: KvBlockSize = None,
        time_unit: TimeUnit = None,
        duration: Duration = 600.0,
        rate: Rate = 10.0,
        tenants: Tenants = 8,
        seed: int = typer.Option(0, help="Random seed (synthetic workload)."),
        json_out: Path | None = typer.Option(None, "--json", help="Write the plan as JSON to this file ('-' for stdout only)."),
    ) -> None:
        from dataclasses import asdict

        from llmfleet.plan.hardware import get_gpu
        from llmfleet.plan.models import tensor_parallel_problem
        from llmfleet.sim.oracle import attainment
        from llmfleet.sim.planning import over_slo_alone, plan_with_reuse, plan_workload
        from llmfleet.sim.types import PoolSpec
        from llmfleet.sim.workload import WorkloadError

        try:
            require_number("--ttft-ms", ttft_ms)
            require_number("--tpot-ms", tpot_ms)
            require_number("--tp", tp, 1, inclusive=True)
            if reuse and hit_rate:
                raise ValueError("--reuse finds the hit rate itself: leave out --hit-rate")
            if not 0 < target <= 1:
                raise ValueError(f"--target must be in (0, 1], got {target:g}")
            if max_model_len is not None and max_model_len < 2:
                raise ValueError(f"--max-model-len must be >= 2, got {max_model_len}")
            m, g = _model(model, shape), get_gpu(gpu)
            if tp_problem := tensor_parallel_problem(m, tp):
                raise ValueError(f"--tp: {tp_problem}")
            w = _workload(trace, fmt, duration, rate, tenants, seed, max_requests, time_scale, trace_seconds,
                          kv_block_size, time_unit)
            if reuse:
                found = plan_with_reuse(w, m, g, ttft_slo_s=ttft_ms / 1e3, tpot_slo_s=tpot_ms / 1e3,
                                        first_minute=first_minute, kv_dtype=kv_dtype, tensor_parallel=tp)
            else:
                found = plan_workload(w, m, g, ttft_slo_s=ttft_ms / 1e3, tpot_slo_s=tpot_ms / 1e3, hit_rate=hit_rate,
                                      first_minute=first_minute, kv_dtype=kv_dtype, tensor_parallel=tp)
            simulated = None
            pool = PoolSpec(model=m if shape else model, gpu=gpu, kv_dtype=kv_dtype, tensor_parallel=tp,
                            max_model_len=max_model_len)
            over, servable = over_slo_alone(w, pool, ttft_ms / 1e3)
            if simulate_fleet:
                n, res = _fewest_static(w, pool, ttft_ms / 1e3, target, seed)
                simulated = {"replicas": n, "attainment": round(attainment(res, ttft_ms / 1e3), 5),
                             "target": target, "gpuSeconds": round(float(res.summary["gpuSeconds"]), 1),
                             "rejectedContext": int(res.summary.get("rejectedContext") or 0)}
        except RecursionError:  # a trace line nested deeper than the JSON decoder goes: one line, exit 2
            raise InputFileError(str(trace), "nested too deeply to parse") from None
        except (ValueError, OSError, WorkloadError) as e:
            raise _fail(e) from None
        doc = {"workload": found.workload, "requests": found.requests, "minutes": found.minutes,
               "rateRps": round(found.rate_rps, 4), "meanRateRps": round(found.mean_rate_rps, 4),
               "firstMinute": first_minute, "model": str(shape) if shape else model, "gpu": g.name,
               "shape": asdict(found.shape),
               "hitRate": round(found.shape.prefix_hit_rate, 4), "pooledCacheBlocks": found.cache_blocks,
               "replicas": found.plan.replicas, "capacity": asdict(found.plan.capacity),
               "reasoning": found.plan.reasoning, "simulated": simulated,
               "overSloAlone": {"requests": over, "servable": servable}}
        if json_out is not None and str(json_out) == "-":
            typer.echo(json.dumps(doc, indent=2))
            return
        which = "first minute" if first_minute else "busiest minute"
        typer.echo(f"{found.workload}: {len(w.requests)} requests, {found.minutes} whole minutes; {which} "
                   f"{found.rate_rps:.2f} req/s (mean {found.mean_rate_rps:.2f})")
        typer.echo(f"planned for {found.rate_rps:.2f} req/s, {found.shape.input_tokens:,} tokens in (mean of "
                   f"{found.requests:,} prompts, each priced on its own) / {found.shape.output_tokens:,} out on "
                   f"{model} / {g.name}: {found.plan.replicas} replica{'s' if found.plan.replicas != 1 else ''}")
        if found.cache_blocks is not None:
            typer.echo(f"prefix hits {found.shape.prefix_hit_rate:.1%}: the trace's reuse in one LRU cache of "
                       f"{found.cache_blocks:,} blocks of {w.block_size} tokens, the planned replicas' KV together")
        for line in found.plan.reasoning:
            typer.echo(f"  {line}")
        typer.echo(f"over the TTFT SLO on any fleet: {over:,} of {servable:,} servable requests "
                   f"({over / max(servable, 1):.2%}): their prefill alone, on an idle replica with every earlier prefix "
                   f"cached, takes longer than {ttft_ms:g} ms")
        if simulated is not None:
            met = "meet" if simulated["attainment"] >= target else "miss"
            typer.echo(f"simulated: {simulated['replicas']} static replicas {met} {target:g} of the TTFT SLO "
                       f"({simulated['attainment']:.2%}, {simulated['gpuSeconds']:,.0f} GPU-s; "
                       f"{simulated['rejectedContext']} requests longer than the context rejected)")
        if json_out is not None:
            json_out.write_text(json.dumps(doc, indent=2))
            typer.echo(f"wrote {json_out}")
