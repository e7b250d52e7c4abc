"""Pure produce planning: validate a request, choose each record's partition, build the batches.

Nothing here does I/O. The produce handler (``gateway/server/produce.py``) plans with these functions,
then sends each partition's bytes to its leader.

Partition choice is Kafka's default partitioner, in order: the record's explicit partition; else
``murmur2(key) % partition_count`` for a non-null key; else the gateway's sticky partition for
null keys, which moves on after every request (one request = one batch per partition).

Each partition gets one or more RecordBatch v2 batches, in request order, split so that no batch
outgrows the byte limit (the gateway's ``max_batch_bytes``, lowered to the topic's
``max.message.bytes`` when that is set on the topic). A single record larger than the limit still
gets a batch of its own, and the storage node answers it with RECORD_TOO_LARGE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from services import errors
from services.acks import Acks
from services.partitioner import StickyPartitioner, partition_for_key
from services.records import Compression, RecordBatchBuilder

Headers = tuple[tuple[str, "bytes | None"], ...]


class RecordIn(NamedTuple):
    """A typed record to produce; None = unset (null key / null value / gateway's clock / chosen)."""

    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int | None = None
    partition: int | None = None


class ProduceCommand(NamedTuple):
    """A produce request: typed ``records`` or pre-encoded ``batches`` (partition, bytes), not both.

    Immutable, and a tuple rather than a frozen dataclass: one is built per request, and a
    frozen dataclass's ``__init__`` (a ``object.__setattr__`` per field) cost the gateway a
    tenth of its time per one-record request."""

    topic: str
    records: Sequence[RecordIn] = ()
    #: The request's bytes per partition, views into its frame (never copied on the way to
    #: the storage node) or bytes.
    batches: Sequence[tuple[int, bytes | memoryview]] = ()
    acks: Acks = Acks.ALL
    #: 0 = the gateway's default.
    timeout_ms: int = 0
    compression: Compression = Compression.NONE
    correlation_id: int = 0
    #: The request's encoded size (0: not known); large typed requests are built off the loop.
    request_bytes: int = 0


class PartitionPayload(NamedTuple):
    """What one partition receives: concatenated batches and, for typed records, their indexes
    (a tuple: one is built per partition of every request)."""

    partition: int
    data: bytes | memoryview
    #: Request indexes of the records, in offset order (empty for pre-encoded batches).
    record_indexes: Sequence[int] = ()


def ensure_valid_command(command: ProduceCommand) -> None:
    """Raise the Kafka-named INVALID_ARGUMENT errors for requests that cannot be served at all."""
    if not command.topic:
        raise errors.InvalidTopicError("produce request has an empty topic name")
    records = command.records
    batches = command.batches
    if records and batches:
        raise errors.InvalidRequestError("set either records or batches in a produce request, not both")
    if command.timeout_ms < 0:
        raise errors.InvalidRequestError(f"timeout_ms {command.timeout_ms} is negative")
    if records:
        for index, record in enumerate(records):
            if record.partition is not None and record.partition < 0:
                raise errors.InvalidRequestError(f"record {index} has negative partition {record.partition}")
        return
    if len(batches) == 1:  # the usual pre-encoded request: nothing can repeat
        partition = batches[0][0]
        if partition < 0:
            raise errors.InvalidRequestError(f"batches for negative partition {partition}")
        return
    seen: set[int] = set()
    for partition, _ in batches:
        if partition < 0:
            raise errors.InvalidRequestError(f"batches for negative partition {partition}")
        if partition in seen:
            raise errors.InvalidRequestError(
                f"partition {partition} appears twice in batches; concatenate them"
            )
        seen.add(partition)


def assign_partitions(
    topic: str, records: Sequence[RecordIn], partition_count: int, sticky: StickyPartitioner
) -> list[int]:
    """Each record's partition, in request order (explicit ones are returned unchecked)."""
    sticky_partition = -1
    assignment = []
    for record in records:
        if record.partition is not None:
            partition = record.partition
        elif record.key is not None:
            partition = partition_for_key(record.key, partition_count)
        else:
            if sticky_partition < 0:
                sticky_partition = sticky.partition(topic, partition_count)
            partition = sticky_partition
        assignment.append(partition)
    if sticky_partition >= 0:
        sticky.on_new_batch(topic, partition_count, sticky_partition)
    return assignment


def estimate_record_size(record: RecordIn) -> int:
    """An upper bound on the record's encoded size (varints at their longest)."""
    size = 21 + 5 + 10 + 5  # length, attributes, timestampDelta, offsetDelta, key/value lengths, count
    size += len(record.key) if record.key is not None else 0
    size += len(record.value) if record.value is not None else 0
    for key, value in record.headers:
        size += 10 + len(key) * 4 + (len(value) if value is not None else 0)
    return size


def group_by_partition(assignment: Sequence[int]) -> dict[int, list[int]]:
    """Partition -> request indexes of its records, partitions in ascending order."""
    groups: dict[int, list[int]] = {}
    for index, partition in enumerate(assignment):
        groups.setdefault(partition, []).append(index)
    return dict(sorted(groups.items()))


def build_batches(
    records: Sequence[RecordIn],
    indexes: Sequence[int],
    *,
    compression: Compression,
    now_ms: int,
    max_batch_bytes: int,
) -> bytes:
    """The records at ``indexes``, in that order, as concatenated batches of bounded size."""
    batches: list[bytes] = []
    builder = RecordBatchBuilder(compression=compression)
    for index in indexes:
        record = records[index]
        if builder.record_count and builder.size_in_bytes() + estimate_record_size(record) > max_batch_bytes:
            batches.append(builder.build())
            builder = RecordBatchBuilder(compression=compression)
        timestamp = now_ms if record.timestamp is None else record.timestamp
        try:
            builder.append(record.value, timestamp=timestamp, key=record.key, headers=record.headers)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidRecordError(f"record {index} cannot be encoded: {exc}") from exc
    batches.append(builder.build())
    return batches[0] if len(batches) == 1 else b"".join(batches)


def plan_typed(
    command: ProduceCommand,
    partition_count: int,
    sticky: StickyPartitioner,
    *,
    now_ms: int,
    max_batch_bytes: int,
) -> tuple[list[int], dict[int, PartitionPayload], list[int]]:
    """Plan a typed produce: (assignment, payloads of valid partitions, out-of-range partitions)."""
    assignment = assign_partitions(command.topic, command.records, partition_count, sticky)
    payloads, unknown = build_payloads(
        command, assignment, partition_count, now_ms=now_ms, max_batch_bytes=max_batch_bytes
    )
    return assignment, payloads, unknown


def build_payloads(
    command: ProduceCommand,
    assignment: Sequence[int],
    partition_count: int,
    *,
    now_ms: int,
    max_batch_bytes: int,
) -> tuple[dict[int, PartitionPayload], list[int]]:
    """The batches of each assigned partition: (payloads of valid partitions, out-of-range
    partitions). Touches nothing shared, so it may run on a worker thread."""
    payloads: dict[int, PartitionPayload] = {}
    unknown: list[int] = []
    for partition, indexes in group_by_partition(assignment).items():
        if partition >= partition_count:
            unknown.append(partition)
            continue
        data = build_batches(
            command.records,
            indexes,
            compression=command.compression,
            now_ms=now_ms,
            max_batch_bytes=max_batch_bytes,
        )
        payloads[partition] = PartitionPayload(partition, data, indexes)
    return payloads, unknown


def plan_raw(command: ProduceCommand, partition_count: int) -> tuple[dict[int, PartitionPayload], list[int]]:
    """Plan a pre-encoded produce: (payloads of valid partitions, out-of-range partitions).

    The bytes pass through untouched: the storage node validates them.
    """
    batches = command.batches
    if len(batches) == 1:  # the usual request: nothing to sort
        ((partition, data),) = batches
        if partition >= partition_count:
            return {}, [partition]
        return {partition: PartitionPayload(partition, data)}, []
    payloads: dict[int, PartitionPayload] = {}
    unknown: list[int] = []
    for partition, data in sorted(batches, key=_partition_of):
        if partition >= partition_count:
            unknown.append(partition)
        else:
            payloads[partition] = PartitionPayload(partition, data)
    return payloads, unknown


def _partition_of(batch: tuple[int, bytes | memoryview]) -> int:
    return batch[0]
