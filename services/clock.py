"""Injected time, so logic never reads the wall clock directly and tests can move time by hand."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What logic needs from time: wall-clock milliseconds and a monotonic reading."""

    def time_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clock."""

    def time_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock for tests: it moves only when told to. Not thread-safe."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._mono = 0.0

    def time_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, ms: int) -> None:
        self._now_ms += ms
        self._mono += ms / 1000.0


SYSTEM_CLOCK = SystemClock()
