"""Where the benchmark scripts write: the recorded results the docs show, and their plots.

A run whose results file is in benchmarks/results (the recorded results) puts its plots in docs/img, where the docs
show them; any other run (`--out elsewhere.json`, e.g. on one's own traces) puts them beside its results file, so it
leaves the documented plots alone.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMG = ROOT / "docs" / "img"


def plot_dir(out: Path) -> Path:
    """The folder for the plots of a run that writes its results to `out`."""
    return IMG if out.resolve().parent == RESULTS.resolve() else out.resolve().parent
