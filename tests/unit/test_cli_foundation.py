"""The CLI surface of the foundation: validate, crds generate, --help, and the import discipline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.cli.main import COMMAND_MODULES, app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_validate_good_examples_exit_zero() -> None:
    result = runner.invoke(app, ["validate", *map(str, sorted((ROOT / "examples").glob("*.yaml")))])
    assert result.exit_code == 0, result.output


def test_validate_bad_example_names_the_field_and_exits_one() -> None:
    bad = ROOT / "examples/invalid/trainingjob-bad-precision.yaml"
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "spec.optimization.precision" in result.output


def test_validate_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml" in result.output


def test_crds_check_detects_stale_files(tmp_path: Path) -> None:
    out = tmp_path / "crds"
    assert runner.invoke(app, ["crds", "generate", "--out", str(out), "--docs", str(tmp_path / "api.md"), "--no-chart"]).exit_code == 0
    assert runner.invoke(app, ["crds", "generate", "--out", str(out), "--docs", str(tmp_path / "api.md"), "--no-chart", "--check"]).exit_code == 0
    victim = next(out.glob("*.yaml"))
    victim.write_text(victim.read_text() + "# edited\n")
    result = runner.invoke(app, ["crds", "generate", "--out", str(out), "--docs", str(tmp_path / "api.md"), "--no-chart", "--check"])
    assert result.exit_code == 1 and victim.name in result.output


@pytest.mark.parametrize(
    "command",
    [["--help"], ["crds", "generate", "--help"], ["validate", "--help"], ["operator", "--help"], ["up", "--help"],
     ["train", "--help"], ["router", "--help"], ["sim", "--help"], ["plan", "--help"]],
    ids=lambda c: " ".join(c),
)
def test_every_subcommand_has_help(command: list[str]) -> None:
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_cli_and_operator_never_import_torch_or_vllm() -> None:
    """The operator image has no torch: importing the CLI and the operator must not pull it in."""
    code = (
        "import sys, importlib\n"
        f"for m in {[m.__name__ for m in COMMAND_MODULES]!r} + ['llmfleet.cli.main', 'llmfleet.api']:\n"
        "    importlib.import_module(m)\n"
        "import pkgutil, llmfleet.operator as op\n"
        "for info in pkgutil.walk_packages(op.__path__, 'llmfleet.operator.'):\n"
        "    importlib.import_module(info.name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'ray'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"
