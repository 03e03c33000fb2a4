"""`llmfleet operator`: run the kopf operator for TrainingJob and InferenceService (imports kopf lazily)."""

from __future__ import annotations

import typer

from llmfleet.api.contracts import OPERATOR_LIVENESS_PORT, OPERATOR_METRICS_PORT
from llmfleet.operator.config import PRIORITY_MAX, PRIORITY_MIN


def register(app: typer.Typer) -> None:
    @app.command(
        "operator",
        help="Run the operator: reconcile TrainingJobs and InferenceServices (cluster-wide unless --namespace).",
    )
    def operator(
        namespace: list[str] = typer.Option([], "--namespace", "-n", help="Namespace to watch (repeat; globs allowed)."),
        all_namespaces: bool = typer.Option(False, "--all-namespaces", "-A", help="Watch every namespace (the default without --namespace)."),
        metrics_port: int = typer.Option(OPERATOR_METRICS_PORT, "--metrics-port", min=0, max=65535,
                                          help="Port of /metrics (Prometheus); 0 disables."),
        liveness_port: int = typer.Option(OPERATOR_LIVENESS_PORT, "--liveness-port", min=0, max=65535,
                                           help="Port of /healthz (liveness probe); 0 disables."),
        peering: str = typer.Option("llmfleet", "--peering", help="kopf peering object name (leader election between replicas)."),
        standalone: bool = typer.Option(False, "--standalone", help="Run without peering (a single replica)."),
        priority: int = typer.Option(
            0, "--priority", min=PRIORITY_MIN, max=PRIORITY_MAX,
            help="Peering priority; the highest live replica acts (equal priorities: ordered by identity, POD_ID).",
        ),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logs."),
        log_format: str = typer.Option("json", "--log-format", help="json (structured) or text."),
    ) -> None:
        if all_namespaces and namespace:
            typer.echo("llmfleet operator: --namespace and --all-namespaces are mutually exclusive", err=True)
            raise typer.Exit(2)
        if log_format not in ("json", "text"):
            typer.echo(f"llmfleet operator: --log-format must be json or text, got {log_format!r}", err=True)
            raise typer.Exit(2)
        from llmfleet.operator.config import OperatorConfig
        from llmfleet.operator.run import RunOptions, run

        try:
            config = OperatorConfig.from_env()
        except ValueError as err:
            typer.echo(f"llmfleet operator: {err}", err=True)
            raise typer.Exit(2) from None
        opts = RunOptions(
            namespaces=namespace,
            all_namespaces=all_namespaces,
            metrics_port=metrics_port or None,
            liveness_port=liveness_port or None,
            peering=peering,
            standalone=standalone,
            priority=priority,
            config=config,
        )
        status = run(opts, verbose=verbose, log_format=log_format)
        if status:
            raise typer.Exit(status)
