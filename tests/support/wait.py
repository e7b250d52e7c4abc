"""Waiting on observable state with a bounded deadline (never a fixed sleep as synchronisation).

``wait_until(check, timeout=..., what=...)`` calls ``check`` until it returns something truthy and
returns that value; after ``timeout`` seconds it fails with an AssertionError naming ``what`` and
the last value (or error) seen. Exceptions of the types in ``tolerate`` count as "not yet" (a
restarting cluster answers with errors for a while); any other exception propagates at once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from services.errors import TributaryError

T = TypeVar("T")

#: What a cluster answers with while a node or coordinator restarts: tolerate these while waiting.
CLUSTER_ERRORS: tuple[type[BaseException], ...] = (TributaryError, grpc.RpcError)

NOTHING_YET = "nothing yet"


def wait_until(
    check: Callable[[], T],
    *,
    timeout: float,
    what: str = "the condition",
    interval: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
) -> T:
    """``check()``'s first truthy result within ``timeout`` seconds; AssertionError otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = NOTHING_YET
    while True:
        try:
            last = check()
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def seconds_until(
    check: Callable[[], object],
    *,
    timeout: float,
    what: str = "the condition",
    interval: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
) -> float:
    """:func:`wait_until`, returning how many seconds it took (for tests that report it)."""
    started = time.monotonic()
    wait_until(check, timeout=timeout, what=what, interval=interval, tolerate=tolerate)
    return time.monotonic() - started


async def async_wait_until(
    check: Callable[[], Any],
    *,
    timeout: float = 5.0,
    what: str = "the condition",
    interval: float = 0.02,
) -> Any:
    """:func:`wait_until` inside an event loop; ``check`` may be sync or return an awaitable (a
    check that hangs is cancelled at the deadline)."""
    last: Any = NOTHING_YET
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            while True:
                last = check()
                if inspect.isawaitable(last):
                    last = await last
                if last:
                    return last
                await asyncio.sleep(interval)
    except TimeoutError:
        if not deadline.expired():
            raise
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
