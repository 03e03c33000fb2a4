"""The one-line summary of skipped tiers (tests/skip_tiers.py): grouping, the log that joins several pytest
runs, and the hook in a real pytest run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from skip_tiers import (
    LOG_ENV,
    OTHER,
    Skip,
    append_log,
    main,
    read_log,
    skip_reason,
    summary_line,
    tier_of,
)

TESTS = Path(__file__).resolve().parents[1]


def test_tier_is_the_first_tier_marker_else_other() -> None:
    assert tier_of(["integration", "slow", "gpu", "skipif"]) == "GPU"
    assert tier_of({"prometheus": 1, "integration": 1}) == "Prometheus"
    assert tier_of(["postgres", "e2e"]) == "e2e"  # e2e comes first in TIER_MARKERS
    assert tier_of(["integration", "skip"]) == OTHER
    assert tier_of([]) == OTHER


def test_reason_comes_from_the_skip_report() -> None:
    assert skip_reason(("/x/test_a.py", 12, "Skipped: needs a CUDA GPU")) == "needs a CUDA GPU"
    assert skip_reason("Skipped: odd report") == "odd report"


def test_summary_groups_by_tier_in_tier_order_with_counts_and_reasons() -> None:
    skips = [
        Skip("t::sqlite", OTHER, "SQLite only"),
        Skip("t::gpu1", "GPU", "needs a CUDA GPU"),
        Skip("t::e2e1", "e2e", "e2e needs a kind cluster"),
        Skip("t::gpu2", "GPU", "needs a CUDA GPU"),
        Skip("t::fp8", "GPU", "needs fp8 tensor cores"),
        Skip("t::e2e2", "e2e", "e2e needs a kind cluster"),
    ]
    assert summary_line(skips) == (
        "skipped tiers: e2e 2 (e2e needs a kind cluster); "
        "GPU 3 (needs a CUDA GPU | needs fp8 tensor cores); other 1 (SQLite only)"
    )
    assert "\n" not in summary_line(skips)


def test_summary_caps_the_reasons_per_tier() -> None:
    skips = [Skip(f"t::{i}", OTHER, f"reason {i}") for i in range(5)]
    line = summary_line(skips)
    assert line.startswith("skipped tiers: other 5 (reason 0 | reason 1 | reason 2 | 2 more reasons)")


def test_summary_when_nothing_skipped() -> None:
    assert summary_line([]) == "skipped tiers: none (every tier ran)"


def test_log_joins_several_runs(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "run" / "skips.jsonl"
    assert read_log(log) == []
    assert main([str(log)]) == 0
    assert capsys.readouterr().out == "skipped tiers: unknown (no pytest run finished)\n"
    append_log(log, [])  # a run without skips
    assert main([str(log)]) == 0
    assert capsys.readouterr().out == "skipped tiers: none (every tier ran)\n"
    append_log(log, [Skip("a::1", "e2e", "no cluster")])
    append_log(log, [Skip("b::1", "GPU", "needs a CUDA GPU"), Skip("b::2", "e2e", "no cluster")])
    assert [s.nodeid for s in read_log(log)] == ["a::1", "b::1", "b::2"]
    assert main([str(log)]) == 0
    assert capsys.readouterr().out == "skipped tiers: e2e 2 (no cluster); GPU 1 (needs a CUDA GPU)\n"


SAMPLE = textwrap.dedent(
    """
    import pytest

    @pytest.mark.gpu
    @pytest.mark.skipif(True, reason="needs a CUDA GPU")
    def test_cuda():
        pass

    @pytest.mark.prometheus
    def test_prometheus():
        pytest.skip("needs the prometheus binary")

    def test_plain():
        pytest.skip("not here")

    def test_runs():
        pass
    """
)


def _pytest(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: x\n    prometheus: x\n")
    (folder / "test_sample.py").write_text(SAMPLE)
    # No third-party plugin autoload (several seconds each with this venv's plugins): only skip_tiers is loaded.
    full = {k: v for k, v in os.environ.items() if k != LOG_ENV} | env | {
        "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "skip_tiers", "-p", "no:cacheprovider", "-c",
         str(folder / "pytest.ini"), str(folder)],
        cwd=folder, env=full, capture_output=True, text=True, timeout=120,
    )


def test_a_pytest_run_ends_with_the_line(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped tiers: GPU 1 (needs a CUDA GPU); Prometheus 1 (needs the prometheus binary); other 1 (not here)" \
        in proc.stdout.splitlines()


def test_with_the_log_each_run_records_and_prints_nothing(tmp_path: Path) -> None:
    log = tmp_path / "skips.jsonl"
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        proc = _pytest(tmp_path / name, {LOG_ENV: str(log)})
        assert proc.returncode == 0 and "skipped tiers" not in proc.stdout, proc.stdout
    assert summary_line(read_log(log)) == (
        "skipped tiers: GPU 2 (needs a CUDA GPU); Prometheus 2 (needs the prometheus binary); other 2 (not here)"
    )
