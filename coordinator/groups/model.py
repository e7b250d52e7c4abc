"""Consumer-group domain values: what the group state machine, the handlers and serde share. Pure.

Everything here is immutable. Topic-partitions are ordered ``(topic, partition)`` pairs so that
assignments sort and compare deterministically.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from services import errors

#: Kafka's assignor names (partition.assignment.strategy), as stored in etcd.
RANGE = "range"
ROUND_ROBIN = "roundrobin"
STICKY = "sticky"
COOPERATIVE_STICKY = "cooperative-sticky"
DEFAULT_ASSIGNOR = COOPERATIVE_STICKY

#: Rebalance protocols: eager revokes everything first; cooperative revokes only what moves.
EAGER = "eager"
COOPERATIVE = "cooperative"

#: Kafka's group states, as DescribeGroup and ListGroups report them.
EMPTY = "Empty"
STABLE = "Stable"
PREPARING_REBALANCE = "PreparingRebalance"

#: Defaults of a JoinGroup that leaves the timeouts 0 (Kafka's consumer defaults).
DEFAULT_SESSION_TIMEOUT_MS = 45_000
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000
#: The heartbeat period suggested to members: a third of the session, at most Kafka's 3 s.
MAX_HEARTBEAT_INTERVAL_MS = 3_000


def protocol_of(assignor: str) -> str:
    """The rebalance protocol an assignor runs with."""
    return COOPERATIVE if assignor == COOPERATIVE_STICKY else EAGER


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    return max(1, min(MAX_HEARTBEAT_INTERVAL_MS, session_timeout_ms // 3))


class TopicPartition(NamedTuple):
    topic: str
    partition: int


def sorted_partitions(partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
    return tuple(sorted(partitions))


@dataclass(frozen=True, slots=True)
class Subscription:
    """Explicit topic names, or a regular expression fully matched against topic names."""

    topics: tuple[str, ...] = ()
    pattern: str = ""

    def resolve(self, topics: Iterable[str]) -> frozenset[str]:
        """The existing topics this subscription selects (explicit names only if they exist)."""
        existing = set(topics)
        if self.pattern:
            compiled = re.compile(self.pattern)
            return frozenset(t for t in existing if compiled.fullmatch(t))
        return frozenset(t for t in self.topics if t in existing)


def ensure_valid_subscription(subscription: Subscription) -> None:
    """INVALID_REQUEST unless exactly one of topics and pattern is given (and the pattern compiles)."""
    if subscription.topics and subscription.pattern:
        raise errors.InvalidRequestError("a subscription takes topic names or a pattern, not both")
    if not subscription.topics and not subscription.pattern:
        raise errors.InvalidRequestError("a subscription needs topic names or a pattern")
    if subscription.pattern:
        try:
            re.compile(subscription.pattern)
        except re.error as exc:
            raise errors.InvalidRequestError(
                f"invalid subscription pattern {subscription.pattern!r}: {exc}"
            ) from None


@dataclass(frozen=True, slots=True)
class Member:
    """A group member as stored in ``groups/<g>/members/<member_id>`` (under ``lease_id``).

    ``last_poll`` (event-loop monotonic seconds) is volatile: it is not stored, and a new active
    controller starts every member's poll clock afresh.
    """

    member_id: str
    instance_id: str
    client_id: str
    host: str
    subscription: Subscription
    session_timeout_ms: int
    max_poll_interval_ms: int
    assignor: str
    lease_id: int
    last_poll: float = field(default=0.0, compare=False)


@dataclass(frozen=True, slots=True)
class JoinParams:
    """What a JoinGroup asks for (timeouts already defaulted; ``assignor`` "" = unspecified)."""

    group_id: str
    member_id: str = ""
    instance_id: str = ""
    client_id: str = ""
    host: str = ""
    subscription: Subscription = Subscription()
    assignor: str = ""
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    max_poll_interval_ms: int = DEFAULT_MAX_POLL_INTERVAL_MS


@dataclass(frozen=True, slots=True)
class HeartbeatParams:
    group_id: str
    member_id: str
    generation: int
    owned: frozenset[TopicPartition] = frozenset()
    polled: bool = False
    instance_id: str = ""


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """The answer to a join or heartbeat: what the member may own now, must give up, waits for."""

    member_id: str
    generation: int
    assignor: str
    assignment: tuple[TopicPartition, ...]
    revoke: tuple[TopicPartition, ...] = ()
    pending: tuple[TopicPartition, ...] = ()
    heartbeat_interval_ms: int = MAX_HEARTBEAT_INTERVAL_MS


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    topic: str
    partition: int
    offset: int
    metadata: str = ""

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class CommitParams:
    """A CommitOffsets request. Empty ``member_id`` with generation -1: a standalone commit."""

    group_id: str
    member_id: str
    generation: int
    offsets: tuple[OffsetCommit, ...]
    instance_id: str = ""


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    """A committed offset as stored in ``groups/<g>/offsets/<topic>/<p>``."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    generation: int = -1


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """The per-partition outcome of a commit (``error`` None = committed)."""

    tp: TopicPartition
    error: errors.TributaryError | None = None


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A fetched (or reset) committed offset; offset -1 when nothing is committed."""

    tp: TopicPartition
    offset: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    error: errors.TributaryError | None = None


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str
    member_count: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member: Member
    assignment: tuple[TopicPartition, ...]
    owned: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    tp: TopicPartition
    committed_offset: int
    log_end_offset: int
    lag: int
    owner: str = ""
    error: errors.TributaryError | None = None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    generation: int
    assignor: str
    members: tuple[MemberDescription, ...]
    partitions: tuple[PartitionLag, ...]


@dataclass(frozen=True, slots=True)
class ResetSpec:
    """Where ResetGroupOffsets moves each partition: ``earliest``, ``latest`` or ``timestamp``
    (ms), unless ``explicit`` offsets are given."""

    kind: str = ""
    timestamp: int = -1
    explicit: tuple[OffsetCommit, ...] = ()
