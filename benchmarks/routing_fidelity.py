"""Simulator fidelity for routing: the routing_vllm workload through `llmfleet.sim`, beside the real runs.

    python benchmarks/routing_fidelity.py [--result benchmarks/results/routing_vllm.json]

`routing_vllm.py` calls `calibrate_replicas` once on its replicas before any router runs (its own prompts and
seed: nothing of the evaluated workload) and `simulate_seeds` after them; run alone, this script re-simulates
the workloads of a routing_vllm result file with the calibration stored there (no replicas needed).

CPU replica model: `llmfleet.plan.roofline.StepCostModel` of the tiny Llama's shape, its per-step overhead and
roofline scale fitted (`roofline.calibrate`, least squares) to measured prefills (`max_tokens` 1, prompts of
64-1,800 tokens, no prefix shared) and decodes (17 output tokens: (e2e - e2e of 1 token) / 16 per step), every
replica measured at once, one request at a time each (they share the host's cores as during the runs), the
median of each prompt length's measurements one point. Client-side times: they include HTTP, the chat
template and tokenization, which the fitted overhead absorbs. KV cache: the replicas' own `--num-gpu-blocks-override` less
vLLM's one null block, `max_num_seqs` as rendered. Workload: the same conversations (systems, turns, think
times) tokenized with the served model's tokenizer and chat template into 32-token block keys; a turn is sent
its think time after the previous turn's answer, which the simulator (open loop) places at the calibrated
latency of one turn (prefill of the median prompt + the decode steps), so every simulated router sees the
same arrival times.

Simulated routers, one per real one: llmfleet's own plugin pipeline (the defaults `router_config_from_service`
gives); sglang-router and vllm-router `cache_aware` (`llmfleet.sim.routers.SGLangCacheAware` with the CLIs'
defaults: cache threshold 0.3, balance thresholds 64 and 1.5, a prompt that matches less goes to the least
loaded replica, a tree that only grows during a run as the real trees do below their 32M-character budget);
round-robin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from llmfleet.plan.roofline import StepCostModel, calibrate  # noqa: E402

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
    from llmfleet.router.prefix_index import load_tokenizer

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


def cost_from(calibration: dict[str, Any]) -> StepCostModel:
    return StepCostModel(**calibration["model"])


# ---- the same workload for the simulator --------------------------------------------------------------------
def sim_workload(name: str, systems: list[str], convs: list[Any], cost: StepCostModel, block_size: int,
                 max_tokens: int, tokenizer_dir: str) -> Any:
    """routing_vllm's conversations as simulator requests: prompts tokenized as the engine does, block keys
    hashed from those tokens, arrivals at think times after the calibrated latency of each turn."""
    from llmfleet.router.chat_template import ChatTemplate
    from llmfleet.router.prefix_index import PromptBlocks, load_tokenizer
    from llmfleet.sim.workload import Request, Workload

    tok = load_tokenizer(tokenizer_dir)
    template = ChatTemplate.from_tokenizer_dir(tokenizer_dir, tok)
    if tok is None or template is None:
        raise RuntimeError(f"{tokenizer_dir}: no tokenizer.json or chat template")
    blocks = PromptBlocks(block_size, tok)
    rendered: list[tuple[float, int, tuple[int, ...], str, str]] = []
    for ci, conv in enumerate(convs):
        messages = [{"role": "system", "content": systems[conv.tenant]}]
        at = conv.start_s
        for (user, reply), think in zip(conv.turns, conv.think_s, strict=True):
            messages.append({"role": "user", "content": user})
            text = template.render(messages)
            if text is None:
                raise RuntimeError("the chat template rejected a workload conversation")
            keys, n = blocks(text)
            rendered.append((at, n, tuple(int(k) for k in keys[: n // block_size]), f"tenant-{conv.tenant}", f"c{ci}"))
            turn_s = cost.prefill_time(n) + max_tokens * cost.decode_step_time(1, n)
            messages.append({"role": "assistant", "content": reply})
            at += turn_s + think
    rendered.sort(key=lambda x: x[0])
    reqs = [Request(i, at, n, max_tokens, keys, tenant, session) for i, (at, n, keys, tenant, session) in enumerate(rendered)]
    return Workload(name, reqs, block_size)


def sim_routers(seed: int, variants: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    from llmfleet.sim.routers import LlmfleetRouter, RoundRobin, SGLangCacheAware

    return {
        "llmfleet": LlmfleetRouter(seed=seed, measure_prefill_rate=True),  # as routing_vllm's CPU replicas
        # a variant's scorer weights (its router limits, if any, have no simulated counterpart)
        **{name: LlmfleetRouter(weights=w.get("scorers") if "scorers" in w or "limits" in w else w, seed=seed,
                                measure_prefill_rate=True)
           for name, w in (variants or {}).items()},
        # both CLIs' cache_aware defaults (sglang-router 0.3.2, vllm-router 0.1.17 --help)
        "sglang-router": SGLangCacheAware(cache_threshold=0.3, balance_abs=64, balance_rel=1.5, seed=seed),
        "vllm-router": SGLangCacheAware(cache_threshold=0.3, balance_abs=64, balance_rel=1.5, seed=seed),
        "round-robin": RoundRobin(),
    }


def simulate_seeds(workloads: dict[int, Any], cost: StepCostModel, replicas: int, kv_blocks: int,
                   max_num_seqs: int, max_model_len: int, routers: list[str],
                   variants: dict[str, dict[str, float]] | None = None) -> list[dict[str, Any]]:
    from llmfleet.sim.engine import PoolSpec, SimConfig, simulate

    runs = []
    for seed, w in workloads.items():
        for name in routers:
            # vLLM keeps one of the overridden blocks as its null block
            pool = PoolSpec(replicas=replicas, model=tiny_shape(), cost=cost, kv_blocks=kv_blocks - 1,
                            max_num_seqs=max_num_seqs, max_batched_tokens=max(2048, max_model_len),
                            max_model_len=max_model_len)
            res = simulate(w, SimConfig(pools=[pool], seed=seed), sim_routers(seed, variants)[name])
            recs = [r for r in res.records if r["ttft"] is not None]
            prompt = sum(r["prompt"] for r in recs)
            ttfts = sorted(r["ttft"] * 1e3 for r in recs)
            runs.append({"router": name, "seed": seed, "requests": len(res.records), "served": len(recs),
                         "hit_share": sum(r["hitTokens"] for r in recs) / prompt if prompt else None,
                         "ttft_p50_ms": _q(ttfts, 0.5), "ttft_p95_ms": _q(ttfts, 0.95),
                         "prompt_tokens_per_replica": [rep["promptTokens"] for rep in res.replicas]})
    return runs


def _q(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def compare(real: dict[str, dict[str, Any]], sim_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per router: real and simulated hit share (mean over seeds), their difference in points, and whether
    both rank the routers the same way."""
    sim: dict[str, list[float]] = {}
    for r in sim_runs:
        if r["hit_share"] is not None:
            sim.setdefault(r["router"], []).append(r["hit_share"])
    rows = {}
    for name, s in real.items():
        if name not in sim:
            continue
        m = statistics.fmean(sim[name])
        rows[name] = {"real_hit_share": s["hit_share_mean"], "sim_hit_share": m,
                      "diff_points": 100 * (m - s["hit_share_mean"]),
                      "sim_per_seed": sim[name], "real_per_seed": s["hit_share_per_seed"],
                      "real_ttft_p50_ms": s["ttft_p50_ms"], "real_ttft_p95_ms": s["ttft_p95_ms"],
                      "sim_ttft_p50_ms": statistics.median([r["ttft_p50_ms"] for r in sim_runs if r["router"] == name]),
                      "sim_ttft_p95_ms": statistics.median([r["ttft_p95_ms"] for r in sim_runs if r["router"] == name])}
    real_rank = sorted(rows, key=lambda n: -rows[n]["real_hit_share"])
    sim_rank = sorted(rows, key=lambda n: -rows[n]["sim_hit_share"])
    return {"routers": rows, "real_ranking": real_rank, "sim_ranking": sim_rank,
            "same_ranking": real_rank == sim_rank,
            "max_abs_diff_points": max((abs(r["diff_points"]) for r in rows.values()), default=None)}


