"""``*_from_proto`` / ``*_to_proto`` for the Gateway's data-plane messages.

Decoding checks what protobuf cannot: enum values outside the known set (proto3 keeps unknown
numbers) become the Kafka-named INVALID_ARGUMENT errors.
"""

from __future__ import annotations

from gateway.server.batching import ProduceCommand, RecordIn
from gateway.server.delete_records import RecordDeletion
from gateway.server.fetch import (
    DEFAULT_PARTITION_MAX_BYTES,
    DEFAULT_TOTAL_MAX_BYTES,
    FetchCommand,
    FetchedPartition,
    PartitionFetch,
)
from gateway.server.offsets import OffsetQuery
from gateway.server.produce import ProduceOutcome
from gateway.server.storage_calls import DeletionOutcome, OffsetOutcome
from services import errors
from services.append_result import AppendResult
from services.proto import pb
from services.records import Compression, TimestampType
from services.serde import acks_from_proto, error_to_proto, offset_spec_from_proto

_COMPRESSION = {
    pb.COMPRESSION_UNSPECIFIED: Compression.NONE,
    pb.COMPRESSION_NONE: Compression.NONE,
    pb.COMPRESSION_GZIP: Compression.GZIP,
    pb.COMPRESSION_SNAPPY: Compression.SNAPPY,
    pb.COMPRESSION_LZ4: Compression.LZ4,
    pb.COMPRESSION_ZSTD: Compression.ZSTD,
}
_TIMESTAMP_TYPE = {
    TimestampType.CREATE_TIME: pb.TIMESTAMP_TYPE_CREATE_TIME,
    TimestampType.LOG_APPEND_TIME: pb.TIMESTAMP_TYPE_LOG_APPEND_TIME,
}


# ---- produce --------------------------------------------------------------------------------


def _record_from_proto(record) -> RecordIn:
    has = record.HasField
    headers = tuple((h.key, h.value if h.HasField("value") else None) for h in record.headers)
    return RecordIn(
        record.key if has("key") else None,
        record.value if has("value") else None,
        headers,
        record.timestamp if has("timestamp") else None,
        record.partition if has("partition") else None,
    )


def produce_command_from_proto(request) -> ProduceCommand:
    acks = acks_from_proto(request.acks)
    compression = _COMPRESSION.get(request.compression)
    if compression is None:
        raise errors.InvalidRequestError(f"unknown compression {request.compression}")
    return ProduceCommand(
        topic=request.topic,
        records=[_record_from_proto(r) for r in request.records],
        batches=[(b.partition, b.record_batches) for b in request.batches],
        acks=acks,
        timeout_ms=request.timeout_ms,
        compression=compression,
        correlation_id=request.correlation_id,
        # Computed in C from the parsed message: a pass over the records in Python would cost
        # the hot path more than the decision it serves.
        request_bytes=request.ByteSize(),
    )


def _partition_result_to_proto(result: AppendResult):
    return pb.PartitionProduceResult(
        partition=result.partition,
        base_offset=result.base_offset,
        log_append_time=result.log_append_time,
        log_start_offset=result.log_start_offset,
        error=error_to_proto(result.error) if result.error is not None else None,
        record_count=result.record_count,
    )


def produce_outcome_to_proto(outcome: ProduceOutcome):
    response = pb.ProduceResponse(
        topic=outcome.topic,
        partitions=[_partition_result_to_proto(r) for r in outcome.partitions],
        correlation_id=outcome.correlation_id,
    )
    add = response.records.add  # in place: no copy per record (see _add_consumed_records)
    for partition, offset in outcome.records:
        add(partition=partition, offset=offset)
    return response


def produce_error_to_proto(request, error: errors.TributaryError):
    """A ProduceStream answer for a request that failed as a whole (the stream goes on).

    The error is reported on partition -1, and every record of the request on partition -1 with
    offset -1, so a client that matches records to partition results finds the error.
    """
    return pb.ProduceResponse(
        topic=request.topic,
        records=[pb.RecordResult(partition=-1, offset=-1)] * len(request.records),
        partitions=[
            pb.PartitionProduceResult(
                partition=-1,
                base_offset=-1,
                log_append_time=-1,
                log_start_offset=-1,
                error=error_to_proto(error),
            )
        ],
        correlation_id=request.correlation_id,
    )


# ---- fetch ----------------------------------------------------------------------------------


