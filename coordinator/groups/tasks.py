"""Tasks owned by one controller term's group (or transaction) machinery: spawned, shielded,
cancelled together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from services import errors
from services.etcd.exceptions import EtcdError

log = logging.getLogger(__name__)

T = TypeVar("T")


class OwnedTasks:
    """Tasks that live at most as long as the term; exceptions are logged, never lost."""

    def __init__(self, kind: str = "consumer group") -> None:
        #: What the tasks are about, for the log.
        self.kind = kind
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved, so asyncio does not warn about it
        if exc is not None and not isinstance(exc, (errors.TributaryError, EtcdError)):
            log.error("%s task failed", self.kind, exc_info=exc)

    async def detached(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to its end even if the RPC awaiting it is cancelled: a client that gives
        up mid-write must not leave etcd and memory disagreeing.

        If instead the term ends under it (the task is cancelled with the others), the caller
        gets NOT_CONTROLLER, which clients and gateways retry against the next controller.
        """
        task = self.spawn(coro)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise errors.NotControllerError("the controller term ended during the call; retry") from None
            raise

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


async def restarting(routine: Callable[[], Coroutine[Any, Any, None]], kind: str = "consumer group") -> None:
    """Run a long-lived routine; if it fails on a bug, log it and start it again (a group or
    transaction routine must not die silently for the rest of the term)."""
    while True:
        try:
            await routine()
            return
        except Exception:
            log.exception("%s routine %s failed; restarting it", kind, getattr(routine, "__name__", routine))
            await asyncio.sleep(1.0)
