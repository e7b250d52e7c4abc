"""The event-loop time a request takes: what a ``request_percentage`` quota meters (KIP-124).

Kafka meters the time a request spends on the broker's network and request-handler threads.
The gateway serves every request on one asyncio event loop, where a request's coroutine runs in
steps between its waits (for a storage node's answer, for the socket); the time it holds the
loop is the sum of those steps. :func:`timed` runs a coroutine and adds the duration of each
of its steps to a :class:`LoopTime`, so waiting counts for nothing and the loop time of other
requests running meanwhile is not counted either.

What it covers: the request's own handler -- decoding, authorization, planning batches,
building and encoding the answer. What it does not: gRPC's own reading and writing of the
messages, and work the request hands to tasks that serve many requests at once (the appends to
a storage node's data port). Timing costs about a microsecond per step (two clock reads).
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from time import perf_counter
from typing import Any, TypeVar

T = TypeVar("T")


class LoopTime:
    """Seconds of event-loop time spent on one request so far."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds

    def add_since(self, started: float) -> None:
        """Count the time since ``started`` (a ``perf_counter()`` reading) as the request's."""
        self.seconds += perf_counter() - started


class _Timed(Coroutine[Any, Any, T]):
    """Drives ``coroutine`` step by step, adding each step's duration to ``spent``."""

    __slots__ = ("_coroutine", "_spent")

    def __init__(self, coroutine: Coroutine[Any, Any, T], spent: LoopTime) -> None:
        self._coroutine = coroutine
        self._spent = spent

    def send(self, value: Any) -> Any:
        started = perf_counter()
        try:
            return self._coroutine.send(value)
        finally:
            self._spent.seconds += perf_counter() - started

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        started = perf_counter()
        try:
            if val is None and tb is None:
                return self._coroutine.throw(typ)
            return self._coroutine.throw(typ, val, tb)
        finally:
            self._spent.seconds += perf_counter() - started

    def close(self) -> None:
        self._coroutine.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self  # an iterator over the steps (send and throw above)

    def __iter__(self) -> _Timed[T]:
        return self

    def __next__(self) -> Any:
        return self.send(None)


def timed(coroutine: Coroutine[Any, Any, T], spent: LoopTime) -> Coroutine[Any, Any, T]:
    """``coroutine``, counting the loop time of each of its steps in ``spent``."""
    return _Timed(coroutine, spent)
