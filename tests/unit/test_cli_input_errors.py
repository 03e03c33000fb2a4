"""Unreadable input files give one line naming the file (and line) and exit 2, for every command that reads one.

The files live in tests/hostile/files/ (each found hostile input stays a regression test here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmfleet.api.loader import InputFileError, load_file, load_json_file, load_yaml_file
from llmfleet.cli.main import app

FILES = Path(__file__).resolve().parents[1] / "hostile" / "files"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
YAMLS = sorted(FILES.glob("*.yaml"))
JSONS = sorted(FILES.glob("*.json"))
runner = CliRunner()

# Expected "FILE[:LINE]: " prefix per hostile file (the line where the parser knows it).
WHERE = {
    "non-utf8.yaml": "non-utf8.yaml:4:",
    "unclosed.yaml": "unclosed.yaml:4:",
    "tab-indent.yaml": "tab-indent.yaml:4:",
    "non-utf8.json": "non-utf8.json:2:",
    "truncated.json": "truncated.json:2:",
}


def _commands(path: Path) -> list[list[str]]:
    """Every CLI entry that reads this kind of file."""
    isvc = str(EXAMPLES / "inferenceservice-small.yaml")
    if path.suffix == ".json":
        return [["autoscaler", "decide", isvc, "--signals", str(path)],
                ["sim", "run", "--calibration", str(path), "--duration", "1"],
                ["sim", "run", "--trace", str(path), "--format", "mooncake"]]
    return [["validate", str(path)], ["up", "-f", str(path), "--no-dashboard"], ["train", "-f", str(path)],
            ["plan", "--shape", str(path)], ["autoscaler", "decide", str(path), "--signals", str(path)]]


def _one_line_exit_2(args: list[str], name: str) -> str:
    result = runner.invoke(app, args)
    out = result.output.strip()
    assert result.exit_code == 2, (args, result.exit_code, out, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert name in out, out
    return out


@pytest.mark.parametrize("path", YAMLS + JSONS, ids=lambda p: p.name)
def test_every_file_reading_command_gives_one_line_and_exit_2(path: Path) -> None:
    for args in _commands(path):
        out = _one_line_exit_2(args, path.name)
        if path.name in WHERE and args[0] != "sim":  # the trace loaders (llmfleet.sim) do not know the line
            assert WHERE[path.name] in out, out


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_loader_raises_input_file_error(path: Path) -> None:
    with pytest.raises(InputFileError) as info:
        load_file(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
    with pytest.raises(InputFileError):
        load_yaml_file(path)


@pytest.mark.parametrize("path", JSONS, ids=lambda p: p.name)
def test_json_loader_raises_input_file_error(path: Path) -> None:
    with pytest.raises(InputFileError) as info:
        load_json_file(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_missing_file_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    for args in (["validate", str(missing)], ["train", "-f", str(missing)], ["plan", "--shape", str(missing)]):
        _one_line_exit_2(args, "nope.yaml")


def test_validate_reports_every_file_and_exits_with_the_worst_status(tmp_path: Path) -> None:
    good = EXAMPLES / "inferenceservice-small.yaml"
    invalid = EXAMPLES / "invalid" / "trainingjob-bad-precision.yaml"
    result = runner.invoke(app, ["validate", str(good), str(FILES / "non-utf8.yaml"), str(invalid)])
    assert result.exit_code == 2
    assert "inferenceservice-small.yaml" in result.output and "spec.optimization.precision" in result.output
    assert "non-utf8.yaml:4: not UTF-8 text" in result.output
    assert runner.invoke(app, ["validate", str(good), str(invalid)]).exit_code == 1


def test_features_log_lines_that_cannot_be_decoded_are_counted_not_fatal() -> None:
    """`llmfleet features generate` reads a JSON-lines request log: a hostile line is a bad line, not a crash."""
    from llmfleet.store import generation

    report = generation.Report()
    generation.aggregate([b"[" * 5000 + b"]" * 5000 + b"\n", b"\xff\xfe\n", b'{"tenant": 1\n'], 16, report)
    assert report.bad_lines == 3 and len(report.errors) == 3


@pytest.mark.parametrize("args,option", [
    (["up", "-f", str(EXAMPLES / "inferenceservice-small.yaml"), "--ready-timeout", "nan"], "--ready-timeout"),
    (["up", "-f", str(EXAMPLES / "inferenceservice-small.yaml"), "--ready-timeout", "-1"], "--ready-timeout"),
    (["up", "-f", str(EXAMPLES / "inferenceservice-small.yaml"), "--port", "70000"], "--port"),
    (["down", "--timeout", "nan"], "--timeout"),
    (["train", "-f", str(EXAMPLES / "trainingjob-small.yaml"), "--promote-timeout", "0"], "--promote-timeout"),
    (["features", "lookup", "--model", "m", "--prompt", "hi", "--timeout-ms", "nan"], "--timeout-ms"),
    (["fetch", "/nonexistent-src", "/nonexistent-dest", "--progress-every", "nan"], "--progress-every"),
    (["router", "--port", "-1"], "--port"),
    (["operator", "--metrics-port", "99999"], "--metrics-port"),
])
def test_numeric_options_out_of_range_are_usage_errors_naming_the_option(args: list[str], option: str) -> None:
    """Seconds and ports out of range (nan, negative, past 65535) stop before anything starts: exit 2 naming the
    option, instead of a wait that never ends or a lookup that times out at once and reports a miss."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and f"Invalid value for '{option}" in r.output, r.output
