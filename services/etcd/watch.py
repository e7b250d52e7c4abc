"""Watches: async-iterable change feeds over key ranges, multiplexed on one stream per client.

Guarantees a :class:`Watch` gives its consumer:

* events arrive in revision order, each exactly once -- across disconnects, endpoint failover
  and etcd restarts, because after any break the watch is re-created from the revision after the
  last one it delivered (and anything older is dropped defensively);
* if that revision has been compacted away, the watch re-lists its range and yields a
  :class:`WatchResync` (the full current state, to replace -- not merge with -- what the consumer
  had), then continues with the events after it;
* it never fails because etcd is unreachable; it keeps reconnecting with backoff until
  cancelled. It ends (iteration stops) on :meth:`Watch.cancel` or when the client closes, and
  raises :class:`EtcdError` only if etcd itself cancels it for another reason (e.g. permissions).

:class:`Watcher` owns the client's single ``Watch`` stream. Watch ids are chosen by the client
(``WatchCreateRequest.watch_id``, etcd >= 3.4), so answers are matched without relying on order.
Events wait in an unbounded per-watch queue: one slow consumer must not stall the shared stream,
and metadata change rates are small.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from services.log_limit import RepeatedLog

from . import _rpc
from .connection import REQUIRE_LEADER_METADATA, Backoff, Stubs
from .exceptions import EtcdClosedError, EtcdError, EtcdUnavailableError, translate_rpc_error
from .values import EventType, KeyValue, WatchEvent, WatchResync

if TYPE_CHECKING:
    from .client import EtcdClient

log = logging.getLogger(__name__)
#: Reconnect loops during an etcd outage log once, then a count of the retries.
_repeats = RepeatedLog(log)
_STREAM_BROKE = "watch stream to %s broke (%s); reconnecting in %.2fs"

_END = object()  # queue sentinel: the watch is over
_ENDPOINT_FAILURE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Stream errors that reconnecting cannot fix: every watch fails with them instead.
_FATAL = (
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INVALID_ARGUMENT,
)

WatchItem = WatchEvent | WatchResync
WatchBatch = list[WatchEvent] | WatchResync


class Watch:
    """One watch over ``[key, range_end)``: ``async for item in watch`` yields
    :class:`WatchEvent` and, after compaction (or first, for a snapshot watch), :class:`WatchResync`.

    :meth:`batches` yields whole etcd responses instead (all events of a txn together), for
    consumers that must apply a revision atomically. Use one style per watch. Always end a watch
    with :meth:`cancel` (or ``async with``): until then it stays registered and queues events.
    Not thread-safe.
    """

    def __init__(
        self, watcher: Watcher, key: bytes, range_end: bytes, start_revision: int, *, prev_kv: bool
    ) -> None:
        self.key = key
        self.range_end = range_end
        self.prev_kv = prev_kv
        self._watcher = watcher
        # Where to (re)start: 0 = "now" until etcd's first answer pins it.
        self.next_revision = start_revision
        self.watch_id: int | None = None  # the id on the current stream, if registered there
        self.resyncing = False
        self.closed = False
        self.created = asyncio.Event()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending: deque[WatchEvent] = deque()

    @property
    def revision(self) -> int:
        """The store revision this watch's consumer is up to date with (once items are read)."""
        return max(0, self.next_revision - 1)

    async def cancel(self) -> None:
        """Stop watching; iteration ends after the items already queued."""
        if self.closed:
            return
        self.closed = True
        await self._watcher.cancel(self)
        self._queue.put_nowait(_END)

    async def next_batch(self) -> WatchBatch:
        """The next response: a list of events of one or more revisions, or a resync.

        Raises ``StopAsyncIteration`` once the watch has ended.
        """
        if self._pending:
            batch = list(self._pending)
            self._pending.clear()
            return batch
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(item)  # keep ending for later calls too
            raise StopAsyncIteration
        if isinstance(item, EtcdError):
            self._queue.put_nowait(item)  # keep failing for later calls too
            raise item
        return item

    async def batches(self) -> AsyncIterator[WatchBatch]:
        """Iterate over whole responses (see :meth:`next_batch`)."""
        while True:
            try:
                yield await self.next_batch()
            except StopAsyncIteration:
                return

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchItem:
        if not self._pending:
            batch = await self.next_batch()
            if isinstance(batch, WatchResync):
                return batch
            self._pending.extend(batch)
        return self._pending.popleft()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.cancel()

    # -- fed by the Watcher -------------------------------------------------------------------

    def deliver(self, events: list[WatchEvent]) -> None:
        fresh = [e for e in events if e.revision >= self.next_revision]
        if not fresh:
            return
        self.next_revision = fresh[-1].revision + 1
        self._queue.put_nowait(fresh)

    def deliver_resync(self, resync: WatchResync) -> None:
        self.next_revision = resync.revision + 1
        self._queue.put_nowait(resync)

    def fail(self, error: EtcdError) -> None:
        self.closed = True
        self._queue.put_nowait(error)

    def end(self) -> None:
        self.closed = True
        self._queue.put_nowait(_END)


