"""Simulator fidelity for routing: the routing_vllm workload through `llmfleet.sim`, beside the real runs.

    python benchmarks/routing_fidelity.py [--result benchmarks/results/routing_vllm.json] [--speed engine|calibrated|client]
                                          [--host-cores N]

`routing_vllm.py` calls `calibrate_replicas` once on its replicas before any router runs (its own prompts and
seed: nothing of the evaluated workload) and `resimulate` after them; run alone, this script re-simulates
the runs of a routing_vllm result file with the calibration stored there (no replicas needed).

CPU replica model: `llmfleet.plan.roofline.StepCostModel` of the tiny Llama's shape, its per-step overhead and
roofline scale fitted (`roofline.calibrate`, least squares) to measured prefills (`max_tokens` 1, prompts of
64-1,800 tokens, no prefix shared) and decodes (17 output tokens: (e2e - e2e of 1 token) / 16 per step), every
replica measured at once, one request at a time each (they share the host's cores as during the runs), the
median of each prompt length's measurements one point. Client-side times: a prefill point is a whole request
(HTTP, the chat template and tokenization besides its one step), a decode point one step. `--cost-fit requests`
(the default) fits a per-step overhead and a per-request cost (`calibrate_with_request_cost`; the simulator
charges the latter once, to the step that admits the request); `--cost-fit steps` is the one-overhead fit stored
in the result file (`calibrate`), which charges every decode step about half the per-request cost (here ~23 ms
per decode step against ~11 ms measured), so simulated requests hold their replica longer than real ones. KV cache: the replicas' own `--num-gpu-blocks-override` less
vLLM's one null block, `max_num_seqs` as rendered.

Speed of each run (`--speed`, SPEEDS): the host is shared, so the replicas' speed during a run is not the
calibration's. `engine` (the default when the result file has the series) slows the calibrated model, run by
run, until the simulated mean TTFT equals the mean TTFT the replicas' own vLLM series measured during that run
(arrival at the engine to the first token: neither the router nor the client is in it); `calibrated` keeps the
calibration's speed; `client` fits the client's TTFT p50 instead (the router and the client slow down with the
host too, so it overstates the replicas' slowdown). The fitted factor is one number per run; the simulated
TTFT is then matched by construction and the hit shares are what the comparison tests.

Shared host (`--host-cores N`, off by default): the replicas step on one host of N cores (`PoolSpec.shared_cores`:
a step takes max(1, busy replicas / N) times as long as alone), so a replica busy alone runs faster than one
of three busy ones. The calibration measured every replica at once, so the replica model alone on the host is
the calibrated one sped up by max(1, replicas / N); the per-run speed fit then scales that host-level model
(one factor for the host: the router, the client and other jobs slowing every replica alike).

Workload: the same conversations (systems, turns, think times) tokenized with the served model's tokenizer and
chat template into 32-token block keys; as the real client does, a conversation's next turn is sent its think
time after the previous turn's answer ended in the simulation (closed loop), so a slower replica or router
spreads a conversation's turns over more time, as it did for real.

Simulated routers, one per real one: llmfleet's own plugin pipeline with the scorer weights the run used
(`llmfleet_scorers` in the result file, `--llmfleet-scorers` for files without it); sglang-router 0.3.2
`cache_aware` (`llmfleet.sim.routers.SGLangCacheAware` with its CLI defaults: cache threshold 0.3, balance
thresholds 64 and 1.5, a prompt that matches less goes to the least loaded replica, load ties to the first
replica of a per-run order, a tree that only grows during a run as the real one does below its
32M-character budget); vllm-router 0.1.17 `cache_aware`, which gets 403 for its render calls from these
replicas and then routes without prefix affinity (`VllmRouterNoRender`); round-robin.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmfleet.api.trainingjob import ModelShape  # noqa: E402
from llmfleet.plan.hardware import get_gpu  # noqa: E402
from llmfleet.plan.roofline import StepCostModel, calibrate, calibrate_with_request_cost  # noqa: E402

CALIBRATION_LENGTHS = (64, 160, 320, 480, 640, 800, 1000, 1200, 1500, 1800)  # about; < max_model_len 2,016  # prompt tokens (approximate)
DECODE_TOKENS = 17
DECODE_LENGTHS = (160, 800, 1500)


def tiny_shape() -> ModelShape:
    from llmfleet.local.tinymodel import PRIMARY, TOKENIZER_VOCAB

    s = PRIMARY
    return ModelShape(layers=s.num_hidden_layers, hidden=s.hidden_size, heads=s.num_attention_heads,
                      kv_heads=s.num_key_value_heads, ffn=s.intermediate_size, vocab=TOKENIZER_VOCAB,
                      seq_len=s.max_position_embeddings)


def base_cost() -> StepCostModel:
    """The tiny Llama on a nominal CPU (0.2 TFLOP/s, 20 GB/s): only the shape's compute/bytes split matters,
    `calibrate` rescales both and adds the fixed per-step cost."""
    cpu = get_gpu("H200", {"bf16_tflops": 0.2, "hbm_bandwidth_tbs": 0.02})
    return StepCostModel.build(tiny_shape(), cpu)


# ---- calibration on a real replica --------------------------------------------------------------------------
async def _chat(s: aiohttp.ClientSession, url: str, content: str, max_tokens: int) -> tuple[float, int]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    t = time.monotonic()
    async with s.post(url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=120)) as r:
        r.raise_for_status()
        data = await r.json()
    return time.monotonic() - t, int(data["usage"]["prompt_tokens"])


async def _measure(url: str, words: list[str], tokens_per_word: float, seed: int, repeats: int) -> list[tuple[str, int, int, float]]:
    """(kind, target length, prompt tokens, seconds) for one replica: prefills (1 output token) and decode steps."""
    rng = random.Random(seed)
    out: list[tuple[str, int, int, float]] = []

    def prompt(n_tokens: int) -> str:  # a fresh random head: nothing is shared with earlier prompts
        return f"{rng.random()} " + " ".join(rng.choice(words) for _ in range(int(n_tokens / tokens_per_word)))

    async with aiohttp.ClientSession() as s:
        await _chat(s, url, prompt(50), 1)  # warm up
        for _ in range(repeats):
            for n in CALIBRATION_LENGTHS:
                t1, tokens = await _chat(s, url, prompt(n), 1)
                out.append(("prefill", n, tokens, t1))
                if n in DECODE_LENGTHS:
                    tn, tokens_n = await _chat(s, url, prompt(n), DECODE_TOKENS)
                    out.append(("decode", n, tokens_n, max(1e-4, (tn - t1) / (DECODE_TOKENS - 1))))
    return out


async def calibrate_replicas(urls: list[str], words: list[str], tokenizer_dir: str, seed: int = 12345,
                             repeats: int = 3) -> dict[str, Any]:
    """Measured prefill and decode times, every replica at once (they share the machine's cores as they do
    during the evaluated runs); the median of each length's measurements becomes one calibration point."""
    from llmfleet.router.block_keys import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    rng = random.Random(seed)
    sample = " ".join(rng.choice(words) for _ in range(400))
    tokens_per_word = len(tok.encode(sample).ids) / 400 if tok is not None else 2.0
    per_replica = await asyncio.gather(*(_measure(u, words, tokens_per_word, seed + i, repeats) for i, u in enumerate(urls)))
    groups: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for kind, n, tokens, secs in (m for ms in per_replica for m in ms):
        groups.setdefault((kind, n), []).append((tokens, secs))
    points: list[dict[str, float]] = []
    for (kind, _), ms in sorted(groups.items()):
        tokens = statistics.median(t for t, _ in ms)
        secs = statistics.median(x for _, x in ms)
        if kind == "prefill":
            points.append({"tokens": tokens, "attendedContext": tokens * (tokens + 1) / 2, "readContext": 0.0, "seconds": secs})
        else:
            ctx = tokens + DECODE_TOKENS / 2
            points.append({"tokens": 1, "attendedContext": ctx, "readContext": ctx, "seconds": secs})
    cost = calibrate(base_cost(), points)
    return {"points": points, "measurements": len(groups) and sum(len(v) for v in groups.values()),
            "model": dict(cost.__dict__)}


