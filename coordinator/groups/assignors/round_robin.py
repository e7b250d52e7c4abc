"""The round-robin assignor: every subscribed partition in (topic, partition) order, dealt to the
members in turn, skipping members not subscribed to its topic (Kafka's RoundRobinAssignor)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from coordinator.groups.assignors.common import (
    Assignment,
    MemberSubscription,
    frozen,
    member_order_key,
    topic_partitions,
)
from services.topic_partition import TopicPartition


def assign(
    members: Sequence[MemberSubscription],
    partitions: Mapping[str, int],
    previous: Mapping[str, Collection[TopicPartition]] | None = None,
) -> Assignment:
    """Deal partitions out one at a time; ``previous`` is not used."""
    ordered = sorted(members, key=member_order_key)
    result: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    subscribed = set().union(*(m.topics for m in members)) if members else set()
    cursor = 0
    for tp in topic_partitions(partitions, subscribed):
        for step in range(len(ordered)):
            member = ordered[(cursor + step) % len(ordered)]
            if tp.topic in member.topics:
                result[member.member_id].add(tp)
                cursor = (cursor + step + 1) % len(ordered)
                break
    return frozen(result)
