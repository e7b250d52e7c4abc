"""The producer's record accumulator: per-partition batches, linger, drain, and buffer memory.

Pure state, no I/O (aiokafka's ``MessageAccumulator``; Kafka's ``RecordAccumulator``). The
application threads append; the sender routine asks which partitions are ready, drains their
batches into requests, and puts failed batches back at the front for a retry. Time is passed in
(``now_ms``), so the rules are tested with a hand-moved clock.

Rules:

* Records go to the last batch of their partition's queue until it would exceed ``batch_size``
  (a record bigger than that gets a batch of its own). Each batch is a client-side
  RecordBatch v2 builder, so compression happens here, once, for the whole path to the consumer.
* A partition is *ready* when its first batch is full, has waited ``linger_ms``, a flush is in
  progress, or the accumulator is closing -- unless the first batch is a retry still backing
  off, or the partition is *muted* (it has a request in flight: that is how per-partition order
  survives retries).
* A drain takes, per ready partition, the first batch and the complete ones behind it, up to
  ``max_request_size`` per request, starting after the last partition the previous drain took
  (Kafka's ``drainIndex``), so every ready partition gets a turn before any gets a second.
  (Moving the start by one partition per drain let the first thousand of 10,000 partitions be
  sent again and again with a record or two each, while the rest waited.) For an
  idempotent producer a retried batch goes alone (a partition leader remembers a request's
  batches as one run, so it recognises each of them retried alone: producer_state.py).
* Buffer memory is reserved per batch, in steps, for the bytes the batch holds: the record that
  opens a batch reserves :data:`INITIAL_BATCH_RESERVATION` bytes (or what the batch header and
  the record need, when more), and a batch about to outgrow its reservation doubles it (up to
  ``batch_size``); the batch releases it all when it completes (acknowledged or failed for
  good). A batch whose next step the pool cannot give is full: it is sent, and the record opens
  a new batch, which waits for memory -- :class:`BufferPool` blocks the appender, or makes it
  wait asynchronously, while the buffer is full. Kafka reserves ``batch_size`` at once (its
  batches are fixed buffers); a builder here grows with its records, and reserving 16 KiB for a
  batch of one record capped a producer spreading records over 10,000 partitions at ~2,000 open
  batches in 32 MiB, so nearly every batch went out with one record (190,000 batches for 200,000
  records, 50x below the 1-partition rate). (Per record it was a lock and a condition a record:
  the producer's hot loop; steps keep it to a few reservations a batch.)

Thread-safety: every public method takes the accumulator's lock; only ``append`` and the pool's
``allocate`` are called off the I/O thread.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.client.errors import IllegalStateError, RecordTooLargeError, RequestTimedOutError
from gateway.client.futures import FutureRecordMetadata, ProduceResult, untrack_new_future
from gateway.client.sealed import RecordRequestSealer, batch_in
from gateway.client.structs import TopicPartition
from services.records import RecordBatchBuilder, read_batch_header
from services.records.format import RECORD_BATCH_OVERHEAD, Compression
from services.records.inplace import set_producer_state

#: Numbers the batches in the order they are made (``ProducerBatch.order``).
_BATCH_ORDER = itertools.count()

#: ``_oldest_created_ms`` when no batch is queued: later than any clock reading.
_NO_BATCH_MS = 2**63 - 1

#: Buffer memory a new batch reserves at first (it doubles as the batch grows, up to
#: ``batch_size``): a batch of a few records holds this much, not a whole ``batch_size``.
INITIAL_BATCH_RESERVATION = 1024

#: Bytes a record costs beyond its key, value and headers (length, attributes, deltas, lengths:
#: varints of a few bytes each); used for buffer accounting and the ``batch_size`` check.
RECORD_OVERHEAD = 16

#: What a batch of one record takes at least beyond the record's ``estimate_record_size``: the
#: batch header, and the 7 bytes a record's fields take at least, less the estimate's allowance.
#: A record whose estimate plus this reaches ``batch_size`` fills a batch on its own.
_SEALED_SLACK = RECORD_BATCH_OVERHEAD + 7 - RECORD_OVERHEAD


def estimate_record_size(key, value, headers_bytes: int) -> int:
    return (
        RECORD_OVERHEAD
        + (len(key) if key is not None else 0)
        + (len(value) if value is not None else 0)
        + headers_bytes
    )


class BufferPool:
    """``buffer_memory`` bytes shared by every queued record; full means the appender waits."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self._available = total_bytes
        # NOTE: the fast paths take the lock itself (a C-level ``with``; the Condition's
        # ``__enter__`` is a Python call), and releasing notifies only when a thread waits:
        # once a record when every record opens a batch (one record per request).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        #: Threads blocked in ``allocate`` (changed and read under the lock).
        self._blocked = 0
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    @property
    def available(self) -> int:
        return self._available

    def try_allocate(self, size: int) -> bool:
        with self._lock:
            if self._available >= size:
                self._available -= size
                return True
            return False

    def allocate(self, size: int, timeout_s: float) -> None:
        """Reserve ``size`` bytes, blocking up to ``timeout_s``; then RequestTimedOutError."""
        with self._lock:  # the common case first: room now, no deadline to compute
            if self._available >= size:
                self._available -= size
                return
        self._ensure_fits(size)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._blocked += 1
            try:
                while self._available < size:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._timeout(size, timeout_s)
                    self._cond.wait(remaining)
                self._available -= size
            finally:
                self._blocked -= 1

    async def allocate_async(self, size: int, timeout_s: float) -> None:
        """``allocate`` for coroutines: waits without blocking the event loop."""
        self._ensure_fits(size)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.try_allocate(size):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._timeout(size, timeout_s)
            waiter = loop.create_future()
            with self._lock:
                self._async_waiters.append((loop, waiter))
            try:
                await asyncio.wait_for(asyncio.shield(waiter), remaining)
            except TimeoutError:
                pass

    def deallocate(self, size: int) -> None:
        with self._lock:
            self._available = min(self.total_bytes, self._available + size)
            if self._blocked:
                self._cond.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_resolve, waiter)

    def _ensure_fits(self, size: int) -> None:
        if size > self.total_bytes:
            raise RecordTooLargeError(
                f"the record is {size} bytes when serialized, larger than buffer_memory ({self.total_bytes})"
            )

    def _timeout(self, size: int, timeout_s: float) -> RequestTimedOutError:
        return RequestTimedOutError(
            f"failed to allocate {size} bytes of buffer_memory within max_block_ms "
            f"({timeout_s * 1000:.0f} ms); {self._available} of {self.total_bytes} free"
        )


