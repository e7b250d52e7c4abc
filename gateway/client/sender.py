"""The producer's sender: the routine that drains the accumulator into Produce requests.

I/O lives here and only here; the decisions are the accumulator's (what is ready, what to drain)
and the retry policy's (retry or fail). Each request is one :class:`SendProduceHandler` with
``create_request`` / ``handle_response`` / ``handle_error``, as aiokafka's sender does it.

Per-partition order, three ways (up to ``max_in_flight`` requests are outstanding in all):

* **Idempotent producers** (the default at acks=all; transactional ones too) on a transport that
  keeps request order (the raw data path, the ProduceStream; not unary calls): up to
  ``max_in_flight`` (<= 5) requests of a partition are in flight at once, numbered in the order
  they are drained (Kafka's ``max.in.flight.requests.per.connection`` with idempotence). The
  leader appends a batch only in sequence, so order holds under failure as in Kafka's producer
  (KIP-360's in-order retry): when a batch fails retriably, the batches in flight behind it come
  back too (OUT_OF_ORDER_SEQUENCE_NUMBER, their predecessor missing), all go back to the front of
  the queue in sequence order, and the partition then sends only its first unacknowledged batch,
  alone, until it is acknowledged; then pipelining resumes. OUT_OF_ORDER_SEQUENCE_NUMBER (or
  UNKNOWN_PRODUCER_ID) means a lost producer state -- an epoch bump -- only for the partition's
  *next* batch (``TransactionManager.is_next_sequence``); behind an unsettled batch it is a plain
  retry. After a bump a partition sends nothing numbered in the new epoch while requests of the
  old one are in flight for it. (:meth:`Sender._gates` says which partitions may send.)
* **Non-idempotent producers with acks 1/all**, and any producer over unary calls: a partition
  with a request in flight is *muted* -- the accumulator does not drain it -- until that request
  is answered, and a failed batch goes back to the front of its queue, so a retry can never
  overtake the batches behind it: one request per partition (stricter than Kafka, whose producer
  may reorder there).
* With ``acks=0`` there are no retries (as in Kafka: the client does not learn of failures), so
  nothing can overtake anything; partitions are then not muted and a transport that keeps
  request order (the ProduceStream) pipelines up to ``max_in_flight`` requests for the same
  partition -- the fire-and-forget producer of the 2011 paper.

Two ways a request goes out. In general each runs in a task of its own through
``transport.send`` (a protobuf request; gRPC, or a frame on the raw data path). On the raw
data path, once its connection is open and nothing is queued on it, the routine writes the
requests of a pass itself (:meth:`Sender._write_direct`: frames straight from the batches, one
write for the pass) and settles them from their answers as the connection reads them; at acks=0
a pass keeps draining while everything it writes is done at once. With one record per request
the general way cost ~70 us of the I/O thread a record, this one ~10 (see the README's raw data
path section).
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import functools
import logging
import math

from gateway.client.accumulator import ProducerBatch, RecordAccumulator
from gateway.client.client import GatewayClient
from gateway.client.dataport import AnswerSlot, current_traceparent
from gateway.client.errors import (
    IllegalStateError,
    RequestTimedOutError,
    TransactionAbortedError,
    TributaryError,
)
from gateway.client.retry import RetryPolicy
from gateway.client.sealed import stamp_correlation_id
from gateway.client.structs import TopicPartition
from gateway.client.telemetry import request_context
from gateway.client.transaction_manager import TransactionManager, TxnState
from services import errors
from services.acks import Acks
from services.proto import pb
from services.serde import acks_to_proto, error_from_proto

log = logging.getLogger(__name__)

#: Errors that say a partition lost this producer's state (KIP-360): bump the epoch, retry.
_LOST_PRODUCER_STATE = (errors.UnknownProducerIdError, errors.OutOfOrderSequenceNumberError)


class RetriableAfterEpochBump(errors.TributaryError):
    """Internal: the batch is retried once the producer has a new epoch."""

    reason = "UNKNOWN_PRODUCER_ID"
    retriable = True


class RetriableBehindUnsettledBatch(errors.TributaryError):
    """Internal: OUT_OF_ORDER_SEQUENCE_NUMBER (or UNKNOWN_PRODUCER_ID) for a batch whose
    predecessor is not settled yet (failed, or still in flight): it is missing at the leader,
    not the producer's state. Retried in sequence order, no epoch bump (Kafka's ``canRetry``)."""

    reason = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    retriable = True


#: Drains one pass of the sender makes at most when each leaves nothing in flight (acks=0 over
#: the raw path): bounded so the loop's other callbacks (answers, wakeups) get their turn.
_PASS_ROUNDS = 64
#: How much longer than its request timeout an answer to a request written directly is awaited
#: before its connection is presumed stuck (the gateway answers a timed-out request itself).
ANSWER_GRACE_S = 5.0


class SendProduceHandler:
    """One Produce request: a topic and, per partition, the batches sent in it (in order)."""

    __slots__ = (
        "_topic_partitions",
        "connection",
        "deadline",
        "epoch",
        "future",
        "numbered",
        "partitions",
        "pipelinable",
        "producer_id",
        "sender",
        "topic",
    )

    def __init__(self, sender: Sender, topic: str, partitions: dict[int, list[ProducerBatch]]) -> None:
        self.sender = sender
        self.topic = topic
        self.partitions = partitions
        #: The answer's slot of a request written directly (``Sender._write_direct``), the
        #: connection it was written on, and when (loop time) its wait is given up
        #: (``Sender._watch_late``).
        self.future: AnswerSlot | None = None
        self.connection = None
        self.deadline = 0.0
        #: The producer id and epoch the batches were numbered with (idempotence), else -1.
        self.epoch = -1
        self.producer_id = -1
        #: Numbered when drained (``Sender._request_started``): the task sends them as they are.
        self.numbered = False
        #: Requests of its partitions may follow it while it is in flight (idempotence: numbered
        #: first attempts, none pre-built; see ``Sender._gates``).
        self.pipelinable = False
        self._topic_partitions: list[TopicPartition] | None = None

    @property
    def topic_partitions(self) -> list[TopicPartition]:
        """The request's partitions (each batch knows its own: none is made here). Made when
        first asked: an acks=0 request written directly never asks (at one record per request
        the list was ~3% of the sender's time)."""
        tps = self._topic_partitions
        if tps is None:
            tps = self._topic_partitions = [
                batches[0].topic_partition for batches in self.partitions.values()
            ]
        return tps

    def create_request(self):
        # NOTE: batches of one partition are concatenated into one PartitionBatches entry; the
        # storage node appends them in order, as one unit.
        # (``batches.add``, not a list of PartitionBatches: passing built sub-messages copies their
        # bytes a second time.)
        request = pb.ProduceRequest(
            topic=self.topic, acks=self.sender.acks, timeout_ms=self.sender.request_timeout_ms
        )
        add = request.batches.add
        for p, batches in self.partitions.items():
            # Mostly one batch a partition (at thousands of partitions): no join for it (unless
            # it was renumbered in place: a bytearray, which the protobuf field refuses).
            data = batches[0].close() if len(batches) == 1 else b"".join(b.close() for b in batches)
            add(partition=p, record_batches=data if type(data) is bytes else bytes(data))
        return request

    def handle_response(self, response) -> None:
        results = {result.partition: result for result in response.partitions}
        # A ProduceStream request that failed as a whole is answered in-band on partition -1.
        whole = results.get(-1)
        acknowledged = []
        for partition, batches in self.partitions.items():
            result = results.get(partition, whole)
            if result is None:
                self.sender.fail_or_retry(
                    batches,
                    RequestTimedOutError(f"the gateway's answer has no result for {self.topic}-{partition}"),
                )
                continue
            error = error_from_proto(result.error) if result.HasField("error") else None
            if error is not None:
                self.sender.fail_or_retry(batches, error)
            else:
                acknowledged.append(
                    (batches, result.base_offset, result.log_append_time, result.log_start_offset)
                )
        if acknowledged:
            self.sender.complete_many(acknowledged)

    def handle_error(self, error: TributaryError) -> None:
        for batches in self.partitions.values():
            self.sender.fail_or_retry(batches, error)


class Sender:
    """Drains ready batches into requests and settles their outcome; run with :meth:`run`."""

    def __init__(
        self,
        *,
        client: GatewayClient,
        accumulator: RecordAccumulator,
        policy: RetryPolicy,
        transport,
        acks=-1,
        max_in_flight: int = 5,
        max_request_size: int = 1048576,
        request_timeout_ms: int = 30_000,
        transaction_manager: TransactionManager | None = None,
    ) -> None:
        self.client = client
        #: Idempotence (and transactions): numbers batches, bumps the epoch after a lost state.
        self.transaction_manager = transaction_manager
        self.accumulator = accumulator
        self.policy = policy
        self.transport = transport
        self.acks = acks_to_proto(Acks.parse(acks))
        self.max_in_flight = max(1, max_in_flight)
        self.max_request_size = max_request_size
        self.request_timeout_ms = request_timeout_ms
        self._muted: set[TopicPartition] = set()
        # Without retries, order needs no muting if the transport delivers requests in order.
        self._pipeline = self.acks == pb.ACKS_NONE and getattr(transport, "preserves_order", False)
        #: Idempotence: a partition may have several requests in flight, numbered in drain order
        #: (while the transport keeps request order: read each pass, a fallback may change it).
        self._pipeline_idempotent = transaction_manager is not None and self.acks != pb.ACKS_NONE
        #: Idempotence: acknowledgements held until an earlier batch of their partition is
        #: settled (``_hold_acknowledgement``), per partition, in the order the batches were made.
        self._held: dict[TopicPartition, list[tuple[ProducerBatch, tuple[int, int, int]]]] = {}
        #: Idempotence: each partition's requests in flight, in the order they were started.
        self._in_flight_by_tp: dict[TopicPartition, list[SendProduceHandler]] = {}
        self._in_flight: set[asyncio.Task] = set()
        #: Requests written by the routine itself (``_write_direct``), awaiting their answers.
        self._direct: set[SendProduceHandler] = set()
        #: One timer for the deadlines of ``_direct`` (``_watch_late``), and when it is due.
        self._late_timer: asyncio.TimerHandle | None = None
        self._late_at = math.inf
        #: The routine's loop (asked once: asking costs a system call in 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A pass is running (no other may start inside it: callbacks it runs may wake us).
        self._in_pass = False
        #: The routine's context, for passes made by :meth:`wakeup_to_send`.
        self._context: contextvars.Context | None = None
        #: Epoch bumps in progress (tasks, also counted in ``_in_flight``).
        self._epoch_bumps: set[asyncio.Task] = set()
        #: The acks value of a raw frame (0, 1, -1).
        self._frame_acks = int(Acks.parse(acks))
        #: Whether the transport takes requests written directly (the raw data path).
        self._direct_capable = hasattr(transport, "writer_now")
        self._waiter: asyncio.Future | None = None
        self._stopping = False
        #: Counters for ``Producer.metrics()``: requests sent (and of them, written directly by the
        #: routine), batches retried / failed / acknowledged.
        self.metrics = {
            "requests": 0,
            "batches-retried": 0,
            "batches-failed": 0,
            "batches-acknowledged": 0,
            "records-acknowledged": 0,
            "requests-written-directly": 0,
        }

    # -- the routine -----------------------------------------------------------------------

    async def run(self) -> None:
        """The sender routine: until stopped and everything queued has completed."""
        loop = self._loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._context = contextvars.copy_context()
        while True:
            now_ms = self.client.clock.time_ms()
            self._fail_expired(now_ms)
            if self._stopping and not self.accumulator.has_incomplete():
                return
            self._in_pass = True
            try:
                delay_ms = self._send_ready(now_ms)
            finally:
                self._in_pass = False
            await self._sleep(loop, delay_ms)

    def _send_ready(self, now_ms: int) -> int | None:
        """Start requests for ready partitions; return ms until the next check (None: on wakeup).

        The requests of one pass are written directly, here, when the transport allows it
        (:meth:`_direct_connection`), and leave in one write; else each runs in a task of its
        own. Once one request of the pass needs a task, the rest do too: requests are written
        in the order they were drained.

        A drain takes one request per partition. At acks=0 requests written directly are done
        at once, so the pass drains again, up to :data:`_PASS_ROUNDS` times (or until the
        connection is backlogged): one record per request at 16 in flight was one event-loop
        turn, one ``ready`` and one ``drain`` per record, ~40% of the I/O thread.
        """
        #: Connections written to directly, holding their writes until the pass ends.
        written: list = []
        #: acks=0 requests written directly: settled together once the pass has written them.
        unacked: list[tuple[list[ProducerBatch], int, int, int]] = []
        try:
            delay = self._drain_rounds(now_ms, written, unacked)
        finally:
            for connection in written:
                connection.flush()  # the pass's requests leave in one write, now
        if unacked:
            self.complete_many(unacked)
            return 0  # the routine looks again (its records are settled: it may be done)
        return delay

    def _drain_rounds(self, now_ms: int, written: list, unacked: list) -> int | None:
        """:meth:`_send_ready`'s drains; the connections it writes to are added to ``written``
        (their writes held for the pass's one write)."""
        delay: int | None = None
        for _ in range(_PASS_ROUNDS):
            slots = self.max_in_flight - len(self._in_flight) - len(self._direct)
            if slots <= 0:
                delay = None
                break
            if self._pipeline_idempotent:
                muted, busy, ordered = self._gates()
                check = self.accumulator.ready(now_ms, muted, busy)
            else:
                check = self.accumulator.ready(now_ms, self._muted)
            if not check.ready:
                delay = check.next_check_ms
                break
            if self._pipeline_idempotent:
                plans = self.accumulator.drain(
                    check.ready,
                    now_ms,
                    max_request_size=self.max_request_size,
                    max_requests=slots,
                    pipelined=ordered,
                    may_pipeline=self._can_number_now,
                )
            else:
                plans = self.accumulator.drain(
                    check.ready,
                    now_ms,
                    max_request_size=self.max_request_size,
                    max_requests=slots,
                    pipelined=self._pipeline,
                )
            connection = self._direct_connection() if plans else None
            if connection is not None and _traced(plans):
                connection = None  # a traced request runs in its record's span: tasks do that
            trace_context = current_traceparent() if connection is not None else ""
            all_direct = connection is not None
            if connection is not None and connection not in written:
                connection.hold_writes()
                written.append(connection)
            for topic, partitions in plans:
                if connection is not None and self._write_direct(
                    connection, topic, partitions, trace_context, unacked
                ):
                    continue
                connection = None
                all_direct = False
                self._start(SendProduceHandler(self, topic, partitions))
            in_flight = len(self._in_flight) + len(self._direct)
            delay = 0 if plans and in_flight < self.max_in_flight else check.next_check_ms
            if not (plans and all_direct and self._frame_acks == 0):
                break  # answers are awaited (muted), or tasks took over: the routine looks again
        return delay

    async def _sleep(self, loop: asyncio.AbstractEventLoop, delay_ms: int | None) -> None:
        if delay_ms is not None and delay_ms <= 0:
            await asyncio.sleep(0)
            return
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(delay_ms / 1000.0, _resolve, waiter) if delay_ms is not None else None
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()

    def wakeup(self) -> None:
        """Make the routine look again now (call on the loop thread)."""
        if self._waiter is not None:
            _resolve(self._waiter)

    def wakeup_to_send(self) -> None:
        """:meth:`wakeup` for records sendable now (a full batch, or ``linger_ms=0``), woken from
        another thread: when the routine sleeps, a pass made here writes their requests in this
        loop turn instead of the routine's next one (with one record at a time, a turn of each
        round trip); the routine then looks again as after any wakeup."""
        waiter = self._waiter
        context = self._context
        if (
            waiter is not None
            and not waiter.done()
            and context is not None
            and not self._in_pass
            and not self._stopping
        ):
            self._in_pass = True
            try:
                context.run(self._send_ready, self.client.clock.time_ms())
            finally:
                self._in_pass = False
        self.wakeup()

    def send_here(self) -> None:
        """:meth:`wakeup_to_send` for a thread that holds the idle loop (``IOThread.call_if_idle``):
        the pass writes the sendable requests now, and the routine is woken only when it has
        something to do that the answers would not wake it for.

        A pass that sent something returns 0 (look again now: more may be sendable) and leaves
        the accumulator saying the routine looks now (``sender_looks_by``), so appenders would
        not wake it: a second pass here looks instead. When that one finds nothing to send and
        no timer to set (its partitions are muted until answered, or empty), the routine may
        sleep on -- its answers wake it, and the accumulator now says appenders must."""
        waiter = self._waiter
        context = self._context
        if (
            waiter is None
            or waiter.done()
            or context is None
            or self._in_pass
            or self._stopping
            or self._frame_acks == 0  # settled in the pass: callbacks would run on this thread
        ):
            self.wakeup()
            return
        self._in_pass = True
        try:
            now_ms = self.client.clock.time_ms()
            delay = context.run(self._send_ready, now_ms)
            if delay == 0:
                delay = context.run(self._send_ready, now_ms)
        except Exception:  # not the appender's to see: the routine's own pass meets it again
            log.exception("sending from the appending thread failed; left to the sender routine")
            delay = 0
        finally:
            self._in_pass = False
        if delay is not None:
            self.wakeup()

    # -- per-partition order: who may send -------------------------------------------------

    def _gates(self) -> tuple[set[TopicPartition], set[TopicPartition], bool]:
        """Idempotence: the partitions with requests in flight that may not send now (muted), those
        that may send more behind them (busy: a first attempt, not a retry -- the accumulator's
        ``ready``), and whether the transport keeps request order now.

        A partition may pipeline while every request of it in flight is pipelinable and numbered
        in the producer's current id and epoch, and a batch for it can be numbered now
        (:meth:`_can_number_now`). Else it waits for its requests to settle: behind a retry
        (only the first unacknowledged batch goes), behind a request numbered in an epoch since
        replaced (never renumber while the old epoch is in flight), behind one not numbered yet
        (it would get a later sequence than one drained after it), or on a transport that may
        reorder requests."""
        by_tp = self._in_flight_by_tp
        ordered = bool(getattr(self.transport, "preserves_order", False))
        muted: set[TopicPartition] = set()
        busy: set[TopicPartition] = set()
        if not by_tp:
            return muted, busy, ordered
        manager = self.transaction_manager
        assert manager is not None, "idempotence only"
        epoch, producer_id = manager.producer_epoch, manager.producer_id
        for tp, handlers in by_tp.items():
            if (
                ordered
                and all(h.pipelinable and h.epoch == epoch and h.producer_id == producer_id for h in handlers)
                and self._can_number_now(tp)
            ):
                busy.add(tp)
            else:
                muted.add(tp)
        return muted, busy, ordered

    def _can_number_now(self, tp: TopicPartition) -> bool:
        """Whether a batch for ``tp`` can be numbered as it is drained (no await first): the
        producer has its id, no epoch bump is starting or running, and (transactional) ``tp`` is
        in the open transaction."""
        manager = self.transaction_manager
        return manager is not None and not self._epoch_bumps and manager.partition_ready(tp)

    def _request_started(self, handler: SendProduceHandler, numbered: bool = False) -> None:
        """``handler``'s request is starting (its batches drained): mute its partitions, or
        (idempotence) number its batches now when possible and count it in flight per partition.
        ``numbered``: its batches were numbered already (written directly)."""
        if self._pipeline:
            return
        if not self._pipeline_idempotent:
            self._muted.update(handler.topic_partitions)
            return
        manager = self.transaction_manager
        assert manager is not None, "idempotence only"
        tps = handler.topic_partitions
        if not numbered and all(self._can_number_now(tp) for tp in tps):
            for batches in handler.partitions.values():
                for batch in batches:
                    manager.number(batch)
            numbered = True
        if numbered:
            # (A retry has its ``last_error``: ``attempts`` may count this send already.)
            handler.numbered = True
            handler.epoch, handler.producer_id = manager.producer_epoch, manager.producer_id
            handler.pipelinable = all(
                batch.last_error is None and not batch.prebuilt and manager.is_current(batch)
                for batches in handler.partitions.values()
                for batch in batches
            )
        by_tp = self._in_flight_by_tp
        for tp in tps:
            handlers = by_tp.get(tp)
            if handlers is None:
                by_tp[tp] = [handler]
            else:
                handlers.append(handler)

    def _request_settled(self, handler: SendProduceHandler) -> None:
        """``handler``'s request is answered (or failed) and its batches settled or re-queued:
        its partitions may send again."""
        if self._pipeline:
            return
        if not self._pipeline_idempotent:
            self._muted.difference_update(handler.topic_partitions)
            return
        by_tp = self._in_flight_by_tp
        for tp in handler.topic_partitions:
            handlers = by_tp.get(tp)
            if handlers is None:
                continue
            if handlers[0] is handler:
                del handlers[0]
            else:
                try:
                    handlers.remove(handler)
                except ValueError:
                    pass
            if not handlers:
                del by_tp[tp]

    # -- one request, written directly -----------------------------------------------------

    def _direct_connection(self):
        """The raw connection this pass may write its requests on itself, or None (tasks).

        Not while an epoch bump runs (batches would be numbered in the epoch being replaced),
        for a transactional producer (its partitions join the transaction first) or one still
        without a producer id. When acks=0 pipelines a partition, not while a request task is
        in flight either: it may not have written yet (opening the connection, or held by the
        gateway's throttle), and what was drained after it must not overtake it; the same when an
        idempotent producer pipelines (it would cost a retry). Otherwise a task's partitions are
        muted until it is answered, so nothing drained now is theirs.
        """
        if (
            not self._direct_capable
            or self._epoch_bumps
            or ((self._pipeline or self._pipeline_idempotent) and self._in_flight)
        ):
            return None
        manager = self.transaction_manager
        if manager is not None and (manager.transactional or not manager.has_producer_id):
            return None
        return self.transport.writer_now()

    def _write_direct(
        self,
        connection,
        topic: str,
        partitions: dict[int, list[ProducerBatch]],
        trace_context: str,
        unacked: list[tuple[list[ProducerBatch], int, int, int]],
    ) -> bool:
        """Queue the request of ``topic``'s ``partitions`` on ``connection`` from the routine: no
        task, no protobuf. At acks=0 its batches go to ``unacked``, to be completed once written
        (as ``RawTransport.send`` does); else its answer settles it in :meth:`_direct_answered`
        (through the request's :class:`SendProduceHandler`, made only then: at one record per
        request at acks=0, one a request was ~4% of the routine's time). False (nothing done):
        send it with a task instead."""
        if connection.broken or connection.backlogged():
            return False
        manager = self.transaction_manager
        metrics = self.metrics
        metrics["requests"] += 1
        metrics["requests-written-directly"] += 1
        answer = handler = None
        try:
            if self._frame_acks != 0:
                handler = SendProduceHandler(self, topic, partitions)
                answer = AnswerSlot(functools.partial(self._direct_answered, handler, connection))
            frame = _sealed_frame(partitions) if not trace_context else None
            if frame is not None:
                # Sealed when appended (sealed.py): only the correlation id is written here.
                correlation_id = connection.next_correlation_id()
                stamp_correlation_id(frame, correlation_id)
                connection.send_nowait(frame, None if answer is None else correlation_id, answer)
            else:
                data = []
                for p, batches in partitions.items():
                    for batch in batches:
                        batch.attempts += 1
                        if manager is not None:
                            manager.number(batch)
                    data.append(
                        (p, batches[0].close() if len(batches) == 1 else b"".join(b.close() for b in batches))
                    )
                self.transport.write_request(
                    connection,
                    topic,
                    self._frame_acks,
                    self.request_timeout_ms,
                    data,
                    trace_context,
                    answer,
                )
        except Exception as exc:  # the batches are drained: they settle here, as a task's would
            log.exception("unexpected error sending to %s", topic)
            SendProduceHandler(self, topic, partitions).handle_error(
                exc if isinstance(exc, TributaryError) else TributaryError(f"{type(exc).__name__}: {exc}")
            )
            return True
        if answer is None or handler is None:  # acks=0: done once written, offsets unknown
            # (A loop, not ``extend`` of a generator: this runs once per request.)
            for batches in partitions.values():
                unacked.append((batches, -1, -1, -1))
            return True
        handler.future = answer
        self._request_started(handler, numbered=manager is not None)
        self._track_direct(handler, connection)
        return True

    def _track_direct(self, handler: SendProduceHandler, connection) -> None:
        """``handler``'s request was written on ``connection``: await its answer until its
        deadline (``_watch_late``)."""
        self._direct.add(handler)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        handler.connection = connection
        handler.deadline = loop.time() + self.request_timeout_ms / 1000.0 + ANSWER_GRACE_S
        if handler.deadline < self._late_at:
            self._watch_late(handler.deadline)

    def _watch_late(self, when: float) -> None:
        """Arm the one timer of the requests written directly for ``when`` (loop time): a
        request's answer is given up at its deadline with a timer per sender, not one made,
        pushed on the loop's heap and cancelled per request. Their deadlines come in the order
        they were written (one timeout for all), so it is re-armed only when it fires."""
        if self._late_timer is not None:
            self._late_timer.cancel()
        loop = self._loop
        assert loop is not None, "set when a request is written"
        self._late_at = when
        self._late_timer = loop.call_at(when, self._answers_late)

    def _answers_late(self) -> None:
        """The timer: a request past its deadline without an answer presumes its connection
        stuck (``answer_late``: it and every request on it fail, the next opens a new one)."""
        self._late_timer, self._late_at = None, math.inf
        assert self._loop is not None
        now = self._loop.time()
        timeout_s = self.request_timeout_ms / 1000.0 + ANSWER_GRACE_S
        for handler in [h for h in self._direct if h.deadline <= now]:
            if handler in self._direct and handler.connection is not None:
                self.transport.answer_late(handler.connection, timeout_s)
        later = [h.deadline for h in self._direct if h.deadline > now]  # (each late one: once)
        if later:
            self._watch_late(min(later))

    def _direct_answered(
        self, handler: SendProduceHandler, connection, body: bytes | None, error: BaseException | None
    ) -> None:
        """Settle a directly written request from its answer's ``body`` (or the ``error`` that
        ended its wait), as the connection's read routine (or its breaking) hands it over."""
        self._direct.discard(handler)
        try:
            if isinstance(error, asyncio.CancelledError):
                closed = IllegalStateError("the producer was closed before the request was answered")
                handler.handle_error(closed)  # type: ignore[arg-type]  # read with getattr, like any error
                return
            if error is not None:
                raise error
            assert body is not None, "an answer has a body or an error"
            answer = self.transport.read_answer(connection, handler.topic, body)
        except TributaryError as exc:
            handler.handle_error(exc)
        except Exception as exc:
            log.exception("unexpected error sending to %s", handler.topic)
            handler.handle_error(TributaryError(f"{type(exc).__name__}: {exc}"))
        else:
            handler.handle_response(answer)
        finally:
            self._request_settled(handler)
            self._pass_after_answer()

    def _pass_after_answer(self) -> None:
        """After a request written directly is settled, in the read routine's loop turn: when
        the routine sleeps, make its pass here, so the next request leaves in this turn rather
        than the routine's next one (with one request in flight: a loop turn, a task step and a
        future each round trip). The routine is woken only when the pass leaves it something to
        look at: a timed check (linger, backoff), or more to drain."""
        waiter = self._waiter
        context = self._context
        if waiter is None or waiter.done() or context is None or self._in_pass or self._stopping:
            self.wakeup()
            return
        delay: int | None = 0
        self._in_pass = True
        try:
            now_ms = self.client.clock.time_ms()
            self._fail_expired(now_ms)
            delay = context.run(self._send_ready, now_ms)
        finally:
            self._in_pass = False
            if delay is not None:
                self.wakeup()

    # -- one request, in a task -------------------------------------------------------------

    def _start(self, handler: SendProduceHandler) -> None:
        self._request_started(handler)
        # Traced sends: the request continues its first record's trace (gateway/client/telemetry.py).
        context = request_context(b.result for batches in handler.partitions.values() for b in batches)
        task = asyncio.get_running_loop().create_task(self._do_produce(handler), context=context)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _do_produce(self, handler: SendProduceHandler) -> None:
        for batches in handler.partitions.values():
            for batch in batches:
                batch.attempts += 1
        self.metrics["requests"] += 1
        try:
            manager = self.transaction_manager
            if manager is not None:
                await self._number_for_task(manager, handler)
            request = handler.create_request()
            response = await self.transport.send(request, self.request_timeout_ms / 1000.0 + ANSWER_GRACE_S)
        except TributaryError as exc:
            handler.handle_error(exc)
        except asyncio.CancelledError:
            closed = IllegalStateError("the producer was closed before the request was answered")
            handler.handle_error(closed)  # type: ignore[arg-type]  # read with getattr, like any error
            raise
        except Exception as exc:
            log.exception("unexpected error sending to %s", handler.topic)
            handler.handle_error(TributaryError(f"{type(exc).__name__}: {exc}"))
        else:
            handler.handle_response(response)
        finally:
            self._request_settled(handler)
            # Leave the in-flight set before waking the routine: the done callback runs only
            # after this returns, and with max_in_flight=1 the routine would find the set still
            # full, go back to sleep and never be woken again.
            self._in_flight.discard(asyncio.current_task())
            self.wakeup()

    async def _number_for_task(self, manager: TransactionManager, handler: SendProduceHandler) -> None:
        """Number ``handler``'s batches before its task sends them, unless that was done when
        they were drained: then they go as numbered, even if the epoch was bumped since (the
        partition sends nothing in the new epoch before this request settles). Else the
        producer id first (waiting out a bump) and, transactional, the partitions' joining."""
        if handler.numbered:
            if manager.transactional:
                manager.ensure_state(TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.ABORTING)
            return
        await manager.ensure_producer_id()
        if manager.transactional:
            await manager.add_partitions(handler.topic_partitions)
        handler.epoch, handler.producer_id = manager.producer_epoch, manager.producer_id
        for batches in handler.partitions.values():
            for batch in batches:
                manager.number(batch)

    # -- outcomes --------------------------------------------------------------------------

    def complete(
        self, batches: list[ProducerBatch], base_offset: int, log_append_time: int, log_start_offset: int
    ) -> None:
        """Acknowledge the batches of one partition, sent together starting at ``base_offset``."""
        self.complete_many([(batches, base_offset, log_append_time, log_start_offset)])

    def complete_many(self, acknowledged: list[tuple[list[ProducerBatch], int, int, int]]) -> None:
        """:meth:`complete` of several partitions: (batches, base offset, append time, log start)
        each; their buffer memory goes back in one step."""
        # (Plain loops, not a generator unpacking each entry: with one record per request this
        # runs for every record.)
        done: list[ProducerBatch] = []
        for entry in acknowledged:
            done += entry[0]
        self.accumulator.complete_all(done)
        manager = self.transaction_manager
        if manager is not None:
            for batch in done:
                manager.settled(batch)
        batch_count = record_count = 0
        for batches, base_offset, log_append_time, log_start_offset in acknowledged:
            offset = base_offset
            batch_count += len(batches)
            for batch in batches:
                count = batch.record_count
                record_count += count
                if manager is not None and manager.follows_unsettled(batch):
                    self._hold_acknowledgement(batch, (offset, log_append_time, log_start_offset))
                else:
                    batch.result.complete(offset, log_append_time, log_start_offset)
                if offset >= 0:
                    offset += count
        if self._held:
            for batches, *_ in acknowledged:
                self._release_acknowledgements(batches[0].topic_partition)
        metrics = self.metrics
        metrics["batches-acknowledged"] += batch_count
        metrics["records-acknowledged"] += record_count

    def _hold_acknowledgement(self, batch: ProducerBatch, result: tuple[int, int, int]) -> None:
        """Keep ``batch``'s acknowledgement until the batches of its partition made before it
        are settled: with several requests of a partition in flight, a later batch can be
        acknowledged while an earlier one, written but its answer lost, is being retried (the
        leader then answers the retry from its state). The application still learns of a
        partition's records in the order it sent them, as Kafka promises for its callbacks."""
        held = self._held.setdefault(batch.topic_partition, [])
        entry = (batch, result)
        if not held or held[-1][0].order < batch.order:
            held.append(entry)  # the usual case: held in the order the batches were made
        else:
            # (Not a sort per entry: an answer of thousands of one-record batches held behind
            # a retry made that quadratic, 4 s of the I/O thread for 15,000.)
            bisect.insort(held, entry, key=_held_order)

    def _release_acknowledgements(self, tp: TopicPartition) -> None:
        """Complete the held acknowledgements of ``tp`` that no unsettled batch precedes now."""
        held = self._held.get(tp)
        if held is None:
            return
        manager = self.transaction_manager
        count = 0
        for batch, _result in held:
            if manager is not None and manager.follows_unsettled(batch):
                break
            count += 1
        released = held[:count]
        del held[:count]  # (one move, not a pop(0) per entry; taken before anyone is told)
        if not held:
            self._held.pop(tp, None)
        for batch, (offset, log_append_time, log_start_offset) in released:
            batch.result.complete(offset, log_append_time, log_start_offset)

    def fail_or_retry(self, batches: list[ProducerBatch], error: TributaryError) -> None:
        """Re-queue the batches (in sequence order, after a backoff) if the policy allows, else
        fail them."""
        now_ms = self.client.clock.time_ms()
        manager = self.transaction_manager
        if manager is not None and isinstance(error, _LOST_PRODUCER_STATE) and batches:
            first = batches[0]
            if manager.is_next_sequence(first):
                # The partition's next batch: the partition lost this producer's state. A new
                # epoch (one bump at a time: those in flight behind it fail the same way), then
                # the batches again, renumbered once the old epoch's requests have settled.
                if manager.lost_state(first.topic_partition) and not self._epoch_bumps:
                    self._start_epoch_bump(manager, error)
                error = RetriableAfterEpochBump(str(error))
            elif first.base_sequence >= 0 and not first.prebuilt:
                # Behind an unsettled batch (failed, or in flight), or numbered in an epoch since
                # replaced: its predecessor is missing there. Retried in order, no bump.
                behind = RetriableBehindUnsettledBatch(str(error))
                behind.__cause__ = error
                error = behind
        if getattr(error, "invalid_metadata", False) and batches:
            self.client.metadata.mark_stale(batches[0].topic_partition.topic)
        retry = [b for b in batches if self.policy.can_retry(error, b.attempts, b.created_ms, now_ms)]
        for batch in batches:
            if batch not in retry:
                self.fail(batch, self._final_error(batch, error, now_ms))
        if retry:
            self.metrics["batches-retried"] += len(retry)
            for batch in retry:
                batch.last_error = error
            backoff = self.policy.backoff_ms(retry[0].attempts)
            log.debug(
                "retrying %d batch(es) of %s in %d ms after %s",
                len(retry),
                retry[0].topic_partition,
                backoff,
                error,
            )
            self.accumulator.reenqueue(retry, now_ms + backoff)

    def _start_epoch_bump(self, manager: TransactionManager, error: TributaryError) -> None:
        task = asyncio.get_running_loop().create_task(manager.reset_after_lost_state(error))
        self._in_flight.add(task)  # the routine waits for it like for a request
        self._epoch_bumps.add(task)
        task.add_done_callback(self._epoch_bumped)

    def _epoch_bumped(self, task: asyncio.Task) -> None:
        self._in_flight.discard(task)
        self._epoch_bumps.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("could not bump the producer epoch: %s", task.exception())
        self.wakeup()

    def _final_error(self, batch: ProducerBatch, error: TributaryError, now_ms: int) -> BaseException:
        if getattr(error, "retriable", False) and self.policy.is_expired(batch.created_ms, now_ms):
            timeout = RequestTimedOutError(
                f"expiring {batch.record_count} record(s) for {batch.topic_partition}: "
                f"{now_ms - batch.created_ms} ms has passed since batch creation; last error: {error}"
            )
            timeout.__cause__ = error
            return timeout
        return error

    def fail(self, batch: ProducerBatch, error: BaseException) -> None:
        self.metrics["batches-failed"] += 1
        manager = self.transaction_manager
        if manager is not None:
            # Settled: the batches behind it are next (an OUT_OF_ORDER answer for the next one
            # then means the leader never got it: a lost state, an epoch bump).
            manager.settled(batch)
            if manager.transactional and not isinstance(error, TransactionAbortedError):
                manager.fail_transaction(error)
            elif isinstance(error, TransactionAbortedError):
                manager.dropped(batch)  # a numbered retry aborted: the abort bumps the epoch
        self.accumulator.complete(batch)
        batch.result.complete(error=error)
        if self._held:
            self._release_acknowledgements(batch.topic_partition)

    def _fail_expired(self, now_ms: int) -> None:
        for batch in self.accumulator.expire(now_ms, self.policy.delivery_timeout_ms):
            last = f"; last error: {batch.last_error}" if batch.last_error is not None else ""
            error = RequestTimedOutError(
                f"expiring {batch.record_count} record(s) for {batch.topic_partition}: "
                f"{now_ms - batch.created_ms} ms has passed since batch creation{last}"
            )
            error.__cause__ = batch.last_error
            self.fail(batch, error)

    # -- shutdown --------------------------------------------------------------------------

    def stop(self) -> None:
        """Finish what is queued, then end the routine."""
        self._stopping = True
        self.wakeup()

    async def abort(self, error: BaseException) -> None:
        """Fail everything queued, cancel what is in flight (their batches fail too)."""
        for batch in self.accumulator.abort_queued():
            self.fail(batch, error)
        for handler in list(self._direct):
            if handler.future is not None:
                handler.future.cancel()  # settles it (failed) at once
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Acknowledged, held behind a batch that was in flight: theirs stand (it failed now).
        held, self._held = self._held, {}
        for entries in held.values():
            for batch, (offset, log_append_time, log_start_offset) in entries:
                batch.result.complete(offset, log_append_time, log_start_offset)
        self._stopping = True
        self.wakeup()


def _held_order(entry: tuple[ProducerBatch, tuple[int, int, int]]) -> int:
    """Where a held acknowledgement goes among its partition's: the order its batch was made."""
    return entry[0].order


def _sealed_frame(partitions: dict[int, list[ProducerBatch]]) -> bytearray | None:
    """The request frame of a request of one batch sealed in it (``gateway/client/sealed.py``)
    on its first attempt, counted as made; else None (encode the request). Not a retry's: the
    frame may still be held by the write that sent it the first time."""
    if len(partitions) != 1:
        return None
    for batches in partitions.values():
        if len(batches) == 1:
            batch = batches[0]
            frame = batch.request_frame
            if frame is not None and batch.attempts == 0:
                batch.attempts = 1
                return frame
    return None


def _traced(plans) -> bool:
    """Whether a batch of ``plans`` is traced (its request continues its record's trace)."""
    return (
        request_context(
            batch.result
            for _topic, partitions in plans
            for batches in partitions.values()
            for batch in batches
        )
        is not None
    )


def _resolve(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
