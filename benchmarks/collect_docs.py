"""Assemble docs/benchmarks.md from the per-benchmark sections in docs/benchmarks/*.md.

Each benchmark script writes benchmarks/results/<script>.json (numbers, machine, command); its prose and
table live in docs/benchmarks/<script>.md. Run: python benchmarks/collect_docs.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["train_mfu", "operator_scale", "serve_local", "router_overhead", "autoscale_eval", "store_lookup",
         "routing_eval", "sim_scale", "roofline_measure"]


def main() -> None:
    sections = {p.stem: p for p in (ROOT / "docs" / "benchmarks").glob("*.md")}
    names = [n for n in ORDER if n in sections] + sorted(set(sections) - set(ORDER))
    out = [
        "# Benchmarks",
        "",
        "Every number below was measured by a script in `benchmarks/`; each section names the command. Raw",
        "results (with the machine and the command) are in `benchmarks/results/<script>.json`. This page is",
        "assembled by `python benchmarks/collect_docs.py` from `docs/benchmarks/*.md`.",
        "",
        "| benchmark | machine | result file |",
        "|---|---|---|",
    ]
    for name in names:
        result = ROOT / "benchmarks" / "results" / f"{name}.json"
        machine = "—"
        if result.exists():
            data = json.loads(result.read_text())
            m = data.get("machine") or data.get("env") or {}
            machine = m if isinstance(m, str) else ", ".join(f"{v}" for v in list(m.values())[:3])
        rel = f"benchmarks/results/{name}.json" if result.exists() else "—"
        out.append(f"| [{name}](#{name.replace('_', '-')}) | {str(machine)[:80]} | `{rel}` |")
    out.append("")
    for name in names:
        text = sections[name].read_text().strip()
        if not text.startswith("#"):
            text = f"## {name}\n\n{text}"
        else:
            # Demote the section's headings one level below this page's title.
            text = "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())
        out += [f'<a id="{name.replace("_", "-")}"></a>', "", text, ""]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(out))
    print(f"wrote docs/benchmarks.md ({len(names)} sections)")


if __name__ == "__main__":
    main()