class BufferExhausted(Exception):
    """``RecordAccumulator.append`` needs ``needed`` bytes of buffer memory the pool has not got
    now; the caller waits for them (``BufferPool.allocate``) and appends again with them."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ProducerBatch:
    """One batch on its way: its builder (or bytes once closed), its shared result, retry state."""

    __slots__ = (
        "_batch_size",
        "_builder",
        "_data",
        "_frame_start",
        "_prebuilt",
        "_used",
        "attempts",
        "base_sequence",
        "created_ms",
        "is_full",
        "last_error",
        "order",
        "producer_epoch",
        "producer_id",
        "record_count",
        "request_frame",
        "reserved_bytes",
        "result",
        "retry_at_ms",
        "topic_partition",
    )

    def __init__(
        self,
        topic_partition: TopicPartition,
        builder: RecordBatchBuilder | None,
        created_ms: int,
        batch_size: int,
        data: bytes | None = None,
        record_count: int = 0,
        request_frame: tuple[bytearray, int] | None = None,
    ) -> None:
        self.topic_partition = topic_partition
        #: When it was made among the accumulator's batches: a partition's record order, which
        #: retries are put back in (``RecordAccumulator.reenqueue``).
        self.order = next(_BATCH_ORDER)
        self.result = ProduceResult(topic_partition)
        self.created_ms = created_ms
        self.attempts = 0
        self.retry_at_ms = 0
        self.reserved_bytes = 0
        self.record_count = record_count
        #: Why the last attempt failed (reported if the batch then expires while waiting to retry).
        self.last_error: BaseException | None = None
        self._builder = builder
        self._batch_size = batch_size
        #: bytearray once numbered in place; a view into ``request_frame`` once closed, when
        #: sealed with one.
        self._data: bytes | bytearray | memoryview | None = data
        self._prebuilt = data is not None
        #: No more records: the batch reached ``batch_size``, the next record did not fit, or
        #: the batch is bytes already (closed, pre-built, or sealed). Sendable without lingering.
        self.is_full = builder is None
        #: The builder's ``size_in_bytes()``, kept here so appends need not ask for it (a
        #: sealed batch's size).
        self._used = builder.size_in_bytes() if builder is not None else 0
        #: The raw data path's request frame holding this batch alone, made when the batch was
        #: sealed on the appending thread (``gateway/client/sealed.py``; its correlation id is
        #: written when it is sent), and where the batch starts in it.
        self.request_frame: bytearray | None = None
        self._frame_start = 0
        if request_frame is not None:
            self.request_frame, self._frame_start = request_frame
            self._used = len(self.request_frame) - self._frame_start - 2
        #: Set when an idempotent producer numbers the batch (TransactionManager.number).
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1

    def try_append(self, timestamp: int, key, value, headers: tuple, size: int) -> int | None:
        """Append and return the record's offset delta, or None when the batch is full/closed.

        ``size`` is the record's estimated size (``estimate_record_size``): a batch that holds a
        record takes the next only if the estimate fits in ``batch_size``, as Kafka's
        ``hasRoomFor`` decides. Buffer memory is not counted here (see ``reserved_bytes``).
        """
        if self.is_full:
            return None
        count = self.record_count
        if count and self._used + size > self._batch_size:
            self.is_full = True  # the next record did not fit: this batch is done, send it
            return None
        used = self._used = self._builder.append_sized(value, timestamp, key, headers)  # type: ignore[union-attr]
        if used >= self._batch_size:
            self.is_full = True
        self.record_count = count + 1
        return count

    @property
    def estimated_size(self) -> int:
        if self._data is not None:
            return len(self._data)
        return self._used  # the builder's size_in_bytes(), kept by every append; or sealed

    def close(self) -> bytes | bytearray | memoryview:
        """The batch bytes (built, compressed) -- once; no record can be appended afterwards."""
        if self._data is None and self.request_frame is not None:
            self._data = batch_in(self.request_frame, self._frame_start)
        elif self._data is None:
            assert self._builder is not None, "a batch has its bytes, its frame or its builder"
            self._data = self._builder.build()
            self._builder = None
            self.is_full = True
        return self._data

    @property
    def prebuilt(self) -> bool:
        """Bytes handed in whole (``send_batch``): sent as they are, never numbered or merged."""
        return self._prebuilt

    def set_producer_state(
        self, producer_id: int, producer_epoch: int, base_sequence: int, *, transactional: bool = False
    ) -> None:
        """Number the batch for an idempotent producer (closing it). Numbered when first sent,
        before it is built, the builder writes the fields (one CRC pass); renumbered (a bumped
        epoch), the header fields of its bytes are rewritten in place. Either way the records
        are not re-encoded."""
        if self._data is None and self._builder is not None:
            self._builder.set_producer_state(
                producer_id, producer_epoch, base_sequence, is_transactional=transactional
            )
            self.close()
        else:
            data = bytearray(self.close())
            set_producer_state(data, producer_id, producer_epoch, base_sequence, transactional=transactional)
            self._data = data
        self.producer_id, self.producer_epoch, self.base_sequence = producer_id, producer_epoch, base_sequence

    def __repr__(self) -> str:
        return f"<ProducerBatch {self.topic_partition} records={self.record_count} attempts={self.attempts}>"


@dataclass(frozen=True)
class ReadyCheck:
    """Partitions whose batches may be sent now, and when to look again (None: nothing queued)."""

    ready: list[TopicPartition]
    next_check_ms: int | None


#: A drained request: the topic and, per partition, the batches to send in order.
RequestPlan = tuple[str, dict[int, list[ProducerBatch]]]


class RecordAccumulator:
    """Per-partition queues of :class:`ProducerBatch`. See the module docstring for the rules."""

    def __init__(
        self,
        *,
        batch_size: int = 16384,
        linger_ms: int = 5,
        compression: Compression = Compression.NONE,
        pool: BufferPool | None = None,
        retried_alone: bool = False,
        sealer: RecordRequestSealer | None = None,
    ) -> None:
        self.batch_size = max(1, batch_size)
        #: An idempotent producer sends a retried batch in a request of its own: then a retry is
        #: always a whole earlier append or none of it, which the leader can tell (see
        #: transaction_manager.py).
        self.retried_alone = retried_alone
        self.linger_ms = max(0, linger_ms)
        self.compression = Compression(compression)
        #: Seals a batch its first record fills in its request frame at once (see sealed.py);
        #: only for batches nothing changes before they are sent: uncompressed, never numbered.
        self._sealer = sealer if self.compression is Compression.NONE else None
        self.pool = pool or BufferPool(32 * 1024 * 1024)
        #: A batch's size bound: ``batch_size``, or the whole pool when that is smaller.
        self._batch_bound = min(self.batch_size, self.pool.total_bytes)
        #: What ``batch_reservation`` reads: the first step of a batch's reservation, the pool.
        self._initial_reservation = min(INITIAL_BATCH_RESERVATION, self.batch_size)
        self._pool_bytes = self.pool.total_bytes
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        #: The same queues by topic and partition: ``append`` finds one without a TopicPartition.
        self._by_topic: dict[str, dict[int, deque[ProducerBatch]]] = {}
        #: Each queue's partition, by the queue's id (queues live as long as the accumulator):
        #: a new batch takes it instead of a new TopicPartition.
        self._queue_tps: dict[int, TopicPartition] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._lock = threading.Lock()
        self._flushes = 0
        self._closed = False
        #: Every queue's place in creation order, and the place of the last partition drained:
        #: the next drain starts after it.
        self._queue_order: dict[TopicPartition, int] = {}
        self._drain_cursor = -1
        #: When the sender routine will call ``ready`` again by itself (ms; None: only when woken),
        #: as its last ``ready`` call told it. See ``sender_looks_by``.
        self._sender_looks_at: int | None = None
        #: No batch queued since the last ``expire`` walk is older than this (ms).
        self._oldest_created_ms = _NO_BATCH_MS

    # -- appending (application threads) ---------------------------------------------------

    def append(
        self,
        topic: str,
        partition: int,
        timestamp: int,
        key,
        value,
        headers: tuple,
        size: int,
        now_ms: int,
        abort_on_new_batch: bool = False,
        reserved: int = 0,
    ) -> tuple[FutureRecordMetadata | None, bool, bool]:
        """Queue one record of estimated ``size`` bytes on ``topic``/``partition``.

        Returns ``(future, batch_is_full, new_batch_created)``; the caller wakes the sender when
        either flag is set (a full batch is sendable; a new batch starts a linger timer). With
        ``abort_on_new_batch`` a record that would open a new batch is not queued (the future is
        None): the sticky partitioner moves on first, as Kafka's does (KIP-480).

        Buffer memory is reserved per batch, as Kafka's ``BufferPool`` does: a record that opens
        a batch takes :meth:`batch_reservation` bytes from the pool; records joining an open
        batch take none. When the pool cannot give them now, nothing is queued and
        :class:`BufferExhausted` says how much to wait for (``BufferPool.allocate``) before
        calling again with those bytes as ``reserved``. ``reserved`` bytes are the
        accumulator's once passed: a new batch keeps them, any other outcome (a record joining
        a batch another thread opened meanwhile, an abort, an error) gives them back.
        """
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                self._give_back(reserved)
                raise IllegalStateError("cannot send after the producer is closed")
            partitions = self._by_topic.get(topic)
            queue = partitions.get(partition) if partitions is not None else None
            batch = queue[-1] if queue else None
            if batch is not None:
                # NOTE: ``batch.try_append`` inlined (the one hot call of this method): the record
                # joins the open batch when the estimate fits, else the batch is full.
                delta = None
                if not batch.is_full:
                    delta = batch.record_count
                    needed = batch._used + size
                    if (delta and needed > batch._batch_size) or (
                        needed > batch.reserved_bytes and not self._grow_reservation(batch, needed)
                    ):
                        batch.is_full = True
                        delta = None
                    else:
                        try:
                            used = batch._used = batch._builder.append_sized(value, timestamp, key, headers)  # type: ignore[union-attr]
                        except BaseException:
                            self._give_back(reserved)
                            raise
                        if used >= batch._batch_size:
                            batch.is_full = True
                        batch.record_count = delta + 1
                if delta is not None:
                    if reserved:
                        self.pool.deallocate(reserved)  # another thread opened the batch meanwhile
                    future = FutureRecordMetadata(batch.result, delta, timestamp)
                    if untrack_new_future is not None:
                        untrack_new_future(future)  # (see there: the collector need not walk it)
                    return (
                        future,
                        len(queue) > 1 or batch.is_full,  # type: ignore[arg-type]
                        False,
                    )
                if abort_on_new_batch:
                    self._give_back(reserved)
                    return None, True, False
            return self._append_to_new_batch(
                topic, partition, queue, timestamp, key, value, headers, size, now_ms, reserved
            )
        finally:
            lock.release()

    def _give_back(self, reserved: int) -> None:
        if reserved:
            self.pool.deallocate(reserved)

    def _append_to_new_batch(
        self,
        topic: str,
        partition: int,
        queue: deque[ProducerBatch] | None,
        timestamp: int,
        key,
        value,
        headers: tuple,
        size: int,
        now_ms: int,
        reserved: int,
    ) -> tuple[FutureRecordMetadata, bool, bool]:
        """``append``'s second half (under the lock): reserve a batch's memory, open it with the
        record, queue it. A record the builder refuses leaves nothing queued or reserved."""
        need = self.batch_reservation(size)
        if reserved > need:
            self.pool.deallocate(reserved - need)
        elif reserved < need and not self.pool.try_allocate(need - reserved):
            if reserved:
                self.pool.deallocate(reserved)
            raise BufferExhausted(need)
        if queue is None:
            queue = self._queue(TopicPartition(topic, partition))
        sealed = None
        if self._sealer is not None and size + _SEALED_SLACK >= self._batch_bound:
            # The record fills the batch by itself: its batch and request frame are made now.
            try:
                sealed = self._sealer.seal(topic, partition, timestamp, key, value, headers)
            except BaseException:
                self.pool.deallocate(need)
                raise
        if sealed is not None:
            batch = ProducerBatch(
                self._queue_tps[id(queue)], None, now_ms, self._batch_bound, None, 1, sealed
            )
            batch.reserved_bytes = need
        else:
            batch = self._new_batch(self._queue_tps[id(queue)], now_ms, need)
            try:
                # A new batch takes its first record whatever its size (``try_append``, inlined).
                used = batch._used = batch._builder.append_sized(value, timestamp, key, headers)  # type: ignore[union-attr]
            except BaseException:
                self.pool.deallocate(need)
                raise
            if used >= batch._batch_size:
                batch.is_full = True
            batch.record_count = 1
        queue.append(batch)
        self._incomplete.add(batch)
        if now_ms < self._oldest_created_ms:
            self._oldest_created_ms = now_ms
        future = FutureRecordMetadata(batch.result, 0, timestamp)
        if untrack_new_future is not None:
            untrack_new_future(future)
        return future, len(queue) > 1 or batch.is_full, True

    def batch_reservation(self, size: int) -> int:
        """Buffer memory a new batch takes for a first record of ``size`` bytes: what the batch
        header and the record need, or :data:`INITIAL_BATCH_RESERVATION` bytes (at most
        ``batch_size``) when more; never more than the whole pool, which then also bounds the
        batch (see ``_new_batch``)."""
        # NOTE: comparisons, not ``max``/``min`` calls: this runs once a record when every record
        # opens a batch (one record per request).
        first = RECORD_BATCH_OVERHEAD + size
        if first < self._initial_reservation:
            first = self._initial_reservation
        if first > self._pool_bytes:
            first = self._pool_bytes
        return first if first > size else size  # a record beyond the pool: too large

    def _grow_reservation(self, batch: ProducerBatch, needed: int) -> bool:
        """Reserve more for ``batch``, which is to hold ``needed`` bytes (call with the lock):
        twice what it has, or ``needed``, up to ``batch_size``. False when the pool has not got
        it now (the batch is then full, and the record waits for a new batch's memory)."""
        target = min(max(needed, 2 * batch.reserved_bytes), max(batch._batch_size, needed))
        if not self.pool.try_allocate(target - batch.reserved_bytes):
            return False
        batch.reserved_bytes = target
        return True

    def _new_batch(self, tp: TopicPartition, now_ms: int, reserved: int) -> ProducerBatch:
        batch = ProducerBatch(
            tp,
            RecordBatchBuilder(compression=self.compression),
            now_ms,
            self._batch_bound,
        )
        batch.reserved_bytes = reserved
        return batch

    def _queue(self, tp: TopicPartition) -> deque[ProducerBatch]:
        """``tp``'s queue, created (and indexed by topic for ``append``) when missing."""
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
            self._by_topic.setdefault(tp.topic, {})[tp.partition] = queue
            self._queue_order[tp] = len(self._queue_order)
            self._queue_tps[id(queue)] = tp
        return queue

    def append_batch(self, tp: TopicPartition, data: bytes, now_ms: int) -> ProduceResult:
        """Queue pre-encoded RecordBatch v2 bytes as one sealed batch (already reserved)."""
        try:
            # The offsets the batch will take, which is what the next batch's offset follows from.
            record_count = read_batch_header(data).last_offset_delta + 1
        except Exception:  # noqa: BLE001 -- malformed bytes are the broker's to reject
            record_count = 1
        with self._lock:
            batch = ProducerBatch(
                tp, None, now_ms, self.batch_size, data=bytes(data), record_count=record_count
            )
            batch.reserved_bytes = len(data)
            self._oldest_created_ms = min(self._oldest_created_ms, now_ms)
            self._incomplete.add(batch)
            self._queue(tp).append(batch)
            return batch.result

    # -- the sender's side -----------------------------------------------------------------

    def ready(
        self,
        now_ms: int,
        muted: set[TopicPartition] | frozenset = frozenset(),
        busy: set[TopicPartition] | frozenset = frozenset(),
    ) -> ReadyCheck:
        """Which partitions can send now, and how long until another one might.

        ``muted`` partitions are not ready at all; ``busy`` ones (requests in flight that more
        may follow: an idempotent producer's pipelining) only with a first batch that was never
        sent and is not pre-built -- a retry waits until nothing of its partition is in flight,
        then goes alone (Kafka's ``shouldStopDrainBatchesForPartition``) -- and is complete: full,
        with batches behind it, or everything being sent (a flush). A batch still filling waits
        for the answer and gathers the records that arrive meanwhile, as a muted partition's
        does: sent alone each, records reached the gateway sooner only to wait there (it keeps
        one append per partition in flight to the node), and cost a request each -- at 2,000
        records/s with ``linger_ms=0`` the end-to-end p50 was 1.2-1.6x higher (A/B, 2026-11-25)."""
        ready: list[TopicPartition] = []
        next_check: int | None = None
        linger_ms = self.linger_ms
        add = ready.append
        with self._lock:
            sending_all = self._flushes > 0 or self._closed
            # NOTE: ``_wait_ms`` inlined: this walks every partition under the lock the appending
            # threads wait for, once per request sent (10,000 partitions: ~1 ms each time).
            for tp, queue in self._queues.items():
                if not queue or tp in muted:
                    continue
                head = queue[0]
                if (
                    busy
                    and tp in busy
                    and (
                        head.attempts or head._prebuilt or not (sending_all or head.is_full or len(queue) > 1)
                    )
                ):
                    continue  # woken when the partition's requests in flight are answered
                retry_at_ms = head.retry_at_ms
                if retry_at_ms > now_ms:
                    wait_ms = retry_at_ms - now_ms
                elif sending_all or head.is_full or len(queue) > 1:
                    add(tp)
                    continue
                else:
                    wait_ms = head.created_ms + linger_ms - now_ms
                    if wait_ms <= 0:
                        add(tp)
                        continue
                if next_check is None or wait_ms < next_check:
                    next_check = wait_ms
            # Ready partitions mean requests start now, and the routine looks again at once or
            # when one of them completes; else it sleeps until the next linger or backoff ends.
            self._sender_looks_at = now_ms if ready else (None if next_check is None else now_ms + next_check)
        return ReadyCheck(ready, next_check)

    def sender_looks_by(self, deadline_ms: int) -> bool:
        """Whether the sender routine will call :meth:`ready` by ``deadline_ms`` without a wakeup.

        So an appender wakes it (a cross-thread call, a syscall and a GIL handover) only when
        it would otherwise look too late: for a full batch (``deadline_ms`` now) or a new one
        (now + ``linger_ms``). Safe without the lock: a ``ready`` call after the append sees the
        record anyway; one before it set what is read here. Relies on the routine calling
        ``ready`` again when a request completes (it is woken then) or its timer fires.
        """
        looks_at = self._sender_looks_at
        return looks_at is not None and looks_at <= deadline_ms

    def drain(
        self,
        ready: Iterable[TopicPartition],
        now_ms: int,
        *,
        max_request_size: int,
        max_requests: int,
        pipelined: bool = False,
        may_pipeline: Callable[[TopicPartition], bool] | None = None,
    ) -> list[RequestPlan]:
        """Pop the sendable batches of ``ready`` partitions into at most ``max_requests`` requests.

        One request holds one topic (the Produce API's shape) and at most ``max_request_size``
        bytes (but always at least one batch, however large). Nothing is popped that does not
        make it into a returned request. ``pipelined`` (a sender that may have several requests
        of a partition in flight: acks=0, or an idempotent producer, on an ordered transport): a
        partition whose sendable batches do not fit one request fills the next ones too, in
        order (else they wait for the next drain, one request per partition per drain). With
        ``may_pipeline`` (idempotence) only partitions it allows, and only with batches never
        sent before and not pre-built (no request follows a retry in the same drain).
        """
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in self._rotate(list(ready)):
            by_topic.setdefault(tp.topic, []).append(tp)
        plans: list[RequestPlan] = []
        with self._lock:
            sending_all = self._flushes > 0 or self._closed
            for topic, tps in by_topic.items():
                if not self._plan_topic(
                    plans,
                    topic,
                    tps,
                    now_ms,
                    max_request_size,
                    max_requests,
                    sending_all,
                    pipelined,
                    may_pipeline,
                ):
                    break
        return plans

    def _rotate(self, ready: list[TopicPartition]) -> list[TopicPartition]:
        """``ready`` in queue order, starting after the last partition drained."""
        order = self._queue_order

        def place(tp: TopicPartition) -> int:
            return order.get(tp, -1)

        ready.sort(key=place)  # already in this order when it comes from ready(): linear
        start = bisect.bisect_right(ready, self._drain_cursor, key=place)
        return ready[start:] + ready[:start]

    def _plan_topic(
        self,
        plans: list[RequestPlan],
        topic: str,
        tps: list[TopicPartition],
        now_ms: int,
        max_request_size: int,
        max_requests: int,
        sending_all: bool,
        pipelined: bool = False,
        may_pipeline: Callable[[TopicPartition], bool] | None = None,
    ) -> bool:
        """Add ``topic``'s requests to ``plans``; False once ``max_requests`` is reached."""
        current: dict[int, list[ProducerBatch]] = {}
        size = 0
        for tp in tps:
            queue = self._queues.get(tp)
            if not queue:
                continue
            if current and size + queue[0].estimated_size > max_request_size:
                plans.append((topic, current))
                current, size = {}, 0
            if not current and len(plans) >= max_requests:
                return False
            batches, taken_size = self._take(tp, now_ms, max_request_size - size, sending_all)
            current[tp.partition] = batches
            size += taken_size
            self._drain_cursor = self._queue_order.get(tp, -1)
            # Pipelined: the partition's next sendable batches go in the next requests (a
            # request names a partition once), as many as the requests allowed.
            while (
                pipelined
                and queue
                and self._sendable(queue, now_ms, sending_all)
                and (
                    may_pipeline is None
                    or (
                        (sending_all or queue[0].is_full or len(queue) > 1)
                        and _may_follow(batches, queue[0], tp, may_pipeline)
                    )
                )
            ):
                plans.append((topic, current))
                current, size = {}, 0
                if len(plans) >= max_requests:
                    return False
                batches, size = self._take(tp, now_ms, max_request_size, sending_all)
                current[tp.partition] = batches
        if current:
            plans.append((topic, current))
        return len(plans) < max_requests

    def _sendable(self, queue: deque[ProducerBatch], now_ms: int, sending_all: bool) -> bool:
        """Whether ``queue``'s first batch may go now: complete (full, not the last, lingered,
        or everything is being sent) and not waiting to retry (call with the lock)."""
        batch = queue[0]
        if batch.retry_at_ms > now_ms:
            return False
        return batch.is_full or len(queue) > 1 or sending_all or now_ms - batch.created_ms >= self.linger_ms

    def _take(
        self, tp: TopicPartition, now_ms: int, max_bytes: int, sending_all: bool
    ) -> tuple[list[ProducerBatch], int]:
        """Pop the first batch of ``tp`` and the complete ones behind it, up to ``max_bytes``;
        returns them and their estimated size."""
        queue = self._queues.get(tp)
        taken: list[ProducerBatch] = []
        size = 0
        while queue:
            batch = queue[0]
            if (
                taken
                and self.retried_alone
                and (batch.attempts or taken[0].attempts or batch.prebuilt or taken[0].prebuilt)
            ):
                break
            estimated = batch.estimated_size
            if taken:
                last = len(queue) == 1
                complete = (
                    batch.is_full or not last or sending_all or now_ms - batch.created_ms >= self.linger_ms
                )
                if not complete or batch.retry_at_ms > now_ms or size + estimated > max_bytes:
                    break
            queue.popleft()
            taken.append(batch)
            size += estimated
        return taken, size

    def reenqueue(self, batches: list[ProducerBatch], retry_at_ms: int) -> None:
        """Put failed batches back at the *front* of their queues, in the order they were made
        (for an idempotent producer, sequence order): among the retries queued there already,
        before those made after them -- with several requests of a partition in flight, the
        later ones' batches often come back after an earlier one's (Kafka's
        ``insertInSequenceOrder``)."""
        with self._lock:
            returning: dict[TopicPartition, list[ProducerBatch]] = {}
            for batch in batches:
                batch.retry_at_ms = retry_at_ms
                returning.setdefault(batch.topic_partition, []).append(batch)
                self._oldest_created_ms = min(self._oldest_created_ms, batch.created_ms)
            for tp, retries in returning.items():
                queue = self._queue(tp)
                # The retries queued there already come first (never-sent batches follow): merged
                # with these by order in one sort of two sorted runs (linear), not an insert each
                # behind a walk of the queue (quadratic: 3.8 s under this lock for the 15,000
                # one-record batches of a failed 1 MiB request).
                while queue and queue[0].attempts:
                    retries.append(queue.popleft())
                retries.sort(key=_made_order)
                queue.extendleft(reversed(retries))

    def expire(self, now_ms: int, delivery_timeout_ms: int) -> list[ProducerBatch]:
        """Remove and return queued batches older than ``delivery_timeout_ms`` (the caller fails them)."""
        # The sender asks on every turn of its loop; the queues are only walked (under the lock
        # the appenders need too) once the oldest batch queued since the last walk may be due.
        if now_ms - self._oldest_created_ms < delivery_timeout_ms:
            return []
        expired: list[ProducerBatch] = []
        with self._lock:
            oldest = _NO_BATCH_MS
            for queue in self._queues.values():
                while queue and now_ms - queue[0].created_ms >= delivery_timeout_ms:
                    expired.append(queue.popleft())
                if queue:  # the head is the oldest of its queue (retries go back to the front)
                    oldest = min(oldest, queue[0].created_ms)
            self._oldest_created_ms = oldest
        return expired

    def complete(self, batch: ProducerBatch) -> None:
        """Forget a finished batch and release its buffer memory (the caller resolves its result)."""
        self.complete_all((batch,))

    def complete_all(self, batches: Iterable[ProducerBatch]) -> None:
        """:meth:`complete` of many batches: one lock and one release for an answer's batches
        (per batch, the lock -- wanted by the appending threads too -- was a tenth of the
        producer's time for answers of a thousand partitions)."""
        incomplete = self._incomplete
        with self._lock:
            done = incomplete.intersection(batches)  # set operations: no Python loop under the lock
            incomplete.difference_update(done)
        released = sum(batch.reserved_bytes for batch in done)
        if released:
            self.pool.deallocate(released)

    # -- flush, close, abort ---------------------------------------------------------------

    def begin_flush(self) -> list[ProduceResult]:
        """Make every queued batch sendable now; returns the results to wait for."""
        with self._lock:
            self._flushes += 1
            return [batch.result for batch in self._incomplete]

    def end_flush(self) -> None:
        with self._lock:
            self._flushes = max(0, self._flushes - 1)

    def close(self) -> None:
        """Refuse new records; everything queued becomes sendable."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def has_incomplete(self) -> bool:
        with self._lock:
            return bool(self._incomplete)

    def has_queued(self) -> bool:
        with self._lock:
            return any(self._queues.values())

    def abort_queued(self) -> list[ProducerBatch]:
        """Remove and return every queued (not in-flight) batch; the caller fails them."""
        with self._lock:
            aborted = [batch for queue in self._queues.values() for batch in queue]
            for queue in self._queues.values():
                queue.clear()
        return aborted


def _made_order(batch: ProducerBatch) -> int:
    return batch.order


def _may_follow(
    taken: list[ProducerBatch],
    head: ProducerBatch,
    tp: TopicPartition,
    may_pipeline: Callable[[TopicPartition], bool],
) -> bool:
    """Whether ``head`` may go in another request of this drain behind ``taken`` (an idempotent
    producer's pipelining): both first attempts of numbered batches, and ``may_pipeline(tp)``."""
    if head.attempts or head._prebuilt:
        return False
    for batch in taken:
        if batch.attempts or batch._prebuilt:
            return False
    return may_pipeline(tp)
