"""`llmfleet autoscaler ...`: run the autoscaler standalone, or evaluate the policy on given signals.

    llmfleet autoscaler decide service.yaml --signals signals.json     # pure policy, prints the decision
    llmfleet autoscaler run service.yaml --kube [--prometheus URL]      # against a cluster (kubeconfig)
    llmfleet autoscaler run service.yaml --local .run/chat [--once]     # observe a local run (dry run)

Inside the operator the same code runs as a kopf timer (llmfleet.autoscaler.kopf_handlers); inside
`llmfleet up` as the local runtime's loop (llmfleet.autoscaler.local.run_local).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def _fail(msg: str) -> typer.Exit:
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(2)


def _load_service(path: Path) -> Any:
    from llmfleet.api import InferenceService
    from llmfleet.api.loader import InputFileError, ManifestError, load_manifest

    try:
        obj = load_manifest(path)
    except InputFileError:
        raise  # one line from the CLI root
    except (ManifestError, OSError, ValueError) as err:
        raise _fail(f"{path}: {str(err).splitlines()[0] if str(err) else err!r}") from err
    if not isinstance(obj, InferenceService):
        raise _fail(f"{path}: expected an InferenceService, got {obj.kind}")
    return obj


def _decision_json(decision: Any) -> dict[str, Any]:
    return {
        "policy": decision.policy,
        "pools": {
            name: {"current": d.current, "desired": d.desired, "recommended": d.recommended, "action": d.action,
                   "predictedTtftMs": d.predicted_ttft_ms, "capacityRps": d.capacity_rps, "reasons": list(d.reasons)}
            for name, d in decision.pools.items()
        },
        "state": json.loads(decision.state.to_json()),
    }


class _ObserveActuator:
    """Dry run over a local run's state file: lists its replicas, changes nothing."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def _state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.run_dir / "state.json").read_text())
        except (OSError, ValueError) as err:
            raise _fail(f"cannot read {self.run_dir / 'state.json'}: {err}") from err
        return data

    async def list_replicas(self, pool: str) -> list[Any]:
        from llmfleet.autoscaler.actuation import ObservedReplica

        return [ObservedReplica(pool=r["pool"], name=r["name"], url=r["url"], ready=bool(r.get("ready")))
                for r in self._state().get("replicas", []) if r["pool"] == pool and r.get("running")]

    async def set_replicas(self, desired: Any, *, reason: str, state_json: str | None = None) -> None:
        if desired:
            typer.echo(f"would set {dict(desired)} ({reason})")

    async def drain_and_remove(self, replica: Any, *, timeout_s: float) -> Any:
        from llmfleet.autoscaler.actuation import DrainResult

        typer.echo(f"would drain and remove {replica.name}")
        return DrainResult(replica=replica, drained=False, removed=False, waited_s=0.0)


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="SLO-driven, cache-aware autoscaler (policies slo, queue, static).", no_args_is_help=True)
    app.add_typer(sub, name="autoscaler")

    @sub.command("decide", help="Run the pure policy once on signals from a JSON file and print the decision.")
    def decide_cmd(
        service: Path = typer.Argument(..., help="InferenceService YAML."),
        signals: Path = typer.Option(..., "--signals", help="JSON list of PoolSignals objects (snake_case fields)."),
        state: Path | None = typer.Option(None, "--state", help="Policy state JSON (the state annotation)."),
    ) -> None:
        from llmfleet.api.loader import load_json_file, parse_json, read_text
        from llmfleet.autoscaler.policy import PolicyConfig, PolicyState, decide
        from llmfleet.autoscaler.seeds import known_shapes, remember_shapes, seeds_for_service
        from llmfleet.autoscaler.types import signals_from_json

        isvc = _load_service(service)
        raw = load_json_file(signals)  # an unreadable file: one line from the CLI root, exit 2
        try:
            sigs = signals_from_json(raw)
        except ValueError as err:
            raise _fail(f"{signals}: {err}") from err
        st = PolicyState()
        if state is not None:
            # the annotation's reader starts fresh on anything unreadable (a controller must go on); a file given
            # on the command line that is not a JSON object is a mistake to report, not to ignore
            data = parse_json(read_text(state), str(state))
            if not isinstance(data, dict):
                raise _fail(f"{state}: a policy state is a JSON object (the state annotation's value)")
            st = PolicyState.from_mapping(data)
        try:
            d = decide(PolicyConfig.from_service(isvc, seeds=seeds_for_service(isvc, known_shapes(sigs, st))), sigs, st)
            remember_shapes(d.state, sigs)
        except ValueError as err:
            raise _fail(str(err)) from err
        typer.echo(json.dumps(_decision_json(d), indent=2))

    @sub.command("run", help="Run the autoscaler loop against a cluster (--kube) or observe a local run (--local).")
    def run_cmd(
        service: Path = typer.Argument(..., help="InferenceService YAML (name and namespace identify it)."),
        kube: bool = typer.Option(False, "--kube", help="Scale the live object in the cluster of the kubeconfig."),
        local: Path | None = typer.Option(None, "--local", help="Run folder of `llmfleet up` (dry run)."),
        prometheus: str | None = typer.Option(None, "--prometheus", help="Prometheus URL (else scrape directly)."),
        router: str | None = typer.Option(None, "--router", help="Router base URL for direct scraping."),
        once: bool = typer.Option(False, "--once", help="One decision, then exit."),
    ) -> None:
        import asyncio

        from llmfleet.autoscaler.local import run_local

        isvc = _load_service(service)
        if kube == (local is not None):
            raise _fail("give exactly one of --kube or --local")
        if kube:
            from llmfleet.api.contracts import ROUTER_PORT, child_name
            from llmfleet.autoscaler.kube import KubernetesActuator
            from llmfleet.kube.client import KubeClient, NoClusterConfig

            try:
                kube_client = KubeClient.from_env()
            except NoClusterConfig as err:
                raise _fail(str(err)) from err
            actuator: Any = KubernetesActuator(isvc.metadata.name, isvc.metadata.namespace or "default", kube_client)
            router_url = router or (
                f"http://{child_name(isvc.metadata.name, 'router')}.{isvc.metadata.namespace or 'default'}:{ROUTER_PORT}"
            )
        elif local is not None:
            actuator = _ObserveActuator(local)
            router_url = router or str(actuator._state().get("url", ""))
        else:
            raise _fail("give exactly one of --kube or --local")

        def show(result: Any) -> None:
            typer.echo(json.dumps(_decision_json(result.decision)["pools"]))

        async def main() -> None:
            try:
                await run_local(isvc, actuator, None, router_url=router_url or None, prometheus_url=prometheus,
                                on_step=show, once=once)
            finally:
                if kube:
                    await actuator.client.close()

        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
        except ValueError as err:
            raise _fail(str(err)) from err
