"""benchmarks/router_scrape.py end to end at a tiny size: it runs against the router's own check, and its results
file has every row and the parse timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_router_scrape_runs_and_writes_its_rows(tmp_path: Path) -> None:
    out = tmp_path / "scrape.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "router_scrape.py"), "--replicas", "3",
                           "--rounds", "2", "--out", str(out)], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = doc["results"]["3"]
    assert set(rows) == {"llmfleet", "aiohttp + line scan", "aiohttp + prometheus_client"}
    assert all(r["cpu_us_per_check"] > 0 and r["wall_ms_per_round"] > 0 for r in rows.values())
    assert set(doc["parse_alone_us"]) == {"line scan", "every sample", "prometheus_client"}
    assert doc["page"]["lines"] == 614 and doc["command"].startswith("python benchmarks/router_scrape.py")
    assert "llmfleet" in proc.stdout and str(out) in proc.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "router_scrape.py"), "--replicas", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--replicas and --rounds must be >= 1" in bad.stderr
