"""Consumer-group domain values: what the group state machine, the handlers and serde share. Pure.

Everything here is immutable. Topic-partitions are ordered ``(topic, partition)`` pairs so that
assignments sort and compare deterministically.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from services import errors
from services.topic_partition import TopicPartition
from services.topic_pattern import compile_topic_pattern

log = logging.getLogger(__name__)

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


def sorted_partitions(partitions: Iterable[TopicPartition]) -> tuple[TopicPartition, ...]:
    return tuple(sorted(partitions))


@dataclass(frozen=True, slots=True)
class Subscription:
    """Explicit topic names, or a pattern (RE2, :mod:`services.topic_pattern`) fully matched
    against topic names."""

    topics: tuple[str, ...] = ()
    pattern: str = ""

    def resolve(self, topics: Mapping[str, int]) -> frozenset[str]:
        """The existing topics this subscription selects (explicit names only if they exist).

        Matches a pattern here and now, in time linear in the number of topics; the group state
        machine gets patterns matched in advance, off the event loop, through :class:`LiveTopics`.
        """
        if self.pattern:
            return select_matching(self.pattern, topics)
        return frozenset(t for t in self.topics if t in topics)


def select_matching(pattern: str, topics: Iterable[str]) -> frozenset[str]:
    """The topics ``pattern`` selects; none for a stored pattern that no longer compiles (one
    written before patterns were RE2: nothing can be matched with it, and its member must not
    stop the rest of the group from being assigned)."""
    try:
        compiled = compile_topic_pattern(pattern)
    except errors.InvalidRequestError as exc:
        log.warning("subscription pattern %r selects no topic: %s", pattern, exc.message)
        return frozenset()
    return compiled.select(topics)


class LiveTopics(Mapping[str, int]):
    """The live topics (name -> partition count) a rebalance sees, with what each subscription
    pattern selects among them.

    Matching a pattern is linear in the number of topics, but thousands of topics times many
    patterns is too much work for the event loop, so the group manager builds this off the loop
    (:class:`~coordinator.groups.matcher.TopicMatcher`) for every pattern the group uses and the
    state machine only looks the answers up. A pattern it was not built for is matched on the spot.
    """

    __slots__ = ("_counts", "_selections")

    def __init__(
        self, counts: Mapping[str, int], selections: Mapping[str, frozenset[str]] | None = None
    ) -> None:
        self._counts = counts
        self._selections = selections or {}

    def select(self, subscription: Subscription) -> frozenset[str]:
        """The topics ``subscription`` selects among these."""
        if subscription.pattern:
            selected = self._selections.get(subscription.pattern)
            return selected if selected is not None else select_matching(subscription.pattern, self._counts)
        return subscription.resolve(self._counts)

    def __getitem__(self, topic: str) -> int:
        return self._counts[topic]

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


def ensure_valid_subscription(subscription: Subscription) -> None:
    """INVALID_REQUEST unless exactly one of topics and pattern is given (and the pattern is one:
    :func:`services.topic_pattern.compile_topic_pattern`). Compiling may take up to ~0.2 s for
    the largest patterns accepted: callers on an event loop run this in a thread."""
    if subscription.topics and subscription.pattern:
        raise errors.InvalidRequestError("a subscription takes topic names or a pattern, not both")
    if not subscription.topics and not subscription.pattern:
        raise errors.InvalidRequestError("a subscription needs topic names or a pattern")
    if subscription.pattern:
        compile_topic_pattern(subscription.pattern)


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
