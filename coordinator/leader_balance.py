"""Automatic preferred-leader balance (Kafka's ``auto.leader.rebalance.enable``). Pure: no I/O.

Placement spreads preferred leaders (first replicas) evenly over the nodes; failures and restarts
move leadership to other replicas and nothing moves it back. Every
``leader.imbalance.check.interval.seconds`` the controller asks, per node, which share of the
partitions it is the preferred leader of are led by another node; above
``leader.imbalance.per.broker.percentage`` it elects the preferred leader of those (where it is
live, in sync and not stopping: the election checks again).
"""

from __future__ import annotations

from collections.abc import Collection

from coordinator.metadata import MetadataState
from coordinator.model import PartitionStatus


def imbalanced_partitions(
    state: MetadataState, percentage: int, shutting_down: Collection[int] = ()
) -> list[tuple[str, int]]:
    """Partitions to hand back to their preferred leader: those of each live node whose
    imbalance ratio is above ``percentage`` and whose preferred leader could lead now."""
    preferred: dict[int, int] = {}
    led_elsewhere: dict[int, int] = {}
    movable: dict[int, list[tuple[str, int]]] = {}
    for topic in state.topics.values():
        if topic.deleting:
            continue
        for partition, record in state.partitions.get(topic.name, {}).items():
            if not record.replicas or record.status is not PartitionStatus.ONLINE:
                continue
            first = record.replicas[0]
            preferred[first] = preferred.get(first, 0) + 1
            if record.leader == first:
                continue
            led_elsewhere[first] = led_elsewhere.get(first, 0) + 1
            if first in state.brokers and first in record.isr and first not in shutting_down:
                movable.setdefault(first, []).append((topic.name, partition))
    due: list[tuple[str, int]] = []
    for node, partitions in sorted(movable.items()):
        if led_elsewhere[node] * 100 > percentage * preferred[node]:
            due += sorted(partitions)
    return due
