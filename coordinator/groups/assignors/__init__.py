"""Partition assignors: pure functions ``(members, partition counts, previous) -> assignment``.

Each assignor module exposes ``assign(members, partitions, previous)``:

* ``members`` -- :class:`MemberSubscription` values: member id, the topics it subscribes to
  (patterns already resolved against the cluster's topics), its static instance id;
* ``partitions`` -- partition count per subscribed topic;
* ``previous`` -- the assignment of the previous generation (used by the sticky assignors only).

They return every member's partitions (an entry for every member, possibly empty), each
subscribed partition to exactly one member that subscribes to its topic. No assignor keeps state
between calls (no class-level memory, unlike aiokafka's sticky assignor): everything it may use
is in its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from coordinator.groups.assignors import range_assignor, round_robin, sticky
from coordinator.groups.assignors.common import Assignment, MemberSubscription, member_order_key
from coordinator.groups.model import COOPERATIVE_STICKY, RANGE, ROUND_ROBIN, STICKY
from services.topic_partition import TopicPartition

AssignFunction = Callable[
    [Sequence[MemberSubscription], Mapping[str, int], Mapping[str, Collection[TopicPartition]]], Assignment
]

#: Assignors by Kafka name. Sticky and cooperative-sticky compute the same assignment; they
#: differ in the rebalance protocol (eager or cooperative) the group state machine runs.
ASSIGNORS: dict[str, AssignFunction] = {
    RANGE: range_assignor.assign,
    ROUND_ROBIN: round_robin.assign,
    STICKY: sticky.assign,
    COOPERATIVE_STICKY: sticky.assign,
}

__all__ = ["ASSIGNORS", "Assignment", "MemberSubscription", "member_order_key"]
