"""`llmfleet up` in the foreground: supervise, show the dashboard, drain on Ctrl-C / SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmfleet.api.inferenceservice import InferenceService
from llmfleet.autoscaler.local import run_local
from llmfleet.local.actuator import LocalActuator
from llmfleet.local.dashboard import Collector, Window, render, scrape_texts
from llmfleet.local.gpus import DeviceLedger
from llmfleet.local.promote import PromotionFollower
from llmfleet.local.runtime import RESTART_BACKOFF_MAX_S, Supervisor

log = logging.getLogger("llmfleet.local")


def _autoscaler_task(sup: Supervisor, stop: asyncio.Event, on_step: Any = None) -> asyncio.Task[Any] | None:
    """Run the autoscaler's local loop (llmfleet.autoscaler.local.run_local) against a LocalActuator.

    It scrapes the router and the ready replicas every `autoscaling.intervalSeconds` and scales through
    the actuator; with `policy: static` pools stay at spec replicas (crashed replicas are still restarted).
    """
    if sup.isvc.spec.autoscaling.policy == "static":
        return None

    def urls(pool: str) -> list[str]:
        return [r.url for r in sup.replicas(pool) if r.ready]

    a = sup.isvc.spec.autoscaling
    sup.event(f"autoscaler: {a.policy} policy every {a.interval_seconds:g}s")
    return asyncio.create_task(run_local(sup.isvc, LocalActuator(sup), urls, stop, on_step=on_step),
                               name="autoscaler")


async def keep_autoscaler(sup: Supervisor, stop: asyncio.Event,
                          started: Callable[[asyncio.Task[Any]], None] | None = None,
                          on_step: Any = None) -> None:
    """Run the autoscaler and restart it, with the replicas' backoff, whenever it dies (an exception, or
    cancelled from outside) while the supervisor runs. It restarts with fresh policy state (no cooldowns);
    meanwhile replicas stay where they are. `started` sees every task (the failure drill kills them)."""
    while not stop.is_set():
        task = _autoscaler_task(sup, stop, on_step=on_step)
        if task is None:
            return
        if started is not None:
            started(task)
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            task.cancel()
            raise
        if stop.is_set():
            return
        why = "killed" if task.cancelled() else repr(task.exception())
        sup.autoscaler_restarts += 1
        delay = min(RESTART_BACKOFF_MAX_S, 2.0 ** (sup.autoscaler_restarts - 1) - 1)
        sup.event(f"autoscaler died ({why}); restart #{sup.autoscaler_restarts} in {delay:.0f}s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)


async def supervise(isvc: InferenceService, run_dir: Path, port: int | None, dashboard: bool,
                    prometheus: bool | None = None, manifest: Path | None = None, sup: Supervisor | None = None,
                    stop: asyncio.Event | None = None,
                    autoscaler_started: Callable[[asyncio.Task[Any]], None] | None = None,
                    ledger: tuple[DeviceLedger, str] | None = None) -> int:
    """Run until SIGINT/SIGTERM (or `stop`, for callers that own the signals): `sup` and `stop` let the
    failure drill run the same loop with fake replicas. `ledger`: the devices the caller listed (Supervisor)."""
    sup = sup or Supervisor(isvc, run_dir, router_port=port, prometheus=prometheus, manifest=manifest, ledger=ledger)
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    collector = Collector()
    window: list[Window | None] = [None]
    announced = [False]

    async def scrape_loop() -> None:
        while True:
            urls = [r.url for r in sup.replicas() if r.proc is not None]
            router = await scrape_texts([sup.url])
            window[0] = collector.update(await scrape_texts(urls), router[0] if router else None)
            await asyncio.sleep(2.0)

    live: Any = None
    if dashboard and sys.stdout.isatty():
        from rich.live import Live

        live = Live(refresh_per_second=2, screen=False)
        live.start()

    def on_tick(s: Supervisor) -> None:
        state = s.state()
        if live is not None:
            live.update(render(state, window[0]))
        if state["ready"] and not announced[0]:
            announced[0] = True
            msg = f"ready: OpenAI API at {s.url}/v1 (Ctrl-C or `llmfleet down {s.isvc.metadata.name}` to stop)"
            s.event(msg)
            if live is None:
                print(msg, flush=True)

    tasks = [asyncio.create_task(scrape_loop())]
    try:
        sup_task = asyncio.create_task(sup.run(stop, on_tick=on_tick))
        await asyncio.sleep(0)
        follower = PromotionFollower(sup)
        tasks.append(asyncio.create_task(
            keep_autoscaler(sup, stop, autoscaler_started, on_step=lambda r: follower.observe(r.signals))))
        tasks.append(asyncio.create_task(follower.run(stop)))
        await sup_task
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if live is not None:
            live.stop()
    print(f"stopped {isvc.metadata.name}; state and logs in {run_dir}", flush=True)
    return 0


def run_foreground(isvc: InferenceService, run_dir: Path, port: int | None, dashboard: bool,
                   prometheus: bool | None = None, manifest: Path | None = None,
                   ledger: tuple[DeviceLedger, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        handlers=[logging.FileHandler(run_dir / "supervisor-events.log"),
                                  *([] if dashboard and sys.stdout.isatty() else [logging.StreamHandler()])])
    return asyncio.run(supervise(isvc, run_dir, port, dashboard, prometheus, manifest, ledger=ledger))
