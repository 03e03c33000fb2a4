"""Assemble docs/benchmarks.md from the per-benchmark sections in docs/benchmarks/*.md.

Each benchmark script writes benchmarks/results/<script>.json (numbers, machine, command); its prose and
table live in docs/benchmarks/<script>.md. Run: python benchmarks/collect_docs.py
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["train_mfu", "operator_scale", "serve_local", "router_overhead", "autoscale_eval", "store_lookup",
         "routing_eval", "routing_vllm", "sim_scale", "roofline_measure", "lora_eval"]


def _shift_headings(text: str, top: int) -> str:
    """Shift markdown headings (outside code fences) so the section's highest heading is at level `top`."""
    lines = text.splitlines()
    fenced, levels = False, []
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            levels.append(len(line) - len(line.lstrip("#")))
    shift = top - min(levels) if levels else 0
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#") and shift:
            line = "#" * shift + line if shift > 0 else line[-shift:]
        out.append(line)
    return "\n".join(out)


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
            if not m and "sessions" in data:  # GPU runs on lent machines record one entry per device session
                m = "NVIDIA H200 (1 and 2 GPUs, device tool)"
            machine = m if isinstance(m, str) else ", ".join(f"{v}" for v in list(m.values())[:3])
        rel = f"benchmarks/results/{name}.json" if result.exists() else "—"
        out.append(f"| [{name}](#{name.replace('_', '-')}) | {str(machine)[:80]} | `{rel}` |")
    out.append("")
    for name in names:
        text = _shift_headings(sections[name].read_text().strip(), top=2)
        if not text.startswith("## "):
            text = f"## {name}\n\n{text}"
        out += [f'<a id="{name.replace("_", "-")}"></a>', "", text, ""]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(out))
    print(f"wrote docs/benchmarks.md ({len(names)} sections)")


if __name__ == "__main__":
    main()
