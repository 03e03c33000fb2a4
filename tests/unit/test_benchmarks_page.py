"""docs/benchmarks.md lists every benchmark that has results, and its links resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def _script(result: Path) -> str:
    """The benchmark that wrote a results file: `<script>.json`, or `<script>_<part>.json` for a second results file
    of the same script (autoscale_eval_heldout.json: autoscale_eval.py on held-out workloads)."""
    name = result.stem
    while "_" in name and not (ROOT / "benchmarks" / f"{name}.py").exists():
        name = name.rsplit("_", 1)[0]
    return name


def test_every_benchmark_with_results_has_an_entry_and_a_page() -> None:
    text = PAGE.read_text()
    for result in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        name = _script(result)
        assert f"(benchmarks/{name}.md)" in text, f"docs/benchmarks.md has no entry for {name}"
        assert (ROOT / "docs" / "benchmarks" / f"{name}.md").exists(), f"docs/benchmarks/{name}.md is missing"
        assert (ROOT / "benchmarks" / f"{name}.py").exists(), f"benchmarks/{name}.py is missing"
        if name != result.stem:  # a second results file: its script's page says where it comes from
            assert f"results/{result.name}" in (ROOT / "docs" / "benchmarks" / f"{name}.md").read_text(), (
                f"docs/benchmarks/{name}.md does not mention {result.name}")


def test_links_resolve() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", PAGE.read_text()):
        assert (PAGE.parent / target).exists(), target
