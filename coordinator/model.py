"""The coordinator's domain values: storage nodes, coordinators, topics and partitions. Pure.

These are what :mod:`coordinator.keys` decodes etcd values into, what the metadata cache holds
and what handlers return; the servicer turns them into protobuf. All are immutable.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.broker_address import BrokerAddress

#: Kafka's "no leader" node id.
NO_LEADER = -1


class PartitionStatus(enum.Enum):
    """Availability of a partition, as stored and as served.

    PENDING: placed, but its leader has not confirmed it holds the partition yet.
    ONLINE: the leader has it and is live.
    OFFLINE: no live in-sync replica can lead it.
    """

    PENDING = "PENDING"
    ONLINE = "ONLINE"
    OFFLINE = "OFFLINE"


@dataclass(frozen=True, slots=True)
class RegisteredBroker(BrokerAddress):
    """A live storage node: its address as registered, and ``incarnation``, the create revision
    of its registration key -- a node that restarted (re-registered) has a new one, so the
    controller knows to re-push its partitions."""

    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class CoordinatorInfo:
    """A running coordinator process (active or standby)."""

    coordinator_id: str
    host: str
    grpc_port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.grpc_port}"


@dataclass(frozen=True, slots=True)
class ControllerInfo:
    """Who is the active controller, where to reach it, and the epoch it was elected with."""

    coordinator_id: str
    address: str
    epoch: int


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic as stored in ``topics/<name>``: the replica assignment is the placement decided at
    create / add-partitions time (leader-first replica lists, one per partition)."""

    name: str
    topic_id: str
    replication_factor: int
    configs: Mapping[str, str]
    assignment: tuple[tuple[int, ...], ...]
    deleting: bool = False
    mod_revision: int = 0

    @property
    def partition_count(self) -> int:
        return len(self.assignment)


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """A partition's state as stored in ``topics/<t>/partitions/<p>`` (written by the controller)."""

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    status: PartitionStatus
    mod_revision: int = 0
    #: A reassignment in progress (Kafka's KIP-455): replicas being added (in ``replicas``,
    #: copying the log) and being removed (in ``replicas`` until the added ones are in sync).
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    #: Nodes taken off the partition by a finished reassignment that may still hold a copy: the
    #: controller stops and deletes it there, then clears this.
    retired: tuple[int, ...] = ()
    #: Copy rate of the added replicas while they catch up, bytes/s (0: unthrottled).
    throttle_bytes_per_s: int = 0

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """Where a reassignment ends: the replicas without those being removed."""
        return tuple(r for r in self.replicas if r not in self.removing)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A partition as served in metadata: the stored state seen against the live nodes.

    A stored ONLINE partition whose leader's lease has expired is served OFFLINE at once, before
    the controller has rewritten it, so every coordinator reports lost nodes within the lease TTL.
    """

    topic: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    status: PartitionStatus


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic with its partitions as served in metadata."""

    name: str
    topic_id: str
    replication_factor: int
    configs: Mapping[str, str]
    partitions: tuple[PartitionView, ...] = field(default=())
    #: Only the partitions that changed after a delta's base revision (the others are as the
    #: watcher has them); see ``MetadataState.changed_partitions``.
    partial: bool = False


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What a CreateTopic request asks for (validated by the controller)."""

    name: str
    partitions: int
    replication_factor: int = 0
    configs: Mapping[str, str] = field(default_factory=dict)
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """One topic config as described to users: set on the topic, or its default."""

    name: str
    value: str
    is_default: bool
    documentation: str = ""


@dataclass(frozen=True, slots=True)
class TopicLookup:
    """The answer for one requested topic: its view, or why there is none (per-topic errors)."""

    name: str
    view: TopicView | None = None
    error: Exception | None = None
    configs: tuple[ConfigValue, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """What GetMetadata answers: live nodes, the requested topics, the controller, the revision."""

    brokers: tuple[RegisteredBroker, ...]
    topics: tuple[TopicLookup, ...]
    controller: ControllerInfo | None
    revision: int
    cluster_id: str
    #: A delta (WatchMetadata to a watcher that accepts them): ``topics`` holds only the topics
    #: changed after ``base_revision``, ``removed_topics`` those deleted since.
    delta: bool = False
    base_revision: int = 0
    removed_topics: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ControllerStatus:
    """This coordinator's role and who the active controller is."""

    coordinator_id: str
    is_active: bool
    active: ControllerInfo | None
