"""docs/benchmarks.md lists every benchmark that has results, and its links resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def test_every_benchmark_with_results_has_an_entry_and_a_page() -> None:
    text = PAGE.read_text()
    for result in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        name = result.stem
        assert f"(benchmarks/{name}.md)" in text, f"docs/benchmarks.md has no entry for {name}"
        assert (ROOT / "docs" / "benchmarks" / f"{name}.md").exists(), f"docs/benchmarks/{name}.md is missing"
        assert (ROOT / "benchmarks" / f"{name}.py").exists(), f"benchmarks/{name}.py is missing"


def test_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", PAGE.read_text()):
        assert (PAGE.parent / target).exists(), target