_ISOLATION_LEVELS: dict[int, bool] = {
    pb.ISOLATION_LEVEL_UNSPECIFIED: False,
    pb.ISOLATION_LEVEL_READ_UNCOMMITTED: False,
    pb.ISOLATION_LEVEL_READ_COMMITTED: True,
}


def read_committed_from_proto(level: int) -> bool:
    """Whether an ``IsolationLevel`` asks for committed data only (INVALID_REQUEST if unknown)."""
    try:
        return _ISOLATION_LEVELS[level]
    except KeyError:
        raise errors.InvalidRequestError(f"unknown isolation_level {level}") from None


def fetch_command_from_proto(request) -> FetchCommand:
    read_committed = read_committed_from_proto(request.isolation_level)
    return FetchCommand(
        partitions=tuple(
            PartitionFetch(p.topic, p.partition, p.offset, p.max_bytes or DEFAULT_PARTITION_MAX_BYTES)
            for p in request.partitions
        ),
        min_bytes=request.min_bytes,
        max_wait_ms=request.max_wait_ms,
        max_bytes=request.max_bytes or DEFAULT_TOTAL_MAX_BYTES,
        raw_batches=request.raw_batches,
        read_committed=read_committed,
    )


def _add_consumed_records(target, batches) -> None:
    """Append the records to the repeated field ``target`` in place.

    NOTE: building messages in place with ``add()`` matters here: constructing each
    ConsumedRecord separately and passing the list to a constructor copies every record once
    more, which measured about twice as slow for 40k-record responses.
    """
    add = target.add
    for timestamp_type, records in batches:
        ts_type = _TIMESTAMP_TYPE[timestamp_type]
        for r in records:
            consumed = add(
                offset=r.offset, timestamp=r.timestamp, timestamp_type=ts_type, key=r.key, value=r.value
            )
            if r.headers:
                add_header = consumed.headers.add
                for key, value in r.headers:
                    add_header(key=key, value=value)


def _fill_fetch_result(message, result: FetchedPartition) -> None:
    message.topic = result.topic
    message.partition = result.partition
    if result.error is not None:
        message.error.CopyFrom(error_to_proto(result.error))
    message.high_watermark = result.high_watermark
    message.log_start_offset = result.log_start_offset
    message.next_offset = result.next_offset
    if result.last_stable_offset >= 0:
        message.last_stable_offset = result.last_stable_offset
        add = message.aborted_transactions.add
        for producer_id, first_offset in result.aborted:
            add(producer_id=producer_id, first_offset=first_offset)
    if result.raw:
        message.record_batches = result.raw
    if result.batches:
        _add_consumed_records(message.records, result.batches)


def fetch_response_to_proto(results: list[FetchedPartition]):
    response = pb.FetchResponse()
    add = response.partitions.add
    for result in results:
        _fill_fetch_result(add(), result)
    return response


# ---- list offsets ---------------------------------------------------------------------------


def _offset_query_from_proto(query) -> OffsetQuery:
    """A bad spec fails only its own partition (INVALID_REQUEST), not the request."""
    try:
        return OffsetQuery(query.topic, query.partition, offset_spec_from_proto(query.spec))
    except errors.TributaryError as exc:
        return OffsetQuery(query.topic, query.partition, None, exc)


def offset_queries_from_proto(request) -> list[OffsetQuery]:
    return [_offset_query_from_proto(p) for p in request.partitions]


def offsets_to_proto(outcomes: list[OffsetOutcome]):
    return pb.ListOffsetsResponse(
        partitions=[
            pb.ListOffsetsPartitionResult(
                topic=o.topic,
                partition=o.partition,
                offset=o.offset,
                timestamp=o.timestamp,
                error=error_to_proto(o.error) if o.error is not None else None,
            )
            for o in outcomes
        ]
    )


# ---- delete records -------------------------------------------------------------------------


def deletions_from_proto(request) -> list[RecordDeletion]:
    return [RecordDeletion(p.topic, p.partition, p.offset) for p in request.partitions]


def deletions_to_proto(outcomes: list[DeletionOutcome]):
    return pb.DeleteRecordsResponse(
        partitions=[
            pb.DeleteRecordsPartitionResult(
                topic=o.topic,
                partition=o.partition,
                log_start_offset=o.log_start_offset,
                error=error_to_proto(o.error) if o.error is not None else None,
            )
            for o in outcomes
        ]
    )
