"""Ordered, coalescing appends for one pipelined producer (a ProduceStream, a data connection).

A stream has many requests in flight, but a storage node may handle concurrent appends in any
order, and a retried append could overtake a later one. So each stream owns an
:class:`AppendQueues`: one FIFO per partition, with at most one append in flight per partition
(the guarantee Kafka gives a producer with one request in flight per partition). Whatever queued
up behind the append in flight goes out *merged* in the next one -- the batches of several
requests concatenated into one partition append, which the storage node validates and writes as
a unit -- so ordering does not cost throughput: the more requests are pipelined, the fewer
appends carry them (Kafka's producer drains its accumulator the same way).

Across partitions, appends go out in *rounds*: once per turn of the event loop, every partition
that has something queued and nothing in flight contributes its next (merged) append, and a
round's appends of one topic are handed to the appender together, which sends one request per
leader node carrying all of its partitions (Kafka's ProduceRequest per broker). So the cost of a
round -- the frames, the tasks, the answers -- does not grow with the partitions it carries: a
producer spreading records over 10,000 partitions costs the gateway a few requests per node per
round, not 10,000 (it cost one append frame and one task per partition, 50x below the
1-partition rate). Each partition's outcome is settled as soon as the appender knows it is final
(``settled``), so a partition waiting out a retry holds up only its own queue.

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
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import replace
from typing import Protocol

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.records.format import (
    BATCH_LENGTH_OFFSET,
    LAST_OFFSET_DELTA_OFFSET,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    RECORD_COUNT_OFFSET,
)

log = logging.getLogger(__name__)

#: Upper bound on one partition's merged append, well under the 128 MiB gRPC message limit.
MAX_MERGED_BYTES = 8 << 20
#: Upper bound on the record bytes of one round's call to the appender (several calls beyond it).
MAX_ROUND_BYTES = 16 << 20
#: Bytes a stream may have queued before it stops reading requests (acks=none back-pressure).
MAX_QUEUED_BYTES = 64 << 20

#: ``settled(partition, result)``: the appender's final outcome for one partition.
Settled = Callable[[int, AppendResult], None]


class Appender(Protocol):
    """``append(topic, payloads, acks, deadline, settled[, first])``: each partition's append
    (payloads: partition -> bytes), retried within the deadline on retriable errors; calls
    ``settled`` once per partition as soon as its outcome is final, and returns every outcome.
    ``first`` (passed only by queues with an ``append_now``): the results of a first attempt
    already made, which the retries go on from."""

    def __call__(
        self,
        topic: str,
        payloads: dict[int, bytes | memoryview],
        acks: Acks,
        deadline: float,
        settled: Settled,
        first: dict[int, AppendResult] | None = None,
        /,
    ) -> Awaitable[dict[int, AppendResult]]: ...


#: ``append_now(topic, payloads, acks, deadline, done)``: the appender's first attempt made
#: without a coroutine when it can be (True: sent, ``done(results)`` hears every partition's
#: result of that attempt from a callback); False: nothing sent, the appender must do it.
AppenderNow = Callable[
    [str, dict[int, bytes | memoryview], Acks, float, Callable[[dict[int, AppendResult]], None]], bool
]

#: ``_Pending.counts`` before anyone asked for them.
_NOT_COUNTED = (-1, -1)


_BATCH_LENGTH = struct.Struct(">i")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_RECORD_COUNT = struct.Struct(">i")


def count_offsets(data: bytes | memoryview) -> tuple[int, int] | None:
    """(offsets, records) the batches in ``data`` take, from their headers; None if unreadable.

    The walk :func:`services.records.iter_batches` makes (the same checks: every batch at least
    the minimum length and held whole, its header readable), reading only the two fields it
    needs: this runs for every merged request, and a batch view each cost a tenth of the
    gateway's time for one-record requests."""
    end = len(data)
    pos = offsets = records = 0
    read = _BATCH_LENGTH.unpack_from
    while pos < end:
        if end - pos < LOG_OVERHEAD:
            return None
        size = read(data, pos + BATCH_LENGTH_OFFSET)[0] + LOG_OVERHEAD
        if size < RECORD_BATCH_OVERHEAD or pos + size > end:
            return None
        offsets += _LAST_OFFSET_DELTA.unpack_from(data, pos + LAST_OFFSET_DELTA_OFFSET)[0] + 1
        records += _RECORD_COUNT.unpack_from(data, pos + RECORD_COUNT_OFFSET)[0]
        pos += size
    return (offsets, records) if offsets else None


