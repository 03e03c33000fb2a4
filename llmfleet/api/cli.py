"""`llmfleet crds generate` and `llmfleet validate`."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

# Copies kept byte-identical with crds/ (the Helm chart ships the same CRDs).
CHART_CRD_DIR = Path("charts/llmfleet/crds")

# Checks that need knowledge above the API layer (the GPU table of llmfleet.plan, say), added by those
# layers' CLI modules when they register: each takes a loaded resource and returns (field path, message)
# problems; `llmfleet validate` runs them all after the schema checks pass.
RESOURCE_CHECKS: list[Callable[[Any], list[tuple[str, str]]]] = []


def _out_of_range(value: float, low: float, inclusive: bool) -> str | None:
    """Why `value` is not a finite number > low (>= low with `inclusive`), or None: nan fails every comparison, so
    it never slips past one."""
    if math.isfinite(value) and (value >= low if inclusive else value > low):
        return None
    return f"must be a finite number {'>=' if inclusive else '>'} {low:g}, got {value:g}"


def require_number(flag: str, value: float, low: float = 0.0, *, inclusive: bool = False) -> None:
    """A numeric CLI option must be finite and > low (>= low with `inclusive`), else ValueError naming it: checked
    before anything is built from it, so the error names the option (a model's validation error further in would
    not)."""
    if problem := _out_of_range(value, low, inclusive):
        raise ValueError(f"{flag} {problem}")


def positive_number(value: float | None) -> float | None:
    """typer callback of a float option that must be finite and > 0 (seconds): a usage error naming the option
    otherwise (typer's `min` takes no open bound and lets inf through)."""
    if value is not None and (problem := _out_of_range(value, 0.0, False)):
        raise typer.BadParameter(problem)
    return value


def non_negative_number(value: float | None) -> float | None:
    """typer callback of a float option that must be finite and >= 0."""
    if value is not None and (problem := _out_of_range(value, 0.0, True)):
        raise typer.BadParameter(problem)
    return value


def register(app: typer.Typer) -> None:
    crds = typer.Typer(help="CustomResourceDefinitions generated from the pydantic models.", no_args_is_help=True)
    app.add_typer(crds, name="crds")

    @crds.command("generate")
    def generate(
        out: Path = typer.Option(Path("crds"), "--out", "-o", help="Folder for the CRD YAML files."),
        docs: Path = typer.Option(Path("docs/api-reference.md"), "--docs", help="Markdown API reference to keep in sync."),
        check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file is stale."),
        chart: bool = typer.Option(
            True, "--chart/--no-chart", help=f"Also keep {CHART_CRD_DIR} identical when that folder's chart exists."
        ),
    ) -> None:
        """Write crds/*.yaml (and the chart's copies) from llmfleet.api."""
        from llmfleet.api.crdgen import all_crds, api_reference, render

        targets = [out]
        if chart and CHART_CRD_DIR.parent.is_dir():
            targets.append(CHART_CRD_DIR)
        stale: list[Path] = []
        for folder in targets:
            for name, crd in all_crds().items():
                path = folder / name
                text = render(crd)
                if path.exists() and path.read_text() == text:
                    continue
                if check:
                    stale.append(path)
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                typer.echo(f"wrote {path}")
        reference = docs
        text = api_reference() + "\n"
        if not (reference.exists() and reference.read_text() == text):
            if check:
                stale.append(reference)
            else:
                reference.parent.mkdir(parents=True, exist_ok=True)
                reference.write_text(text)
                typer.echo(f"wrote {reference}")
        if stale:
            typer.echo(f"stale CRDs (run `make crds`): {', '.join(map(str, stale))}", err=True)
            raise typer.Exit(1)

    @app.command("validate", help="Validate llmfleet manifests; print each problem with its field path. Exit 1 when "
                                  "a resource is invalid, 2 when a file cannot be read or parsed (missing, not UTF-8, "
                                  "YAML syntax, nested too deeply).")
    def validate(
        files: list[Path] = typer.Argument(..., help="Manifest files (YAML, may hold several documents)."),
    ) -> None:
        from llmfleet.api.loader import InputFileError, ManifestError, load_file

        console = Console(stderr=True, soft_wrap=True)
        status = 0
        for f in files:
            try:
                resources = load_file(f)
            except InputFileError as err:
                status = 2
                console.print(f"[red]✗[/red] {escape(str(err))}", highlight=False)
                continue
            except ManifestError as err:
                status = max(status, 1)
                for path, msg in err.problems:
                    console.print(f"[red]✗[/red] {escape(err.source)}: [bold]{escape(path)}[/bold]: {escape(msg)}", highlight=False)
                continue
            for r in resources:
                problems = [p for check in RESOURCE_CHECKS for p in check(r)]
                for path, msg in problems:
                    console.print(f"[red]✗[/red] {escape(str(f))}: {r.kind}/{r.metadata.name}: [bold]{escape(path)}"
                                  f"[/bold]: {escape(msg)}", highlight=False)
                if problems:
                    status = max(status, 1)
                    continue
                console.print(f"[green]✓[/green] {escape(str(f))}: {r.kind}/{r.metadata.name}", highlight=False)
        if status:
            raise typer.Exit(status)
