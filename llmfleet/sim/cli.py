"""`llmfleet sim run`: replay a trace or a synthetic workload through simulated replicas and routers."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    sim = typer.Typer(help="Fleet simulator: vLLM-like replicas behind routing policies.", no_args_is_help=True)
    app.add_typer(sim, name="sim")

    @sim.command("run", help="Simulate a workload on a fleet with one or more routers; print a table, write JSON/PNG.")
    def run(
        trace: Path | None = typer.Option(None, help="Trace file (Mooncake JSONL or Azure CSV); synthetic when omitted."),
        fmt: str = typer.Option("auto", "--format", help="auto, mooncake, azure."),
        router: list[str] = typer.Option(["least-request", "llmfleet"], help="Routers to compare (repeatable): "
                                         "round-robin, least-request, power-of-two, sglang, llm-d, llmfleet."),
        replicas: int = typer.Option(8, help="Primary replicas."),
        model: str = typer.Option("llama-3-8b", help="Model preset of the primary pool."),
        gpu: str = typer.Option("H200", help="GPU profile."),
        kv_dtype: str = typer.Option("bf16", help="KV-cache dtype."),
        tp: int = typer.Option(1, help="Tensor parallelism per replica."),
        host_kv_gib: float = typer.Option(0.0, help="Host-memory KV tier per replica, GiB (vLLM CPU offloading); 0 = none."),
        student: str | None = typer.Option(None, help="Add a student pool: MODEL:REPLICAS, e.g. llama-3.2-1b:2."),
        time_scale: float = typer.Option(1.0, help="Replay at k x the trace's rate."),
        max_requests: int | None = typer.Option(None, help="Use the first N requests."),
        duration: float = typer.Option(600.0, help="Synthetic workload length, s."),
        rate: float = typer.Option(10.0, help="Synthetic mean rate, requests/s."),
        tenants: int = typer.Option(8, help="Synthetic tenants."),
        ttft_slo_ms: float = typer.Option(2000.0, help="TTFT SLO for attainment/goodput, ms."),
        tpot_slo_ms: float = typer.Option(100.0, help="TPOT SLO, ms."),
        calibration: Path | None = typer.Option(None, help="Step-time calibration JSON (see docs/simulator.md)."),
        seed: int = typer.Option(0, help="Random seed (synthetic workload, randomized routers)."),
        out: Path | None = typer.Option(None, help="Folder for result.json and PNG plots."),
    ) -> None:
        from rich.console import Console
        from rich.table import Table

        from llmfleet.sim.engine import PoolSpec, SimConfig, simulate
        from llmfleet.sim.report import oracle_hit_rate, plot
        from llmfleet.sim.routers import make_router
        from llmfleet.sim.workload import SyntheticSpec, WorkloadError, load_azure, load_mooncake, synthetic

        try:
            if trace is None:
                w = synthetic(SyntheticSpec(duration_s=duration, rate_rps=rate, tenants=tenants, seed=seed))
            else:
                kind = fmt if fmt != "auto" else ("azure" if trace.suffix.lower() == ".csv" else "mooncake")
                if kind not in ("mooncake", "azure"):
                    raise ValueError(f"unknown --format {fmt!r}")
                w = load_mooncake(trace) if kind == "mooncake" else load_azure(trace)
            if max_requests:
                w = w.head(max_requests)
            if time_scale != 1.0:
                w = w.scaled(time_scale)
            if host_kv_gib < 0:
                raise ValueError(f"--host-kv-gib must be >= 0, got {host_kv_gib:g}")
            pools = [PoolSpec(replicas=replicas, model=model, gpu=gpu, kv_dtype=kv_dtype, tensor_parallel=tp,
                              host_kv_gib=host_kv_gib, calibration=str(calibration) if calibration else None)]
            if student:
                sm, _, sn = student.partition(":")
                pools.append(PoolSpec(name="student", role="student", model=sm, gpu=gpu, replicas=int(sn or 1)))
            cfg = SimConfig(pools=pools, ttft_slo_s=ttft_slo_ms / 1e3, tpot_slo_s=tpot_slo_ms / 1e3, seed=seed)
            routers = [make_router(r, seed) for r in router]
            results = [simulate(w, cfg, router=r) for r in routers]
        except (ValueError, OSError, WorkloadError) as e:
            typer.echo(f"llmfleet sim: {str(e).splitlines()[0]}", err=True)
            raise typer.Exit(2) from None
        oracle = oracle_hit_rate(w)
        t = Table(title=f"{w.name}: {len(w.requests)} requests, {replicas} x {model} on {gpu}, "
                        f"oracle hit rate {oracle:.3f}")
        for c in ("router", "hit rate", "TTFT p50", "TTFT p99", "TPOT p50", "e2e p99", "SLO att.", "goodput",
                  "GPU-s", "degraded", "preempt", "balance CV"):
            t.add_column(c)
        for res in results:
            s = res.summary
            t.add_row(res.router, f"{s['prefixHitRate']:.3f}", f"{s['ttft']['p50']:.3f}s", f"{s['ttft']['p99']:.3f}s",
                      f"{(s['tpot']['p50'] or 0) * 1e3:.1f}ms", f"{s['e2e']['p99']:.2f}s", f"{s['sloAttainment']:.3f}",
                      f"{s['goodputRps']:.2f}/s", f"{s['gpuSeconds']:.0f}", f"{s['degradedFraction']:.3f}",
                      str(s["preemptions"]), f"{s['balance']['servedCv']:.2f}")
        Console(width=200).print(t)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "result.json").write_text(json.dumps(
                {"oracleHitRate": oracle, "results": [r.to_json() for r in results]}, indent=1))
            for p in plot(results, out, w.name):
                typer.echo(f"wrote {p}")
            typer.echo(f"wrote {out / 'result.json'}")
