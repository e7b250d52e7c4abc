"""A consumer's side of group membership: pure state and decisions, no I/O, no clock reads.

aiokafka keeps ``SubscriptionState`` apart from its coordinator's I/O; this module is that split
for groups. :class:`GroupMembership` is what a member knows; the I/O routine in
:mod:`gateway.client.group_coordinator` feeds it every JoinGroup / Heartbeat answer and error, and
asks it what to send and when, and what the consumer must change. Time is passed in (``now``, in
monotonic seconds).

**The protocol** (server-side assignment; the coordinator is in ``coordinator/groups``):

* Join with an empty member id the first time (and after UNKNOWN_MEMBER_ID); keep the id the
  answer gives.
* Heartbeat every ``heartbeat_interval_ms``; every ~100 ms while ``pending`` is non-empty (the
  coordinator promised us partitions another member still holds); at once after giving
  partitions up. A heartbeat reports ``owned`` -- what the member still holds -- and leaving a
  partition out of it is what releases the partition to its next owner.
* Every answer carries ``assignment``: what the member may hold now. Whatever it holds outside
  ``assignment`` must be given up (the answer's ``revoke``, and anything else held that is in
  neither list); what ``assignment`` has that it does not hold yet is new. Eager assignors answer
  the first heartbeat after a rebalance with everything revoked and nothing assigned; the new
  assignment comes once the member reported ``owned=[]``. Cooperative-sticky revokes only what
  moves. The member's loop is the same for both, so nothing here depends on the assignor.

**Held versus reported.** ``held`` is what the consumer really consumes (its subscription state);
it changes only when the consumer has applied a change (:meth:`complete_revocation`,
:meth:`complete_assignment`, :meth:`complete_loss`), which happens inside ``poll()`` so that
rebalance listeners run on the application's thread, as Kafka's do. Until then heartbeats keep
reporting the revoked partitions (they are still consumed) *and* the newly granted ones (they are
ours already: leaving them out would hand them back).

**Lost.** UNKNOWN_MEMBER_ID (the session expired, or the member was removed for not polling) and
FENCED_INSTANCE_ID end the membership: whatever is held is *lost* -- dropped without a commit
(another member may own it already) via ``on_partitions_lost``. A commit refused per partition
with ILLEGAL_GENERATION means that partition moved: it is lost too. After UNKNOWN_MEMBER_ID the
member joins again only once the application polls (at once if a poll is in progress), as Kafka's
consumer rejoins from ``poll()``: an application stuck past ``max_poll_interval_ms`` must not keep
taking partitions back in the background, which would rebalance the group again and again.

Not thread-safe: owned by the consumer's event loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.client.structs import TopicPartition

#: How often to heartbeat while partitions promised to us are still held by another member.
PENDING_HEARTBEAT_S = 0.1


@dataclass(frozen=True)
class RebalancePlan:
    """What the consumer must change now, in this order: drop ``lost`` (no commit), give up
    ``revoked`` (commit first), then take ``assigned``."""

    generation: int
    lost: frozenset[TopicPartition] = frozenset()
    revoked: frozenset[TopicPartition] = frozenset()
    assigned: frozenset[TopicPartition] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.lost or self.revoked or self.assigned)


class GroupMembership:
    """One member's view of its group. See the module docstring."""

    def __init__(self, *, heartbeat_interval_ms: int) -> None:
        #: The configured heartbeat period; the coordinator may ask for a shorter one.
        self.configured_heartbeat_interval_ms = heartbeat_interval_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.member_id = ""
        self.generation = -1
        self.needs_join = False
        #: What the consumer consumes now.
        self.held: set[TopicPartition] = set()
        #: Held partitions whose ownership ended without a revocation (drop them, no commit).
        self.lost: set[TopicPartition] = set()
        #: The coordinator's latest ``assignment`` / ``pending`` for this member.
        self.assignment: frozenset[TopicPartition] = frozenset()
        self.pending: frozenset[TopicPartition] = frozenset()
        #: An error that ends the membership for good (FENCED_INSTANCE_ID, a rejected config).
        self.fatal: BaseException | None = None
        self._heartbeat_now = False
        self._last_heartbeat = float("-inf")
        self._polled = False
        self._polls_in_progress = 0
        #: Lost the membership while the application was not polling: rejoin at its next poll.
        self._join_at_next_poll = False

    # -- joining ------------------------------------------------------------------------------

    @property
    def is_member(self) -> bool:
        """Whether the member has an id the coordinator knows (commits can carry it)."""
        return bool(self.member_id) and self.fatal is None

    def request_join(self) -> None:
        """Join (again) at the next turn of the routine: after subscribing or changing the
        subscription (a known member rejoins with its id, so nothing is lost)."""
        self.needs_join = True
        self.fatal = None
        self._join_at_next_poll = False

    def on_join(
        self,
        member_id: str,
        generation: int,
        assignment: Iterable[TopicPartition],
        pending: Iterable[TopicPartition],
        heartbeat_interval_ms: int,
        now: float,
    ) -> None:
        """A JoinGroup answer. (Its ``revoke`` needs no handling of its own: whatever is held
        outside ``assignment`` is revoked anyway.)"""
        self.member_id, self.needs_join = member_id, False
        if heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = min(self.configured_heartbeat_interval_ms, heartbeat_interval_ms)
        self._on_answer(generation, assignment, pending, now)

    # -- heartbeats ---------------------------------------------------------------------------

    def owned_to_report(self) -> list[TopicPartition]:
        """``owned`` for the next heartbeat: held and not lost, plus everything granted."""
        return sorted((self.held - self.lost) | self.assignment)

    def take_polled(self) -> bool:
        """Whether the application polled since the last heartbeat (or is inside ``poll`` now);
        resets the flag."""
        polled = self._polled or self._polls_in_progress > 0
        self._polled = False
        return polled

    def poll_started(self) -> None:
        self._polled = True
        self._polls_in_progress += 1
        self._join_at_next_poll = False

    def poll_finished(self) -> None:
        self._polls_in_progress = max(0, self._polls_in_progress - 1)

    def heartbeat_sent(self, now: float) -> None:
        self._last_heartbeat = now
        self._heartbeat_now = False

    def on_heartbeat(
        self,
        generation: int,
        assignment: Iterable[TopicPartition],
        pending: Iterable[TopicPartition],
        now: float,
    ) -> None:
        """A Heartbeat answer (see the module docstring for what it means)."""
        self._on_answer(generation, assignment, pending, now)

    def _on_answer(
        self,
        generation: int,
        assignment: Iterable[TopicPartition],
        pending: Iterable[TopicPartition],
        now: float,
    ) -> None:
        self.generation = generation
        self.assignment = frozenset(assignment)
        self.pending = frozenset(pending)
        self._last_heartbeat = max(self._last_heartbeat, now)

    def heartbeat_soon(self) -> None:
        """Heartbeat at the next turn (after giving partitions up; to learn a new generation)."""
        self._heartbeat_now = True

    def heartbeat_delay(self, now: float) -> float:
        """Seconds until the next heartbeat (or join) is due; ``math.inf`` while a lost member
        waits for the application's next poll to join again."""
        if self.needs_join:
            return math.inf if self._join_at_next_poll else 0.0
        if self._heartbeat_now:
            return 0.0
        if self.pending:
            return max(0.0, min(PENDING_HEARTBEAT_S, self._last_heartbeat + PENDING_HEARTBEAT_S - now))
        return max(0.0, self._last_heartbeat + self.heartbeat_interval_ms / 1000.0 - now)

    # -- the membership ending ----------------------------------------------------------------

    def on_member_lost(self) -> None:
        """UNKNOWN_MEMBER_ID: we are out of the group; everything held is lost; join afresh."""
        self.lost |= self.held
        self.member_id, self.generation = "", -1
        self.assignment = self.pending = frozenset()
        self.needs_join = True
        self._join_at_next_poll = self._polls_in_progress == 0

    def on_fenced(self, error: BaseException) -> None:
        """FENCED_INSTANCE_ID (a newer incarnation of this static member took over) or a fatal
        join error: everything held is lost, and the member stops."""
        self.lost |= self.held
        self.assignment = self.pending = frozenset()
        self.fatal = error
        self.needs_join = False

    def leave(self) -> None:
        """The member left (or unsubscribed): forget the membership; nothing is lost."""
        self.member_id, self.generation, self.needs_join = "", -1, False
        self.assignment = self.pending = frozenset()
        self.held.clear()
        self.lost.clear()
        self.fatal = None

    def mark_moved(self, partitions: Iterable[TopicPartition]) -> None:
        """A commit said these partitions moved to another member: they are lost, and no longer
        ours to report or take again until an answer of the coordinator grants them anew."""
        partitions = set(partitions)
        self.lost |= partitions & self.held
        self.assignment -= partitions

    # -- what the consumer must do --------------------------------------------------------------

    def plan(self) -> RebalancePlan:
        """The changes the consumer should make now (see :class:`RebalancePlan`)."""
        lost = frozenset(self.lost & self.held)
        kept = self.held - lost
        return RebalancePlan(
            self.generation,
            lost=lost,
            revoked=frozenset(kept - self.assignment),
            assigned=frozenset(self.assignment - kept),
        )

    def holds(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` is still ours to commit: held and not lost (a partition being revoked
        is still held until the consumer gives it up)."""
        return tp in self.held and tp not in self.lost

    def complete_loss(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = set(partitions)
        self.held -= partitions
        self.lost -= partitions

    def complete_revocation(self, partitions: Iterable[TopicPartition]) -> None:
        """The consumer gave ``partitions`` up: report it at once, which releases them."""
        self.held -= set(partitions)
        self._heartbeat_now = True

    def complete_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        self.held |= set(partitions)


class AutoCommitTimer:
    """When ``poll`` should commit what was consumed (Kafka's ``auto.commit.interval.ms``)."""

    def __init__(self, interval_ms: int, now: float) -> None:
        if interval_ms <= 0:
            raise ValueError("auto_commit_interval_ms must be positive")
        self.interval_s = interval_ms / 1000.0
        self.next_at = now + self.interval_s

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def reset(self, now: float) -> None:
        self.next_at = now + self.interval_s


def changed_offsets(
    consumed: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The consumed offsets that differ from what this consumer last committed (an auto-commit
    of an idle consumer sends nothing)."""
    return {tp: offset for tp, offset in consumed.items() if committed.get(tp) != offset}
