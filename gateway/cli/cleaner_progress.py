"""The log cleaner's progress on compacted topics, for ``tributary topics describe``.

Asked of each partition's leader directly (``StorageNode.DescribePartitions``), as ``tributary
top`` asks the storage nodes for their log sizes: the gateway's metadata names the leaders and
their addresses. A leader that does not answer leaves its partitions without progress ("-").
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import grpc

from services.proto import gateway_grpc, pb, storage_grpc
from services.tls import ClientTls, sync_channel

CALL_TIMEOUT_S = 5.0


class CleanerProgress(NamedTuple):
    """One compacted partition as its leader's cleaner sees it."""

    dirty_ratio: float
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    dirty_bytes: int

    def text(self) -> str:
        """``dirty 12% (compacted below 4500)``: what the describe column shows."""
        return f"dirty {self.dirty_ratio:.0%} (compacted below {self.first_dirty_offset})"


def collect(
    gateway: str,
    topics: list[str],
    credentials: grpc.ChannelCredentials | None = None,
    node_tls: ClientTls | None = None,
) -> dict[tuple[str, int], CleanerProgress]:
    """(topic, partition) -> progress for every partition of ``topics`` whose leader answered
    (the gateway over TLS with ``credentials``, the leaders with ``node_tls``: a member
    certificate, when the cluster runs internal TLS)."""
    if not topics:
        return {}
    to_gateway = grpc.secure_channel(gateway, credentials) if credentials else grpc.insecure_channel(gateway)
    with to_gateway as channel:
        metadata = gateway_grpc.GatewayStub(channel).GetMetadata(
            pb.GetMetadataRequest(topics=topics), timeout=CALL_TIMEOUT_S
        )
    by_leader: dict[int, list[pb.TopicPartition]] = defaultdict(list)
    for topic in metadata.topics:
        for partition in topic.partitions:
            if partition.leader >= 0:
                by_leader[partition.leader].append(
                    pb.TopicPartition(topic=topic.name, partition=partition.partition)
                )
    progress: dict[tuple[str, int], CleanerProgress] = {}
    for broker in metadata.brokers:
        wanted = by_leader.get(broker.node_id)
        if not wanted:
            continue
        try:
            with sync_channel(f"{broker.host}:{broker.grpc_port}", node_tls) as channel:
                response = storage_grpc.StorageNodeStub(channel).DescribePartitions(
                    pb.DescribePartitionsRequest(partitions=wanted), timeout=CALL_TIMEOUT_S
                )
        except grpc.RpcError:
            continue
        for info in response.partitions:
            if info.HasField("cleaner"):
                c = info.cleaner
                progress[(info.topic, info.partition)] = CleanerProgress(
                    c.dirty_ratio,
                    c.first_dirty_offset,
                    c.first_uncleanable_offset,
                    c.clean_bytes,
                    c.dirty_bytes,
                )
    return progress
