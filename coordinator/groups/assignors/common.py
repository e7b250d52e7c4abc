"""What every assignor shares: the member value, the result type, the member order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from services.topic_partition import TopicPartition

#: Member id -> the partitions assigned to it.
Assignment = dict[str, frozenset[TopicPartition]]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """One member as assignors see it: its id, resolved topics and static instance id."""

    member_id: str
    topics: frozenset[str]
    instance_id: str = ""


def member_order_key(member: MemberSubscription) -> tuple[int, str, str]:
    """Static members first, by instance id, then dynamic ones by member id (Kafka's order).

    Ordering by instance id keeps a static member's place -- and so its range or round-robin
    share -- when a restart gives it a new member id.
    """
    if member.instance_id:
        return (0, member.instance_id, member.member_id)
    return (1, member.member_id, "")


def topic_partitions(partitions: Mapping[str, int], topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` (those in ``partitions``), sorted."""
    return [
        TopicPartition(t, p) for t in sorted(set(topics)) if t in partitions for p in range(partitions[t])
    ]


def frozen(assignment: Mapping[str, Iterable[TopicPartition]]) -> Assignment:
    return {member_id: frozenset(tps) for member_id, tps in assignment.items()}
