"""The consumer's fetcher: a routine that keeps raw batches ready, and the lazy decoder of them.

* The *fetch routine* asks the gateway (``Fetch`` with ``raw_batches=true``) for every
  fetchable partition that has fewer than :data:`PREFETCH_DEPTH` chunks buffered, so the next
  chunk is on its way while the application processes the current one. Long poll:
  ``fetch_min_bytes`` / ``fetch_max_wait_ms``; size bounds ``max_partition_fetch_bytes`` and
  ``fetch_max_bytes``. Partitions awaiting an offset reset are looked up (ListOffsets) in a
  task of their own, while the partitions with a position are fetched.
* A fetched chunk stays the bytes the storage node wrote (compressed once by the producer);
  :class:`PartitionRecords` walks its batches, checks their CRCs, and decodes records only as
  ``poll`` hands them out (aiokafka's ``PartitionRecords``), up to ``max_records`` at a time --
  as ``ConsumerRecord`` objects (``take``) or, for ``poll_arrow``, straight into Arrow buffers
  (``take_columns``: a batch is decoded from the position each time, so a window that stops
  inside a batch leaves nothing decoded behind; a batch whose records turn out to be corrupt
  gives the records in front of the fault first, as Kafka's consumer does).
* A result is used only if it is still wanted: the partition is assigned and the offset it was
  fetched for is still where the consumer would fetch next; a ``seek`` discards what was
  buffered for that partition and cancels the fetch in flight, so it takes effect at once.

Errors found for a partition (out of range with ``auto_offset_reset='none'``, unknown topic or
partition, a corrupt batch) are kept and raised by the next ``poll`` that has no records to
return, as Kafka's consumer raises them from ``poll``. A batch that cannot be read (stored by an
older storage node, which checked less) is raised once the records before it are consumed, as a
``CorruptRecordError`` carrying its topic, partition, base offset and ``next_offset``; the position
stays at the batch, so every poll raises it again until the application seeks past it
(``consumer.seek(TopicPartition(e.topic, e.partition), e.next_offset)``), as with Kafka.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from gateway.client.client import GatewayClient, list_offsets
from gateway.client.dataport import RawFetcher, StartedFetch, parse_data_path
from gateway.client.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    TributaryError,
    UnknownTopicOrPartitionError,
)
from gateway.client.structs import ConsumerRecord, TopicPartition
from gateway.client.subscription import SubscriptionState
from services.dataport import protocol as dp
from services.proto import pb
from services.records import RecordBatchView, iter_batches
from services.records.aborted import AbortedTransactionFilter
from services.records.format import COMPRESSION_CODEC_MASK, TIMESTAMP_TYPE_MASK
from services.records.record import py_as_consumer_records
from services.records.record import speedups as _speedups
from services.serde import error_from_proto

log = logging.getLogger(__name__)

#: Chunks buffered per partition: the one being consumed and the next one, prefetched.
PREFETCH_DEPTH = 2
#: The isolation levels: read_committed stops at the last stable offset and drops the records of
#: aborted transactions (see services/records/aborted.py).
_ISOLATION = {
    "read_uncommitted": pb.ISOLATION_LEVEL_READ_UNCOMMITTED,
    "read_committed": pb.ISOLATION_LEVEL_READ_COMMITTED,
}
_new_tuple = tuple.__new__  # skips NamedTuple's Python-level __new__: one call per record saved


#: ``py_as_consumer_records`` in C when the accelerator is built (and not switched off with
#: ``TRIBUTARY_NO_EXTENSIONS``): no Python-level step per record, and records left untracked
#: by the garbage collector (see ``_speedups.c``).
as_consumer_records = py_as_consumer_records if _speedups is None else _speedups.as_consumer_records


def to_consumer_records(
    records: list,
    topic: str,
    partition: int,
    timestamp_type: int,
    key_deserializer: Callable | None,
    value_deserializer: Callable | None,
) -> list[ConsumerRecord]:
    """Decoded ``Record`` tuples as ``ConsumerRecord``s, deserializing non-null keys and values."""
    if key_deserializer is None and value_deserializer is None:
        out = list(records)
        as_consumer_records(out, ConsumerRecord, topic, partition, timestamp_type)
        return out
    kd = key_deserializer or (lambda data: data)
    vd = value_deserializer or (lambda data: data)
    return [
        _new_tuple(
            ConsumerRecord,
            (
                topic,
                partition,
                r[0],
                r[1],
                timestamp_type,
                None if r[2] is None else kd(r[2]),
                None if r[3] is None else vd(r[3]),
                r[4],
            ),
        )
        for r in records
    ]


class PartitionRecords:
    """One partition's fetched chunk of raw batches, decoded batch by batch as records are taken.

    Construction walks only batch headers (and CRCs with ``check_crcs``): that gives
    ``next_fetch_offset`` -- where the next fetch starts -- without decoding a record. A corrupt
    batch ends the chunk there; its error is raised once the records before it are consumed.
    """

    __slots__ = (
        "_aborted",
        "_batch_index",
        "_batches",
        "_decoded",
        "_index",
        "_payload",
        "_raw_records",
        "_timestamp_type",
        "error",
        "fetch_offset",
        "next_fetch_offset",
        "topic_partition",
    )

    def __init__(
        self,
        tp: TopicPartition,
        fetch_offset: int,
        raw,
        *,
        check_crcs: bool = True,
        aborted: AbortedTransactionFilter | None = None,
    ) -> None:
        self.topic_partition = tp
        #: read_committed: drops the batches of aborted transactions (None: read_uncommitted).
        self._aborted = aborted
        self.fetch_offset = fetch_offset
        self.next_fetch_offset = fetch_offset
        self.error: TributaryError | None = None
        self._batches: list[RecordBatchView] = []
        self._batch_index = 0
        self._decoded: list = []
        self._index = 0
        #: ``_decoded`` holds ``Record`` tuples, to be made ``ConsumerRecord``s as they are taken
        #: (with deserializers); else they are ``ConsumerRecord``s already.
        self._raw_records = False
        self._timestamp_type = 0
        #: take_columns: the decompressed payload of the batch it stopped inside, by batch index.
        self._payload: tuple[int, bytes] | None = None
        try:
            for view in iter_batches(raw, allow_partial_tail=True):
                if view.next_offset <= fetch_offset:
                    continue  # wholly before the position (the first batch may start earlier)
                if check_crcs and not self._crc_ok(view):
                    return
                self._batches.append(view)
                self.next_fetch_offset = view.next_offset
        except CorruptRecordError as exc:  # a damaged batch length: the walk cannot go past it
            self.error = self._corrupt(exc, None)

    def _crc_ok(self, view: RecordBatchView) -> bool:
        try:
            view.validate()
        except CorruptRecordError as exc:
            self.error = self._corrupt(exc, view)
            return False
        return True

    def _corrupt(self, exc: CorruptRecordError, view: RecordBatchView | None) -> CorruptRecordError:
        """The error for the batch the chunk stops at: ``view`` when it could be read as a batch,
        else (a damaged length) the batch at ``next_fetch_offset``, whose end is unknown."""
        tp = self.topic_partition
        if view is not None:
            return CorruptRecordError.unreadable_batch(
                exc,
                topic=tp.topic,
                partition=tp.partition,
                base_offset=view.base_offset,
                next_offset=view.next_offset,
            )
        error = CorruptRecordError(
            f"record batch at offset {self.next_fetch_offset} of {tp} cannot be read ({exc.message}); "
            "its length is damaged, so where it ends is unknown",
            topic=tp.topic,
            partition=tp.partition,
            offset=self.next_fetch_offset,
        )
        error.__cause__ = exc
        return error

    @property
    def has_records(self) -> bool:
        return self._batch_index < len(self._batches) or self._index < len(self._decoded)

    @property
    def exhausted(self) -> bool:
        """Every record handed out (an error may still be pending)."""
        return not self.has_records

    def take(
        self, max_records: int, position: int, key_deserializer=None, value_deserializer=None
    ) -> list[ConsumerRecord]:
        """Up to ``max_records`` records at or after ``position``, in offset order."""
        plain = key_deserializer is None and value_deserializer is None
        out: list[ConsumerRecord] = []
        while len(out) < max_records:
            if self._index >= len(self._decoded) and not self._decode_next(position, plain):
                break
            decoded, start = self._decoded, self._index
            end = min(len(decoded), start + max_records - len(out))
            if start == 0 and end == len(decoded):
                records = decoded  # the whole batch (the common case): handed out as it is
                self._decoded, self._index = [], 0
            else:
                records = decoded[start:end]
                self._index = end
            if self._raw_records:
                tp = self.topic_partition
                records = to_consumer_records(
                    records,
                    tp.topic,
                    tp.partition,
                    self._timestamp_type,
                    key_deserializer,
                    value_deserializer,
                )
            position = records[-1].offset + 1
            if out:
                out.extend(records)
            else:
                out = records
        return out

    def take_columns(self, columns, max_records: int, position: int) -> int:
        """Append up to ``max_records`` records at or after ``position`` to ``columns`` (a
        :class:`services.records.columns.Columns`): ``take``'s records, decoded into Arrow
        buffers instead of ``ConsumerRecord`` objects. Returns how many were appended;
        ``columns.last_offset`` is the last one's offset."""
        if self._index < len(self._decoded):
            # ``take`` stopped inside a batch: decode that batch again, from the position.
            self._batch_index -= 1
        self._decoded, self._index = [], 0
        taken = 0
        while taken < max_records and self._batch_index < len(self._batches):
            view = self._batches[self._batch_index]
            dropped = self._aborted.drops(view) if self._aborted is not None else view.is_control
            if dropped or view.next_offset <= position:
                self._batch_index += 1
                continue
            wanted = max_records - taken
            try:
                added = view.read_columns(
                    columns, self._batch_payload(view), first_offset=position, max_records=wanted
                )
            except CorruptRecordError as exc:
                self.error = self._corrupt(exc, view)
                self._batches = self._batches[: self._batch_index]
                self.next_fetch_offset = view.base_offset
                break
            taken += added
            if added:
                position = columns.last_offset + 1
            if added < wanted or position >= view.next_offset:
                self._batch_index += 1  # the batch is done (a full window may end it exactly)
        return taken

    def _batch_payload(self, view: RecordBatchView) -> bytes | None:
        """The current batch's decompressed payload, kept while a window stops inside it; None
        for an uncompressed batch (read in place)."""
        if not view.attributes & COMPRESSION_CODEC_MASK:
            return None
        cached = self._payload
        if cached is not None and cached[0] == self._batch_index:
            return cached[1]
        payload = view.payload()
        self._payload = (self._batch_index, payload)
        return payload

    def _decode_next(self, position: int, as_consumer: bool = True) -> bool:
        """Decode the next data batch from ``position`` on (records before it are checked, not
        built), as ``ConsumerRecord``s when ``as_consumer`` else as ``Record``s; False at the end."""
        tp = self.topic_partition
        while self._batch_index < len(self._batches):
            view = self._batches[self._batch_index]
            self._batch_index += 1
            # Control batches (markers) are never records; read_committed drops aborted ones too.
            dropped = self._aborted.drops(view) if self._aborted is not None else view.is_control
            if dropped:
                continue
            try:
                if as_consumer:
                    records = view.read_consumer_records(
                        ConsumerRecord, tp.topic, tp.partition, first_offset=position
                    )
                else:
                    records = view.read_records(first_offset=position)
            except CorruptRecordError as exc:
                self.error = self._corrupt(exc, view)
                self._batches = self._batches[: self._batch_index - 1]
                self.next_fetch_offset = view.base_offset
                return False
            self._decoded, self._index = records, 0
            self._raw_records = not as_consumer
            # TimestampType's value without the enum (a class-attribute lookup per batch)
            self._timestamp_type = 1 if view.attributes & TIMESTAMP_TYPE_MASK else 0
            if records:
                return True
        self._decoded, self._index = [], 0
        return False


