from __future__ import annotations

import sys
from pathlib import Path

import pytest

from services.clock import ManualClock

# The suite runs with --import-mode=importlib, which does not put test directories on sys.path;
# the shared helpers in log_testkit.py (Kafka's LogTestUtils) are imported by name, so add ours.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_700_000_000_000)
