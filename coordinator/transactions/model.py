"""Transaction coordinator values: states, a transactional id's metadata, requests, markers. Pure.

Everything here is immutable; the state machine (:mod:`.state`) returns new values.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from coordinator.groups.model import OffsetCommit, OffsetRecord
from services.topic_partition import TopicPartition

#: "No producer id / epoch" in requests and in the stored metadata (Kafka's NO_PRODUCER_ID and
#: NO_PRODUCER_EPOCH).
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: The largest producer epoch: a RecordBatch v2 carries the epoch in 16 signed bits.
MAX_PRODUCER_EPOCH = 32_767


def epoch_exhausted(epoch: int) -> bool:
    """Whether a transactional producer at ``epoch`` must move to a new producer id: one epoch is
    kept in reserve so an ongoing transaction can still be fenced (Kafka's isEpochExhausted)."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


class TxnState(enum.Enum):
    """Kafka's transaction states (TransactionState), as stored in etcd."""

    #: Initialised (InitProducerId), no transaction begun.
    EMPTY = "EMPTY"
    #: Partitions or a group were added: a transaction is open.
    ONGOING = "ONGOING"
    #: EndTxn decided: markers are being written. A coordinator that takes over finishes it.
    PREPARE_COMMIT = "PREPARE_COMMIT"
    PREPARE_ABORT = "PREPARE_ABORT"
    #: Every marker is written (and, for a commit, the staged offsets are the group's).
    COMPLETE_COMMIT = "COMPLETE_COMMIT"
    COMPLETE_ABORT = "COMPLETE_ABORT"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def kafka_name(self) -> str:
        """Kafka's name of the state, as its tools print it (``PrepareCommit``)."""
        return "".join(word.capitalize() for word in self.value.split("_"))

    @property
    def idle(self) -> bool:
        """No transaction open or ending: a new one may begin, the id may expire."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """Everything the coordinator keeps about one transactional id (``transactions/<id>``).

    ``last_producer_id`` / ``last_producer_epoch`` remember the id and epoch before the last
    bump or rotation asked with an expected id and epoch (KIP-360), so a retry whose answer was
    lost gets the same answer instead of PRODUCER_FENCED. ``pending_offsets`` are the offsets
    staged by TxnOffsetCommit per group: they become the group's committed offsets only when the
    transaction commits.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: frozenset[TopicPartition] = frozenset()
    groups: frozenset[str] = frozenset()
    pending_offsets: Mapping[str, Mapping[TopicPartition, OffsetRecord]] = field(default_factory=dict)
    #: When the current transaction began (its first AddPartitionsToTxn / AddOffsetsToTxn); -1: none.
    start_ms: int = -1
    #: When this value last changed (transactional ids idle for too long expire).
    last_update_ms: int = -1

    @property
    def size(self) -> int:
        """Partitions plus staged offsets: what the cost of encoding and markers grows with."""
        return len(self.partitions) + sum(len(o) for o in self.pending_offsets.values())


# ---- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InitProducerIdParams:
    """An InitProducerId. Empty ``transactional_id``: an idempotent producer. ``producer_id`` and
    ``producer_epoch`` (both -1 when none) ask for a bump of that id's epoch (KIP-360)."""

    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class ProducerRef:
    """The producer a transactional request speaks for."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitParams:
    """A TxnOffsetCommit. ``generation`` -1 with an empty ``member_id``: no group-member check."""

    producer: ProducerRef
    group_id: str
    generation: int
    member_id: str
    offsets: tuple[OffsetCommit, ...]


# ---- markers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT or ABORT marker for ``partitions`` of one producer, decided by the controller of
    ``coordinator_epoch`` (storage nodes refuse one older than a marker they already took)."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]
