"""The producer's identity for exactly-once (Kafka's ``TransactionManager``): its producer id and
epoch, the sequence numbers of its batches, and (with a ``transactional_id``) its transactions.

**Idempotence** (on by default, as in Kafka since 3.0). The producer gets a producer id and epoch
from the cluster (``InitProducerId``) before its first batch goes out. Each batch is numbered when
it is first sent (:meth:`TransactionManager.number`): its base sequence is the partition's next
sequence, which then advances by the batch's record count. A retried batch keeps its number, so
the partition leader recognises a retry of a batch it already wrote and answers it with the
offsets it got the first time: retries never duplicate. Batches are numbered in the order they are
drained, so up to ``max_in_flight`` (<= 5) requests of a partition can be in flight at once on a
transport that keeps request order (the sender's pipelining, Kafka's
``max.in.flight.requests.per.connection`` with idempotence): the leader appends a batch only if
it follows the last one it appended (else OUT_OF_ORDER_SEQUENCE_NUMBER), so order holds whatever
fails, and it remembers the last 5 runs of batches of a producer, enough to recognise the retry
of any of 5 requests in flight (``storage_node/log/producer_state.py``).

The manager keeps, per partition, the batches numbered in the current epoch and not yet settled
(acknowledged, or failed for good), in sequence order (Kafka's ``inflightBatchesBySequence``):
:meth:`is_next_sequence` tells whether a batch is the first of them -- every batch before it is
settled.

If a leader answers UNKNOWN_PRODUCER_ID or OUT_OF_ORDER_SEQUENCE_NUMBER for the *next* batch of a
partition (the partition lost this producer's state: expired, or removed with old segments), an
idempotent producer bumps its epoch with the cluster (KIP-360) and numbers its unacknowledged
batches again from 0 in the new epoch (:meth:`reset_after_lost_state`); those batches are then
retried. For a batch behind an unsettled one the same answers only mean that its predecessor is
missing (it failed, or is still on its way): a plain retry (KIP-360's in-order retry; the sender
decides, see ``Sender.fail_or_retry``).

**Transactions** (a ``transactional_id``; Kafka's KIP-98 client flow):

* ``init_transactions`` gets the id's producer id and a new epoch -- fencing any older instance
  with the same transactional id (its requests then fail with PRODUCER_FENCED) and aborting a
  transaction it left open;
* ``begin_transaction`` opens one locally; before the first batch to a partition goes out, the
  partition is added to the transaction (``AddPartitionsToTxn``, in the sender);
* ``send_offsets_to_transaction`` adds the consumer group and stages its offsets
  (``AddOffsetsToTxn`` + ``TxnOffsetCommit``): they become the group's committed offsets only if
  the transaction commits;
* ``commit_transaction`` sends everything queued and, once every batch is acknowledged, ends the
  transaction with ``EndTxn(commit)``; a batch that failed makes the commit fail (the transaction
  must then be aborted); ``abort_transaction`` fails what is not sent yet, waits for what is in
  flight and ends with ``EndTxn(abort)``. A fenced producer is done for good.

Not thread-safe: the producer's I/O loop only.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.client.errors import IllegalStateError, TributaryError
from services import errors
from services.proto import pb
from services.serde import error_from_proto
from services.topic_partition import TopicPartition

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
#: Sequences wrap from 2**31 - 1 to 0, as Kafka's.
_SEQUENCE_LIMIT = 2**31


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    #: A batch of the transaction failed: only abort_transaction may follow.
    ABORTABLE_ERROR = "abortable error"
    #: Fenced by a newer instance (or another fatal error): nothing may follow.
    FATAL = "fatal"


class TransactionManager:
    """Producer id, epoch, sequences and transactions of one producer. See the module docstring."""

    def __init__(
        self, client, *, transactional_id: str | None = None, transaction_timeout_ms: int = 60_000
    ) -> None:
        self._client = client
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = -1
        self.state = TxnState.UNINITIALIZED
        #: Per partition, the producer id and epoch its batches are numbered in (``number``).
        self._partition_epochs: dict[TopicPartition, tuple[int, int]] = {}
        self._next_sequence: dict[TopicPartition, int] = {}
        #: Per partition, the batches numbered in its epoch and not yet settled, in sequence
        #: order (they are numbered in the order they are sent).
        self._unsettled: dict[TopicPartition, deque] = {}
        #: Per partition, batches of ``_unsettled`` settled while one before them was not: taken
        #: off its front once they reach it (``settled``).
        self._settled_early: dict[TopicPartition, set] = {}
        #: Partitions whose leader lost this producer's state (``lost_state``).
        self._lost: set[TopicPartition] = set()
        self._init_lock = asyncio.Lock()
        #: Partitions added to the open transaction (AddPartitionsToTxn answered).
        self._partitions: set[TopicPartition] = set()
        #: Whether the coordinator knows of the open transaction (a partition or group was added);
        #: if not, commit and abort end it here, with no EndTxn (as Kafka's client).
        self._started = False
        self._failure: BaseException | None = None
        #: A numbered batch of the open transaction was aborted unsent or failed (``dropped``):
        #: the leader may or may not have its sequence, so the abort bumps the epoch (``end``).
        self._sequence_unknown = False

    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    # ---- producer id and epoch ---------------------------------------------------------------

    async def ensure_producer_id(self) -> None:
        """Get a producer id and epoch from the cluster unless this producer has one; waits out an
        epoch bump in progress, so no batch goes out numbered in the epoch being replaced."""
        if self.transactional:
            self.ensure_state(TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.ABORTING)
            return
        if self.has_producer_id and not self._init_lock.locked():
            return
        async with self._init_lock:
            if not self.has_producer_id:
                await self._init_producer_id(NO_PRODUCER_ID, -1)

    async def _init_producer_id(
        self, producer_id: int, producer_epoch: int, *, keep_partitions: bool = False
    ) -> None:
        """Get a producer id and epoch (a new epoch when ``producer_epoch`` is ours). Every
        partition starts afresh unless ``keep_partitions`` (a bump for one partition's lost
        state: the others keep numbering in their epoch until it is settled, see ``number``)."""
        request = pb.InitProducerIdRequest(
            transactional_id=self.transactional_id or "",
            transaction_timeout_ms=self.transaction_timeout_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
        response = await self._client.call_with_retry("InitProducerId", request)
        self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
        if not keep_partitions:
            self._partition_epochs.clear()
            self._next_sequence.clear()
            self._unsettled.clear()
            self._settled_early.clear()
            self._lost.clear()
        log.info("producer id %d, epoch %d", self.producer_id, self.producer_epoch)

    def number(self, batch) -> None:
        """Give a batch about to be sent its producer id, epoch and base sequence -- once: a retry
        keeps its number (its first attempt may have been written; the leader recognises it).

        The number is the partition's: a partition keeps the id and epoch it numbers in until
        nothing numbered in them is unsettled, and only then moves to the producer's current
        ones, from sequence 0 (KIP-360; Kafka's producer keeps an epoch per partition too). An
        epoch bump for one partition's lost state so never renumbers another partition's batch,
        which its leader may have written with its answer lost: written again under a new
        number, it would be a duplicate. The partition that lost the state starts afresh in the
        next epoch (:meth:`lost_state`)."""
        if batch.prebuilt:
            return
        tp = batch.topic_partition
        current = (self.producer_id, self.producer_epoch)
        numbered_in = self._partition_epochs.get(tp)
        if numbered_in is not None and numbered_in != current and tp in self._lost:
            self._forget(tp)  # its leader has nothing of the old epoch: afresh in this one
            numbered_in = None
        if (
            numbered_in is not None
            and batch.base_sequence >= 0
            and (batch.producer_id, batch.producer_epoch) == numbered_in
        ):
            return  # a retry
        if numbered_in is None or (numbered_in != current and not self._unsettled.get(tp)):
            numbered_in = self._partition_epochs[tp] = current
            self._next_sequence[tp] = 0
        sequence = self._next_sequence.get(tp, 0)
        batch.set_producer_state(numbered_in[0], numbered_in[1], sequence, transactional=self.transactional)
        self._next_sequence[tp] = (sequence + batch.record_count) % _SEQUENCE_LIMIT
        unsettled = self._unsettled.get(tp)
        if unsettled is None:
            unsettled = self._unsettled[tp] = deque()
        unsettled.append(batch)

    def lost_state(self, tp: TopicPartition) -> bool:
        """``tp``'s leader refused the partition's next batch for a lost producer state
        (UNKNOWN_PRODUCER_ID, or OUT_OF_ORDER_SEQUENCE_NUMBER where nothing was missing): its
        batches are numbered afresh, from 0, in an epoch newer than the one they have. True when
        that needs an epoch bump (the partition numbers in the current epoch); False when the
        producer has moved on already (the partition kept an older one)."""
        self._lost.add(tp)
        return self._partition_epochs.get(tp) == (self.producer_id, self.producer_epoch)

    def _forget(self, tp: TopicPartition) -> None:
        self._partition_epochs.pop(tp, None)
        self._next_sequence.pop(tp, None)
        self._unsettled.pop(tp, None)
        self._settled_early.pop(tp, None)
        self._lost.discard(tp)

    def is_current(self, batch) -> bool:
        """Whether ``batch`` is numbered in this producer's current id and epoch."""
        return batch.producer_epoch == self.producer_epoch and batch.producer_id == self.producer_id

    def is_next_sequence(self, batch) -> bool:
        """Whether ``batch`` is the next its partition's leader expects of this producer: numbered
        in the current epoch, and every batch numbered before it there is settled (Kafka's
        ``isNextSequence``). Only then does OUT_OF_ORDER_SEQUENCE_NUMBER (or UNKNOWN_PRODUCER_ID)
        say that the partition lost this producer's state.

        Numbered in the partition's epoch, which may be older than the producer's (``number``)."""
        tp = batch.topic_partition
        unsettled = self._unsettled.get(tp)
        if not unsettled or unsettled[0] is not batch:
            return False
        return (batch.producer_id, batch.producer_epoch) == self._partition_epochs.get(tp)

    def settled(self, batch) -> None:
        """``batch`` was acknowledged or failed for good: the batches behind it move up."""
        tp = batch.topic_partition
        unsettled = self._unsettled.get(tp)
        if not unsettled:
            return
        if unsettled[0] is batch:  # the common case: settled in sequence order
            unsettled.popleft()
            early = self._settled_early.get(tp)
            if early:
                while unsettled and unsettled[0] in early:
                    early.discard(unsettled.popleft())
                if not early:
                    del self._settled_early[tp]
            return
        if (
            batch.base_sequence >= 0
            and not batch.prebuilt
            and (batch.producer_id, batch.producer_epoch) == self._partition_epochs.get(tp)
        ):
            # Behind an unsettled one (acknowledged while an earlier batch is retried): marked,
            # and taken off when it reaches the front -- not a walk of the deque per batch
            # (quadratic: 2.3 s for the 15,000 batches of a 1 MiB request of one-record batches).
            self._settled_early.setdefault(tp, set()).add(batch)
        # (else numbered in an epoch replaced since, or never numbered: prebuilt)

    def dropped(self, batch) -> None:
        """``batch`` failed for good without being written as far as we know (a transaction's
        abort took it from the queue): if it was numbered, its partition's next sequence is
        unknown -- the next transaction's first batch there would be refused as out of order
        -- so the abort bumps the epoch (:meth:`end`)."""
        if self.transactional and batch.base_sequence >= 0 and not batch.prebuilt:
            self._sequence_unknown = True

    def follows_unsettled(self, batch) -> bool:
        """Whether a batch of ``batch``'s partition made before it is not settled yet (its answer
        was lost, so it is being retried, while ``batch``, behind it, was acknowledged)."""
        unsettled = self._unsettled.get(batch.topic_partition)
        return unsettled is not None and bool(unsettled) and unsettled[0].order < batch.order

    def partition_ready(self, tp: TopicPartition) -> bool:
        """Whether a batch for ``tp`` can be numbered now, without awaiting anything: the
        producer has its id, no epoch bump is running and (transactional) ``tp`` is in the open
        transaction. The sender pipelines a partition's requests only then: a request numbered
        later, after an await, could get a lower sequence than one drained after it."""
        if not self.has_producer_id or self._init_lock.locked():
            return False
        if self.transactional:
            return self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING) and tp in self._partitions
        return True

    async def reset_after_lost_state(self, error: TributaryError) -> None:
        """A partition lost this producer's state: bump the epoch (KIP-360); batches not yet
        acknowledged are numbered again in the new epoch when they are sent next. In a
        transaction this cannot be done safely: the transaction must be aborted."""
        if self.transactional:
            self.fail_transaction(error)
            return
        async with self._init_lock:
            log.warning(
                "producer %d epoch %d: %s; bumping the epoch and renumbering unacknowledged batches",
                self.producer_id,
                self.producer_epoch,
                error,
            )
            await self._init_producer_id(self.producer_id, self.producer_epoch, keep_partitions=True)

    # ---- transactions ------------------------------------------------------------------------

    def ensure_state(self, *allowed: TxnState) -> None:
        if self.state in allowed:
            return
        # Chained to the failure, so an application can tell a fenced producer (close it) from
        # a failed transaction (abort it) by the error, not by parsing the message.
        if self.state is TxnState.FATAL:
            if isinstance(self._failure, errors.ProducerFencedError | errors.InvalidProducerEpochError):
                # Kafka's producer throws ProducerFencedException here: close, do not abort.
                raise errors.ProducerFencedError(
                    f"a newer instance with transactional id {self.transactional_id!r} took over "
                    f"({self._failure}); close this producer"
                ) from self._failure
            raise IllegalStateError(
                f"the producer cannot go on after a fatal error: {self._failure}"
            ) from self._failure
        if self.state is TxnState.ABORTABLE_ERROR:
            raise IllegalStateError(
                f"the transaction failed ({self._failure}); abort_transaction() must be called"
            ) from self._failure
        wanted = " or ".join(s.value for s in allowed)
        raise IllegalStateError(f"the producer is {self.state.value}; this needs it {wanted}")

    async def init_transactions(self) -> None:
        """Get the transactional id's producer id and a new epoch (fencing older instances)."""
        if not self.transactional:
            raise IllegalStateError("init_transactions needs a transactional_id")
        self.ensure_state(TxnState.UNINITIALIZED)
        async with self._init_lock:
            await self._call_checked(self._init_producer_id, self.producer_id, self.producer_epoch)
        self.state = TxnState.READY

    def begin(self) -> None:
        self.ensure_state(TxnState.READY)
        self._partitions.clear()
        self._started = False
        self._failure = None
        self.state = TxnState.IN_TRANSACTION

    async def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Add partitions to the open transaction before their first batch goes out."""
        new = sorted(set(partitions) - self._partitions)
        if not new:
            return
        request = pb.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            partitions=[pb.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in new],
        )
        response = await self._call_checked(self._call_until_settled, "AddPartitionsToTxn", request)
        failed = [
            (r.topic, r.partition, error_from_proto(r.error)) for r in response.results if r.HasField("error")
        ]
        if failed:
            topic, partition, error = failed[0]
            error = error or errors.UnknownServerError(f"{topic}-{partition}: no reason given")
            self.fail_transaction(error)
            raise error
        self._partitions.update(new)
        self._started = True

    async def send_offsets(
        self,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        group_id: str,
        generation_id: int,
        member_id: str,
    ) -> None:
        """Stage consumed offsets in the transaction (committed with it, or not at all)."""
        self.ensure_state(TxnState.IN_TRANSACTION)
        common: dict[str, Any] = {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }
        await self._call_checked(
            self._call_until_settled,
            "AddOffsetsToTxn",
            pb.AddOffsetsToTxnRequest(group_id=group_id, **common),
        )
        self._started = True
        request = pb.TxnOffsetCommitRequest(
            group_id=group_id,
            generation_id=generation_id,
            member_id=member_id,
            offsets=[
                pb.TxnOffset(topic=tp.topic, partition=tp.partition, offset=offset, metadata=metadata)
                for tp, (offset, metadata) in offsets.items()
            ],
            **common,
        )
        response = await self._call_checked(self._call_until_settled, "TxnOffsetCommit", request)
        for result in response.results:
            if result.HasField("error"):
                error = error_from_proto(result.error) or errors.UnknownServerError("no reason given")
                self.fail_transaction(error)
                raise error

    async def end(self, commit: bool) -> None:
        """EndTxn once every batch of the transaction has settled."""
        request = pb.EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            commit=commit,
        )
        if self._started:
            await self._call_checked(self._call_until_settled, "EndTxn", request)
        self._partitions.clear()
        self._started = False
        if not commit and (self._failure is not None or self._sequence_unknown):
            # A batch of the aborted transaction failed, or was aborted after it was numbered (a
            # retry waiting in the queue): the leader may or may not have written it, so its
            # partition's sequence is unknown. A new epoch starts every partition's sequence
            # again at 0 (KIP-360's bump after an abortable error).
            async with self._init_lock:
                await self._call_checked(self._init_producer_id, self.producer_id, self.producer_epoch)
            self._sequence_unknown = False
        self._failure = None
        self.state = TxnState.READY

    def fail_transaction(self, error: BaseException) -> None:
        """A batch or call of the open transaction failed: only an abort may follow (or nothing,
        when the producer was fenced)."""
        fenced = isinstance(error, errors.ProducerFencedError | errors.InvalidProducerEpochError)
        if self.state is TxnState.FATAL:
            return
        self._failure = error
        if fenced:
            self.state = TxnState.FATAL
        elif self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
            self.state = TxnState.ABORTABLE_ERROR

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    async def _call_until_settled(self, method: str, request):
        """A coordinator call, retried while the previous transaction is still being completed
        (CONCURRENT_TRANSACTIONS) and on other retriable errors."""
        return await self._client.call_with_retry(
            method, request, max_wait_ms=max(self._client.request_timeout_ms, self.transaction_timeout_ms)
        )

    async def _call_checked(self, call, *args):
        try:
            return await call(*args)
        except (errors.ProducerFencedError, errors.InvalidProducerEpochError) as exc:
            self._failure = exc
            self.state = TxnState.FATAL
            raise