def table(cmp: dict[str, Any]) -> list[str]:
    lines = [f"{'router':14s} {'real hit':>8s} {'sim hit':>8s} {'diff pts':>8s} {'real p50':>9s} {'sim p50':>8s} "
             f"{'real p95':>9s} {'sim p95':>8s}"]
    for name, r in cmp["routers"].items():
        lines.append(f"{name:14s} {r['real_hit_share']:8.3f} {r['sim_hit_share']:8.3f} {r['diff_points']:+8.1f} "
                     f"{r['real_ttft_p50_ms']:7.0f}ms {r['sim_ttft_p50_ms']:6.0f}ms {r['real_ttft_p95_ms']:7.0f}ms "
                     f"{r['sim_ttft_p95_ms']:6.0f}ms")
    lines.append(f"ranking real {' > '.join(cmp['real_ranking'])}; simulated {' > '.join(cmp['sim_ranking'])} "
                 f"({'same' if cmp['same_ranking'] else 'DIFFERENT'}); largest difference "
                 f"{cmp['max_abs_diff_points']:.1f} points")
    return lines


def resimulate(result: dict[str, Any]) -> dict[str, Any]:
    """Simulate the workloads of a routing_vllm result with its stored calibration."""
    from routing_vllm import chat_workload, workload_args

    from llmfleet.local.tinymodel import PRIMARY, build_tiny

    p = argparse.Namespace(**result["params"])
    cost = cost_from(result["calibration"])
    tok_dir = str(build_tiny(PRIMARY))
    workloads = {}
    for seed in p.seeds:
        systems, convs = chat_workload(seed, *workload_args(p))
        workloads[seed] = sim_workload(f"chat-{seed}", systems, convs, cost, result["block_size"], p.max_tokens, tok_dir)
    runs = simulate_seeds(workloads, cost, p.replicas, p.kv_blocks, result["max_num_seqs"], result["max_model_len"],
                          list(result["summary"]), getattr(p, "variants", None))
    return {"runs": runs, "comparison": compare(result["summary"], runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", type=Path, default=ROOT / "benchmarks" / "results" / "routing_vllm.json")
    args = ap.parse_args()
    result = json.loads(args.result.read_text())
    if "calibration" not in result:
        raise SystemExit(f"{args.result}: no calibration (run routing_vllm.py first)")
    out = resimulate(result)
    print("\n".join(table(out["comparison"])))


if __name__ == "__main__":
    main()
