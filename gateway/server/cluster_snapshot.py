"""An immutable routing snapshot of cluster metadata, and leader lookup over it (pure, no I/O).

A :class:`ClusterSnapshot` is built from one ``GetMetadataResponse`` (what ``WatchMetadata``
streams), or from the previous snapshot and a delta (:meth:`ClusterSnapshot.with_delta`: only
the topics that changed -- of a topic whose own key did not, only the partitions that did
(``TopicMetadata.partial``) -- so following a cluster of tens of thousands of partitions costs
each change in proportion to what it touched); the gateway swaps whole snapshots, never mutates
one, so a request that read a snapshot sees one consistent view. Lookups raise the taxonomy's retriable,
``invalid_metadata`` errors (``UNKNOWN_TOPIC_OR_PARTITION``, ``LEADER_NOT_AVAILABLE``,
``BROKER_NOT_AVAILABLE``) so callers know to refresh and retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from services import errors
from services.broker_address import BrokerAddress
from services.proto import pb
from services.serde import broker_address_from_proto, error_from_proto

#: Kafka's default ``max.message.bytes`` (1 MiB + the 12-byte log overhead).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


@dataclass(frozen=True, slots=True)
class PartitionRoute:
    partition: int
    leader: int
    leader_epoch: int
    #: Set when the partition is not usable (offline, no leader).
    error: errors.TributaryError | None = None


@dataclass(frozen=True, slots=True)
class TopicRoute:
    name: str
    partitions: tuple[PartitionRoute, ...]
    configs: Mapping[str, str] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def max_message_bytes(self) -> int:
        """The topic's ``max.message.bytes`` when set on it, else Kafka's default."""
        try:
            return int(self.configs.get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES))
        except ValueError:
            return DEFAULT_MAX_MESSAGE_BYTES

    def ensure_partition(self, partition: int) -> PartitionRoute:
        """The route of ``partition``, or UNKNOWN_TOPIC_OR_PARTITION when out of range."""
        if not 0 <= partition < len(self.partitions):
            raise errors.UnknownTopicOrPartitionError(
                f"topic {self.name!r} has {len(self.partitions)} partitions; "
                f"partition {partition} does not exist"
            )
        return self.partitions[partition]


def _partition_from_proto(message) -> PartitionRoute:
    error = error_from_proto(message.error) if message.HasField("error") else None
    if error is None and (message.leader < 0 or message.state == pb.PARTITION_STATE_OFFLINE):
        error = errors.LeaderNotAvailableError(f"partition {message.partition} has no live leader")
    return PartitionRoute(message.partition, message.leader, message.leader_epoch, error)


def _topic_from_proto(message) -> TopicRoute:
    partitions = sorted((_partition_from_proto(p) for p in message.partitions), key=lambda p: p.partition)
    return TopicRoute(message.name, tuple(partitions), MappingProxyType(dict(message.configs)))


class PartialTopicError(Exception):
    """A partition delta for a topic the snapshot does not hold as it should (unknown, or a
    partition out of its range): the delta cannot be applied, the whole metadata is needed."""


def _merged_topic(route: TopicRoute | None, message, partial) -> tuple[TopicRoute, object]:
    """``route`` (and its ``message``) with the partitions of a partial topic message replaced."""
    if route is None or message is None:
        raise PartialTopicError(f"a partition delta for topic {partial.name!r}, which is not known")
    partitions = list(route.partitions)
    merged = type(message)()
    merged.CopyFrom(message)
    for changed in partial.partitions:
        index = changed.partition
        if not 0 <= index < len(partitions) or merged.partitions[index].partition != index:
            raise PartialTopicError(f"a partition delta for {partial.name}-{index}, which is not known")
        partitions[index] = _partition_from_proto(changed)
        merged.partitions[index].CopyFrom(changed)
    return TopicRoute(route.name, tuple(partitions), route.configs), merged


@dataclass(frozen=True)
class ClusterSnapshot:
    """One consistent view of brokers and topics at an etcd ``revision``."""

    revision: int
    nodes: Mapping[int, BrokerAddress]
    topics: Mapping[str, TopicRoute]
    #: Each topic's message as the coordinator sent it (what :attr:`source` is rebuilt from).
    messages: Mapping[str, object] = field(default_factory=dict)
    #: The last response applied: brokers, controller and cluster id (its topics may be a delta).
    header: object = None

    @classmethod
    def empty(cls) -> ClusterSnapshot:
        return cls.from_proto(pb.GetMetadataResponse(revision=-1))

    @classmethod
    def from_proto(cls, response) -> ClusterSnapshot:
        """The snapshot a whole GetMetadataResponse describes."""
        nodes = {b.node_id: broker_address_from_proto(b) for b in response.brokers}
        messages = {t.name: t for t in response.topics if not t.HasField("error")}
        topics = {name: _topic_from_proto(t) for name, t in messages.items()}
        snapshot = cls(
            response.revision,
            MappingProxyType(nodes),
            MappingProxyType(topics),
            MappingProxyType(messages),
            response,
        )
        snapshot.__dict__["source"] = response  # what cached_property would build, already at hand
        return snapshot

    def with_delta(self, response) -> ClusterSnapshot:
        """This snapshot with a delta applied (``response.is_delta``; the caller checked that
        ``response.base_revision <= self.revision <= response.revision``): brokers and header
        replaced, the changed topics replaced (a partial one: its changed partitions), the
        removed ones dropped. Copies the topic maps (one entry per topic) but re-parses only the
        changed topics (partitions). Raises :class:`PartialTopicError` when a partial topic
        does not fit this snapshot."""
        nodes = {b.node_id: broker_address_from_proto(b) for b in response.brokers}
        topics, messages = dict(self.topics), dict(self.messages)
        for name in response.removed_topics:
            topics.pop(name, None)
            messages.pop(name, None)
        for message in response.topics:
            if message.HasField("error"):
                topics.pop(message.name, None)
                messages.pop(message.name, None)
            elif message.partial:
                topics[message.name], messages[message.name] = _merged_topic(
                    topics.get(message.name), messages.get(message.name), message
                )
            else:
                topics[message.name] = _topic_from_proto(message)
                messages[message.name] = message
        return ClusterSnapshot(
            response.revision,
            MappingProxyType(nodes),
            MappingProxyType(topics),
            MappingProxyType(messages),
            response,
        )

    @cached_property
    def source(self):
        """The whole GetMetadataResponse this snapshot stands for (served as is by GetMetadata
        fallbacks); rebuilt from the topic messages, once, when the snapshot came from a delta."""
        response = pb.GetMetadataResponse()
        if self.header is not None:
            response.CopyFrom(self.header)
        del response.topics[:]
        del response.removed_topics[:]
        response.is_delta = False
        response.base_revision = 0
        response.topics.extend(self.messages[name] for name in sorted(self.messages))
        return response

    def ensure_topic(self, topic: str) -> TopicRoute:
        route = self.topics.get(topic)
        if route is None:
            raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return route

    def ensure_leader(self, topic: str, partition: int) -> BrokerAddress:
        """The leader's address, or a retriable error naming why there is none."""
        route = self.ensure_topic(topic).ensure_partition(partition)
        if route.error is not None:
            raise route.error
        node = self.nodes.get(route.leader)
        if node is None:
            raise errors.BrokerNotAvailableError(
                f"leader {route.leader} of {topic}-{partition} is not a live storage node"
            )
        return node
