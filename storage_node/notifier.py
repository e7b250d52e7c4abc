"""Wakes fetch long-polls when a partition changes: records appended (what followers wait
for), its high watermark moved (what consumers wait for)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class AppendNotifier:
    """One future per partition, completed (and replaced) on every append and every move of its
    high watermark; and watchers of many partitions at once (:meth:`watch`).

    Long-polling readers ``await wait(key, timeout)``; the appender calls ``notify(key)`` after
    the records are in the log. Must be used from the event loop's thread.
    """

    def __init__(self) -> None:
        self._waiters: dict[object, asyncio.Future[None]] = {}
        #: The futures of :meth:`watch`, by partition (a set each: unwatched one by one).
        self._watchers: dict[object, set[asyncio.Future[None]]] = {}

    def notify(self, key: object) -> None:
        future = self._waiters.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)
        watchers = self._watchers.pop(key, None)
        if watchers:
            for watcher in watchers:
                if not watcher.done():
                    watcher.set_result(None)

    def next_append(self, key: object) -> asyncio.Future[None]:
        """The future the next append to ``key`` completes. Shared by every waiter: await it
        through ``asyncio.shield`` or ``asyncio.wait``, never cancel it."""
        future = self._waiters.get(key)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiters[key] = future
        return future

    def watch(self, keys: Iterable[object]) -> asyncio.Future[None]:
        """A future of the caller's own, completed by the next append to any of ``keys``; give
        it back with :meth:`unwatch` (the same keys) once done with it, completed or not.

        One future for all the keys, where :meth:`next_append` per key made a wide long poll
        build and watch one future per partition (hundreds for a consumer's fetch session)."""
        watcher: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        watchers = self._watchers
        for key in keys:
            found = watchers.get(key)
            if found is None:
                watchers[key] = {watcher}
            else:
                found.add(watcher)
        return watcher

    def unwatch(self, keys: Iterable[object], watcher: asyncio.Future[None]) -> None:
        """Stop watching ``keys`` with ``watcher`` (a :meth:`watch` future)."""
        watchers = self._watchers
        for key in keys:
            found = watchers.get(key)
            if found is not None:
                found.discard(watcher)
                if not found:
                    del watchers[key]

    def watched(self) -> int:
        """How many partitions some :meth:`watch` future is waiting for (for tests)."""
        return len(self._watchers)

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
