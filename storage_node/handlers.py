"""What the StorageNode RPCs do, as plain async methods over domain values.

The servicer (``servicer.py``) only translates protobuf to these calls and back; nothing here sees
a gRPC context. Multi-partition calls return one result per partition, carrying either the
outcome or a :class:`~services.errors.TributaryError`, so one bad partition does not fail the rest.

Roles, leadership checks and acknowledgements are the replica manager's
(``storage_node/replication``): an append reaches a partition only where this node leads it, and
``acks=all`` answers once the high watermark has passed the records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.broker_address import BrokerAddress
from services.leader_and_isr import LeaderAndIsr
from services.offset_spec import EARLIEST, LATEST
from services.records import read_batch_header
from services.records.format import ATTRIBUTES_OFFSET, TRANSACTIONAL_MASK
from storage_node.log.files import partition_dir_name
from storage_node.log.group_commit import GroupCommit
from storage_node.log.partition_log import AppendInfo, PartitionLog
from storage_node.notifier import AppendNotifier
from storage_node.replication.manager import ReplicaManager, StateUpdateResult
from storage_node.replication.partition import Partition

log = logging.getLogger(__name__)


#: The byte of a batch's attributes (a big-endian int16) that holds the transactional bit.
_ATTRIBUTES_LOW_BYTE = ATTRIBUTES_OFFSET + 1


def _written(topic: str, partition: int, info: AppendInfo) -> AppendResult:
    """The result of an append that was written (``info``: the log's AppendInfo)."""
    return AppendResult(
        topic,
        partition,
        base_offset=info.first_offset,
        last_offset=info.last_offset,
        log_append_time=info.log_append_time,
        log_start_offset=info.log_start_offset,
        record_count=info.record_count,
    )


class TransactionVerifier(Protocol):
    """Who answers whether a producer's transaction is open on a partition (KIP-890)."""

    async def verify_transaction(
        self, producer_id: int, producer_epoch: int, topic: str, partition: int
    ) -> errors.TributaryError | None: ...


@dataclass(frozen=True, slots=True)
class CreationRequest:
    """What a CreatePartition asks of this node for one partition."""

    topic: str
    partition: int
    configs: Mapping[str, str]
    controller_epoch: int = 0
    leader_epoch: int = 0
    #: Only confirm the log is here (REPLICA_NOT_AVAILABLE when it is not).
    must_exist: bool = False


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A transaction coordinator's decision for one producer, to write on some partitions."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class OffsetResult:
    topic: str
    partition: int
    offset: int = -1
    timestamp: int = -1
    error: errors.TributaryError | None = None


class StorageNodeHandlers:
    """Domain operations of one storage node over its LogManager."""

    def __init__(
        self,
        logs,
        notifier: AppendNotifier,
        replicas: ReplicaManager,
        *,
        flush_before_ack: bool = False,
        standalone: bool = False,
        telemetry=None,
    ) -> None:
        self.logs = logs
        self.notifier = notifier
        self.replicas = replicas
        #: No controller: CreatePartition makes this node the sole leader of the partition.
        self.standalone = standalone
        self.flush_before_ack = flush_before_ack
        self.group_commit = GroupCommit()
        #: Asks the transaction coordinator about a transactional batch that would open a
        #: transaction here (``verify_transaction``; the controller channel); None = no check
        #: (standalone nodes have no coordinator to ask).
        self.transaction_verifier: TransactionVerifier | None = None
        #: Totals since start for DescribeLogDirs' traffic (plain ints: free on the hot path).
        self.bytes_in = 0
        self.records_in = 0
        self.append_requests = 0
        #: StorageNodeInstruments when telemetry is on, else None. Fixed at construction: with
        #: telemetry on, ``append`` is rebound to the observed variant, so with it off appends
        #: run exactly the uninstrumented code (not even an ``is None`` test).
        self.telemetry = telemetry
        if telemetry is not None:
            self.append = self._observed_append  # type: ignore[method-assign]  # on purpose, see above
            self.append_now = self._observed_append_now  # type: ignore[method-assign]

    async def _observed_append(
        self,
        topic: str,
        partition: int,
        data: bytes,
        *,
        acks: Acks,
        timeout_s: float,
        leader_epoch: int | None = None,
        written: Callable[[], None] | None = None,
    ) -> AppendResult:
        """``append`` inside a span, counted (telemetry on)."""
        telemetry = self.telemetry
        span = telemetry.start_append(topic, partition, len(data))
        try:
            result = await StorageNodeHandlers.append(
                self,
                topic,
                partition,
                data,
                acks=acks,
                timeout_s=timeout_s,
                leader_epoch=leader_epoch,
                written=written,
            )
        except BaseException:
            if span is not None:
                span.end()
            raise
        telemetry.end_append(span, topic, len(data), result)
        return result

    async def append(
        self,
        topic: str,
        partition: int,
        data: bytes,
        *,
        acks: Acks,
        timeout_s: float,
        leader_epoch: int | None = None,
        written: Callable[[], None] | None = None,
    ) -> AppendResult:
        """Validate and append one partition's batches where this node leads it.

        ``written`` is called once the batches are in the log, before any wait for the in-sync
        replicas or the disk (the data port uses it to keep one connection's appends of a
        partition in order); it is not called when the append fails or is refused.

        ``acks=all``: refused before writing when the ISR is below ``min.insync.replicas``;
        answered once the high watermark passes the records (or with the error that stopped
        it: REQUEST_TIMED_OUT after ``timeout_s``, NOT_ENOUGH_REPLICAS_AFTER_APPEND, a lost
        leadership). With ``flush_before_ack``, ``acks>=1`` also waits for the fsync.
        """
        acks_all = acks is Acks.ALL
        refused = await self._verify_transaction(topic, partition, data)
        if refused is not None:
            return AppendResult(topic, partition, error=refused)
        written_at = self._write(topic, partition, data, acks_all, leader_epoch, written)
        if isinstance(written_at, AppendResult):
            return written_at
        replica, info = written_at
        if acks_all:
            try:
                await replica.wait_committed(info.last_offset + 1, timeout_s)
            except errors.TributaryError as exc:
                return AppendResult(topic, partition, error=exc)
        if self.flush_before_ack and acks is not Acks.NONE:
            try:
                await self.group_commit.wait_durable(replica.log, info.last_offset)
            except (ValueError, OSError) as exc:  # truncated or deleted meanwhile; a failed fsync
                log.error("append to %s-%d is not durable: %s", topic, partition, exc)
                return AppendResult(
                    topic, partition, error=errors.KafkaStorageError(f"not made durable: {exc}")
                )
        return _written(topic, partition, info)

    def append_now(
        self,
        topic: str,
        partition: int,
        data,
        *,
        acks: Acks,
        leader_epoch: int | None = None,
        written: Callable[[], None] | None = None,
    ) -> AppendResult | None:
        """:meth:`append` without an event-loop turn, for an append that waits for nothing:
        acks 0 or 1 (without ``flush_before_ack``), and no transaction to verify first. Returns
        its result, or None (nothing done) when it would wait: then call :meth:`append`.

        The data port serves an acks 0/1 request's partitions one after another with it: the
        coroutines of ``append`` (three a partition) were a tenth of a leader's time for frames
        of hundreds of small batches. Same checks, same write, same result.
        """
        if self._must_wait(data, acks):
            return None
        return self._append_written(topic, partition, data, leader_epoch, written)

    def _must_wait(self, data, acks: Acks) -> bool:
        """Whether an append of ``data`` with ``acks`` waits for something (see append_now)."""
        if acks is Acks.ALL or (self.flush_before_ack and acks is not Acks.NONE):
            return True
        # The first batch's transactional bit (attributes, big-endian int16 at byte 21): what
        # _verify_transaction reads to decide whether to ask the coordinator.
        return self.transaction_verifier is not None and (
            len(data) <= _ATTRIBUTES_LOW_BYTE or bool(data[_ATTRIBUTES_LOW_BYTE] & TRANSACTIONAL_MASK)
        )

    def _append_written(
        self, topic: str, partition: int, data, leader_epoch: int | None, written: Callable[[], None] | None
    ) -> AppendResult:
        written_at = self._write(topic, partition, data, False, leader_epoch, written)
        if isinstance(written_at, AppendResult):
            return written_at
        return _written(topic, partition, written_at[1])

    def _observed_append_now(
        self,
        topic: str,
        partition: int,
        data,
        *,
        acks: Acks,
        leader_epoch: int | None = None,
        written: Callable[[], None] | None = None,
    ) -> AppendResult | None:
        """``append_now`` inside a span, counted (telemetry on), as ``_observed_append``."""
        if self._must_wait(data, acks):
            return None
        telemetry = self.telemetry
        span = telemetry.start_append(topic, partition, len(data))
        try:
            result = self._append_written(topic, partition, data, leader_epoch, written)
        except BaseException:
            if span is not None:
                span.end()
            raise
        telemetry.end_append(span, topic, len(data), result)
        return result

    def _write(
        self,
        topic: str,
        partition: int,
        data,
        acks_all: bool,
        leader_epoch: int | None,
        written: Callable[[], None] | None,
    ) -> tuple[Partition, AppendInfo] | AppendResult:
        """The leader's checks and the write: (replica, AppendInfo), or the AppendResult of the
        error that refused it (nothing written)."""
        try:
            replica, info = self.replicas.append(
                topic, partition, data, acks_all=acks_all, leader_epoch=leader_epoch
            )
        except errors.TributaryError as exc:
            return AppendResult(topic, partition, error=exc)
        except OSError as exc:
            log.error("append to %s-%d failed: %s", topic, partition, exc)
            return AppendResult(topic, partition, error=errors.KafkaStorageError(str(exc)))
        if written is not None:
            written()
        self.notifier.notify((topic, partition))
        if not info.duplicate:
            self.bytes_in += len(data)
            self.records_in += info.record_count
        self.append_requests += 1
        return replica, info

    async def _verify_transaction(
        self, topic: str, partition: int, data: bytes
    ) -> errors.TributaryError | None:
        """A transactional batch that would open a transaction on this partition is checked with
        the transaction coordinator first (KIP-890): written without AddPartitionsToTxn, it would
        open a transaction no one ends and hold the last stable offset back for good."""
        verifier = self.transaction_verifier
        if verifier is None:
            return None
        try:
            header = read_batch_header(data)
        except errors.TributaryError:
            return None  # not a batch: validation refuses it with the precise reason
        if not header.attributes & TRANSACTIONAL_MASK or header.producer_id < 0:
            return None
        try:
            replica = self.replicas.get(topic, partition)
            replica.ensure_leader()
        except errors.TributaryError as exc:
            return exc
        if replica.log.transaction_open(header.producer_id, header.producer_epoch):
            return None
        return await verifier.verify_transaction(header.producer_id, header.producer_epoch, topic, partition)

    def list_offset(
        self, topic: str, partition: int, *, timestamp: int, read_committed: bool = False
    ) -> OffsetResult:
        """``timestamp`` -2 = earliest, -1 = latest (the high watermark; with ``read_committed``
        the last stable offset), else the first offset with ts >= timestamp below that end.
        Only the leader answers."""
        try:
            replica = self.replicas.get(topic, partition)
            replica.ensure_leader()
            partition_log = replica.log
            end = partition_log.last_stable_offset if read_committed else partition_log.high_watermark
            if timestamp == EARLIEST:
                return OffsetResult(topic, partition, offset=partition_log.log_start_offset)
            if timestamp == LATEST:
                return OffsetResult(topic, partition, offset=end)
            found = partition_log.offset_for_timestamp(timestamp)
        except errors.TributaryError as exc:
            return OffsetResult(topic, partition, error=exc)
        if found is None or found[0] >= end:
            return OffsetResult(topic, partition)
        offset, ts = found
        return OffsetResult(topic, partition, offset=offset, timestamp=ts)

    async def create_partition(
        self,
        topic: str,
        partition: int,
        configs: dict[str, str],
        *,
        controller_epoch: int = 0,
        leader_epoch: int = 0,
        must_exist: bool = False,
    ):
        """Create the partition's log (idempotent; configs applied), or with ``must_exist`` only
        confirm it is here (REPLICA_NOT_AVAILABLE when it was lost). A standalone node leads
        what it creates; with a controller the role comes from UpdateLeaderAndIsr."""
        new = self._check_creation(
            CreationRequest(topic, partition, configs, controller_epoch, leader_epoch, must_exist)
        )
        if new:
            # A new log's directory and files are made durable with fsyncs (milliseconds): in a
            # worker thread, so a create of thousands of partitions does not stall the appends
            # and fetches this node serves meanwhile.
            partition_log = await asyncio.to_thread(self.logs.create_partition, topic, partition, configs)
        else:
            partition_log = self.logs.create_partition(topic, partition, configs)  # applies configs
        if self.standalone:
            self.replicas.become_sole_leader(topic, partition, leader_epoch)
        return partition_log

    async def create_partitions(
        self, creations: Sequence[CreationRequest]
    ) -> list[PartitionLog | errors.TributaryError]:
        """:meth:`create_partition` of each, each its own outcome (the log or the error), in
        order. The new logs are made in one worker-thread batch, their directories made durable
        with one fsync per log dir."""
        outcomes: list[PartitionLog | errors.TributaryError | None] = [None] * len(creations)
        new: list[int] = []
        checked: dict[tuple, errors.TributaryError | None] = {}
        for index, creation in enumerate(creations):
            try:
                if self._check_creation(creation, checked):
                    new.append(index)
                else:  # applies configs
                    outcomes[index] = self.logs.create_partition(
                        creation.topic, creation.partition, creation.configs
                    )
            except errors.TributaryError as exc:
                outcomes[index] = exc
        if new:
            items = [(creations[i].topic, creations[i].partition, creations[i].configs) for i in new]
            made = await asyncio.to_thread(self.logs.create_partitions, items)
            for index, outcome in zip(new, made, strict=True):
                outcomes[index] = outcome
        if self.standalone:
            for creation, outcome in zip(creations, outcomes, strict=True):
                if not isinstance(outcome, errors.TributaryError):
                    self.replicas.become_sole_leader(
                        creation.topic, creation.partition, creation.leader_epoch
                    )
        return outcomes  # type: ignore[return-value]  # every slot filled above

    def _check_creation(
        self, creation: CreationRequest, checked: dict[tuple, errors.TributaryError | None] | None = None
    ) -> bool:
        """Raise what refuses ``creation`` (a stale controller, bad configs, a name the disk
        cannot hold, a lost log it must already hold); True when the log is new here.
        ``checked`` remembers configs already validated (a batch's are mostly one topic's)."""
        from services.topic_config import validate_topic_configs

        self.replicas.ensure_controller_epoch(creation.controller_epoch)
        key = tuple(sorted(creation.configs.items()))
        if checked is None or key not in checked:
            try:
                validate_topic_configs(dict(creation.configs))
                error = None
            except errors.TributaryError as exc:
                error = exc
            if checked is not None:
                checked[key] = error
        else:
            error = checked[key]
        if error is not None:
            raise error
        topic, partition = creation.topic, creation.partition
        try:
            partition_dir_name(topic, partition)  # a name the disk can hold, before anything else
        except ValueError as exc:
            raise errors.InvalidTopicError(str(exc)) from None
        try:
            self.logs.get(topic, partition)
            return False
        except errors.UnknownTopicOrPartitionError:
            if creation.must_exist:
                raise errors.ReplicaNotAvailableError(
                    f"{topic}-{partition} is not on node {self.replicas.node_id}: its log was lost"
                ) from None
            return True

    def delete_partition(self, topic: str, partition: int, *, controller_epoch: int = 0) -> None:
        """Delete the partition's log (idempotent). Refused while this node is an active replica
        (POLICY_VIOLATION): the controller stops a replica before deleting it."""
        self.replicas.stop_replica(controller_epoch, topic, partition)
        try:
            self.logs.delete_partition(topic, partition)
        except errors.UnknownTopicOrPartitionError:
            pass  # idempotent: the coordinator retries deletes
        self.replicas.forget(topic, partition)

    def update_leader_and_isr(
        self,
        controller_epoch: int,
        states: Iterable[LeaderAndIsr],
        leaders: Mapping[int, BrokerAddress],
        topic_configs: Mapping[str, Mapping[str, str]],
    ) -> list[StateUpdateResult]:
        return self.replicas.update_leader_and_isr(controller_epoch, states, leaders, topic_configs)

    async def write_txn_markers(
        self, markers: Iterable[TxnMarker], *, timeout_s: float
    ) -> list[tuple[int, str, int, errors.TributaryError | None]]:
        """End transactions on partitions this node leads: each marker is appended and answered
        once committed (the high watermark passed it), as Kafka writes markers with acks=all.
        One ``(producer id, topic, partition, error or None)`` per marker partition."""

        async def one(marker: TxnMarker, topic: str, partition: int):
            try:
                replica = self.replicas.get(topic, partition)
                offset = replica.append_marker(
                    producer_id=marker.producer_id,
                    producer_epoch=marker.producer_epoch,
                    commit=marker.commit,
                    coordinator_epoch=marker.coordinator_epoch,
                )
                self.notifier.notify((topic, partition))
                await replica.wait_committed(offset + 1, timeout_s)
            except errors.TributaryError as exc:
                return marker.producer_id, topic, partition, exc
            return marker.producer_id, topic, partition, None

        return list(
            await asyncio.gather(
                *(one(m, topic, partition) for m in markers for topic, partition in m.partitions)
            )
        )

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        """Move the log start (Kafka's DeleteRecords) on the leader; followers follow it."""
        replica = self.replicas.get(topic, partition)
        replica.ensure_leader()
        partition_log = replica.log
        if before_offset == -1:
            before_offset = partition_log.high_watermark
        partition_log.delete_records_before(before_offset)
        return partition_log.log_start_offset
