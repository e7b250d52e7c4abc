"""The gateway's calls to one storage node's gRPC service, in domain values.

This is the client edge towards storage nodes: protobuf is built and read here, and a failed call
(``RpcError``) becomes a per-partition error for every partition it carried, so the retry loop
can treat "the node said NOT_LEADER" and "the node is gone" alike. Appends prefer the node's
data port (``node_appends.py``), whose failures read the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from gateway.server.node_appends import NodeAppends
from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.proto import pb, storage_grpc
from services.serde import acks_to_proto, append_result_from_proto, error_from_proto, offset_spec_to_proto


@dataclass(frozen=True, slots=True)
class OffsetOutcome:
    """One partition's answer to an offset lookup (offset -1 = no record at/after the timestamp)."""

    topic: str
    partition: int
    offset: int = -1
    timestamp: int = -1
    error: errors.TributaryError | None = None


def _failed_call(exc: grpc.RpcError) -> errors.TributaryError:
    return errors.error_from_rpc(exc)


async def append(
    stub: storage_grpc.StorageNodeStub,
    topic: str,
    payloads: dict[int, bytes | memoryview],
    *,
    acks: Acks,
    timeout_s: float,
    leader_epochs: Mapping[int, int] | None = None,
    data_port: NodeAppends | None = None,
) -> dict[int, AppendResult]:
    """Append each partition's batches (``payloads``: partition -> bytes) on one node; with
    ``leader_epochs`` the node checks each partition's leader epoch is the one routed by.

    With ``data_port`` the append goes over the node's data port (pipelined frames,
    ``node_appends.py``), unless the node takes no appends there: then over gRPC, as without.
    """
    if data_port is not None:
        results = await data_port.append(
            topic, payloads, acks=acks, timeout_s=timeout_s, leader_epochs=leader_epochs
        )
        if results is not None:
            return results
    request = pb.AppendRequest(acks=acks_to_proto(acks), timeout_ms=max(1, int(timeout_s * 1000)))
    add = request.partitions.add  # in place: the batch bytes are copied into the message once
    epochs = leader_epochs or {}
    for partition, data in payloads.items():
        # protobuf takes bytes only: a view into a client's frame is copied here (the data
        # port, the usual way, writes views as they are)
        records = data if isinstance(data, bytes) else bytes(data)
        added = add(topic=topic, partition=partition, record_batches=records)
        epoch = epochs.get(partition)
        if epoch is not None:
            added.leader_epoch = epoch
    try:
        response = await stub.Append(request, timeout=max(timeout_s, 0.001))
    except grpc.RpcError as exc:
        error = _failed_call(exc)
        return {p: AppendResult(topic, p, error=error) for p in payloads}
    results = {r.partition: append_result_from_proto(r) for r in response.partitions if r.topic == topic}
    missing = errors.UnknownServerError("the storage node did not answer for this partition")
    return {p: results.get(p) or AppendResult(topic, p, error=missing) for p in payloads}


async def list_offsets(
    stub: storage_grpc.StorageNodeStub,
    queries: list[tuple[str, int, int]],
    *,
    timeout_s: float,
    read_committed: bool = False,
) -> dict[tuple[str, int], OffsetOutcome]:
    """Look up offsets on one node; ``queries`` are (topic, partition, Kafka-style timestamp)."""
    request = pb.ListPartitionOffsetsRequest(
        partitions=[
            pb.PartitionOffsetQuery(topic=t, partition=p, spec=offset_spec_to_proto(ts))
            for t, p, ts in queries
        ],
        read_committed=read_committed,
    )
    try:
        response = await stub.ListPartitionOffsets(request, timeout=max(timeout_s, 0.001))
    except grpc.RpcError as exc:
        error = _failed_call(exc)
        return {(t, p): OffsetOutcome(t, p, error=error) for t, p, _ in queries}
    outcomes = {
        (r.topic, r.partition): OffsetOutcome(
            r.topic,
            r.partition,
            r.offset,
            r.timestamp,
            error_from_proto(r.error) if r.HasField("error") else None,
        )
        for r in response.partitions
    }
    missing = errors.UnknownServerError("the storage node did not answer for this partition")
    return {(t, p): outcomes.get((t, p)) or OffsetOutcome(t, p, error=missing) for t, p, _ in queries}


@dataclass(frozen=True, slots=True)
class DeletionOutcome:
    """One partition's answer to a DeleteRecords: its log start offset after it, or the error."""

    topic: str
    partition: int
    log_start_offset: int = -1
    error: errors.TributaryError | None = None


async def delete_records(
    stub: storage_grpc.StorageNodeStub, topic: str, partition: int, before_offset: int, *, timeout_s: float
) -> DeletionOutcome:
    """Delete the records of one partition below ``before_offset`` (-1 = the high watermark) on
    its leader."""
    request = pb.DeletePartitionRecordsRequest(topic=topic, partition=partition, before_offset=before_offset)
    try:
        response = await stub.DeleteRecords(request, timeout=max(timeout_s, 0.001))
    except grpc.RpcError as exc:
        return DeletionOutcome(topic, partition, error=_failed_call(exc))
    return DeletionOutcome(topic, partition, response.log_start_offset)