class Fetcher:
    """Keeps fetched chunks ready for ``poll``; run :meth:`run` as the consumer's fetch routine."""

    def __init__(
        self,
        client: GatewayClient,
        subscription: SubscriptionState,
        *,
        fetch_min_bytes: int = 1,
        fetch_max_wait_ms: int = 500,
        fetch_max_bytes: int = 52_428_800,
        max_partition_fetch_bytes: int = 1_048_576,
        check_crcs: bool = True,
        isolation_level: str = "read_uncommitted",
        data_path: str = "auto",
        retry_backoff_ms: int = 100,
        key_deserializer: Callable | None = None,
        value_deserializer: Callable | None = None,
        data_ready: asyncio.Event | None = None,
        fetch_before_poll: bool = True,
    ) -> None:
        """``data_ready``: the event to set while something is buffered or failed (the consumer
        passes one that also wakes its waiting poll); a new ``asyncio.Event`` by default.
        ``fetch_before_poll`` false: the routine looks nothing up and fetches nothing until
        :meth:`allow_fetching` (the consumer's first poll), opening only its data connection
        meanwhile -- as Kafka's consumer, which does no fetching outside ``poll``."""
        if isolation_level not in _ISOLATION:
            raise ValueError(f"isolation_level must be one of {', '.join(_ISOLATION)}")
        self.client = client
        self.subscription = subscription
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.check_crcs = check_crcs
        self.isolation_level = _ISOLATION[isolation_level]
        self.retry_backoff_ms = retry_backoff_ms
        #: The raw data path (None: gRPC only); it answers None when the gateway offers none.
        self._raw = RawFetcher(client) if parse_data_path(data_path) == "auto" else None
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self._buffers: dict[TopicPartition, deque[PartitionRecords]] = {}
        self._errors: dict[TopicPartition, TributaryError] = {}
        self._backoff_until: dict[TopicPartition, float] = {}
        self._data_ready = data_ready if data_ready is not None else asyncio.Event()
        #: The raw path's last ``FetchPartition`` per partition (reused while its offset holds).
        self.raw_fetch_partitions: dict[TopicPartition, dp.FetchPartition] = {}
        self._waiter: asyncio.Future | None = None
        self._fetch_task: asyncio.Task | None = None
        #: The next fetch, written as the last answer was buffered (``_send_next``), to be
        #: awaited by the routine's next round.
        self._next: tuple[SendFetchHandler, StartedFetch] | None = None
        #: The written fetch the current fetch task awaits (its task may be cancelled before
        #: it starts: the fetch is abandoned here then).
        self._awaited: StartedFetch | None = None
        #: Fetching (and offset lookups) may start: see ``fetch_before_poll``.
        self._may_fetch = fetch_before_poll
        #: The data connection opened ahead of the first poll (None: not yet asked for).
        self._warm_up: asyncio.Task | None = None
        #: The offset lookup of partitions awaiting a reset, running beside the fetches of the
        #: partitions with a position (see ``_start_reset``); None when none runs.
        self._resetting: asyncio.Task | None = None
        self._closed = False
        self._drain_start = 0
        self._confirming: set[TopicPartition] = set()
        self._background: set[asyncio.Task] = set()

    # -- what to fetch ---------------------------------------------------------------------

    def next_fetch_offset(self, tp: TopicPartition) -> int | None:
        """Where the next fetch of ``tp`` starts: after the last buffered chunk, else the position."""
        chunks = self._buffers.get(tp)
        if chunks:
            return chunks[-1].next_fetch_offset
        return self.subscription.position(tp)

    def fetch_candidates(self, now: float) -> dict[TopicPartition, int]:
        """``{tp: offset}`` for partitions worth fetching now."""
        # Once per fetch over every assigned partition (256 and more): one pass, with the
        # lookups bound, and the error and backoff tables asked only when they hold anything.
        candidates: dict[TopicPartition, int] = {}
        buffers, errors, backoff = self._buffers, self._errors, self._backoff_until
        for tp, offset in self.subscription.fetchable_positions():
            if buffers:
                chunks = buffers.get(tp)
                if chunks:
                    last = chunks[-1]
                    if len(chunks) >= PREFETCH_DEPTH or last.error is not None:
                        continue
                    offset = last.next_fetch_offset
            if (errors and tp in errors) or (backoff and backoff.get(tp, 0.0) > now):
                continue
            candidates[tp] = offset
        return candidates

    # -- the routine -----------------------------------------------------------------------

    async def run(self) -> None:
        """The fetch routine: reset offsets, fetch, buffer; until :meth:`close`."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._waiter = loop.create_future()
            if not self._may_fetch:
                self._open_ahead()
                await self._sleep(loop, None)  # until allow_fetching (or close)
                continue
            sent, self._next = self._next, None
            if sent is not None:
                handler, self._awaited = sent
                self._fetch_task = loop.create_task(self._do_fetch(handler, self._awaited))
            else:
                self._start_reset()
                now = self.client.clock.monotonic()
                offsets = self.fetch_candidates(now)
                if not offsets:
                    await self._sleep(loop, self._next_backoff_delay(now))
                    continue
                self._fetch_task = loop.create_task(self._do_fetch(SendFetchHandler(self, offsets)))
            await asyncio.wait({self._fetch_task})  # never raises: a cancelled fetch is just dropped
            self._fetch_task = self._awaited = None

    def allow_fetching(self) -> None:
        """Let the routine fetch (the consumer's first poll; see ``fetch_before_poll``).

        Before it, an application's ``assign`` then ``seek`` of each of its partitions -- each
        seek restarting the fetch in flight, so that it takes effect at once -- cost a
        restarted fetch (or a lookup of the data listener, or of offsets) per partition."""
        if not self._may_fetch:
            self._may_fetch = True
            self.wakeup()

    def _open_ahead(self) -> None:
        """Open the data connection while fetching waits for the first poll (once), in a task
        that no seek restarts, so that the first poll's fetch finds it open."""
        if self._warm_up is not None or self._raw is None or self._closed:
            return
        topic = next((tp.topic for tp in self.subscription.assigned_partitions()), None)
        if topic is None:
            return
        task = self._warm_up = asyncio.get_running_loop().create_task(self._raw.open(topic))
        self._background.add(task)
        task.add_done_callback(self._opened_ahead)

    def _opened_ahead(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the first fetch opens it (and reports what fails then)
            log.debug("opening the data connection ahead of the first poll failed: %r", task.exception())

    def _start_reset(self) -> None:
        """Look up the offsets of the partitions awaiting a reset, in a task of its own: the
        partitions with a position are fetched meanwhile (as Kafka's consumer does), so a lookup
        made moot by the application's seeks -- ``assign`` then ``seek`` of each partition, the
        usual start of a manually assigned consumer -- holds no fetch back. One lookup at a time;
        when it ends the routine looks again (the partitions it positioned are fetched, and
        those that came to await a reset meanwhile are looked up)."""
        if self._resetting is not None or self._closed:
            return
        subscription, failed = self.subscription, self._errors
        if not subscription.has_partitions_awaiting_reset():
            return
        awaiting = {tp: se for tp, se in subscription.partitions_awaiting_reset().items() if tp not in failed}
        if not awaiting:
            return
        task = self._resetting = asyncio.get_running_loop().create_task(self.reset_offsets(awaiting))
        self._background.add(task)
        task.add_done_callback(self._reset_done)

    def _reset_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if self._resetting is task:
            self._resetting = None
        if not task.cancelled() and task.exception() is not None:
            log.warning("offset reset failed: %r", task.exception())
        self.wakeup()

    async def _sleep(self, loop: asyncio.AbstractEventLoop, delay: float | None) -> None:
        waiter = self._waiter
        assert waiter is not None, "run() sets the waiter before sleeping"
        timer = loop.call_later(delay, _resolve, waiter) if delay is not None else None
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()

    def _next_backoff_delay(self, now: float) -> float | None:
        pending = [until - now for until in self._backoff_until.values() if until > now]
        return min(pending) if pending else None

    def wakeup(self, *, restart_fetch: bool = False) -> None:
        """Look again now; with ``restart_fetch`` also abandon the fetch in flight (after a seek,
        an assignment change or a resume, so the change takes effect without a long-poll wait)."""
        if self._waiter is not None:
            _resolve(self._waiter)
        if restart_fetch:
            if self._fetch_task is not None:
                self._fetch_task.cancel()
            sent, self._next = self._next, None
            for started in (sent[1] if sent is not None else None, self._awaited):
                if started is not None and self._raw is not None:
                    self._raw.abandon(started)

    async def _do_fetch(self, handler: SendFetchHandler, started: StartedFetch | None = None) -> None:
        timeout_ms = self.client.request_timeout_ms + self.fetch_max_wait_ms
        try:
            if self._raw is not None:
                request = started.request if started is not None else handler.create_raw_request()
                answer = await self._raw.fetch(request, timeout_ms / 1000.0, started)
                while answer is not None:
                    handler.handle_raw_response(answer)
                    self._send_next()
                    sent, self._next = self._next, None
                    if sent is None:
                        return
                    # Its answer is awaited here, in this task: a task of its own and the
                    # routine's round took three more loop turns before the loop went idle
                    # (when a thread-based consumer's poll takes the records).
                    handler, self._awaited = sent
                    answer = await self._raw.fetch(self._awaited.request, timeout_ms / 1000.0, self._awaited)
                # None (only ever for the first): the gateway offers no raw data path
            throttle = self.client.fetch_throttles.of(self.client.pool.current().address)
            await throttle.wait()  # held by the gateway (a quota): the raw path waits in its link
            response = await self.client.call("Fetch", handler.create_request(), timeout_ms=timeout_ms)
            throttle.observe(response.throttle_time_ms)
        except TributaryError as exc:
            handler.handle_error(exc)
        else:
            handler.handle_response(response)

    def _send_next(self) -> None:
        """Write the next fetch now, in the loop turn that buffered the last answer: before
        ``poll`` decodes those records (it runs next), so the round trip overlaps the decoding
        and the application's work instead of following them (Kafka's consumer sends its next
        fetch as soon as it has parsed a response, too). Not when offsets are to be reset first
        or the connection cannot take it at once: the routine's next round fetches then."""
        if self._closed or self._raw is None:
            return
        if self._resetting is None and self.subscription.has_partitions_awaiting_reset():
            return  # the routine's next round starts their lookup first
        offsets = self.fetch_candidates(self.client.clock.monotonic())
        if not offsets:
            return
        handler = SendFetchHandler(self, offsets)
        started = self._raw.start(handler.create_raw_request())
        if started is not None:
            self._next = (handler, started)

    def handle_partition_result(self, tp: TopicPartition, fetch_offset: int, result) -> None:
        """Buffer one partition's fetched batches (a gRPC ``FetchPartitionResult``), or act on
        its error."""
        error = error_from_proto(result.error) if result.HasField("error") else None
        self.handle_partition_data(
            tp,
            fetch_offset,
            error,
            result.high_watermark,
            result.log_start_offset,
            # each read of a protobuf bytes field is a fresh copy: read once
            result.record_batches,
            lambda: [(a.producer_id, a.first_offset) for a in result.aborted_transactions],
        )

    def handle_partition_data(
        self,
        tp: TopicPartition,
        fetch_offset: int,
        error: TributaryError | None,
        high_watermark: int,
        log_start_offset: int,
        data: bytes | memoryview,
        aborted_transactions: Callable[[], Iterable[tuple[int, int]]],
    ) -> None:
        """Buffer one partition's fetched batches, or act on its error (either data path)."""
        if not self.subscription.is_assigned(tp) or self.next_fetch_offset(tp) != fetch_offset:
            return  # the application moved on (seek, reassignment): this data is stale
        if error is not None:
            self.handle_partition_error(tp, fetch_offset, error)
            return
        self.subscription.update_watermarks(tp, high_watermark, log_start_offset)
        if not data:
            return
        aborted = None
        if self.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED:
            aborted = AbortedTransactionFilter(aborted_transactions())
        chunk = PartitionRecords(tp, fetch_offset, data, check_crcs=self.check_crcs, aborted=aborted)
        if chunk.has_records or chunk.error is not None:
            self._buffers.setdefault(tp, deque()).append(chunk)
            self._data_ready.set()

    def handle_partition_error(self, tp: TopicPartition, fetch_offset: int, error: TributaryError) -> None:
        """Reset, back off, or keep the error for ``poll``, depending on what failed."""
        if isinstance(error, OffsetOutOfRangeError):
            if self.subscription.default_reset in ("earliest", "latest"):
                log.info(
                    "offset %d out of range for %s; resetting to %s",
                    fetch_offset,
                    tp,
                    self.subscription.default_reset,
                )
                self.subscription.request_reset(tp)
                return
            error = OffsetOutOfRangeError(
                f"fetch offset {fetch_offset} is out of range for partition {tp} "
                f"and auto_offset_reset is 'none': {error.message}"
            )
        if error.invalid_metadata:
            self.client.metadata.mark_stale(tp.topic)
        if isinstance(error, UnknownTopicOrPartitionError):
            self._backoff([tp])
            self._maybe_confirm_unknown(tp, error)
        elif error.retriable:
            # Leader moves, a node restarting, the gateway's own retries running out: the
            # application cannot act on these; fetch again after a backoff, as Kafka does.
            log.debug("fetch of %s failed (%s); retrying in %d ms", tp, error, self.retry_backoff_ms)
            self._backoff([tp])
        else:
            self._set_error(tp, error)

    def _maybe_confirm_unknown(self, tp: TopicPartition, error: TributaryError) -> None:
        """Raise UNKNOWN_TOPIC_OR_PARTITION to the application only if metadata agrees.

        A partition being created answers it for a moment too; only a topic or partition that
        the cluster metadata does not have is the application's mistake.
        """
        if tp in self._confirming:
            return
        self._confirming.add(tp)

        async def confirm() -> None:
            try:
                await self.client.refresh_metadata([tp.topic])
                count = self.client.metadata.partition_count(tp.topic)
                if (count is None or tp.partition >= count) and self.subscription.is_assigned(tp):
                    self._set_error(tp, error)
            except TributaryError as exc:
                log.debug("metadata check for %s failed: %s", tp, exc)
            finally:
                self._confirming.discard(tp)

        task = asyncio.get_running_loop().create_task(confirm())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _backoff(self, tps: list[TopicPartition]) -> None:
        until = self.client.clock.monotonic() + self.retry_backoff_ms / 1000.0
        for tp in tps:
            self._backoff_until[tp] = until

    def _set_error(self, tp: TopicPartition, error: TributaryError) -> None:
        self._errors[tp] = error
        self._data_ready.set()

    # -- offset resets ---------------------------------------------------------------------

    async def reset_offsets(self, awaiting: dict[TopicPartition, tuple[str, int]]) -> None:
        """Look up and apply ``{tp: (strategy, epoch)}``; 'none' and lookup failures become errors."""
        for tp, (strategy, _) in list(awaiting.items()):
            if strategy == "none":
                del awaiting[tp]
                self._set_error(
                    tp,
                    OffsetOutOfRangeError(
                        f"no offset for partition {tp} and auto_offset_reset is 'none'; seek first"
                    ),
                )
        try:
            results = await list_offsets(
                self.client,
                {tp: s for tp, (s, _) in awaiting.items()},
                read_committed=self.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED,
            )
        except TributaryError as exc:
            for tp in awaiting:
                self.handle_partition_error(tp, -1, exc)
            return
        for tp, result in results.items():
            if isinstance(result, TributaryError):
                self.handle_partition_error(tp, -1, result)
            elif tp in awaiting:
                self.subscription.complete_reset(tp, awaiting[tp][1], max(result.offset, 0))

    # -- handing records out ---------------------------------------------------------------

    def discard(self, tp: TopicPartition) -> None:
        """Drop what is buffered or failed for ``tp`` (after a seek or an unassignment)."""
        self._buffers.pop(tp, None)
        self._errors.pop(tp, None)
        self._backoff_until.pop(tp, None)
        self.raw_fetch_partitions.pop(tp, None)

    def has_data(self) -> bool:
        return any(self._buffers.values()) or bool(self._errors)

    def _drainable(self) -> bool:
        """Whether ``drain`` may have something to hand out: records or an error of a partition
        that is not paused. (``has_data`` counts the paused ones too: while one kept
        ``data_ready`` set, every poll returned at once, empty -- a busy loop, and an
        ``AsyncConsumer.poll`` that never gave its event loop a turn.)"""
        paused = self.subscription.is_paused
        return any(chunks and not paused(tp) for tp, chunks in self._buffers.items()) or any(
            not paused(tp) for tp in self._errors
        )

    def partitions_resumed(self) -> None:
        """Partitions were resumed: what is buffered for them is ready for ``drain`` again."""
        if self._drainable():
            self._data_ready.set()

    @property
    def data_ready(self) -> asyncio.Event:
        """Set while something is buffered (or failed) for ``drain``."""
        return self._data_ready

    def drain(
        self, max_records: int, only: set[TopicPartition] | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``max_records`` buffered records by partition (of ``only``, if given), advancing positions.

        If nothing can be returned and a partition has a pending error, that error is raised
        (once; the partition is fetched again afterwards).
        """
        drained: dict[TopicPartition, list[ConsumerRecord]] = {}
        remaining = max_records
        for tp in self._rotated(list(self._buffers)):
            if remaining <= 0:
                break
            if self.subscription.is_paused(tp) or (only is not None and tp not in only):
                continue
            taken = self._drain_partition(tp, remaining)
            if taken:
                drained[tp] = taken
                remaining -= len(taken)
        if not drained:
            self._maybe_raise(only)
        if not self._drainable():
            self._data_ready.clear()
        return drained

    def drain_columns(
        self, max_records: int, only: set[TopicPartition] | None, new_columns: Callable[[], Any]
    ) -> dict[TopicPartition, Any]:
        """``drain`` with each partition's records decoded into Arrow buffers: ``{tp: columns}``
        where ``columns`` is a :class:`services.records.columns.Columns` made by ``new_columns``
        holding the partition's records (positions advanced as ``drain`` advances them).
        Deserializers do not apply: keys and values stay bytes. Raises as ``drain`` does."""
        drained: dict[TopicPartition, Any] = {}
        remaining = max_records
        for tp in self._rotated(list(self._buffers)):
            if remaining <= 0:
                break
            if self.subscription.is_paused(tp) or (only is not None and tp not in only):
                continue
            columns = new_columns()
            self._drain_partition_columns(tp, remaining, columns)
            if len(columns):
                drained[tp] = columns
                remaining -= len(columns)
        if not drained:
            self._maybe_raise(only)
        if not self._drainable():
            self._data_ready.clear()
        return drained

    def _drain_partition_columns(self, tp: TopicPartition, max_records: int, columns) -> None:
        chunks = self._buffers.get(tp)
        taken = 0
        while chunks and taken < max_records:
            chunk = chunks[0]
            position = self.subscription.position(tp)
            if position is None:
                break
            if chunk.take_columns(columns, max_records - taken, position):
                taken = len(columns)
                self.subscription.advance(tp, columns.last_offset + 1)
            if not self._finish_chunk(tp, chunks, chunk):
                break
        if not chunks:
            self._buffers.pop(tp, None)

    def _finish_chunk(self, tp: TopicPartition, chunks, chunk) -> bool:
        """After taking from ``tp``'s head chunk: drop it once exhausted, keeping its error for
        the next poll or moving past it; True when the next chunk may be taken from."""
        if not chunk.exhausted:
            return False
        chunks.popleft()
        if chunk.error is not None:
            self._errors[tp] = chunk.error
            return False
        self.subscription.advance(tp, chunk.next_fetch_offset)
        self.wakeup()  # room for another chunk of tp
        return True

    def _rotated(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        # Start each drain at a different partition so one busy partition cannot starve the rest.
        if not tps:
            return tps
        self._drain_start = (self._drain_start + 1) % len(tps)
        return tps[self._drain_start :] + tps[: self._drain_start]

    def _drain_partition(self, tp: TopicPartition, max_records: int) -> list[ConsumerRecord]:
        chunks = self._buffers.get(tp)
        taken: list[ConsumerRecord] = []
        while chunks and len(taken) < max_records:
            chunk = chunks[0]
            position = self.subscription.position(tp)
            if position is None:
                break
            records = chunk.take(
                max_records - len(taken), position, self.key_deserializer, self.value_deserializer
            )
            if records:
                taken.extend(records)
                self.subscription.advance(tp, records[-1].offset + 1)
            if not self._finish_chunk(tp, chunks, chunk):
                break
        if not chunks:
            self._buffers.pop(tp, None)
        return taken

    def raise_error(self, tp: TopicPartition) -> None:
        """Raise (and clear) ``tp``'s pending error, if it has one."""
        error = self._errors.pop(tp, None)
        if error is not None:
            self.wakeup()
            raise error

    def _maybe_raise(self, only: set[TopicPartition] | None = None) -> None:
        for tp, error in list(self._errors.items()):
            if not self.subscription.is_paused(tp) and (only is None or tp in only):
                del self._errors[tp]
                self.wakeup()
                raise error

    async def wait_for_data(self, timeout: float) -> None:
        """Wait until something is buffered (or failed), at most ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._data_ready.wait(), timeout)
        except TimeoutError:
            pass

    async def close(self) -> None:
        self._closed = True
        self.wakeup(restart_fetch=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._raw is not None:
            await self._raw.close()


class SendFetchHandler:
    """One Fetch request: ``create_request`` / ``handle_response`` / ``handle_error``.

    It remembers the offset it asked for per partition; the fetcher decides whether the answer
    is still wanted when it arrives.
    """

    def __init__(self, fetcher: Fetcher, offsets: dict[TopicPartition, int]) -> None:
        self.fetcher = fetcher
        self.offsets = offsets

    def create_request(self):
        f = self.fetcher
        return pb.FetchRequest(
            partitions=[
                pb.FetchPartition(
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=offset,
                    max_bytes=f.max_partition_fetch_bytes,
                )
                for tp, offset in self.offsets.items()
            ],
            min_bytes=f.fetch_min_bytes,
            max_wait_ms=f.fetch_max_wait_ms,
            max_bytes=f.fetch_max_bytes,
            isolation_level=f.isolation_level,
            raw_batches=True,
        )

    def create_raw_request(self) -> dp.FetchRequest:
        f = self.fetcher
        # The same partition at the same offset is the same tuple: built again only when its
        # offset moved (most of a many-partition consumer's partitions, fetch after fetch).
        known = f.raw_fetch_partitions
        max_bytes = f.max_partition_fetch_bytes
        partitions: list[dp.FetchPartition] = []
        get, append = known.get, partitions.append
        for tp, offset in self.offsets.items():
            partition = get(tp)
            # (fields by index: a NamedTuple's named access costs a call per partition)
            if partition is None or partition[2] != offset or partition[3] != max_bytes:
                partition = known[tp] = _new_tuple(dp.FetchPartition, (tp[0], tp[1], offset, max_bytes))
            append(partition)
        return dp.FetchRequest(
            0,
            partitions,
            max_bytes=f.fetch_max_bytes,
            min_bytes=f.fetch_min_bytes,
            max_wait_ms=f.fetch_max_wait_ms,
            isolation_level=(
                dp.READ_COMMITTED
                if f.isolation_level == pb.ISOLATION_LEVEL_READ_COMMITTED
                else dp.READ_UNCOMMITTED
            ),
        )

    def handle_raw_response(self, response: dp.FetchResponse) -> None:
        error = response.error()
        if error is not None:
            self.handle_error(error)
            return
        for result in response.partitions:
            tp = TopicPartition(result.topic, result.partition)
            if tp in self.offsets:
                self.fetcher.handle_partition_data(
                    tp,
                    self.offsets[tp],
                    result.error(),
                    result.high_watermark,
                    result.log_start_offset,
                    result.records,
                    _given(result.aborted),
                )

    def handle_response(self, response) -> None:
        for result in response.partitions:
            tp = TopicPartition(result.topic, result.partition)
            if tp in self.offsets:
                self.fetcher.handle_partition_result(tp, self.offsets[tp], result)

    def handle_error(self, error: TributaryError) -> None:
        """The whole call failed (gateway unreachable, request rejected): as if each partition had."""
        for tp in self.offsets:
            self.fetcher.handle_partition_error(tp, -1, error)


def _given(aborted: tuple[tuple[int, int], ...]) -> Callable[[], Iterable[tuple[int, int]]]:
    return lambda: aborted


def _resolve(waiter: asyncio.Future | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