def cost_from(calibration: dict[str, Any], fit: str = "steps") -> StepCostModel:
    """The replica model of a stored calibration: its stored one-overhead fit ("steps"), or refitted from its
    points with a per-request cost ("requests", `calibrate_with_request_cost`)."""
    if fit == "requests":
        # the prefill points time whole 1-token requests; the decode points (they read their context) single steps
        points = [{**p, "wholeRequest": not p.get("readContext")} for p in calibration["points"]]
        return calibrate_with_request_cost(base_cost(), points)
    return StepCostModel(**calibration["model"])



# ---- the same workload for the simulator --------------------------------------------------------------------
Turn = tuple[float, float, int, tuple[int, ...], str, str]  # (conversation start, think s, prompt tokens, keys, tenant, session)


def render_turns(systems: list[str], convs: list[Any], block_size: int, tokenizer_dir: str) -> list[list[Turn]]:
    """routing_vllm's conversations tokenized as the engine does (the served model's tokenizer and chat
    template), their prompts as 32-token block keys: one list of turns per conversation."""
    from llmfleet.router.block_keys import load_tokenizer
    from llmfleet.router.chat_template import ChatTemplate
    from llmfleet.router.prompt_tokens import PromptBlocks

    tok = load_tokenizer(tokenizer_dir)
    template = ChatTemplate.from_tokenizer_dir(tokenizer_dir, tok)
    if tok is None or template is None:
        raise RuntimeError(f"{tokenizer_dir}: no tokenizer.json or chat template")
    blocks = PromptBlocks(block_size, tok)
    out = []
    for ci, conv in enumerate(convs):
        messages = [{"role": "system", "content": systems[conv.tenant]}]
        turns: list[Turn] = []
        for (user, reply), think in zip(conv.turns, conv.think_s, strict=True):
            messages.append({"role": "user", "content": user})
            text = template.render(messages)
            if text is None:
                raise RuntimeError("the chat template rejected a workload conversation")
            keys, n = blocks(text)
            turns.append((conv.start_s, think, n, tuple(int(k) for k in keys[: n // block_size]), f"tenant-{conv.tenant}", f"c{ci}"))
            messages.append({"role": "assistant", "content": reply})
        out.append(turns)
    return out


def sim_workload(name: str, turns: list[list[Turn]], max_tokens: int, block_size: int) -> Any:
    """Simulator requests for rendered conversations, as routing_vllm's client sends them: a conversation's
    first turn at its start, every later turn its think time after the previous turn's answer ended (closed
    loop: `Request.after`)."""
    from llmfleet.sim.workload import Request, Workload

    reqs = []
    for conv in turns:
        prev = -1
        for k, (start, _, n, keys, tenant, session) in enumerate(conv):
            think = conv[k - 1][1] if k else 0.0  # the client sleeps after a turn's answer
            reqs.append(Request(len(reqs), start, n, max_tokens, keys, tenant, session, after=prev, think=think))
            prev = reqs[-1].rid
    return Workload(name, reqs, block_size)


def alone_on_host(cost: StepCostModel, replicas: int, host_cores: float) -> StepCostModel:
    """One replica's speed alone on the host, from the calibration's (`calibrate_replicas` measures every
    replica at once: each ran max(1, replicas / cores) times slower than alone)."""
    return slowed(cost, 1.0 / max(1.0, replicas / host_cores))


def slowed(cost: StepCostModel, factor: float) -> StepCostModel:
    """The replica model with every step `factor` times longer (a host busier than during the calibration)."""
    return dataclasses.replace(cost, overhead_s=cost.overhead_s * factor, compute_eff=cost.compute_eff / factor,
                               bandwidth_eff=cost.bandwidth_eff / factor,
                               request_overhead_s=cost.request_overhead_s * factor)


def sim_routers(seed: int, variants: dict[str, dict[str, float]] | None = None,
                llmfleet_scorers: dict[str, float] | None = None) -> dict[str, Any]:
    from llmfleet.router.config import RouterConfig, SLOConfig
    from llmfleet.sim.routers import LlmfleetRouter, RoundRobin, SGLangCacheAware, VllmRouterNoRender

    fields = RouterConfig.model_fields
    # the router's TTFT objective (spec.slo's default, as `llmfleet up` writes it) bounds the sole-holder discount
    objective_s = SLOConfig().ttft_p95_ms / 1e3

    def flag(w: dict[str, Any], name: str, camel: str) -> Any:  # a config variant may set it, in either spelling
        return w.get(name, w.get(camel, fields[name].default))

    def llmfleet(weights: dict[str, float] | None, w: dict[str, Any]) -> Any:
        return LlmfleetRouter(weights=weights, seed=seed, ttft_objective_s=objective_s,
                              measure_prefill_rate=flag(w, "measure_prefill_rate", "measurePrefillRate"),
                              sole_holder_discount=flag(w, "sole_holder_discount", "soleHolderDiscount"),
                              eviction_cost=flag(w, "eviction_cost", "evictionCost"))

    return {
        # the scorer weights the real run used (None: today's defaults) and the router's default config
        "llmfleet": llmfleet(llmfleet_scorers, {}),
        # a variant's scorer weights and router fields (its router limits have no simulated counterpart)
        **{name: llmfleet(w["scorers"], w) if "scorers" in w else llmfleet(w, {})
           for name, w in (variants or {}).items()},
        # sglang-router 0.3.2 cache_aware with its CLI defaults
        "sglang-router": SGLangCacheAware(cache_threshold=0.3, balance_abs=64, balance_rel=1.5, seed=seed),
        # vllm-router 0.1.17 cache_aware: these replicas refuse its render call, so it routes without affinity
        "vllm-router": VllmRouterNoRender(balance_abs=64, balance_rel=1.5, seed=seed),
        "round-robin": RoundRobin(),
    }


@dataclasses.dataclass
class SimSetup:
    """What every simulated run shares: the fleet (as routing_vllm starts it) and the routers' settings."""

    replicas: int
    kv_blocks: int
    max_num_seqs: int
    max_model_len: int
    max_tokens: int
    block_size: int
    variants: dict[str, dict[str, float]] | None = None
    llmfleet_scorers: dict[str, float] | None = None
    # A simulated run's hit share is the mean over these draws, each a speed factor around the run's (the
    # calibration and the fit know the speed to about 10 %, and 10 % moves one seed's simulated hit share by
    # up to several points: routers that follow load react to when requests end) and a router seed
    # (llmfleet's tie-breaks; the real router draws them anew in every process).
    speed_draws: tuple[float, ...] = (1.0, 0.9, 1.1, 0.95, 1.05)
    # The replicas' host's cores (PoolSpec.shared_cores): a replica's step is max(1, busy replicas / cores) times
    # its time alone on the host. 0: independent replicas, each at the calibrated speed.
    host_cores: float = 0.0


def simulate_one(turns: list[list[Turn]], cost: StepCostModel, setup: SimSetup, router: str, seed: int) -> dict[str, Any]:
    from llmfleet.sim.engine import PoolSpec, SimConfig, simulate

    w = sim_workload(f"chat-{seed}", turns, setup.max_tokens, setup.block_size)
    # vLLM keeps one of the overridden blocks as its null block
    pool = PoolSpec(replicas=setup.replicas, model=tiny_shape(), cost=cost, kv_blocks=setup.kv_blocks - 1,
                    max_num_seqs=setup.max_num_seqs, max_batched_tokens=max(2048, setup.max_model_len),
                    max_model_len=setup.max_model_len, shared_cores=setup.host_cores)
    res = simulate(w, SimConfig(pools=[pool], seed=seed), sim_routers(seed, setup.variants, setup.llmfleet_scorers)[router])
    recs = [r for r in res.records if r["ttft"] is not None]
    prompt = sum(r["prompt"] for r in recs)
    ttfts = sorted(r["ttft"] * 1e3 for r in recs)
    return {"router": router, "seed": seed, "requests": len(res.records), "served": len(recs),
            "hit_share": sum(r["hitTokens"] for r in recs) / prompt if prompt else None,
            "ttft_p50_ms": _q(ttfts, 0.5), "ttft_p95_ms": _q(ttfts, 0.95),
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else None,
            "prompt_tokens_per_replica": [rep["promptTokens"] for rep in res.replicas]}


SLOWDOWN_RANGE = (0.25, 64.0)  # the replica model's step times x this; the bisection's bounds
SLOWDOWN_STEPS = 14  # bisection steps on log(slowdown): the last one moves it by under 0.1 %
SPEEDS = {
    # how fast the simulated replicas of a run are, from what the real run measured
    "calibrated": "the calibration's speed for every run",
    "engine": "each run at the slowdown that gives the mean TTFT the replicas' own vLLM series measured "
              "(vllm:time_to_first_token_seconds: arrival at the engine's API server to the first token)",
    "client": "each run at the slowdown that gives the client's TTFT p50 (it includes the router and the "
              "client, which the host's load slows too: an upper bound on the replicas' slowdown)",
}


def real_ttft_ms(run: dict[str, Any], speed: str) -> tuple[str, float] | None:
    """The real run's TTFT statistic a speed fit matches: (which simulated statistic, milliseconds)."""
    if speed == "engine" and run.get("engine_ttft_count"):
        return "ttft_mean_ms", 1e3 * run["engine_ttft_s_sum"] / run["engine_ttft_count"]
    if speed == "client" and run.get("ttfts_ms"):
        return "ttft_p50_ms", statistics.median(run["ttfts_ms"])
    return None


def fit_slowdown(turns: list[list[Turn]], cost: StepCostModel, setup: SimSetup, router: str, seed: int,
                 stat: str, target_ms: float) -> tuple[float, dict[str, Any]]:
    """The run's own speed: the factor on the calibrated step times at which the simulated run's TTFT
    statistic `stat` equals the real run's (bisection on its logarithm; the simulated TTFT grows with the
    factor). Returns the factor and the simulated run at it."""
    lo, hi = (math.log(x) for x in SLOWDOWN_RANGE)
    for _ in range(SLOWDOWN_STEPS):
        mid = (lo + hi) / 2
        got = simulate_one(turns, slowed(cost, math.exp(mid)), setup, router, seed)[stat]
        if got is not None and got > target_ms:
            hi = mid
        else:
            lo = mid
    factor = math.exp((lo + hi) / 2)
    return factor, simulate_one(turns, slowed(cost, factor), setup, router, seed)


def default_speed(runs: list[dict[str, Any]]) -> str:
    """'engine' when every run has the engines' TTFT series (result files written since they are recorded)."""
    return "engine" if runs and all(r.get("engine_ttft_count") for r in runs) else "calibrated"


def simulate_runs(real_runs: list[dict[str, Any]], turns_by_seed: dict[int, list[list[Turn]]], cost: StepCostModel,
                  setup: SimSetup, speed: str = "calibrated") -> list[dict[str, Any]]:
    """One simulated run per real (router, seed) run, at the speed `speed` (one of SPEEDS) gives it: the host's
    load changes between runs, and with how many replicas a router keeps busy."""
    if speed not in SPEEDS:
        raise ValueError(f"speed must be one of {', '.join(SPEEDS)}, got {speed!r}")
    out = []
    for r in real_runs:
        turns = turns_by_seed[r["seed"]]
        target = real_ttft_ms(r, speed)
        if target is not None:
            factor, sim = fit_slowdown(turns, cost, setup, r["router"], r["seed"], *target)
        else:
            if speed != "calibrated":
                raise ValueError(f"run {r['router']} seed {r['seed']} has no TTFT series for speed {speed!r}")
            factor, sim = 1.0, simulate_one(turns, cost, setup, r["router"], r["seed"])
        shares = [sim["hit_share"]] + [
            simulate_one(turns, slowed(cost, factor * f), setup, r["router"], 1000 * k + r["seed"])["hit_share"]
            for k, f in enumerate(setup.speed_draws[1:], start=1)]
        out.append({**sim, "hit_share": statistics.fmean(x for x in shares if x is not None), "hit_share_draws": shares,
                    "slowdown": round(factor, 3)})
    return out


def _q(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


SYSTEMS = ("llmfleet", "sglang-router", "vllm-router", "round-robin")  # the routers the ranking target is about


def compare(real: dict[str, dict[str, Any]], sim_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per router: real and simulated hit share (mean over seeds), their difference in points, the fitted
    slowdowns; whether both rank the four router systems (`SYSTEMS`) the same way, and all rows."""
    sim: dict[str, list[dict[str, Any]]] = {}
    for r in sim_runs:
        if r["hit_share"] is not None:
            sim.setdefault(r["router"], []).append(r)
    rows = {}
    for name, s in real.items():
        if name not in sim:
            continue
        runs = sim[name]
        m = statistics.fmean(r["hit_share"] for r in runs)
        rows[name] = {"real_hit_share": s["hit_share_mean"], "sim_hit_share": m,
                      "diff_points": 100 * (m - s["hit_share_mean"]),
                      "sim_per_seed": [r["hit_share"] for r in runs], "real_per_seed": s["hit_share_per_seed"],
                      "slowdowns": [r.get("slowdown", 1.0) for r in runs],
                      "real_ttft_p50_ms": s["ttft_p50_ms"], "real_ttft_p95_ms": s["ttft_p95_ms"],
                      "sim_ttft_p50_ms": statistics.median([r["ttft_p50_ms"] for r in runs]),
                      "sim_ttft_p95_ms": statistics.median([r["ttft_p95_ms"] for r in runs])}
    real_rank = sorted(rows, key=lambda n: -rows[n]["real_hit_share"])
    sim_rank = sorted(rows, key=lambda n: -rows[n]["sim_hit_share"])
    systems = [n for n in SYSTEMS if n in rows]
    return {"routers": rows, "real_ranking": real_rank, "sim_ranking": sim_rank,
            "same_ranking": real_rank == sim_rank,
            "systems_real_ranking": [n for n in real_rank if n in systems],
            "systems_sim_ranking": [n for n in sim_rank if n in systems],
            "same_systems_ranking": [n for n in real_rank if n in systems] == [n for n in sim_rank if n in systems],
            "max_abs_diff_points": max((abs(r["diff_points"]) for r in rows.values()), default=None)}


def table(cmp: dict[str, Any]) -> list[str]:
    lines = [f"{'router':18s} {'real hit':>8s} {'sim hit':>8s} {'diff pts':>8s} {'real p50':>9s} {'sim p50':>8s} "
             f"{'real p95':>9s} {'sim p95':>8s}  slowdown per seed"]
    for name, r in cmp["routers"].items():
        lines.append(f"{name:18s} {r['real_hit_share']:8.3f} {r['sim_hit_share']:8.3f} {r['diff_points']:+8.1f} "
                     f"{r['real_ttft_p50_ms']:7.0f}ms {r['sim_ttft_p50_ms']:6.0f}ms {r['real_ttft_p95_ms']:7.0f}ms "
                     f"{r['sim_ttft_p95_ms']:6.0f}ms  {' '.join(f'{x:.1f}' for x in r['slowdowns'])}")
    speed = cmp.get("speed", "calibrated")
    lines.append(f"simulated replicas' speed: {speed} ({SPEEDS[speed]})")
    if cmp.get("cost_fit"):
        lines.append(f"replica model: {cmp['cost_fit']} ({COST_FITS[cmp['cost_fit']]})")
    if cmp.get("host_cores"):
        lines.append(f"replicas share a host of {cmp['host_cores']:g} cores (a step: max(1, busy replicas / cores) x alone)")
    lines.append(f"ranking of {', '.join(SYSTEMS)}: real {' > '.join(cmp['systems_real_ranking'])}; simulated "
                 f"{' > '.join(cmp['systems_sim_ranking'])} ({'same' if cmp['same_systems_ranking'] else 'DIFFERENT'})")
    lines.append(f"all rows: real {' > '.join(cmp['real_ranking'])}; simulated {' > '.join(cmp['sim_ranking'])} "
                 f"({'same' if cmp['same_ranking'] else 'different'}); largest difference "
                 f"{cmp['max_abs_diff_points']:.1f} points")
    return lines


COST_FITS = {
    "requests": "a per-step overhead and a per-request cost (`calibrate_with_request_cost`)",
    "steps": "one per-step overhead for prefill requests and decode steps alike (the stored `calibrate` fit)",
}


def resimulate(result: dict[str, Any], speed: str | None = None,
               llmfleet_scorers: dict[str, float] | None = None, host_cores: float | None = None,
               cost_fit: str = "requests") -> dict[str, Any]:
    """Simulate every run of a routing_vllm result (its workloads, its stored calibration, each run at the
    speed `speed` gives it: None for `default_speed`) and compare with the real runs."""
    from chat_workload import chat_workload, workload_args

    from llmfleet.local.tinymodel import PRIMARY, build_tiny

    p = argparse.Namespace(**result["params"])
    if cost_fit not in COST_FITS:
        raise ValueError(f"cost_fit must be one of {', '.join(COST_FITS)}, got {cost_fit!r}")
    cost = cost_from(result["calibration"], cost_fit)
    cores = 0.0 if host_cores is None else host_cores
    if cores > 0:
        cost = alone_on_host(cost, p.replicas, cores)
    tok_dir = str(build_tiny(PRIMARY))
    turns = {}
    for seed in p.seeds:
        systems, convs = chat_workload(seed, *workload_args(p))
        turns[seed] = render_turns(systems, convs, result["block_size"], tok_dir)
    setup = SimSetup(replicas=p.replicas, kv_blocks=p.kv_blocks, max_num_seqs=result["max_num_seqs"],
                     max_model_len=result["max_model_len"], max_tokens=p.max_tokens, block_size=result["block_size"],
                     variants=getattr(p, "variants", None),
                     llmfleet_scorers=llmfleet_scorers or result.get("llmfleet_scorers"), host_cores=cores)
    real = [r for r in result["runs"] if r.get("hit_share") is not None]
    speed = speed or default_speed(real)
    runs = simulate_runs(real, turns, cost, setup, speed)
    return {"runs": runs, "comparison": {**compare(result["summary"], runs), "speed": speed, "host_cores": cores,
                                         "cost_fit": cost_fit},
            "llmfleet_scorers": setup.llmfleet_scorers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", type=Path, default=ROOT / "benchmarks" / "results" / "routing_vllm.json")
    ap.add_argument("--speed", choices=list(SPEEDS), default=None,
                    help="how fast each run's simulated replicas are: " + "; ".join(f"{k}: {v}" for k, v in SPEEDS.items())
                    + " (default: engine when the result file has the engines' TTFT series, else calibrated)")
    ap.add_argument("--llmfleet-scorers", type=json.loads, default=None, metavar="JSON",
                    help="the scorer weights the llmfleet row ran with, for result files that do not record them")
    ap.add_argument("--host-cores", type=float, default=None, metavar="N",
                    help="simulate the replicas sharing a host of N cores (a step is max(1, busy replicas / N) times "
                         "as long as alone); 0: independent replicas")
    ap.add_argument("--cost-fit", choices=list(COST_FITS), default="requests",
                    help="the replica model from the calibration's points: " + "; ".join(f"{k}: {v}" for k, v in COST_FITS.items()))
    ap.add_argument("--write", action="store_true",
                    help="store the re-simulation in the result file (simulated_runs, fidelity, the table's simulator "
                         "lines, fidelity_command), as routing_vllm.py writes them")
    args = ap.parse_args()
    result = json.loads(args.result.read_text())
    if "calibration" not in result:
        raise SystemExit(f"{args.result}: no calibration (run routing_vllm.py first)")
    out = resimulate(result, speed=args.speed, llmfleet_scorers=args.llmfleet_scorers, host_cores=args.host_cores,
                     cost_fit=args.cost_fit)
    lines = table(out["comparison"])
    print("\n".join(lines))
    if args.write:
        result["simulated_runs"], result["fidelity"] = out["runs"], out["comparison"]
        result["fidelity_command"] = "python benchmarks/routing_fidelity.py " + " ".join(sys.argv[1:])
        old = result.get("table", [])
        head = next((i for i, line in enumerate(old) if line.startswith("simulator (")), len(old))
        result["table"] = [*old[:head + 1], *lines] if head < len(old) else [*old, "", "simulator vs real:", *lines]
        args.result.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.result}")


if __name__ == "__main__":
    main()
