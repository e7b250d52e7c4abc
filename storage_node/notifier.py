"""Wakes fetch long-polls when a partition changes: records appended (what followers wait
for), its high watermark moved (what consumers wait for)."""

from __future__ import annotations

import asyncio


class AppendNotifier:
    """One future per partition, completed (and replaced) on every append.

    Long-polling readers ``await wait(key, timeout)``; the appender calls ``notify(key)`` after
    the records are in the log. Must be used from the event loop's thread.
    """

    def __init__(self) -> None:
        self._waiters: dict[object, asyncio.Future[None]] = {}

    def notify(self, key: object) -> None:
        future = self._waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, key: object, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the next append to ``key``; True if one happened."""
        if timeout <= 0:
            return False
        future = self._waiters.get(key)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiters[key] = future
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except TimeoutError:
            return False

    async def wait_any(self, keys: list[object], timeout: float) -> bool:
        """Wait up to ``timeout`` s for a change to any of ``keys``; True if one happened."""
        if timeout <= 0 or not keys:
            return False
        loop = asyncio.get_running_loop()
        futures = []
        for key in keys:
            future = self._waiters.get(key)
            if future is None or future.done():
                future = loop.create_future()
                self._waiters[key] = future
            futures.append(future)
        done, _ = await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return bool(done)
