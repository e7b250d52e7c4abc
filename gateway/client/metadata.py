"""The client's cache of cluster metadata, and its conversion from ``GetMetadataResponse``.

Producers need a topic's partition count to partition by key the way Kafka does
(``murmur2(key) % partitions``) before the request leaves the client; consumers and admin tools
show leaders. The cache is pure state: it is filled from responses and asked questions; the I/O
(one ``GetMetadata`` call) lives with whoever owns the cache. Entries expire after
``metadata_max_age_ms`` (Kafka's default: 5 minutes) and are invalidated when a request fails
with an ``invalid_metadata`` error, so partitions added with ``CreatePartitions`` are picked up.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.client.structs import (
    BrokerMetadata,
    ClusterDescription,
    PartitionMetadata,
    TopicDescription,
)
from services.proto import pb

_STATE_NAMES = {
    pb.PARTITION_STATE_PENDING: "pending",
    pb.PARTITION_STATE_ONLINE: "online",
    pb.PARTITION_STATE_OFFLINE: "offline",
}


def partition_from_proto(topic: str, message) -> PartitionMetadata:
    return PartitionMetadata(
        topic=topic,
        partition=message.partition,
        leader=message.leader,
        leader_epoch=message.leader_epoch,
        replicas=tuple(message.replicas),
        isr=tuple(message.in_sync_replicas),
        state=_STATE_NAMES.get(message.state, "unknown"),
        error=message.error.reason if message.HasField("error") and message.error.reason else None,
    )


def topic_from_proto(message, configs: dict[str, str] | None = None) -> TopicDescription:
    """A ``TopicMetadata`` message as a :class:`TopicDescription` (partitions sorted)."""
    partitions = sorted(
        (partition_from_proto(message.name, p) for p in message.partitions), key=lambda p: p.partition
    )
    return TopicDescription(
        name=message.name,
        partitions=tuple(partitions),
        replication_factor=message.replication_factor,
        configs=dict(message.configs) if configs is None else configs,
    )


def cluster_from_proto(response) -> ClusterDescription:
    brokers = tuple(
        BrokerMetadata(b.node_id, b.host, b.grpc_port, b.fetch_port, b.rack or None)
        for b in sorted(response.brokers, key=lambda b: b.node_id)
    )
    return ClusterDescription(response.cluster_id, response.controller_id, brokers)


class MetadataCache:
    """Topic metadata by name, with the time each entry was fetched. Not thread-safe by itself:
    reads of ``partition_count`` are single dict lookups, safe from any thread under the GIL."""

    def __init__(self, *, max_age_ms: int = 300_000) -> None:
        self.max_age_ms = max_age_ms
        self._topics: dict[str, TopicDescription] = {}
        self._fetched_ms: dict[str, int] = {}
        self._partition_counts: dict[str, int] = {}
        self.cluster: ClusterDescription | None = None

    def update(self, response, now_ms: int) -> list[str]:
        """Store a ``GetMetadataResponse``; returns the topics it reported as unknown."""
        self.cluster = cluster_from_proto(response)
        unknown = []
        for message in response.topics:
            if message.HasField("error") and message.error.reason:
                unknown.append(message.name)
                self.invalidate(message.name)
                continue
            description = topic_from_proto(message)
            self._topics[message.name] = description
            self._fetched_ms[message.name] = now_ms
            self._partition_counts[message.name] = len(description.partitions)
        return unknown

    def topic(self, name: str) -> TopicDescription | None:
        return self._topics.get(name)

    @property
    def partition_counts(self) -> Mapping[str, int]:
        """Partition count by cached topic, live (the producer reads it once per record)."""
        return self._partition_counts

    def partition_count(self, topic: str) -> int | None:
        """The cached partition count, or None when the topic is not cached (fast path)."""
        return self._partition_counts.get(topic)

    def is_stale(self, topic: str, now_ms: int) -> bool:
        fetched = self._fetched_ms.get(topic)
        return fetched is None or now_ms - fetched >= self.max_age_ms

    def invalidate(self, topic: str) -> None:
        """Forget ``topic`` so the next use fetches fresh metadata."""
        self._topics.pop(topic, None)
        self._fetched_ms.pop(topic, None)
        self._partition_counts.pop(topic, None)

    def mark_stale(self, topic: str) -> None:
        """Keep using ``topic``'s entry but refresh it soon (after an invalid_metadata error)."""
        if topic in self._fetched_ms:
            self._fetched_ms[topic] = -self.max_age_ms

    def topics(self) -> list[str]:
        return sorted(self._topics)
