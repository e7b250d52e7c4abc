"""Wakes fetch long-polls when a partition changes: records appended (what followers wait
for), its high watermark moved (what consumers wait for)."""

from __future__ import annotations

import asyncio


class AppendNotifier:
    """One future per partition, completed (and replaced) on every append and every move of its
    high watermark.

    Long-polling readers ``await wait(key, timeout)``; the appender calls ``notify(key)`` after
    the records are in the log. Must be used from the event loop's thread.
    """

    def __init__(self) -> None:
        self._waiters: dict[object, asyncio.Future[None]] = {}

    def notify(self, key: object) -> None:
        future = self._waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def next_append(self, key: object) -> asyncio.Future[None]:
        """The future the next append to ``key`` completes. Shared by every waiter: await it
        through ``asyncio.shield`` or ``asyncio.wait``, never cancel it."""
        future = self._waiters.get(key)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiters[key] = future
        return future

    async def wait(self, key: object, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the next append to ``key``; True if one happened."""
        if timeout <= 0:
            return False
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a cancellation that
            # arrives as the awaited future completes, which once left a stopping node hanging.
            async with asyncio.timeout(timeout):
                await asyncio.shield(self.next_append(key))
            return True
        except TimeoutError:
            return False
