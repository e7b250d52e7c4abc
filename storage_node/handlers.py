"""What the StorageNode RPCs do, as plain async methods over domain values.

The servicer (``servicer.py``) only translates protobuf to these calls and back; nothing here sees
a gRPC context. Multi-partition calls return one result per partition, carrying either the
outcome or a :class:`~services.errors.TributaryError`, so one bad partition does not fail the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services import errors
from storage_node.log.files import partition_dir_name
from storage_node.log.group_commit import GroupCommit
from storage_node.notifier import AppendNotifier

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class AppendResult:
    topic: str
    partition: int
    error: errors.TributaryError | None = None
    base_offset: int = -1
    last_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    record_count: int = 0


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
        self, logs, notifier: AppendNotifier, *, flush_before_ack: bool = False, telemetry=None
    ) -> None:
        self.logs = logs
        self.notifier = notifier
        self.flush_before_ack = flush_before_ack
        self.group_commit = GroupCommit()
        #: Totals since start for DescribeLogDirs' traffic (plain ints: free on the hot path).
        self.bytes_in = 0
        self.records_in = 0
        self.append_requests = 0
        #: StorageNodeInstruments when telemetry is on, else None. Fixed at construction: with
        #: telemetry on, ``append`` is rebound to the observed variant, so with it off appends
        #: run exactly the uninstrumented code (not even an ``is None`` test).
        self.telemetry = telemetry
        if telemetry is not None:
            self.append = self._observed_append

    async def _observed_append(
        self, topic: str, partition: int, data: bytes, *, acks_none: bool
    ) -> AppendResult:
        """``append`` inside a span, counted (telemetry on)."""
        telemetry = self.telemetry
        span = telemetry.start_append(topic, partition, len(data))
        try:
            result = await StorageNodeHandlers.append(self, topic, partition, data, acks_none=acks_none)
        except BaseException:
            if span is not None:
                span.end()
            raise
        telemetry.end_append(span, topic, len(data), result)
        return result

    async def append(self, topic: str, partition: int, data: bytes, *, acks_none: bool) -> AppendResult:
        """Validate and append one partition's batches; wait for fsync when configured."""
        try:
            partition_log = self.logs.get(topic, partition)
            info = partition_log.append(data)
            partition_log.maybe_increment_high_watermark(info.last_offset + 1)
        except errors.TributaryError as exc:
            return AppendResult(topic, partition, error=exc)
        except OSError as exc:
            log.error("append to %s-%d failed: %s", topic, partition, exc)
            return AppendResult(topic, partition, error=errors.KafkaStorageError(str(exc)))
        self.notifier.notify((topic, partition))
        self.bytes_in += len(data)
        self.records_in += info.record_count
        self.append_requests += 1
        if self.flush_before_ack and not acks_none:
            try:
                await self.group_commit.wait_durable(partition_log, info.last_offset)
            except (ValueError, OSError) as exc:  # truncated or deleted meanwhile; a failed fsync
                log.error("append to %s-%d is not durable: %s", topic, partition, exc)
                return AppendResult(
                    topic, partition, error=errors.KafkaStorageError(f"not made durable: {exc}")
                )
        return AppendResult(
            topic,
            partition,
            base_offset=info.first_offset,
            last_offset=info.last_offset,
            log_append_time=info.log_append_time,
            log_start_offset=info.log_start_offset,
            record_count=info.record_count,
        )

    def list_offset(self, topic: str, partition: int, *, timestamp: int) -> OffsetResult:
        """``timestamp`` -2 = earliest, -1 = latest, else the first offset with ts >= timestamp."""
        try:
            partition_log = self.logs.get(topic, partition)
            if timestamp == EARLIEST:
                return OffsetResult(topic, partition, offset=partition_log.log_start_offset)
            if timestamp == LATEST:
                return OffsetResult(topic, partition, offset=partition_log.high_watermark)
            found = partition_log.offset_for_timestamp(timestamp)
        except errors.TributaryError as exc:
            return OffsetResult(topic, partition, error=exc)
        if found is None:
            return OffsetResult(topic, partition)
        offset, ts = found
        return OffsetResult(topic, partition, offset=offset, timestamp=ts)

    def create_partition(self, topic: str, partition: int, configs: dict[str, str]):
        from services.topic_config import validate_topic_configs

        validate_topic_configs(configs)
        try:
            partition_dir_name(topic, partition)  # a name the disk can hold, before anything else
        except ValueError as exc:
            raise errors.InvalidTopicError(str(exc)) from None
        return self.logs.create_partition(topic, partition, configs)

    def delete_partition(self, topic: str, partition: int) -> None:
        try:
            self.logs.delete_partition(topic, partition)
        except errors.UnknownTopicOrPartitionError:
            pass  # idempotent: the coordinator retries deletes

    def delete_records(self, topic: str, partition: int, before_offset: int) -> int:
        partition_log = self.logs.get(topic, partition)
        if before_offset == -1:
            before_offset = partition_log.high_watermark
        partition_log.delete_records_before(before_offset)
        return partition_log.log_start_offset
