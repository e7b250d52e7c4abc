"""The sticky assignor: balanced, and moving as few partitions as balance allows.

Three passes over plain dictionaries:

1. **keep** -- every member keeps the partitions it had in ``previous`` that still exist and that
   it still subscribes to;
2. **place** -- each partition nobody kept goes to the least-loaded member subscribed to its
   topic (partitions with the fewest candidates first, so constrained ones are not left over);
3. **balance** -- while some member has at least two more partitions than another member that
   could take one of them, move one, preferring partitions the giver did not have before.

The result is balanced in Kafka's sense: no single move between two members subscribed to a
partition's topic would narrow their gap. With identical subscriptions that means sizes differ by
at most one, and a member loses a partition it had only if its new share is smaller than what it
had: once it gives one up it is among the most loaded, and the most loaded never gain.

Sticky and cooperative-sticky share this function; the group state machine decides whether
members revoke everything (eager) or only what moved (cooperative).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping, Sequence

from coordinator.groups.assignors.common import (
    Assignment,
    MemberSubscription,
    frozen,
    member_order_key,
    topic_partitions,
)
from services.topic_partition import TopicPartition

_Loads = dict[str, set[TopicPartition]]


def assign(
    members: Sequence[MemberSubscription],
    partitions: Mapping[str, int],
    previous: Mapping[str, Collection[TopicPartition]] | None = None,
) -> Assignment:
    """A balanced assignment that keeps as much of ``previous`` as balance allows."""
    by_id = {m.member_id: m for m in members}
    loads: _Loads = {m.member_id: set() for m in members}
    kept = _keep_previous(by_id, partitions, previous or {}, loads)
    _place_free(members, partitions, kept, loads)
    _balance(by_id, previous or {}, loads)
    return frozen(loads)


def _still_valid(member: MemberSubscription, tp: TopicPartition, partitions: Mapping[str, int]) -> bool:
    return tp.topic in member.topics and 0 <= tp.partition < partitions.get(tp.topic, 0)


def _keep_previous(
    by_id: Mapping[str, MemberSubscription],
    partitions: Mapping[str, int],
    previous: Mapping[str, Collection[TopicPartition]],
    loads: _Loads,
) -> set[TopicPartition]:
    """Pass 1; returns the partitions kept (each by one member, the first in member order)."""
    kept: set[TopicPartition] = set()
    for member_id in sorted((m for m in previous if m in by_id), key=lambda m: member_order_key(by_id[m])):
        member = by_id[member_id]
        for tp in sorted(previous[member_id]):
            if tp not in kept and _still_valid(member, tp, partitions):
                kept.add(tp)
                loads[member_id].add(tp)
    return kept


def _place_free(
    members: Sequence[MemberSubscription],
    partitions: Mapping[str, int],
    kept: set[TopicPartition],
    loads: _Loads,
) -> None:
    """Pass 2: partitions nobody kept, most constrained first, to the least-loaded candidate."""
    candidates = {
        topic: sorted((m for m in members if topic in m.topics), key=member_order_key) for topic in partitions
    }
    free = [tp for tp in topic_partitions(partitions, partitions) if tp not in kept and candidates[tp.topic]]
    free.sort(key=lambda tp: (len(candidates[tp.topic]), tp))
    for tp in free:
        # min() keeps the first of equals, and candidates are in member order: deterministic.
        taker = min(candidates[tp.topic], key=lambda m: len(loads[m.member_id]))
        loads[taker.member_id].add(tp)


#: A member's partitions in the order it gives them up: (had it before, partition) -- the ones
#: it did not have first.
_GivingOrder = list[tuple[bool, TopicPartition]]


def _balance(
    by_id: Mapping[str, MemberSubscription], previous: Mapping[str, Collection[TopicPartition]], loads: _Loads
) -> None:
    """Pass 3: single moves from heavier to lighter members until none narrows a gap.

    Each move shrinks the sum of squared loads, so the loop ends. Each member's partitions are
    kept sorted in giving order (updated per move), so a move costs in proportion to the members,
    not to the partitions: sorting them for every move made a member joining a group of 20,000
    partitions wait minutes for its half.
    """
    had = {m: set(previous.get(m, ())) for m in loads}
    giving: dict[str, _GivingOrder] = {m: sorted((tp in had[m], tp) for tp in loads[m]) for m in loads}
    order = {m: member_order_key(by_id[m]) for m in loads}
    while (move := _find_move(by_id, order, loads, giving)) is not None:
        tp, giver, taker = move
        loads[giver].remove(tp)
        loads[taker].add(tp)
        entries = giving[giver]
        del entries[bisect.bisect_left(entries, (tp in had[giver], tp))]
        bisect.insort(giving[taker], (tp in had[taker], tp))


def _find_move(
    by_id: Mapping[str, MemberSubscription],
    order: Mapping[str, tuple],
    loads: _Loads,
    giving: Mapping[str, _GivingOrder],
) -> tuple[TopicPartition, str, str] | None:
    """The first (partition, giver, taker) with giver at least two above taker, heaviest giver
    first, lightest taker first; None when the assignment is balanced."""
    by_load = sorted(loads, key=lambda m: (-len(loads[m]), order[m]))
    for giver in by_load:
        takers = [m for m in reversed(by_load) if len(loads[m]) <= len(loads[giver]) - 2]
        if not takers:
            return None  # lighter givers have even fewer takers
        takers.sort(key=lambda m: (len(loads[m]), order[m]))
        taker_of: dict[str, str | None] = {}
        for _, tp in giving[giver]:
            if tp.topic not in taker_of:
                taker_of[tp.topic] = next((m for m in takers if tp.topic in by_id[m].topics), None)
            taker = taker_of[tp.topic]
            if taker is not None:
                return tp, giver, taker
    return None
