"""Public value types of the client SDK, shaped like aiokafka's and kafka-python's ``structs``.

All are NamedTuples: immutable, cheap, hashable (``TopicPartition`` is a dict key everywhere) and
unpackable, so code written against kafka-python or aiokafka reads the same fields by the same
names.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# Re-exported: one definition for the SDK, the coordinator and Spark.
from services.topic_partition import TopicPartition as TopicPartition

#: A record header: a string key and a bytes value (``None`` = null), as in Kafka.
Header = tuple[str, "bytes | None"]

#: ``ConsumerRecord.timestamp_type`` values (Kafka's ``TimestampType`` ids).
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class RecordMetadata(NamedTuple):
    """Where a produced record landed, as its future resolves.

    ``offset`` is -1 when the producer sent with ``acks=0`` (nobody waited for the log).
    ``timestamp`` is the record's create time, or the broker's append time when the topic uses
    ``message.timestamp.type=LogAppendTime``.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    log_start_offset: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class ConsumerRecord(NamedTuple):
    """One consumed record: its position, timestamp, deserialized key and value, and headers.

    ``key``/``value`` are ``None`` for a null key / a tombstone (deserializers are not called on
    ``None``). ``headers`` is a tuple of ``(str, bytes | None)`` pairs in the order they were sent.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any  # whatever the key deserializer returns (bytes without one)
    value: Any  # whatever the value deserializer returns (bytes without one)
    headers: tuple[Header, ...] = ()

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class OffsetAndTimestamp(NamedTuple):
    """An offset with the timestamp of its record (``offsets_for_times`` results)."""

    offset: int
    timestamp: int


class OffsetAndMetadata(NamedTuple):
    """A committed offset -- the next offset to consume, Kafka's convention -- with its metadata
    string (at most ``offset.metadata.max.bytes``, 4096 by default)."""

    offset: int
    metadata: str = ""


class ConsumerGroupMetadata(NamedTuple):
    """Who a group consumer is (``consumer.group_metadata()``), for
    ``producer.send_offsets_to_transaction``: the coordinator accepts the staged offsets only
    from the group's current generation, so a consumer that lost its partitions to a rebalance
    cannot commit a transaction's offsets over the new owner's (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class BrokerMetadata(NamedTuple):
    """A storage node as cluster metadata describes it."""

    node_id: int
    host: str
    port: int
    fetch_port: int
    rack: str | None = None


class PartitionMetadata(NamedTuple):
    """One partition of a topic: its leader (-1 when offline), replicas and in-sync replicas.

    ``error`` is the reason the partition is unusable (``LEADER_NOT_AVAILABLE`` ...) or ``None``.
    """

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    state: str
    error: str | None = None


class TopicDescription(NamedTuple):
    """A topic: partitions, replication factor and its configs by Kafka name."""

    name: str
    partitions: tuple[PartitionMetadata, ...]
    replication_factor: int
    configs: dict[str, str]


class ClusterDescription(NamedTuple):
    """What ``GetMetadata`` says about the cluster itself."""

    cluster_id: str
    controller_id: str
    brokers: tuple[BrokerMetadata, ...]


class NewTopic(NamedTuple):
    """A topic to create (kafka-python's ``NewTopic``): name, partitions, replication, configs."""

    name: str
    num_partitions: int
    replication_factor: int = 1
    topic_configs: dict[str, str] | None = None


class NewPartitions(NamedTuple):
    """The new total partition count of a topic (Kafka never shrinks a topic)."""

    total_count: int


# ---- consumer groups ----------------------------------------------------------------------------

#: Kafka's names for the partition assignment strategies (``partition_assignment_strategy``).
ASSIGNORS = ("cooperative-sticky", "range", "roundrobin", "sticky")


class GroupListing(NamedTuple):
    """A consumer group as ``list_consumer_groups`` sees it.

    ``state`` is Kafka's: ``Empty`` (no members), ``Stable`` (every member holds exactly its
    assignment) or ``PreparingRebalance`` (partitions are being handed over).
    """

    group_id: str
    state: str
    member_count: int


class TransactionDescription(NamedTuple):
    """A transactional id as the transaction coordinator holds it (``describe_transactions``).

    ``state`` is Kafka's: ``Empty``, ``Ongoing`` (a transaction is open), ``PrepareCommit`` /
    ``PrepareAbort`` (decided, markers being written), ``CompleteCommit`` / ``CompleteAbort``.
    ``start_ms`` is when the open transaction began (-1: none); ``partitions`` are listed only
    for ids named in the call.
    """

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    start_ms: int
    partition_count: int
    partitions: tuple[TopicPartition, ...] = ()
    groups: tuple[str, ...] = ()


class PartitionReassignment(NamedTuple):
    """A partition being reassigned (``list_partition_reassignments``): ``replicas`` is every
    replica now (the target first, then those being removed); ``adding`` copy the log until they
    join ``isr``; ``throttle_bytes_per_second`` caps their copy rate (0: none)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    throttle_bytes_per_second: int

    @property
    def target(self) -> tuple[int, ...]:
        """Where the partition's replicas will be."""
        return tuple(r for r in self.replicas if r not in self.removing)


class MemberDescription(NamedTuple):
    """One member of a group: who it is, what it subscribed to, what it is assigned and holds.

    ``assignment`` is its target in the current generation; ``owned`` what it holds right now
    (they differ while partitions are being handed over). ``pattern`` is set instead of
    ``topics`` for a pattern subscription; ``group_instance_id`` only for a static member.
    """

    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    topics: tuple[str, ...]
    pattern: str | None
    assignment: tuple[TopicPartition, ...]
    owned: tuple[TopicPartition, ...]


class PartitionLag(NamedTuple):
    """A partition of a group: committed offset (None when nothing is committed), log end
    offset, lag (log end - committed, or - log start when nothing is committed) and the member
    consuming it. ``error`` (a Kafka reason) is set when the log end could not be read; then
    ``log_end_offset`` and ``lag`` are None."""

    topic: str
    partition: int
    committed_offset: int | None
    log_end_offset: int | None
    lag: int | None
    owner: str | None
    error: str | None = None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class GroupDescription(NamedTuple):
    """``describe_consumer_group``: state, generation, assignor, members, and lag per partition
    (every partition assigned, held or committed)."""

    group_id: str
    state: str
    generation: int
    assignor: str
    members: tuple[MemberDescription, ...]
    partitions: tuple[PartitionLag, ...]
