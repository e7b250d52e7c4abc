"""The controller's decisions, as pure functions of the metadata state. No I/O.

Given what etcd says (topics, stored partition states, live storage nodes), these functions say
what the controller must do; :mod:`coordinator.controller` carries it out (RPCs to storage nodes,
then guarded etcd writes). Being level-triggered -- "compare desired with actual" rather than
"react to this event" -- a newly elected controller simply runs them once to finish whatever its
predecessor left half done.

Partition transitions (Kafka's partition state machine, leader epoch bumped on every change of
leader, including to "no leader"):

* new (no stored state): the first live replica becomes leader once it holds the partition; the
  other live replicas are asked to create it too, and those that did form the ISR with it. With no
  live replica it stays PENDING.
* ONLINE, leader live: in-sync replicas whose node is gone (lease expired) or which lost their log
  leave the ISR, leader and epoch unchanged (the leader's own AlterPartition does the same for
  followers that merely lag).
* ONLINE, leader gone (or its log lost): the first live in-sync replica in assignment order becomes
  leader, after confirming it still holds the log, and the lost nodes leave the ISR; with none,
  OFFLINE with no leader, ISR kept (as Kafka keeps the last in-sync replicas, to know who may lead
  again without losing data).
* OFFLINE: as soon as an in-sync replica is live again, it leads (after confirming).

``unclean.leader.election.enable=true`` on the topic lets an out-of-sync live replica lead when no
in-sync one is live, as in Kafka: records it never copied are lost (the transition says so, for
the log and the metric).

**Controlled shutdown** (Kafka's ControlledShutdown): a node that asked to stop may neither
gain leadership nor stay in or join an ISR. Each partition it leads moves to the first live
in-sync replica of the others (leader epoch bumped, the stopping node out of the ISR), as for
any change of leader, so producers see NOT_LEADER_OR_FOLLOWER and retry elsewhere; it leaves
the ISR of the partitions it follows. A partition whose only live in-sync replica is the
stopping node stays led by it until it exits.

"Lost" replicas are those that answered that their log is missing (REPLICA_NOT_AVAILABLE): they
may neither lead nor stay in the ISR, so an empty log never leads under the old offsets; as
out-of-sync followers they copy the log again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from coordinator.metadata import MetadataState
from coordinator.model import NO_LEADER, PartitionRecord, PartitionStatus, TopicRecord
from services import errors

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
    #: The pushed nodes must already hold the log (an election): never create it empty.
    must_exist: bool = False
    #: An out-of-sync replica takes over (unclean.leader.election.enable): records may be lost.
    unclean: bool = False


@dataclass(frozen=True, slots=True)
class NodeSync:
    """What a (re)joined storage node must hold and must drop, from its list of local partitions."""

    node_id: int
    create: tuple[tuple[str, int], ...]
    delete: tuple[tuple[str, int], ...]


def _moved_on(
    current: PartitionRecord, leader: int, leader_epoch: int, isr: tuple[int, ...], status: PartitionStatus
) -> PartitionRecord:
    """``current`` with a new leader, epoch, ISR and status -- and everything else kept: a
    reassignment under way (adding, removing, its throttle) and retired copies outlive any
    change of leader or ISR."""
    return dataclasses.replace(
        current, leader=leader, leader_epoch=leader_epoch, isr=isr, status=status, mod_revision=0
    )


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
    topic: TopicRecord,
    partition: int,
    current: PartitionRecord | None,
    live: Collection[int],
    lost: Collection[int] = (),
    shutting_down: Collection[int] = (),
) -> Transition | None:
    """The next state of one partition, or None when it is where it should be. ``lost``: the
    replicas known to have lost this partition's log; ``shutting_down``: live nodes that asked
    for a controlled shutdown."""
    if current is None:
        return _plan_new(topic, partition, live)
    usable = {r for r in live if r not in lost}
    eligible = usable.difference(shutting_down)
    if current.status is PartitionStatus.ONLINE and current.leader in usable:
        if current.leader in eligible:
            return _plan_isr_shrink(topic, partition, current, eligible)
        return _plan_leader_shutdown(topic, partition, current, usable, eligible)
    leader = elect_leader(current.replicas, current.isr, eligible)
    unclean = False
    if leader is None and _unclean_allowed(topic):
        leader = next((r for r in current.replicas if r in usable), None)
        leader = leader if leader is not None else next((r for r in current.replicas if r in live), None)
        unclean = leader is not None
    if leader is not None:
        isr = (leader,) if unclean else _isr_after_election(current.isr, leader, eligible)
        record = _moved_on(current, leader, current.leader_epoch + 1, isr, PartitionStatus.ONLINE)
        return Transition(
            topic.name,
            partition,
            current.mod_revision,
            record,
            (leader,),
            leader,
            must_exist=not unclean,
            unclean=unclean,
        )
    if current.status is PartitionStatus.OFFLINE:
        return None  # still no live in-sync replica: wait
    record = _moved_on(current, NO_LEADER, current.leader_epoch + 1, current.isr, PartitionStatus.OFFLINE)
    return Transition(topic.name, partition, current.mod_revision, record)


def _plan_isr_shrink(
    topic: TopicRecord, partition: int, current: PartitionRecord, usable: Collection[int]
) -> Transition | None:
    """Drop in-sync replicas that are gone or lost their log; the leader keeps its epoch."""
    isr = tuple(r for r in current.isr if r in usable)
    if isr == current.isr or current.leader not in isr:
        return None
    record = _moved_on(current, current.leader, current.leader_epoch, isr, PartitionStatus.ONLINE)
    return Transition(topic.name, partition, current.mod_revision, record)


def _plan_leader_shutdown(
    topic: TopicRecord,
    partition: int,
    current: PartitionRecord,
    usable: Collection[int],
    eligible: Collection[int],
) -> Transition | None:
    """The leader is stopping: the first eligible in-sync replica takes over (epoch bumped, the
    stopping node out of the ISR); with none, it keeps leading and the ISR only loses the gone."""
    successor = next((r for r in current.replicas if r in current.isr and r in eligible), None)
    if successor is None:
        return _plan_isr_shrink(topic, partition, current, usable)
    isr = tuple(r for r in current.isr if r in eligible)
    record = _moved_on(current, successor, current.leader_epoch + 1, isr, PartitionStatus.ONLINE)
    return Transition(
        topic.name, partition, current.mod_revision, record, (successor,), successor, must_exist=True
    )


def election_targets(
    state: MetadataState, topics: Iterable[str], partitions: Iterable[tuple[str, int]]
) -> list[tuple[str, int]]:
    """The partitions an ElectLeaders names, each once: those given, every partition of the
    topics given (an unknown topic as ``(name, -1)``, to be answered UNKNOWN_TOPIC_OR_PARTITION),
    or, with neither, every partition of every live topic."""
    topics, wanted = list(topics), list(partitions)
    every = not topics and not wanted
    for name in state.topics if every else topics:
        topic = state.live_topic(name)
        if topic is None:
            wanted.append((name, -1))
        else:
            wanted += [(name, p) for p in range(topic.partition_count)]
    return [key for key in dict.fromkeys(wanted) if not (every and key[1] < 0)]


def plan_preferred_leader(
    topic: TopicRecord,
    partition: int,
    current: PartitionRecord | None,
    live: Collection[int],
    lost: Collection[int] = (),
    shutting_down: Collection[int] = (),
) -> Transition | errors.TributaryError:
    """Preferred leader election of one partition (Kafka's ElectLeaders, PREFERRED): the move of
    leadership to its first replica (leader epoch bumped, ISR kept), or why not:
    ELECTION_NOT_NEEDED when it leads already, PREFERRED_LEADER_NOT_AVAILABLE when it is not
    live, not in sync, lost its log or is stopping (or the partition is not online)."""
    name = f"{topic.name}-{partition}"
    if current is None or current.status is not PartitionStatus.ONLINE:
        return errors.PreferredLeaderNotAvailableError(f"{name} is not online")
    preferred = current.replicas[0]
    if current.leader == preferred:
        return errors.ElectionNotNeededError(f"{name} is led by its preferred leader {preferred} already")
    if (
        preferred not in live
        or preferred in lost
        or preferred in shutting_down
        or preferred not in current.isr
    ):
        return errors.PreferredLeaderNotAvailableError(
            f"{name}: preferred leader {preferred} is not live and in sync (ISR {list(current.isr)})"
        )
    record = _moved_on(current, preferred, current.leader_epoch + 1, current.isr, PartitionStatus.ONLINE)
    return Transition(
        topic.name, partition, current.mod_revision, record, (preferred,), preferred, must_exist=True
    )


def shutdown_progress(
    state: MetadataState, node_id: int, shutting_down: Collection[int]
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """For a node in controlled shutdown: ``(remaining, kept)``. ``remaining``: partitions it
    still leads or is in the ISR of that the controller will move it off (another eligible
    in-sync replica exists, or it follows an eligible leader); ``kept``: partitions it leads
    with no other eligible in-sync replica, which stay led by it until it exits."""
    eligible = set(state.brokers).difference(shutting_down)
    remaining: list[tuple[str, int]] = []
    kept: list[tuple[str, int]] = []
    for topic in state.topics.values():
        if topic.deleting:
            continue
        for partition, record in sorted(state.partitions.get(topic.name, {}).items()):
            if record.status is not PartitionStatus.ONLINE or node_id not in record.isr:
                continue
            if record.leader != node_id:
                if record.leader in eligible:  # else its own leader is stopping too: left as is
                    remaining.append((topic.name, partition))
            elif any(r in eligible for r in record.isr):
                remaining.append((topic.name, partition))
            else:
                kept.append((topic.name, partition))
    return remaining, kept


def _plan_new(topic: TopicRecord, partition: int, live: Collection[int]) -> Transition | None:
    replicas = tuple(topic.assignment[partition])
    alive = tuple(r for r in replicas if r in live)
    if not alive:
        return None  # stays PENDING until a replica is live
    leader = alive[0]
    record = PartitionRecord(replicas, leader, 0, alive, PartitionStatus.ONLINE)
    return Transition(topic.name, partition, 0, record, alive, leader)


def _isr_after_election(isr: tuple[int, ...], leader: int, live: Collection[int]) -> tuple[int, ...]:
    """Lost nodes leave the ISR; the new leader is always in it."""
    kept = tuple(r for r in isr if r in live)
    return kept if leader in kept else (leader, *kept)


def plan_partitions(
    state: MetadataState,
    lost: Mapping[tuple[str, int], Collection[int]] | None = None,
    shutting_down: Collection[int] = (),
    *,
    topics: Collection[str] | None = None,
) -> list[Transition]:
    """Every partition transition the current state calls for (topics being deleted excluded).
    ``lost``: per partition, the replicas known to have lost its log; ``shutting_down``: live
    nodes in controlled shutdown; ``topics``: plan only these (None: every topic)."""
    live = set(state.brokers)
    lost = lost or {}
    transitions = []
    for topic in _selected_topics(state, topics):
        if topic.deleting:
            continue
        stored = state.partitions.get(topic.name, {})
        for partition in range(topic.partition_count):
            transition = plan_partition(
                topic,
                partition,
                stored.get(partition),
                live,
                lost.get((topic.name, partition), ()),
                shutting_down,
            )
            if transition is not None:
                transitions.append(transition)
    return transitions


def _selected_topics(state: MetadataState, names: Collection[str] | None) -> list[TopicRecord]:
    """The topic records named (those that exist), or every topic for None."""
    if names is None:
        return list(state.topics.values())
    return [state.topics[name] for name in names if name in state.topics]


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
    # Copies a finished reassignment took off this node are the reassignment's to delete (it
    # stops the replica first; the node refuses to delete one it still serves).
    retired = {
        (name, p)
        for name, records in state.partitions.items()
        for p, record in records.items()
        if node_id in record.retired
    }
    orphans = sorted(set(local) - wanted - retired)
    return NodeSync(node_id, tuple(assigned), tuple(orphans))


def deleting_topics(state: MetadataState) -> list[TopicRecord]:
    """Topics marked for deletion whose data must still be removed from their replicas."""
    return [topic for topic in state.topics.values() if topic.deleting]
