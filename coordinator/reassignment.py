"""Partition reassignment: moving a partition's replicas to other nodes. Pure: no I/O.

Kafka's reassignment as KIP-455 has it, with the state in the partition's own record (so it
survives a controller failover: a new controller reads it and carries on):

1. **Start** (:func:`start_reassignment`): the replica list becomes the target followed by the
   replicas being removed; ``adding`` names the new ones, ``removing`` the old. The topic's
   assignment names the same list, so the new replicas are told their role (a follower out of
   the ISR) and create their log and copy it, at ``throttle_bytes_per_s`` if set.
2. **Catch up**: the leader adds each new replica to the ISR once it has caught up, with an
   ordinary AlterPartition.
3. **Finish** (:func:`plan_completion`): once every target replica is in the ISR, one write makes
   the target the replica list and ISR (minus the removed), moving leadership to the first
   in-sync target replica if the leader is being removed (leader epoch bumped, as any election);
   the removed nodes are remembered as ``retired``.
4. **Clean up**: the controller stops the partition on each retired node (a state that no
   longer names it) and deletes its copy, then clears ``retired``.

A cancel (:func:`cancel_reassignment`) goes back to the replicas there were before, in one write:
the replicas being added are retired (their partial copies deleted). A reassignment that only
reorders the replicas (a new preferred leader) is done at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from coordinator.model import PartitionRecord, PartitionStatus, TopicRecord
from coordinator.partition_state import Transition
from services import errors

MIN_INSYNC_REPLICAS = "min.insync.replicas"


@dataclass(frozen=True, slots=True)
class ReassignmentRequest:
    """One partition's requested replica list; ``replicas`` empty: cancel its reassignment."""

    topic: str
    partition: int
    replicas: tuple[int, ...]


def validate_target(
    topic: TopicRecord | None,
    partition: int,
    record: PartitionRecord | None,
    target: Sequence[int],
    live: Collection[int],
    default_min_insync: int,
) -> None:
    """Refuse a target replica list Kafka would refuse: unknown topic or partition; empty,
    duplicate or unknown (not live) nodes; fewer replicas than ``min.insync.replicas``; a
    partition not placed yet, or being reassigned already."""
    name = f"{topic.name if topic else '?'}-{partition}"
    if topic is None or not 0 <= partition < topic.partition_count:
        raise errors.UnknownTopicOrPartitionError(f"{name} does not exist")
    if not target:
        raise errors.InvalidReplicaAssignmentError(f"{name}: the replica list is empty")
    if len(set(target)) != len(target):
        raise errors.InvalidReplicaAssignmentError(f"{name}: duplicate nodes in {list(target)}")
    unknown = sorted(r for r in set(target) if r not in live)
    if unknown:
        raise errors.InvalidReplicaAssignmentError(
            f"{name}: nodes {unknown} are not live storage nodes (live: {sorted(live)})"
        )
    min_insync = int(topic.configs.get(MIN_INSYNC_REPLICAS, default_min_insync))
    if len(target) < min_insync:
        raise errors.InvalidReplicationFactorError(
            f"{name}: {len(target)} replicas are fewer than min.insync.replicas={min_insync}: "
            "acks=all produce would always fail"
        )
    if record is None:
        raise errors.LeaderNotAvailableError(f"{name} is not placed yet (PENDING): try again")
    if record.reassigning:
        raise errors.ReassignmentInProgressError(
            f"{name} is being reassigned to {list(record.target_replicas)} already: cancel it first"
        )


def start_reassignment(
    record: PartitionRecord, target: Sequence[int], throttle_bytes_per_s: int
) -> PartitionRecord:
    """The record that starts moving the partition to ``target`` (validated). A mere reorder
    (same nodes) is complete at once."""
    target = tuple(target)
    adding = tuple(r for r in target if r not in record.replicas)
    removing = tuple(r for r in record.replicas if r not in target)
    retired = tuple(r for r in record.retired if r not in target)  # coming back: keep its copy
    if not adding and not removing:
        return PartitionRecord(
            target,
            record.leader,
            record.leader_epoch,
            record.isr,
            record.status,
            record.mod_revision,
            retired=retired,
        )
    return PartitionRecord(
        target + removing,
        record.leader,
        record.leader_epoch,
        record.isr,
        record.status,
        record.mod_revision,
        adding=adding,
        removing=removing,
        retired=retired,
        throttle_bytes_per_s=throttle_bytes_per_s if adding else 0,
    )


