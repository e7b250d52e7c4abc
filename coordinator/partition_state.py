"""The controller's decisions, as pure functions of the metadata state. No I/O.

Given what etcd says (topics, stored partition states, live storage nodes), these functions say
what the controller must do; :mod:`coordinator.controller` carries it out (RPCs to storage nodes,
then guarded etcd writes). Being level-triggered -- "compare desired with actual" rather than
"react to this event" -- a newly elected controller simply runs them once to finish whatever its
predecessor left half done.

Partition transitions (Kafka's partition state machine, leader epoch bumped on every change of
leader, including to "no leader"):

* new (no stored state): the first live replica becomes leader once it holds the partition; the
  other live replicas are asked to create it too. With no live replica it stays PENDING.
* ONLINE, leader live: nothing to do.
* ONLINE, leader gone: the first live in-sync replica becomes leader (after it confirms it holds
  the partition) and the lost node leaves the ISR; with none, OFFLINE with no leader, ISR kept
  (as Kafka keeps the last in-sync replica, to know who may lead again without losing data).
* OFFLINE: as soon as an in-sync replica is live again, it leads (after confirming).

Until replication lands the ISR of a partition is just its leader: followers hold no data, so
moving leadership to them would lose records. ``unclean.leader.election.enable=true`` on the topic
allows it anyway, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from coordinator.metadata import MetadataState
from coordinator.model import NO_LEADER, PartitionRecord, PartitionStatus, TopicRecord

UNCLEAN_ELECTION = "unclean.leader.election.enable"


@dataclass(frozen=True, slots=True)
class Transition:
    """One partition's next state. ``push_to``: nodes that must be asked to create the partition
    first; ``required``: the one of them whose success the write depends on (the new leader),
    None when the write needs no confirmation (going OFFLINE)."""

    topic: str
    partition: int
    expected_mod_revision: int  # 0: the state key must not exist yet
    record: PartitionRecord
    push_to: tuple[int, ...] = ()
    required: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSync:
    """What a (re)joined storage node must hold and must drop, from its list of local partitions."""

    node_id: int
    create: tuple[tuple[str, int], ...]
    delete: tuple[tuple[str, int], ...]


def _unclean_allowed(topic: TopicRecord) -> bool:
    return str(topic.configs.get(UNCLEAN_ELECTION, "false")).lower() == "true"


def elect_leader(
    replicas: Iterable[int], isr: Collection[int], live: Collection[int], *, unclean: bool = False
) -> int | None:
    """The first replica (in assignment order) that is live and in sync; None if there is none.

    An empty ISR means the partition never had a leader, so no data can be lost: any live
    replica may lead. With ``unclean``, any live replica may lead when no in-sync one is live.
    """
    ordered = list(replicas)
    for replica in ordered:
        if replica in live and (replica in isr or not isr):
            return replica
    if unclean:
        return next((r for r in ordered if r in live), None)
    return None


def plan_partition(
    topic: TopicRecord, partition: int, current: PartitionRecord | None, live: Collection[int]
) -> Transition | None:
    """The next state of one partition, or None when it is where it should be."""
    if current is None:
        return _plan_new(topic, partition, live)
    if current.status is PartitionStatus.ONLINE and current.leader in live:
        return None
    leader = elect_leader(current.replicas, current.isr, live, unclean=_unclean_allowed(topic))
    if leader is not None:
        isr = _isr_after_election(current.isr, leader, live)
        record = PartitionRecord(
            current.replicas, leader, current.leader_epoch + 1, isr, PartitionStatus.ONLINE
        )
        return Transition(topic.name, partition, current.mod_revision, record, (leader,), leader)
    if current.status is PartitionStatus.OFFLINE:
        return None  # still no live in-sync replica: wait
    record = PartitionRecord(
        current.replicas, NO_LEADER, current.leader_epoch + 1, current.isr, PartitionStatus.OFFLINE
    )
    return Transition(topic.name, partition, current.mod_revision, record)


def _plan_new(topic: TopicRecord, partition: int, live: Collection[int]) -> Transition | None:
    replicas = tuple(topic.assignment[partition])
    alive = tuple(r for r in replicas if r in live)
    if not alive:
        return None  # stays PENDING until a replica is live
    leader = alive[0]
    record = PartitionRecord(replicas, leader, 0, (leader,), PartitionStatus.ONLINE)
    return Transition(topic.name, partition, 0, record, alive, leader)


def _isr_after_election(isr: tuple[int, ...], leader: int, live: Collection[int]) -> tuple[int, ...]:
    """Lost nodes leave the ISR; the new leader is always in it."""
    kept = tuple(r for r in isr if r in live)
    return kept if leader in kept else (leader, *kept)


def plan_partitions(state: MetadataState) -> list[Transition]:
    """Every partition transition the current state calls for (topics being deleted excluded)."""
    live = set(state.brokers)
    transitions = []
    for topic in state.topics.values():
        if topic.deleting:
            continue
        stored = state.partitions.get(topic.name, {})
        for partition in range(topic.partition_count):
            transition = plan_partition(topic, partition, stored.get(partition), live)
            if transition is not None:
                transitions.append(transition)
    return transitions


def assigned_partitions(state: MetadataState, node_id: int) -> list[tuple[str, int]]:
    """Every partition of a live topic with a replica on ``node_id``."""
    return [
        (topic.name, partition)
        for topic in state.topics.values()
        if not topic.deleting
        for partition, replicas in enumerate(topic.assignment)
        if node_id in replicas
    ]


def plan_node_sync(state: MetadataState, node_id: int, local: Iterable[tuple[str, int]]) -> NodeSync:
    """What a storage node that (re)joined must create, and which local partitions are orphans.

    Orphans are partitions of topics deleted (or shrunk, or moved) while the node was away: the
    controller could not reach it then, so it cleans up now.
    """
    assigned = assigned_partitions(state, node_id)
    wanted = set(assigned)
    orphans = sorted(set(local) - wanted)
    return NodeSync(node_id, tuple(assigned), tuple(orphans))


def deleting_topics(state: MetadataState) -> list[TopicRecord]:
    """Topics marked for deletion whose data must still be removed from their replicas."""
    return [topic for topic in state.topics.values() if topic.deleting]
