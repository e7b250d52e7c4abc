"""Helpers for the replication tests: a three-node cluster, partition metadata, replica roles
straight from each storage node, and the batches of a replica's log straight from its disk."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TypeVar

import grpc

from gateway.client import Admin, NewTopic
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.proto import pb, storage_grpc
from services.records import iter_batches

T = TypeVar("T")

#: Lease TTL of nodes and coordinators: a killed node's partitions move this long after.
TTL_S = 2
#: replica.lag.time.max.ms of the test clusters: a stopped follower leaves the ISR this soon.
LAG_MS = 1500


def start_cluster(
    data_dir: Path, *, coordinators: int = 1, coordinator_args: list[str] | None = None
) -> LocalCluster:
    spec = LocalClusterSpec(
        storage_nodes=3,
        coordinators=coordinators,
        gateways=1,
        session_timeout_s=TTL_S,
        storage_args=["--replica-lag-time-max-ms", str(LAG_MS), "--replica-fetch-backoff-ms", "200"],
        coordinator_args=coordinator_args or [],
    )
    return LocalCluster(data_dir, spec)  # started by "with"


def new_topic(admin: Admin, partitions: int = 1, replication_factor: int = 3, **configs: str) -> str:
    name = f"r-{uuid.uuid4().hex[:8]}"
    admin.create_topics(
        [
            NewTopic(
                name,
                partitions,
                replication_factor,
                {k.replace("_", "."): str(v) for k, v in configs.items()},
            )
        ]
    )
    return name


def partition(admin: Admin, topic: str, index: int = 0):
    """The partition's metadata as the coordinators serve it (leader, leader_epoch, isr, state)."""
    return admin.describe_topics([topic])[0].partitions[index]


def storage_stub(cluster: LocalCluster, node_id: int) -> storage_grpc.StorageNodeStub:
    info = cluster.storage_nodes[node_id].info
    channel = grpc.insecure_channel(f"{info['host']}:{info['grpc_port']}")
    return storage_grpc.StorageNodeStub(channel)


def replica_info(cluster: LocalCluster, node_id: int, topic: str, index: int = 0):
    """The replica as its storage node holds it: offsets, high watermark, role (leader, epoch, ISR)."""
    request = pb.DescribePartitionsRequest(partitions=[pb.TopicPartition(topic=topic, partition=index)])
    return storage_stub(cluster, node_id).DescribePartitions(request, timeout=5).partitions[0]


def replica_batches(
    cluster: LocalCluster, node_id: int, topic: str, index: int = 0, below: int | None = None
) -> list[tuple[int, int, bytes]]:
    """``(base offset, partition leader epoch, bytes)`` of every whole batch in the replica's
    segment files, read from its disk; with ``below``, only batches ending below that offset."""
    directory = cluster.data_dir / f"storage-{node_id}" / f"{topic}-{index}"
    batches = []
    for path in sorted(directory.glob("*.log")):
        for batch in iter_batches(path.read_bytes(), allow_partial_tail=True):
            if below is None or batch.last_offset < below:
                batches.append((batch.base_offset, batch.partition_leader_epoch, bytes(batch.buffer)))
    return batches


def values_in(batches: list[tuple[int, int, bytes]]) -> list[bytes | None]:
    return [
        record.value for _, _, data in batches for batch in iter_batches(data) for record in batch.records()
    ]
