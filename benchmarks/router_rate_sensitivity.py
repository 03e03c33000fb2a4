"""How much the llmfleet router's SLO attainment depends on the prefill rate it prices work at.

    python benchmarks/router_rate_sensitivity.py             # ~11 min on the dev VM; writes
                                                             # benchmarks/results/router_rate_sensitivity.json
    python benchmarks/router_rate_sensitivity.py --quick     # three rates

The estimated-ttft scorer prices a request's prefill at a rate: configured, measured, the planner's price for the
pool, or the H200-class default (30,000 tokens/s; docs/router.md, `rate(r)`). Real replicas are never exactly at the default, so the routing must
not hinge on it. The fleet is the autoscaler benchmark's static fleet at the 10x spike's peak (8 Llama-3.1-8B
replicas on simulated H200s, the 1 s TTFT SLO, autoscale_setup.py's service with the production router's
mapping); every llmfleet row prices prefill at the rate in its column (`ReplicaState.prefill_tokens_per_s`).
Rows: llmfleet's default scorers; the same with the work externality off (`work_externality=0`: plain
estimated TTFT); llmfleet measuring the rate from its own first bytes (one value, the column does not apply);
llm-d's weighted scorers and least-request (they price nothing: one value each).

Slower hardware: what one fixed rate does where the replicas prefill slower than the H200 the default was set
for. The same spike on static fleets of other hardware (`SLOW_FLEETS`: Llama-3.1-8B on A100s, the planner's
prefill rate there 0.32x an H200's; Llama-3-70B on pairs of H200s, tensor parallel 2, 0.22x), with the arrivals
spread and the TTFT SLO lengthened by that ratio (the same load and deadline relative to the hardware), at two
fleet sizes each around where the fleet stops meeting the SLO. Rows: llmfleet as production routes it now (the
pool priced by the planner, llmfleet.router.prefill_price), llmfleet at the fixed H200-class default (what every
GPU pool got before), llmfleet measuring the rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from autoscale_setup import ROOT, service, spike, ttft_attainment  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from llmfleet.api import InferenceService  # noqa: E402
from llmfleet.api.contracts import MODEL_PRESET_ANNOTATION  # noqa: E402
from llmfleet.router.config import router_config_from_service  # noqa: E402
from llmfleet.router.plugins import EstimatedTTFTScorer  # noqa: E402
from llmfleet.router.prefill_price import DEFAULT_PREFILL_TOKENS_PER_S, pool_prefill_rate  # noqa: E402
from llmfleet.sim.engine import simulate  # noqa: E402
from llmfleet.sim.production import pool_specs  # noqa: E402
from llmfleet.sim.routers import LlmfleetRouter, make_router  # noqa: E402
from llmfleet.sim.types import SimConfig  # noqa: E402

RATES = (5_000.0, 10_000.0, 15_000.0, 20_000.0, 25_000.0, 30_000.0, 35_000.0, 40_000.0, 50_000.0, 60_000.0, 100_000.0,
         150_000.0, 300_000.0)
QUICK_RATES = (20_000.0, 30_000.0, 40_000.0)
REPLICAS, SLO_S = 8, 1.0


# (model preset, GPU, tensor parallelism, fleet sizes): hardware slower than the reference H200
SLOW_FLEETS = (("llama-3.1-8b", "A100", 1, (10, 12)), ("llama-3-70b", "H200", 2, (7, 8)))


def static_fleet(slo_s: float = SLO_S, replicas: int = REPLICAS) -> Any:
    """The autoscaler benchmark's service as a static fleet of `replicas` primaries (no student)."""
    return service("static", slo_s, replicas, with_student=False)


def fleet_on(model: str, gpu: str, tp: int, slo_s: float, replicas: int) -> Any:
    """`static_fleet` with its primaries serving preset `model` on `gpu`, `tp` GPUs each (tensor parallel)."""
    doc = static_fleet(slo_s, replicas).model_dump(by_alias=True, exclude_none=True)
    doc["metadata"]["annotations"][MODEL_PRESET_ANNOTATION] = model
    doc["spec"]["resources"].update({"gpus": tp, "gpuType": gpu})
    doc["spec"].setdefault("vllm", {})["tensorParallelSize"] = tp
    return InferenceService.model_validate(doc)


def run(w: Any, router: Any, isvc: Any = None, slo_s: float = SLO_S) -> dict[str, Any]:
    """The static fleet of the autoscaler benchmark (or `isvc`'s), with `router` in place of the default one."""
    isvc = isvc if isvc is not None else static_fleet()
    cfg = SimConfig(pools=pool_specs(isvc, None), ttft_slo_s=slo_s, tpot_slo_s=isvc.spec.slo.tpot_p95_ms / 1e3)
    res = simulate(w, cfg, router=router)
    s = res.summary
    row: dict[str, Any] = {"attainment": ttft_attainment(res, slo_s), "hitRate": s["prefixHitRate"],
                           "ttftP50S": s["ttft"]["p50"], "ttftP99S": s["ttft"]["p99"]}
    if isinstance(router, LlmfleetRouter):
        for scorer, _ in router.pipeline.scorers:
            if not isinstance(scorer, EstimatedTTFTScorer) or "primary" not in scorer.fits:
                continue
            fit = scorer.fits["primary"]
            est = fit.estimate(scorer.default_rate)
            if est is not None:  # what the measuring router learned: overhead per request and marginal rate
                row["measuredFit"] = {"overheadS": est[0], "tokensPerS": est[1], "samples": fit.samples}
    return row


