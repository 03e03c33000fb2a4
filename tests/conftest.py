"""Shared test helpers live beside this file (tests/kubeemu.py): make them importable as top-level modules."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# The one-line summary of skipped tiers at the end of every run (tests/skip_tiers.py).
from skip_tiers import pytest_terminal_summary  # noqa: E402, F401
