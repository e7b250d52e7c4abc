"""A partition's replication state as the controller commits it: :class:`LeaderAndIsr`.

The contract between the controller (which writes it to etcd and tells replicas) and storage
nodes (which act on it, and ask to change the ISR with AlterPartition): leader, leader epoch,
ISR, replicas, and the state's version -- the etcd mod revision of its key, so "newer" is
well defined and a compare-and-swap can name it. Kept once here, as ``cluster_keys`` is, because
the two services may not import each other. Pure (the protobuf form is in ``services.serde``).
"""

from __future__ import annotations

from dataclasses import dataclass

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """One partition's committed replication state (Kafka's LeaderAndIsr partition state)."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    #: The etcd mod revision of the state's key: increases with every change.
    version: int
    #: The topic is being deleted: replicas stop serving it and drop their logs next.
    deleting: bool = False
    #: Replicas a reassignment is adding (copying the log, not yet in sync).
    adding: tuple[int, ...] = ()
    #: Copy rate of the adding replicas, bytes/s, their own fetchers hold to (0: unthrottled).
    throttle_bytes_per_s: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def newer_than(self, other: LeaderAndIsr) -> bool:
        """Whether this state supersedes ``other`` (a later leader epoch, or a later version of
        the same epoch)."""
        if self.leader_epoch != other.leader_epoch:
            return self.leader_epoch > other.leader_epoch
        return self.version > other.version