#: ``done(results)``: a request's partition -> AppendResult once every partition has one, or
#: None when its appends were abandoned (the loop is shutting down).
Done = Callable[["dict[int, AppendResult] | None"], None]


class _Answer:
    """Where a request's appends report: one future for all its partitions (a future per
    partition, gathered, cost a tenth of the gateway's time at thousands of partitions per
    request). ``single``: the future resolves to the one partition's AppendResult (``submit``);
    else to a dict partition -> AppendResult once every partition has its result. Without a
    future, ``done`` is called with that dict instead, at once (``submit_then``)."""

    __slots__ = ("done", "future", "left", "results", "single")

    def __init__(
        self, future: asyncio.Future | None, partitions: int, single: bool, done: Done | None = None
    ) -> None:
        self.future = future
        self.done = done
        self.left = partitions
        self.results: dict[int, AppendResult] = {}
        self.single = single
        if not partitions and not single:
            self._resolve(self.results)

    def put(self, partition: int, result: AppendResult) -> None:
        if self.left <= 0:
            return
        if self.single:
            self.left = 0
            self._resolve(result)
            return
        if partition not in self.results:
            self.results[partition] = result
            self.left -= 1
            if not self.left:
                self._resolve(self.results)

    def _resolve(self, answer) -> None:
        self.left = 0
        future = self.future
        if future is not None:
            if not future.done():
                future.set_result(answer)
            return
        done = self.done
        assert done is not None
        try:
            done(answer)
        except Exception:  # the caller's bug must not break the queues' bookkeeping
            log.exception("a produce answer callback failed")

    def cancel(self) -> None:
        """The appends were abandoned: the future is cancelled, or ``done`` hears None."""
        if self.future is not None:
            self.future.cancel()
        elif self.left > 0:
            self.left = 0
            assert self.done is not None
            try:
                self.done(None)
            except Exception:
                log.exception("a produce answer callback failed")


class _Pending:
    """One request's append to one partition, queued."""

    __slots__ = ("_counts", "acks", "answer", "data", "deadline", "partition")

    def __init__(
        self, data: bytes | memoryview, acks: Acks, deadline: float, answer: _Answer | None, partition: int
    ) -> None:
        self.data = data
        self.acks = acks
        self.deadline = deadline
        self.answer = answer
        self.partition = partition
        #: (offsets, records) from the headers, read only when the request is merged with
        #: another; None = unreadable, never merged.
        self._counts: tuple[int, int] | None = _NOT_COUNTED

    @property
    def counts(self) -> tuple[int, int] | None:
        if self._counts is _NOT_COUNTED:
            self._counts = count_offsets(self.data)
        return self._counts


def take_group(queue: deque[_Pending], max_bytes: int = MAX_MERGED_BYTES) -> tuple[list[_Pending], int]:
    """The longest run at the head of ``queue`` that can go out as one append, and its bytes."""
    first = queue.popleft()
    group = [first]
    size = len(first.data)
    if not queue or first.counts is None:
        return group, size
    while queue:
        nxt = queue[0]
        if nxt.acks != first.acks or size + len(nxt.data) > max_bytes or nxt.counts is None:
            break
        group.append(queue.popleft())
        size += len(nxt.data)
    return group, size


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


def _group_bytes(group: list[_Pending]) -> int:
    return len(group[0].data) if len(group) == 1 else sum(len(p.data) for p in group)


#: One partition's next append in a round: (partition, the requests merged, their bytes).
_Take = tuple[int, list[_Pending], int]