def _settled(
    record: PartitionRecord,
    replicas: tuple[int, ...],
    retired: tuple[int, ...],
    live: Collection[int],
    shutting_down: Collection[int],
) -> tuple[PartitionRecord, bool] | None:
    """``record`` with ``replicas`` as its final list: the ISR cut to them, leadership kept if
    the leader stays, else moved to the first live in-sync one (epoch bumped). None when no such
    replica exists. The flag says whether leadership moved."""
    isr = tuple(r for r in record.isr if r in replicas)
    leader = record.leader
    moved = leader not in replicas or leader in shutting_down
    if moved:
        candidate = next((r for r in replicas if r in isr and r in live and r not in shutting_down), None)
        if candidate is None:
            if leader in replicas:
                moved = False  # stays with the stopping leader rather than none
            else:
                return None
        else:
            leader = candidate
    if record.status is not PartitionStatus.ONLINE or leader not in isr:
        return None
    return (
        PartitionRecord(
            replicas,
            leader,
            record.leader_epoch + (1 if moved else 0),
            isr,
            PartitionStatus.ONLINE,
            record.mod_revision,
            retired=retired,
        ),
        moved,
    )


def plan_completion(
    topic: TopicRecord,
    partition: int,
    record: PartitionRecord,
    live: Collection[int],
    shutting_down: Collection[int] = (),
) -> Transition | None:
    """The write that finishes a reassignment whose target replicas are all in sync, or None
    while it must wait (a target replica still copying, the partition offline)."""
    if not record.reassigning or record.status is not PartitionStatus.ONLINE:
        return None
    target = record.target_replicas
    if not set(target) <= set(record.isr) or record.leader not in live:
        return None
    retired = tuple(dict.fromkeys((*record.retired, *record.removing)))
    settled = _settled(record, target, retired, live, shutting_down)
    if settled is None:
        return None
    final, moved = settled
    if moved:
        return Transition(
            topic.name, partition, record.mod_revision, final, (final.leader,), final.leader, must_exist=True
        )
    return Transition(topic.name, partition, record.mod_revision, final)


def cancel_reassignment(
    topic: TopicRecord,
    partition: int,
    record: PartitionRecord,
    live: Collection[int],
    shutting_down: Collection[int] = (),
) -> Transition:
    """The write that takes a partition back to the replicas it had before its reassignment
    (NO_REASSIGNMENT_IN_PROGRESS if none runs; LEADER_NOT_AVAILABLE if none of them can lead)."""
    name = f"{topic.name}-{partition}"
    if not record.reassigning:
        raise errors.NoReassignmentInProgressError(f"{name} is not being reassigned")
    original = tuple(r for r in record.replicas if r not in record.adding)
    retired = tuple(dict.fromkeys((*(r for r in record.retired if r not in original), *record.adding)))
    settled = _settled(record, original, retired, live, shutting_down)
    if settled is None:
        raise errors.LeaderNotAvailableError(
            f"{name}: none of the original replicas {list(original)} is live and in sync to lead"
        )
    final, moved = settled
    if moved:
        return Transition(
            topic.name, partition, record.mod_revision, final, (final.leader,), final.leader, must_exist=True
        )
    return Transition(topic.name, partition, record.mod_revision, final)


def with_assignment(topic: TopicRecord, replicas: Mapping[int, tuple[int, ...]]) -> TopicRecord:
    """``topic`` whose assignment names the given partitions' new replica lists."""
    assignment = list(topic.assignment)
    for partition, listed in replicas.items():
        assignment[partition] = listed
    return TopicRecord(
        topic.name,
        topic.topic_id,
        topic.replication_factor,
        topic.configs,
        tuple(assignment),
        topic.deleting,
        topic.mod_revision,
    )


def reassigning(
    partitions: Mapping[str, Mapping[int, PartitionRecord]],
) -> list[tuple[str, int, PartitionRecord]]:
    """Every partition being reassigned, sorted."""
    return sorted(
        (name, p, record)
        for name, by_partition in partitions.items()
        for p, record in by_partition.items()
        if record.reassigning
    )


def retiring(
    partitions: Mapping[str, Mapping[int, PartitionRecord]],
) -> list[tuple[str, int, PartitionRecord]]:
    """Every partition with copies left on nodes a reassignment took it off."""
    return sorted(
        (name, p, record)
        for name, by_partition in partitions.items()
        for p, record in by_partition.items()
        if record.retired
    )
