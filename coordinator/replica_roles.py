"""What each storage node has been told of its replica roles, and what it still must be told.

The controller tells replicas their roles with UpdateLeaderAndIsr (Kafka's LeaderAndIsr). Rather
than react to each change, it compares, every pass, the partition states in etcd with the last
state each live node acknowledged (:class:`RoleTracker`) and sends the difference -- level
triggered, so a new controller simply sends everything once, a node that restarted (a new
incarnation) is told everything again, and a failed call is retried by the next pass. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from coordinator.metadata import MetadataState
from coordinator.model import PartitionRecord, TopicRecord
from services.leader_and_isr import LeaderAndIsr


def leader_and_isr(topic: TopicRecord, partition: int, record: PartitionRecord) -> LeaderAndIsr:
    """The state a replica is told: the stored record, its version, and whether its topic is
    being deleted."""
    return LeaderAndIsr(
        topic.name,
        partition,
        record.replicas,
        record.leader,
        record.leader_epoch,
        record.isr,
        record.mod_revision,
        topic.deleting,
        record.adding,
        record.throttle_bytes_per_s,
    )


@dataclass
class _NodeRoles:
    incarnation: int
    #: partition -> (version, deleting) the node acknowledged
    acknowledged: dict[tuple[str, int], tuple[int, bool]] = field(default_factory=dict)


class RoleTracker:
    """The states each node acknowledged, per node incarnation."""

    def __init__(self) -> None:
        self._nodes: dict[int, _NodeRoles] = {}

    def due(
        self, state: MetadataState, topics: Collection[str] | None = None
    ) -> dict[int, list[LeaderAndIsr]]:
        """Per live node, the states (of ``topics``; None: of every topic) it has not
        acknowledged yet."""
        due: dict[int, list[LeaderAndIsr]] = {}
        brokers = state.brokers
        selected = (
            state.topics.values()
            if topics is None
            else [state.topics[name] for name in topics if name in state.topics]
        )
        for topic in selected:
            for partition, record in state.partitions.get(topic.name, {}).items():
                version = (record.mod_revision, topic.deleting)
                for node_id in record.replicas:
                    broker = brokers.get(node_id)
                    if broker is None:
                        continue
                    roles = self._roles(node_id, broker.incarnation)
                    if roles.acknowledged.get((topic.name, partition)) != version:
                        due.setdefault(node_id, []).append(leader_and_isr(topic, partition, record))
        return due

    def acknowledged(
        self, node_id: int, incarnation: int, states: Mapping[tuple[str, int], LeaderAndIsr]
    ) -> None:
        roles = self._roles(node_id, incarnation)
        for key, state in states.items():
            roles.acknowledged[key] = (state.version, state.deleting)

    def told(
        self, node_id: int, incarnation: int, key: tuple[str, int], version: int, deleting: bool
    ) -> bool:
        """Whether the node acknowledged at least ``version`` (with this deleting flag)."""
        roles = self._nodes.get(node_id)
        if roles is None or roles.incarnation != incarnation:
            return False
        known = roles.acknowledged.get(key)
        return known is not None and known[0] >= version and known[1] == deleting

    def _roles(self, node_id: int, incarnation: int) -> _NodeRoles:
        roles = self._nodes.get(node_id)
        if roles is None or roles.incarnation != incarnation:
            roles = self._nodes[node_id] = _NodeRoles(incarnation)
        return roles
