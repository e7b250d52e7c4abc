"""Ordered, coalescing appends for one pipelined producer (a ProduceStream).

A stream has many requests in flight, but a storage node may handle concurrent Append calls in
any order, and a retried append could overtake a later one. So each stream owns an
:class:`AppendQueues`: one FIFO per partition, with at most one append in flight per partition
(the guarantee Kafka gives a producer with one request in flight per partition). Whatever queued
up behind the append in flight goes out *merged* in the next one -- the batches of several
requests concatenated into one ``PartitionAppend``, which the storage node validates and writes
as a unit -- so ordering does not cost throughput: the more requests are pipelined, the fewer
appends carry them (Kafka's producer drains its accumulator the same way).

Each request's share of a merged append is told apart by counting offsets in its batch headers
(``lastOffsetDelta + 1`` per batch): its base offset is the merged base offset plus the offsets
of the requests before it. A merged append that fails for good (a corrupt batch, a record too
large) is resent request by request, so only the request at fault gets the error. Bytes whose
headers cannot be read are never merged: they go alone and the node answers them.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.records import iter_batches

log = logging.getLogger(__name__)

#: Upper bound on one merged append, well under the 128 MiB gRPC message limit.
MAX_MERGED_BYTES = 8 << 20
#: Bytes a stream may have queued before it stops reading requests (acks=none back-pressure).
MAX_QUEUED_BYTES = 64 << 20


#: ``append(topic, partition, data, acks, deadline)``: one partition's append, retried within
#: the deadline on retriable errors.
Appender = Callable[[str, int, bytes, Acks, float], Awaitable[AppendResult]]


def count_offsets(data: bytes) -> tuple[int, int] | None:
    """(offsets, records) the batches in ``data`` take, from their headers; None if unreadable."""
    offsets = records = 0
    try:
        for batch in iter_batches(data):
            offsets += batch.last_offset_delta + 1
            records += batch.record_count
    except errors.CorruptRecordError:
        return None
    return (offsets, records) if offsets else None


@dataclass(slots=True)
class _Pending:
    data: bytes
    acks: Acks
    deadline: float
    #: (offsets, records) from the headers; None = unreadable, never merged.
    counts: tuple[int, int] | None
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def take_group(queue: deque[_Pending], max_bytes: int = MAX_MERGED_BYTES) -> list[_Pending]:
    """The longest run at the head of ``queue`` that can go out as one append."""
    first = queue.popleft()
    group = [first]
    if first.counts is None:
        return group
    size = len(first.data)
    while queue:
        nxt = queue[0]
        if nxt.counts is None or nxt.acks != first.acks or size + len(nxt.data) > max_bytes:
            break
        group.append(queue.popleft())
        size += len(nxt.data)
    return group


def split_result(result: AppendResult, group: list[_Pending]) -> list[AppendResult]:
    """Each member's share of a successful merged append, in order."""
    if len(group) == 1:
        return [result]
    shares = []
    base = result.base_offset
    for pending in group:
        offsets, records = pending.counts or (0, 0)
        if base >= 0:
            share = replace(result, base_offset=base, last_offset=base + offsets - 1, record_count=records)
            base += offsets
        else:
            share = replace(result, base_offset=-1, last_offset=-1, record_count=records)
        shares.append(share)
    return shares


class AppendQueues:
    """Per-partition FIFOs of one stream (see the module docstring)."""

    def __init__(
        self,
        appender: Appender,
        *,
        max_merged_bytes: int = MAX_MERGED_BYTES,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self._append = appender
        self._max_merged_bytes = max_merged_bytes
        self._max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._queues: dict[tuple[str, int], deque[_Pending]] = {}
        self._drains: dict[tuple[str, int], asyncio.Task] = {}

    async def wait_for_room(self) -> None:
        """Until the queued bytes are back under the limit (the stream reader's back-pressure)."""
        await self._room.wait()

    def submit(self, topic: str, partition: int, data: bytes, acks: Acks, deadline: float) -> asyncio.Future:
        """Queue an append now (synchronously, so submission order is append order).

        The future resolves to this request's :class:`AppendResult`; it never raises.
        """
        key = (topic, partition)
        pending = _Pending(data, acks, deadline, count_offsets(data))
        self._queues.setdefault(key, deque()).append(pending)
        self._queued_bytes += len(data)
        if self._queued_bytes > self._max_queued_bytes:
            self._room.clear()
        if key not in self._drains:
            self._drains[key] = asyncio.create_task(self._drain_routine(key))
        return pending.future

    async def _drain_routine(self, key: tuple[str, int]) -> None:
        queue = self._queues[key]
        try:
            while queue:
                group = take_group(queue, self._max_merged_bytes)
                try:
                    shares = await self._do_group(key, group)
                except Exception as exc:
                    log.exception("append to %s-%d failed", *key)
                    shares = [AppendResult(*key, error=errors.UnknownServerError(repr(exc)))] * len(group)
                for pending, share in zip(group, shares, strict=True):
                    if not pending.future.done():
                        pending.future.set_result(share)
                self._release(group)
        finally:
            del self._drains[key]
            if not queue:
                del self._queues[key]
            else:  # cancelled with work left: fail it rather than leave callers waiting
                for pending in queue:
                    pending.future.cancel()

    def _release(self, group: list[_Pending]) -> None:
        self._queued_bytes -= sum(len(p.data) for p in group)
        if self._queued_bytes <= self._max_queued_bytes:
            self._room.set()

    async def _do_group(self, key: tuple[str, int], group: list[_Pending]) -> list[AppendResult]:
        topic, partition = key
        deadline = min(p.deadline for p in group)
        data = group[0].data if len(group) == 1 else b"".join(p.data for p in group)
        result = await self._append(topic, partition, data, group[0].acks, deadline)
        if result.error is None:
            return split_result(result, group)
        if len(group) == 1 or result.error.retriable:
            return [result] * len(group)
        # Find the request at fault: resend one by one (the node wrote nothing of the merged append).
        return [await self._append(topic, partition, p.data, p.acks, p.deadline) for p in group]

    async def close(self) -> None:
        """Wait until everything submitted has been appended (or failed)."""
        while self._drains:
            await asyncio.gather(*list(self._drains.values()), return_exceptions=True)
