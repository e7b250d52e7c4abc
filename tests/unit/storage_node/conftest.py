from __future__ import annotations

import pytest

from services.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=1_700_000_000_000)
