"""``*_to_proto`` / ``*_from_proto`` for the transaction RPCs (transactions.proto)."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.groups.model import OffsetCommit, PartitionResult
from coordinator.transactions.model import (
    InitProducerIdParams,
    ProducerIdAndEpoch,
    ProducerRef,
    TxnOffsetCommitParams,
)
from services.proto import pb
from services.serde import error_to_proto
from services.topic_partition import TopicPartition


def init_from_proto(request) -> InitProducerIdParams:
    return InitProducerIdParams(
        request.transactional_id, request.transaction_timeout_ms, request.producer_id, request.producer_epoch
    )


def init_to_proto(answer: ProducerIdAndEpoch):
    return pb.InitProducerIdResponse(producer_id=answer.producer_id, producer_epoch=answer.epoch)


def producer_from_proto(request) -> ProducerRef:
    """The producer of any transactional request (they share the three field names)."""
    return ProducerRef(request.transactional_id, request.producer_id, request.producer_epoch)


def partitions_from_proto(partitions) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in partitions]


def txn_offset_commit_from_proto(request) -> TxnOffsetCommitParams:
    return TxnOffsetCommitParams(
        producer=producer_from_proto(request),
        group_id=request.group_id,
        generation=request.generation_id,
        member_id=request.member_id,
        offsets=tuple(OffsetCommit(o.topic, o.partition, o.offset, o.metadata) for o in request.offsets),
    )


def results_to_proto(results: Sequence[PartitionResult]) -> list:
    return [
        pb.PartitionError(topic=r.tp.topic, partition=r.tp.partition, error=error_to_proto(r.error))
        if r.error is not None
        else pb.PartitionError(topic=r.tp.topic, partition=r.tp.partition)
        for r in results
    ]


def description_to_proto(described, *, with_partitions: bool):
    """A DescribeTransactions entry: the metadata (partitions only when asked), or the error
    (a ``(transactional_id, error)`` pair)."""
    if isinstance(described, tuple):
        transactional_id, error = described
        return pb.TransactionDescription(transactional_id=transactional_id, error=error_to_proto(error))
    meta = described
    partitions = sorted(meta.partitions) if with_partitions else []
    return pb.TransactionDescription(
        transactional_id=meta.transactional_id,
        state=meta.state.kafka_name,
        producer_id=meta.producer_id,
        producer_epoch=meta.producer_epoch,
        transaction_timeout_ms=meta.timeout_ms,
        start_ms=meta.start_ms,
        partition_count=len(meta.partitions),
        partitions=[pb.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions],
        groups=sorted(meta.groups),
    )