class Watcher:
    """Owns the client's one ``Watch`` stream and every :class:`Watch` multiplexed on it."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._watches: set[Watch] = set()
        self._by_id: dict[int, Watch] = {}
        self._call: Any = None
        self._send_lock = asyncio.Lock()  # grpc.aio allows one write in flight per stream
        self._wake = asyncio.Event()
        self._ids = itertools.count(1)
        self._routine: asyncio.Task[None] | None = None
        self._resyncs: set[asyncio.Task[None]] = set()
        self._closed = False

    async def open(
        self, key: bytes, range_end: bytes, start_revision: int | None, *, prev_kv: bool, snapshot: bool
    ) -> Watch:
        """Register a watch and wait until etcd confirms it (or the client timeout passes)."""
        self._client.ensure_open()
        if snapshot and start_revision:
            raise ValueError("a snapshot watch starts after its snapshot; give no start_revision")
        watch = Watch(self, key, range_end, start_revision or 0, prev_kv=prev_kv)
        if snapshot:
            kvs, revision = await self._client.range(key, range_end)
            watch.deliver_resync(WatchResync(tuple(kvs), revision))
        self._watches.add(watch)
        self._maybe_start_routine()
        try:
            async with asyncio.timeout(self._client.timeout):
                await self._send_create(watch)
                await watch.created.wait()
        except TimeoutError:
            await watch.cancel()
            raise EtcdUnavailableError(
                f"etcd did not confirm the watch within {self._client.timeout:.1f}s "
                f"(endpoint {self._client.current_endpoint})"
            ) from None
        except BaseException:
            await watch.cancel()
            raise
        return watch

    async def cancel(self, watch: Watch) -> None:
        self._watches.discard(watch)
        watch_id, watch.watch_id = watch.watch_id, None
        if watch_id is None or self._by_id.pop(watch_id, None) is None:
            return
        request = _rpc.WatchRequest(cancel_request=_rpc.WatchCancelRequest(watch_id=watch_id))
        async with self._send_lock:
            if self._call is not None:
                await _write_quietly(self._call, request)

    async def close(self) -> None:
        self._closed = True
        for task in [*self._resyncs, self._routine]:
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *self._resyncs, *([self._routine] if self._routine else []), return_exceptions=True
        )
        for watch in list(self._watches):
            watch.end()
        self._watches.clear()

    # -- the stream ------------------------------------------------------------------------------

    def _maybe_start_routine(self) -> None:
        if self._routine is None:
            self._routine = asyncio.create_task(self._stream_routine(), name="etcd-watch-stream")
        self._wake.set()

    async def _stream_routine(self) -> None:
        backoff = Backoff()
        broken = False
        while not self._closed:
            if not self._watches:
                self._wake.clear()
                await self._wake.wait()
                continue
            stubs = self._client.pool.stubs()
            call = stubs.watch.Watch(metadata=REQUIRE_LEADER_METADATA)
            try:
                await self._connect(call)
                async for response in call:
                    if broken:  # the stream works again: report the retries not logged yet
                        broken = False
                        _repeats.ended(_STREAM_BROKE)
                    backoff.reset()
                    self._dispatch(response)
                reason = "etcd ended the watch stream"
            except grpc.aio.AioRpcError as error:
                reason = self._on_stream_error(stubs, error)
            except Exception as error:  # a bug must not end every watch silently
                log.exception("watch stream routine failed; reconnecting")
                reason = repr(error)
            finally:
                self._disconnect(call)
            if not self._closed:
                broken = True
                delay = backoff.next_delay()
                _repeats.info(_STREAM_BROKE, stubs.endpoint, reason, delay)
                await asyncio.sleep(delay)

    async def _connect(self, call: Any) -> None:
        async with self._send_lock:
            self._call = call
            for watch in list(self._watches):
                await self._send_create_locked(watch)

    def _disconnect(self, call: Any) -> None:
        """Forget the broken stream; every watch is re-created on the next one (no awaits)."""
        call.cancel()
        if self._call is call:
            self._call = None
        self._by_id.clear()
        for watch in self._watches:
            watch.watch_id = None

    def _on_stream_error(self, stubs: Stubs, error: grpc.aio.AioRpcError) -> str:
        if error.code() in _ENDPOINT_FAILURE:
            self._client.pool.fail_over(stubs)
        if error.code() in _FATAL:
            translated = translate_rpc_error(error, stubs.endpoint)
            translated.__cause__ = error
            for watch in list(self._watches):
                watch.fail(translated)
            self._watches.clear()
        return f"{error.code().name}: {error.details()}"

    async def _send_create(self, watch: Watch) -> None:
        async with self._send_lock:
            await self._send_create_locked(watch)

    async def _send_create_locked(self, watch: Watch) -> None:
        call = self._call
        if call is None or watch.watch_id is not None or watch.resyncing or watch.closed:
            return
        watch_id = next(self._ids)
        watch.watch_id = watch_id
        self._by_id[watch_id] = watch
        create = _rpc.WatchCreateRequest(
            key=watch.key,
            range_end=watch.range_end,
            start_revision=watch.next_revision,
            prev_kv=watch.prev_kv,
            watch_id=watch_id,
        )
        # A failed write means a broken stream: the routine sees it and re-creates everything.
        await _write_quietly(call, _rpc.WatchRequest(create_request=create))

    def _dispatch(self, response: Any) -> None:
        watch = self._by_id.get(response.watch_id)
        if watch is None:
            return  # progress for the whole stream, or an answer for a cancelled watch
        if response.compact_revision:
            self._forget(watch)
            self._start_resync(watch, response.compact_revision)
            return
        if response.canceled:
            self._forget(watch)
            self._watches.discard(watch)
            watch.fail(EtcdError(f"etcd cancelled the watch: {response.cancel_reason or 'no reason'}"))
            return
        if response.created:
            if watch.next_revision == 0:
                # Created "from now": etcd watches from the revision after this header's.
                watch.next_revision = response.header.revision + 1
            watch.created.set()
        if response.events:
            keyspace = self._client.keyspace
            watch.deliver([_event(keyspace, e) for e in response.events])

    def _forget(self, watch: Watch) -> None:
        if watch.watch_id is not None:
            self._by_id.pop(watch.watch_id, None)
            watch.watch_id = None

    # -- compaction ------------------------------------------------------------------------------

    def _start_resync(self, watch: Watch, compact_revision: int) -> None:
        log.info(
            "watch resume revision %d was compacted (compact revision %d); re-listing",
            watch.next_revision,
            compact_revision,
        )
        watch.resyncing = True
        task = asyncio.create_task(self._resync_routine(watch, compact_revision), name="etcd-watch-resync")
        self._resyncs.add(task)
        task.add_done_callback(self._resyncs.discard)

    async def _resync_routine(self, watch: Watch, compact_revision: int) -> None:
        backoff = Backoff()
        while True:
            if watch.closed or self._closed:
                return
            try:
                kvs, revision = await self._client.range(watch.key, watch.range_end)
                break
            except EtcdClosedError:
                return
            except EtcdError as error:
                _repeats.info("re-listing a compacted watch failed, retrying: %s", error)
                await asyncio.sleep(backoff.next_delay())
        _repeats.ended("re-listing a compacted watch failed, retrying: %s")
        watch.deliver_resync(WatchResync(tuple(kvs), revision, compact_revision))
        watch.resyncing = False
        watch.created.set()
        await self._send_create(watch)


def _event(keyspace: Any, pb: Any) -> WatchEvent:
    kind = EventType.DELETE if pb.type == _rpc.PbEvent.DELETE else EventType.PUT
    prev: KeyValue | None = keyspace.key_value(pb.prev_kv) if pb.HasField("prev_kv") else None
    return WatchEvent(kind, keyspace.key_value(pb.kv), prev)


async def _write_quietly(call: Any, request: Any) -> None:
    try:
        await call.write(request)
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as error:
        log.debug("write to a broken watch stream dropped: %s", error)
