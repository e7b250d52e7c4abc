"""A local, always-current copy of every key under a prefix, fed by a watch.

The coordinator and the gateway keep their metadata (brokers, topics, partition leaders) this
way: reads are local dict lookups, and :attr:`PrefixCache.revision` says how current the copy is.
Changes of one etcd revision (one txn) are applied together, so a reader never sees half a txn.
After compaction the watch resyncs and the cache is *replaced* by the fresh listing, which also
drops keys whose deletion was never seen.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .exceptions import EtcdError
from .values import EventType, KeyValue, WatchResync
from .watch import Watch, WatchBatch

if TYPE_CHECKING:
    from .client import EtcdClient

log = logging.getLogger(__name__)


class PrefixCache:
    """``key -> KeyValue`` for every key starting with ``prefix``, kept in sync by a watch.

    Keys are the client's keys (relative to the client prefix, *including* ``prefix``).
    ``on_change`` (sync or async) is called after each applied batch with the batch (a list of
    :class:`~services.etcd.values.WatchEvent` or a :class:`WatchResync`). Use from one event loop.
    """

    def __init__(
        self, client: EtcdClient, prefix: str, *, on_change: Callable[[WatchBatch], Any] | None = None
    ) -> None:
        self.prefix = prefix
        self._client = client
        self._on_change = on_change
        self._data: dict[str, KeyValue] = {}
        self._revision = 0
        self._changed = asyncio.Event()
        self._watch: Watch | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: EtcdError | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> PrefixCache:
        """Load the current contents and start following changes; return ``self``."""
        if self._watch is not None:
            return self
        self._watch = await self._client.watch_prefix_with_snapshot(self.prefix)
        await self._apply(await self._watch.next_batch())
        self._task = asyncio.create_task(self._follow_routine(), name=f"etcd-cache-{self.prefix}")
        return self

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.cancel()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def __aenter__(self) -> PrefixCache:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- reads ------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The etcd revision the cache reflects: it holds every change up to it."""
        return self._revision

    def get(self, key: str) -> KeyValue | None:
        return self._data.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def snapshot(self) -> dict[str, KeyValue]:
        """A copy of the contents (safe to keep while the cache moves on)."""
        return dict(self._data)

    async def wait_for_revision(self, revision: int, timeout: float | None = None) -> None:
        """Wait until the cache holds every change up to ``revision``.

        Meant for read-your-writes after a write *under this prefix* (pass the revision the
        write returned); a revision of a write elsewhere may never be reached, since the cache
        only hears about its own prefix.
        """
        async with asyncio.timeout(timeout):
            while self._revision < revision:
                await self._wait_changed()

    async def wait_for_change(self, after_revision: int | None = None, timeout: float | None = None) -> int:
        """Wait until the cache moves past ``after_revision`` (default: now); return the revision."""
        start = self._revision if after_revision is None else after_revision
        await self.wait_for_revision(start + 1, timeout)
        return self._revision

    # -- internals -----------------------------------------------------------------------------

    async def _wait_changed(self) -> None:
        if self._error is not None:
            raise self._error
        if self._task is not None and self._task.done():
            raise EtcdError(f"the cache of {self.prefix!r} is stopped")
        await self._changed.wait()

    def _notify(self) -> None:
        # Wake every waiter, then give later waiters a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    async def _follow_routine(self) -> None:
        assert self._watch is not None
        try:
            async for batch in self._watch.batches():
                await self._apply(batch)
        except EtcdError as error:
            log.error("cache of %r stopped: %s", self.prefix, error)
            self._error = error
        finally:
            self._notify()

    async def _apply(self, batch: WatchBatch) -> None:
        if isinstance(batch, WatchResync):
            self._data = {kv.key: kv for kv in batch.kvs}
            self._revision = batch.revision
        else:
            for event in batch:
                if event.type is EventType.PUT:
                    self._data[event.kv.key] = event.kv
                else:
                    self._data.pop(event.kv.key, None)
            self._revision = max(self._revision, batch[-1].revision)
        self._notify()
        if self._on_change is None:
            return
        try:
            result = self._on_change(batch)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_change callback of the %r cache failed", self.prefix)
