"""The range assignor: the paper's Algorithm 1, per topic.

For each topic T: sort its partitions P_T and the members subscribed to it C_T; with
N = |P_T| / |C_T|, member j takes the contiguous range [j*N, (j+1)*N). The paper leaves the
remainder |P_T| mod |C_T| unassigned; like Kafka's RangeAssignor, the first members each take
one extra partition so that every partition has an owner.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from coordinator.groups.assignors.common import Assignment, MemberSubscription, frozen, member_order_key
from services.topic_partition import TopicPartition


def assign(
    members: Sequence[MemberSubscription],
    partitions: Mapping[str, int],
    previous: Mapping[str, Collection[TopicPartition]] | None = None,
) -> Assignment:
    """Contiguous ranges of each topic's partitions; ``previous`` is not used."""
    result: dict[str, set[TopicPartition]] = {m.member_id: set() for m in members}
    for topic in sorted(partitions):
        consumers = sorted((m for m in members if topic in m.topics), key=member_order_key)
        for member, span in zip(consumers, _ranges(partitions[topic], len(consumers))):
            result[member.member_id].update(TopicPartition(topic, p) for p in span)
    return frozen(result)


def _ranges(count: int, consumers: int) -> list[range]:
    """``consumers`` contiguous ranges covering ``range(count)``; the first ``count % consumers``
    are one longer."""
    if consumers == 0:
        return []
    share, extra = divmod(count, consumers)
    spans, start = [], 0
    for index in range(consumers):
        length = share + (1 if index < extra else 0)
        spans.append(range(start, start + length))
        start += length
    return spans
