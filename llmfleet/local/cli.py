"""`llmfleet up | down | status` (the local runtime) and `llmfleet model build-tiny`."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from llmfleet.api.cli import non_negative_number, positive_number
from llmfleet.api.contracts import STORE_URL_ENV
from llmfleet.local.manifest import InvalidManifest, load_service


def _fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(msg, err=True)
    return typer.Exit(code)


def _run_dir(name: str | None, run_dir: Path | None) -> Path:
    if run_dir is not None:
        return run_dir
    base = Path.cwd() / ".run"
    if name:
        return base / name
    found = sorted(p.parent for p in base.glob("*/state.json")) if base.exists() else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise _fail(f"no run folder under {base}: nothing was started here (or pass --run-dir)")
    raise _fail(f"several run folders under {base} ({', '.join(p.name for p in found)}): name one")


def register(app: typer.Typer) -> None:
    from llmfleet.local.train_cli import register_train

    register_train(app)

    @app.command("demo", help="The whole loop on this machine: train + promote a student, route, burst, scale, "
                              "report (what `make demo` runs).")
    def demo(
        quick: bool = typer.Option(False, "--quick", help="Serving and routing only (no training, no burst)."),
        keep: bool = typer.Option(False, "--keep", help="Leave the service running at the end (URL printed)."),
    ) -> None:
        from llmfleet.local.demo import main as run_demo

        raise typer.Exit(run_demo([*(["--quick"] if quick else []), *(["--keep"] if keep else [])]))

    @app.command("up", help="Run an InferenceService on this machine: replicas, router, dashboard (Ctrl-C drains).")
    def up(
        file: Path = typer.Option(..., "--file", "-f", help="InferenceService manifest (YAML)."),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="State folder; .run/<name> by default."),
        port: int = typer.Option(0, "--port", "-p", min=0, max=65535, help="Router port (0 = any free port)."),
        detach: bool = typer.Option(False, "--detach", "-d", help="Start in the background, wait until ready, return."),
        dashboard: bool = typer.Option(True, "--dashboard/--no-dashboard", help="Live rich dashboard (foreground)."),
        ready_timeout: float = typer.Option(900.0, "--ready-timeout", callback=positive_number,
                                             help="Seconds --detach waits for readiness."),
        prometheus: bool = typer.Option(True, "--prometheus/--no-prometheus",
                                        help="Start Prometheus (scraping router + replicas) when its binary is installed."),
    ) -> None:
        from llmfleet.local.run_state import pid_alive, read_state, run_dir_for

        try:
            isvc = load_service(file)
        except InvalidManifest as err:
            raise _fail(f"llmfleet up: {err}") from None
        store = isvc.spec.feature_store
        if store is not None and store.url_secret_ref is not None and not os.environ.get(STORE_URL_ENV):
            raise _fail(f"llmfleet up: spec.featureStore.urlSecretRef: no Kubernetes Secret here; set {STORE_URL_ENV} "
                        "to the store's URL (or use spec.featureStore.url without a password and PGPASSWORD)")
        listed = None  # the machine's devices, listed once here and handed to the foreground supervisor
        if any(p.resources.gpus > 0 for p in isvc.pools()):
            from llmfleet.local.gpus import device_kind_problems, machine_ledger

            listed = ledger, said = machine_ledger(os.environ)
            if problems := device_kind_problems(ledger.devices, isvc.pools()):
                raise _fail(f"llmfleet up: {problems[0]}" + ("" if ledger.devices else f" ({said})"))
        rdir = (run_dir or run_dir_for(isvc.metadata.name)).resolve()
        old = read_state(rdir)
        if old and pid_alive(old.get("supervisorPid")):
            raise _fail(f"llmfleet up: {isvc.metadata.name} is already running (pid {old['supervisorPid']}, "
                        f"{old.get('url')}); edits to spec.adapters in the manifest it was started from are applied "
                        f"live; for anything else run `llmfleet down {isvc.metadata.name}` first", 1)
        rdir.mkdir(parents=True, exist_ok=True)
        if detach:
            raise typer.Exit(_detach(file, rdir, port, ready_timeout, prometheus))
        from llmfleet.local.foreground import run_foreground

        raise typer.Exit(run_foreground(isvc, rdir, port or None, dashboard, None if prometheus else False,
                                        manifest=file.resolve(), ledger=listed))

    @app.command("down", help="Stop a local InferenceService started by `llmfleet up` (drains first).")
    def down(
        name: str | None = typer.Argument(None, help="InferenceService name (the only one running when omitted)."),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="State folder of the run."),
        timeout: float = typer.Option(180.0, "--timeout", callback=non_negative_number,
                                       help="Seconds to wait for the drain before killing."),
    ) -> None:
        from llmfleet.local.run_state import down as stop

        rdir = _run_dir(name, run_dir)
        try:
            killed = stop(rdir, timeout_s=timeout)
        except FileNotFoundError as err:
            raise _fail(f"llmfleet down: {err}", 1) from None
        typer.echo(f"stopped {rdir.name}" + (f" (killed leftover pids {killed})" if killed else ""))

    @app.command("status", help="Show a local InferenceService: replicas, ports, restarts, live metrics.")
    def status(
        name: str | None = typer.Argument(None, help="InferenceService name (the only one running when omitted)."),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="State folder of the run."),
    ) -> None:
        import asyncio

        from rich.console import Console

        from llmfleet.local.dashboard import Collector, render, scrape_texts
        from llmfleet.local.run_state import pid_alive, read_state

        rdir = _run_dir(name, run_dir)
        state = read_state(rdir)
        if state is None:
            raise _fail(f"llmfleet status: no state in {rdir}", 1)
        if not pid_alive(state.get("supervisorPid")):
            raise _fail(f"llmfleet status: {state.get('name')} is not running (last state in {rdir})", 1)
        urls = [r["url"] for r in state.get("replicas", []) if r.get("running")]
        col = Collector()

        async def scrape() -> None:
            router = await scrape_texts([state["url"]])
            col.update(await scrape_texts(urls), router[0] if router else None)

        async def two() -> None:
            await scrape()
            await asyncio.sleep(2.0)
            await scrape()

        asyncio.run(two())
        Console().print(render(state, col.history[-1][1]))

    model = typer.Typer(help="Model utilities.", no_args_is_help=True)
    app.add_typer(model, name="model")

    @model.command("build-tiny", help="Build the tiny primary and student Llama models (cached; never downloaded).")
    def build_tiny(
        out: Path | None = typer.Option(None, "--out", help="Cache folder; $LLMFLEET_CACHE/models or ~/.cache/llmfleet/models."),
        force: bool = typer.Option(False, "--force", help="Rebuild even when cached."),
        train_steps: int = typer.Option(0, "--train-steps", min=0,
                                        help="Also train each model this many steps on stdlib source with the "
                                             "training worker (CPU; slow: seconds per step). 0 = random weights."),
    ) -> None:
        from llmfleet.local.tinymodel import SPECS, build_tiny, param_count

        for name, spec in SPECS.items():
            path = build_tiny(spec, out, force)
            typer.echo(f"{name}: {path}  ({param_count(spec) / 1e6:.1f}M params, random weights)")
            if train_steps:
                from llmfleet.local.tinytrain import trained_tiny

                typer.echo(f"{name}: training {train_steps} steps with llmfleet.workers.train ...")
                try:
                    trained = trained_tiny(spec, train_steps, out, force)
                except RuntimeError as err:
                    raise _fail(f"llmfleet model build-tiny: {err}", 1) from None
                typer.echo(f"{name}: {trained}  (trained {train_steps} steps; log in train.log)")


def _detach(file: Path, rdir: Path, port: int, ready_timeout: float, prometheus: bool) -> int:
    import subprocess
    import sys
    import time

    from llmfleet.local.run_state import pid_alive, read_state

    (rdir / "logs").mkdir(parents=True, exist_ok=True)
    (rdir / "state.json").unlink(missing_ok=True)
    log_path = rdir / "logs" / "supervisor.log"
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmfleet.cli", "up", "-f", str(file), "--run-dir", str(rdir), "--port", str(port),
             "--no-dashboard", "--prometheus" if prometheus else "--no-prometheus"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    typer.echo(f"started supervisor pid {proc.pid}; logs in {rdir / 'logs'}; waiting for readiness...")
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        state = read_state(rdir)
        if state and state.get("ready"):
            typer.echo(f"ready: {state['url']}/v1  (llmfleet down --run-dir {rdir})")
            return 0
        if proc.poll() is not None or (state and not pid_alive(state.get("supervisorPid"))):
            tail = log_path.read_text(errors="replace").splitlines()[-15:]
            typer.echo("llmfleet up: the supervisor exited before becoming ready:\n" + "\n".join(tail), err=True)
            return 1
        time.sleep(1.0)
    typer.echo(f"llmfleet up: not ready after {ready_timeout:.0f}s; still starting (see {rdir / 'logs'})", err=True)
    return 1
