"""One line at the end of a test run: which tiers were skipped and why, instead of pytest's long skip list.

A skipped test belongs to the tier of its first tier marker (pyproject.toml registers them: e2e, gpu,
prometheus, postgres, helm, shellcheck, network); a skip without one is "other". tests/conftest.py loads the
hooks below. When LLMFLEET_SKIP_LOG names a file (`make test` sets it), each pytest run appends its skips
there as JSON lines and prints nothing; `python tests/skip_tiers.py LOG` then prints the line for all the
runs together, so a suite split over several pytest calls still ends with one line.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LOG_ENV = "LLMFLEET_SKIP_LOG"
# marker -> the tier's name in the summary, in the order the summary lists them.
TIER_MARKERS: dict[str, str] = {
    "e2e": "e2e",
    "gpu": "GPU",
    "prometheus": "Prometheus",
    "postgres": "PostgreSQL",
    "helm": "Helm chart",
    "shellcheck": "shellcheck",
    "network": "network",
}
OTHER = "other"
MAX_REASONS = 3  # per tier; the rest is counted


@dataclass(frozen=True)
class Skip:
    nodeid: str
    tier: str
    reason: str


def tier_of(markers: Iterable[str]) -> str:
    names = set(markers)
    return next((tier for marker, tier in TIER_MARKERS.items() if marker in names), OTHER)


def skip_reason(longrepr: Any) -> str:
    """The reason of a skip report: pytest keeps (path, line, "Skipped: reason") for skips."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ").strip()


def skip_of(report: Any) -> Skip:
    """A Skip from a skipped TestReport or CollectReport (the latter has no markers: tier "other")."""
    return Skip(report.nodeid, tier_of(getattr(report, "keywords", {}) or {}), skip_reason(report.longrepr))


def summary_line(skips: Sequence[Skip]) -> str:
    """`skipped tiers: e2e 16 (reason); GPU 3 (reason | reason); other 1 (reason)`, tiers in TIER_MARKERS order."""
    if not skips:
        return "skipped tiers: none (every tier ran)"
    order = [*TIER_MARKERS.values(), OTHER]
    by_tier: dict[str, Counter[str]] = {}
    for s in skips:
        by_tier.setdefault(s.tier, Counter())[s.reason] += 1
    parts = []
    for tier in sorted(by_tier, key=lambda t: order.index(t) if t in order else len(order)):
        reasons = by_tier[tier]
        shown = [r for r, _ in reasons.most_common(MAX_REASONS)]
        more = len(reasons) - len(shown)
        text = " | ".join(shown) + (f" | {more} more reasons" if more else "")
        parts.append(f"{tier} {sum(reasons.values())} ({text})")
    return "skipped tiers: " + "; ".join(parts)


def append_log(path: Path, skips: Iterable[Skip]) -> None:
    """Append the skips (the file is created even when there are none: the run finished)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for s in skips:
            f.write(json.dumps(asdict(s)) + "\n")


def read_log(path: Path) -> list[Skip]:
    if not path.exists():
        return []
    return [Skip(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# pytest hooks (tests/conftest.py imports them).
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    skips = [skip_of(r) for r in terminalreporter.stats.get("skipped", [])]
    log = os.environ.get(LOG_ENV)
    if log:
        append_log(Path(log), skips)
    else:
        terminalreporter.write_line(summary_line(skips))


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/skip_tiers.py SKIP_LOG", file=sys.stderr)
        return 2
    log = Path(argv[0])
    # Each finished pytest run creates the log, skips or not: no log means no run got to its summary.
    print(summary_line(read_log(log)) if log.exists() else "skipped tiers: unknown (no pytest run finished)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
