"""``GroupCommit``: fsync-before-acknowledge for asyncio callers, one fsync for many appends."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Protocol


class DurableLog(Protocol):
    """What group commit needs from a log (``PartitionLog`` provides it)."""

    @property
    def recovery_point(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def flush(self) -> None: ...


class GroupCommit:
    """Coalesces fsyncs: ``await wait_durable(log, offset)`` returns once ``offset`` is on disk.

    Per log, at most one flush runs at a time, in a worker thread (never on the event loop).
    Waiters that arrive while it runs wait for it; when it finishes, every waiter whose offset it
    covered returns, and one flush is started for all the rest. So N concurrent producers waiting
    on one partition cost about two fsyncs, not N -- the classic group commit. A flush covers
    every append made before it started (``PartitionLog.flush`` snapshots the log end first).

    A failed flush raises its error (KafkaStorageError) in every waiter that was waiting for it.

    Thread safety: use from one event loop. ``flush_count`` counts the flushes it ran.
    """

    def __init__(self, *, executor: Executor | None = None) -> None:
        self._executor = executor
        self._in_flight: dict[int, asyncio.Future[None]] = {}
        self.flush_count = 0

    async def wait_durable(self, log: DurableLog, offset: int) -> None:
        """Return once every offset up to and including ``offset`` of ``log`` is fsynced.

        ValueError if ``offset`` was never appended (it could never become durable).
        """
        while log.recovery_point <= offset:
            if offset >= log.log_end_offset:
                raise ValueError(f"offset {offset} is not in the log (log end {log.log_end_offset})")
            flush = self._in_flight.get(id(log))
            if flush is None:
                flush = asyncio.ensure_future(self._do_flush(log))
                # Mark the error retrieved even if every waiter was cancelled meanwhile.
                flush.add_done_callback(lambda done: done.cancelled() or done.exception())
                self._in_flight[id(log)] = flush
            # shield: one cancelled waiter must not cancel the flush the others are waiting on
            await asyncio.shield(flush)

    async def _do_flush(self, log: DurableLog) -> None:
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, log.flush)
            self.flush_count += 1
        finally:
            del self._in_flight[id(log)]