def llmfleet(rate: float | None, externality: float | None = None, measure: bool | None = False,
             isvc: Any = None) -> LlmfleetRouter:
    """llmfleet's router for the fleet (`isvc`, else the benchmark's), with the production mapping of its service
    (the pools' prices included); `rate` set: every replica priced at it."""
    isvc = isvc if isvc is not None else static_fleet()
    rc = router_config_from_service(isvc, endpoints={})
    return LlmfleetRouter(weights=dict(isvc.spec.router.scorers), fallback=rc.fallback, prefill_tokens_per_s=rate,
                          measure_prefill_rate=measure, sole_holder_discount=rc.sole_holder_discount,
                          work_externality=externality,
                          pool_prefill_rates={p.name: p.prefill_tokens_per_s for p in rc.pools if p.prefill_tokens_per_s})


def slow_fleet_rows(w: Any) -> list[dict[str, Any]]:
    """Each of SLOW_FLEETS at each of its sizes: `w` spread by the hardware's prefill ratio to the reference, the
    SLO lengthened by it; llmfleet priced by the planner, at the fixed default, and measuring."""
    out = []
    for model, gpu, tp, sizes in SLOW_FLEETS:
        price = pool_prefill_rate(model, gpu, tensor_parallel=tp)
        if price is None or price >= DEFAULT_PREFILL_TOKENS_PER_S:
            raise SystemExit(f"the planner does not price {model} on {gpu} below the default")
        k = price / DEFAULT_PREFILL_TOKENS_PER_S
        slo_s, spread = SLO_S / k, w.scaled(k)
        for n in sizes:
            isvc = fleet_on(model, gpu, tp, slo_s, n)
            rows = {"llmfleet (planner's price)": run(spread, llmfleet(None, measure=None, isvc=isvc), isvc, slo_s),
                    "llmfleet, fixed default rate": run(spread, llmfleet(DEFAULT_PREFILL_TOKENS_PER_S, isvc=isvc),
                                                        isvc, slo_s),
                    "llmfleet, measured rate": run(spread, llmfleet(None, measure=True, isvc=isvc), isvc, slo_s)}
            out.append({"model": model, "gpu": gpu, "tensorParallel": tp, "replicas": n, "pricedTokensPerS": price,
                        "rateScale": k, "ttftSloS": slo_s, "results": rows})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three rates")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/router_rate_sensitivity.json"))
    args = ap.parse_args()
    rates = QUICK_RATES if args.quick else RATES
    name, w = spike(10.0, quick=False)
    t0 = time.time()
    rows: dict[str, dict[str, Any]] = {"llmfleet": {}, "llmfleet, work externality off": {}}
    for r in rates:
        rows["llmfleet"][f"{r:.0f}"] = run(w, llmfleet(r))
        rows["llmfleet, work externality off"][f"{r:.0f}"] = run(w, llmfleet(r, externality=0.0))
    rows["llmfleet, measured rate"] = {"measured": run(w, llmfleet(None, measure=True))}
    for base in ("llm-d", "least-request"):
        rows[base] = {"any": run(w, make_router(base))}
    table = Table(title=f"{name}: {REPLICAS} static Llama-3.1-8B replicas on H200, TTFT SLO {SLO_S:g} s; "
                        "share of requests within it (hit rate) by the prefill rate priced, tokens/s")
    table.add_column("router")
    for r in rates:
        table.add_column(f"{r / 1000:g}k")
    table.add_column("other")
    for router, by_rate in rows.items():
        cells = [f"{by_rate[f'{r:.0f}']['attainment']:.2%} ({by_rate[f'{r:.0f}']['hitRate']:.3f})"
                 if f"{r:.0f}" in by_rate else "" for r in rates]
        other = next((v for k, v in by_rate.items() if not k[0].isdigit()), None)
        table.add_row(router, *cells, f"{other['attainment']:.2%} ({other['hitRate']:.3f})" if other else "")
    Console(width=200).print(table)
    slow = slow_fleet_rows(w)
    slow_table = Table(title=f"{name} on slower hardware (arrivals spread and SLO lengthened by the prefill ratio): "
                             "within SLO (hit rate, TTFT p99 s)")
    for col in ("fleet", "priced tokens/s", "TTFT SLO (s)", *slow[0]["results"]):
        slow_table.add_column(col)
    for f in slow:
        slow_table.add_row(f"{f['replicas']} x {f['model']} on {f['gpu']}" + (f" x{f['tensorParallel']}" if f["tensorParallel"] > 1 else ""),
                           f"{f['pricedTokensPerS']:,.0f}", f"{f['ttftSloS']:.2f}",
                           *(f"{r['attainment']:.2%} ({r['hitRate']:.3f}, {r['ttftP99S']:.2f})"
                             for r in f["results"].values()))
    Console(width=220).print(slow_table)
    out = {"benchmark": "router_rate_sensitivity", "workload": name, "replicas": REPLICAS, "ttftSloS": SLO_S,
           "command": "python benchmarks/router_rate_sensitivity.py" + (" --quick" if args.quick else ""),
           "date": datetime.now(UTC).isoformat(timespec="seconds"), "simulated": True,
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                       "processor": platform.processor() or platform.machine()},
           "wallSeconds": round(time.time() - t0, 1), "rates": list(rates), "results": rows,
           "slowerHardware": slow}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