def _rounds_within(takes: list[_Take], max_bytes: int) -> Iterator[list[_Take]]:
    """``takes`` cut into runs of at most ``max_bytes`` (a larger one goes alone)."""
    run: list[_Take] = []
    size = 0
    for take in takes:
        if run and size + take[2] > max_bytes:
            yield run
            run, size = [], 0
        run.append(take)
        size += take[2]
    if run:
        yield run


class AppendQueues:
    """Per-partition FIFOs of one stream, sent in rounds (see the module docstring)."""

    def __init__(
        self,
        appender: Appender,
        *,
        append_now: AppenderNow | None = None,
        max_merged_bytes: int = MAX_MERGED_BYTES,
        max_round_bytes: int = MAX_ROUND_BYTES,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self._append = appender
        #: Starts a round's appends without a task when it can (see :meth:`_round_now`).
        self._append_now = append_now
        #: Rounds started by ``append_now`` whose results have not come yet.
        self._rounds_now = 0
        #: Set when ``_rounds_now`` drops to 0 while :meth:`close` waits for it.
        self._quiet: asyncio.Future[None] | None = None
        self._max_merged_bytes = max_merged_bytes
        self._max_round_bytes = max_round_bytes
        self._max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._queues: dict[tuple[str, int], deque[_Pending]] = {}
        #: Partitions with something queued and no append in flight, in the order they became so
        #: (a dict as an ordered set): the next round's.
        self._ready: dict[tuple[str, int], None] = {}
        #: Partitions with an append in flight.
        self._in_flight: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._round_scheduled = False
        #: While held (:meth:`hold_rounds`), a round wanted waits for :meth:`release_rounds`.
        self._holding = False
        self._round_wanted = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def has_room(self) -> bool:
        """Whether the queued bytes are under the limit (see :meth:`wait_for_room`)."""
        return self._room.is_set()

    async def wait_for_room(self) -> None:
        """Until the queued bytes are back under the limit (the stream reader's back-pressure)."""
        await self._room.wait()

    def submit(self, topic: str, partition: int, data: bytes, acks: Acks, deadline: float) -> asyncio.Future:
        """Queue an append now (synchronously, so submission order is append order).

        The future resolves to this request's :class:`AppendResult`; it never raises.
        """
        future = self._running_loop().create_future()
        self._queue(topic, partition, _Pending(data, acks, deadline, _Answer(future, 1, True), partition))
        return future

    def submit_all(
        self, topic: str, payloads: Mapping[int, bytes | memoryview], acks: Acks, deadline: float
    ) -> asyncio.Future[dict[int, AppendResult]]:
        """:meth:`submit` of one request's partitions (``payloads``: partition -> bytes): one
        future, resolved to every partition's :class:`AppendResult` once all have one; it never
        raises."""
        future = self._running_loop().create_future()
        answer = _Answer(future, len(payloads), False)
        for partition, data in payloads.items():
            self._queue(topic, partition, _Pending(data, acks, deadline, answer, partition))
        return future

    def submit_then(
        self,
        topic: str,
        payloads: Mapping[int, bytes | memoryview],
        acks: Acks,
        deadline: float,
        done: Done | None,
    ) -> None:
        """:meth:`submit_all` without a future: ``done(results)`` is called as soon as every
        partition has its result -- in the same turn of the loop, so answers settled together
        can leave together -- or ``done(None)`` if the appends are abandoned. ``done`` must not
        raise (what it raises is logged). ``done`` None: nobody waits for the results (an
        acks=0 request), and no answer is kept for them -- one object fewer per queued request
        for the garbage collector to walk, while a flood of them waits in the queues."""
        answer = _Answer(None, len(payloads), False, done) if done is not None else None
        for partition, data in payloads.items():
            self._queue(topic, partition, _Pending(data, acks, deadline, answer, partition))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the queues run on (asked once: asking costs a system call in 3.11)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _queue(self, topic: str, partition: int, pending: _Pending) -> None:
        key = (topic, partition)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(pending)
        self._queued_bytes += len(pending.data)
        if self._queued_bytes > self._max_queued_bytes:
            self._room.clear()
        if key not in self._in_flight:
            self._ready[key] = None
            self._schedule_round()

    def _schedule_round(self) -> None:
        # At the end of this turn of the loop: every request read in it joins the same round.
        if self._round_scheduled:
            return
        if self._holding:
            self._round_wanted = True
            return
        self._round_scheduled = True
        self._running_loop().call_soon(self._start_round)

    def hold_rounds(self) -> None:
        """Requests are about to be submitted from one callback (the data listener serving the
        frames of one read): the round they want starts at :meth:`release_rounds`, in that
        callback, instead of a turn of the event loop later. The caller must release (in a
        ``finally``) before it returns to the loop."""
        self._holding = True

    def release_rounds(self) -> None:
        """End :meth:`hold_rounds`: the round the submitted requests want starts now (unless one
        is already scheduled for this turn of the loop, which they joined)."""
        self._holding = False
        if self._round_wanted:
            self._round_wanted = False
            if not self._round_scheduled:
                try:
                    self._start_round()
                except Exception:  # a bug: as the loop reports a scheduled round's
                    log.exception("starting an append round failed")

    def _start_round(self) -> None:
        """Take the next append of every ready partition; one appender call per topic and acks."""
        self._round_scheduled = False
        ready, self._ready = self._ready, {}
        by_topic: dict[tuple[str, Acks], list[_Take]] = {}
        for key in ready:
            group, size = take_group(self._queues[key], self._max_merged_bytes)
            self._in_flight.add(key)
            by_topic.setdefault((key[0], group[0].acks), []).append((key[1], group, size))
        loop = self._running_loop()
        for (topic, acks), takes in by_topic.items():
            for run in _rounds_within(takes, self._max_round_bytes):
                groups = {partition: group for partition, group, _ in run}
                if self._append_now is None or not self._round_now(topic, acks, groups):
                    self._track(loop.create_task(self._do_round(topic, acks, groups)))

    def _round_now(self, topic: str, acks: Acks, groups: dict[int, list[_Pending]]) -> bool:
        """Start a round with ``append_now``: no task, no coroutine, and its results settled in
        the callback that read the node's answer (one turn of the loop sooner). A round whose
        first attempt has a retriable error goes on in :meth:`_do_round`, as any other. False:
        nothing sent (the round needs :meth:`_do_round`)."""
        append_now = self._append_now
        assert append_now is not None
        deadline, data = _round_data(groups)

        def answered(results: dict[int, AppendResult]) -> None:
            try:
                if any(r.error is not None and r.error.retriable for r in results.values()):
                    self._track(
                        self._running_loop().create_task(self._do_round(topic, acks, groups, results))
                    )
                    return
                missing = errors.UnknownServerError("the append round returned no result for this partition")
                for partition, group in groups.items():
                    result = results.get(partition) or AppendResult(topic, partition, error=missing)
                    self._settle(topic, partition, group, result)
            except Exception as exc:  # a bug: every request of the round hears of it all the same
                log.exception("append round to %s failed", topic)
                failure = errors.UnknownServerError(repr(exc))
                for partition, group in groups.items():
                    key = (topic, partition)
                    if key in self._in_flight:
                        self._finish(key, group, [AppendResult(topic, partition, error=failure)] * len(group))
            finally:
                self._rounds_now -= 1
                if not self._rounds_now and self._quiet is not None and not self._quiet.done():
                    self._quiet.set_result(None)

        try:
            sent = append_now(topic, data, acks, deadline, answered)
        except Exception:  # a bug before anything was sent: the general path answers the round
            log.exception("the immediate append round to %s failed; it takes the general path", topic)
            return False
        if not sent:
            return False
        self._rounds_now += 1
        return True

    def _track(self, task: asyncio.Task) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _do_round(
        self,
        topic: str,
        acks: Acks,
        groups: dict[int, list[_Pending]],
        first: dict[int, AppendResult] | None = None,
    ) -> None:
        """The round's appends, retried by the appender; ``first``: the results of a first
        attempt already made (:meth:`_round_now`)."""
        unsettled = dict(groups)

        def settled(partition: int, result: AppendResult) -> None:
            group = unsettled.pop(partition, None)
            if group is not None:
                self._settle(topic, partition, group, result)

        deadline, data = _round_data(groups)
        try:
            if first is None:
                results = await self._append(topic, data, acks, deadline, settled)
            else:
                results = await self._append(topic, data, acks, deadline, settled, first)
            for partition, result in results.items():
                settled(partition, result)
            missing = errors.UnknownServerError("the append round returned no result for this partition")
            for partition in list(unsettled):
                settled(partition, AppendResult(topic, partition, error=missing))
        except asyncio.CancelledError:
            for partition, group in unsettled.items():
                self._abandon((topic, partition), group)
            raise
        except Exception as exc:
            log.exception("append round to %s failed", topic)
            failure = errors.UnknownServerError(repr(exc))
            for partition in list(unsettled):
                settled(partition, AppendResult(topic, partition, error=failure))

    def _settle(self, topic: str, partition: int, group: list[_Pending], result: AppendResult) -> None:
        error = result.error
        if error is None:
            # acks=0: nobody reads the shares (the requests were answered, if at all, unacked).
            shares = [result] * len(group) if group[0].acks is Acks.NONE else split_result(result, group)
            self._finish((topic, partition), group, shares)
        elif len(group) == 1 or error.retriable:
            self._finish((topic, partition), group, [result] * len(group))
        else:
            # Find the request at fault: resend one by one (the node wrote nothing of the merged
            # append); the partition stays in flight meanwhile.
            self._track(asyncio.get_running_loop().create_task(self._resend_alone(topic, partition, group)))

    async def _resend_alone(self, topic: str, partition: int, group: list[_Pending]) -> None:
        shares = []
        try:
            for pending in group:
                results = await self._append(
                    topic, {partition: pending.data}, pending.acks, pending.deadline, _ignore_settled
                )
                shares.append(results[partition])
        except asyncio.CancelledError:
            self._abandon((topic, partition), group)
            raise
        except Exception as exc:
            log.exception("append to %s-%d failed", topic, partition)
            failure = errors.UnknownServerError(repr(exc))
            shares += [AppendResult(topic, partition, error=failure)] * (len(group) - len(shares))
        self._finish((topic, partition), group, shares)

    def _finish(self, key: tuple[str, int], group: list[_Pending], shares: list[AppendResult]) -> None:
        for pending, share in zip(group, shares, strict=True):
            answer = pending.answer
            if answer is not None:
                answer.put(pending.partition, share)
        self._release(group)
        self._in_flight.discard(key)
        queue = self._queues.get(key)
        if queue:
            self._ready[key] = None
            self._schedule_round()
        elif queue is not None:
            del self._queues[key]

    def _abandon(self, key: tuple[str, int], group: list[_Pending]) -> None:
        """Cancelled with work left (the loop is shutting down): fail it rather than leave
        callers waiting."""
        queued = self._queues.pop(key, deque())
        for pending in (*group, *queued):
            if pending.answer is not None:
                pending.answer.cancel()
        self._release([*group, *queued])
        self._in_flight.discard(key)
        self._ready.pop(key, None)

    def _release(self, group: list[_Pending]) -> None:
        self._queued_bytes -= _group_bytes(group)
        if self._queued_bytes <= self._max_queued_bytes:
            self._room.set()

    async def close(self) -> None:
        """Wait until everything submitted has been appended (or failed)."""
        while self._tasks or self._ready or self._rounds_now:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            elif self._rounds_now:
                self._quiet = self._running_loop().create_future()
                await self._quiet
            else:
                await asyncio.sleep(0)  # the scheduled round starts


def _round_data(groups: dict[int, list[_Pending]]) -> tuple[float, dict[int, bytes | memoryview]]:
    """A round's deadline (its earliest request's) and each partition's bytes."""
    deadline = min(p.deadline for group in groups.values() for p in group)
    data = {
        p: group[0].data if len(group) == 1 else b"".join(x.data for x in group)
        for p, group in groups.items()
    }
    return deadline, data


def _ignore_settled(_partition: int, _result: AppendResult) -> None:
    pass
