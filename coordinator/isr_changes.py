"""The controller's rules for a leader's AlterPartition (KIP-497). Pure: no I/O.

A leader asks to change its partition's ISR, naming the leader epoch and the state version it
holds. The change is accepted only from the current leader, for the current epoch and version (a
leader that missed a change is told INVALID_UPDATE_VERSION and waits for the new state), for an
ISR that is a set of the partition's replicas holding the leader, where every replica joining is
live, has not lost its log and is not in controlled shutdown (INELIGIBLE_REPLICA). The controller
then writes the new state with a compare-and-swap on the version.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from coordinator.metadata import MetadataState
from coordinator.model import PartitionRecord, PartitionStatus
from services import errors


@dataclass(frozen=True, slots=True)
class IsrChange:
    """One partition of an AlterPartition request."""

    topic: str
    partition: int
    leader_epoch: int
    partition_version: int
    new_isr: tuple[int, ...]


def validated_isr_change(
    state: MetadataState,
    node_id: int,
    change: IsrChange,
    lost: Collection[int] = (),
    shutting_down: Collection[int] = (),
) -> tuple[PartitionRecord, PartitionRecord]:
    """``(current, proposed)`` records for an acceptable change, else the error Kafka answers.
    ``shutting_down``: nodes in controlled shutdown, which may not join an ISR (KIP-841)."""
    name = f"{change.topic}-{change.partition}"
    topic = state.live_topic(change.topic)
    current = state.partition_record(change.topic, change.partition) if topic is not None else None
    if current is None:
        raise errors.UnknownTopicOrPartitionError(f"{name} does not exist")
    if current.status is not PartitionStatus.ONLINE or current.leader != node_id:
        raise errors.NotLeaderOrFollowerError(
            f"node {node_id} does not lead {name} (leader {current.leader})"
        )
    if change.leader_epoch < current.leader_epoch:
        raise errors.FencedLeaderEpochError(
            f"{name}: leader epoch {change.leader_epoch} is older than {current.leader_epoch}"
        )
    if change.leader_epoch > current.leader_epoch:
        raise errors.UnknownLeaderEpochError(
            f"{name}: leader epoch {change.leader_epoch} is newer than {current.leader_epoch}"
        )
    if change.partition_version != current.mod_revision:
        raise errors.InvalidUpdateVersionError(
            f"{name}: state version {change.partition_version} is not the current {current.mod_revision}"
        )
    isr = change.new_isr
    if len(set(isr)) != len(isr) or not set(isr) <= set(current.replicas) or node_id not in isr:
        raise errors.InvalidRequestError(
            f"{name}: ISR {list(isr)} must be distinct replicas of {list(current.replicas)} "
            "holding the leader"
        )
    for joining in set(isr) - set(current.isr):
        if joining not in state.brokers or joining in lost:
            raise errors.IneligibleReplicaError(f"{name}: replica {joining} may not join the ISR (not live)")
        if joining in shutting_down:
            raise errors.IneligibleReplicaError(
                f"{name}: replica {joining} may not join the ISR (it is shutting down)"
            )
    ordered = tuple(r for r in current.replicas if r in isr)
    return current, replace(current, isr=ordered)
