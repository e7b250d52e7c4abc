"""The consumer-group state machine: membership, generations, target assignment, ownership. Pure.

One :class:`GroupState` per group. It does no I/O: the manager copies it, applies one operation
to the copy, writes what changed to etcd (:func:`coordinator.groups.keys.plan_writes`) and only
then keeps the copy -- so a failed write leaves the state as etcd has it. Time comes from an
injected :class:`~services.clock.Clock`; lease ids are handed in by the caller.

**Model.** ``target`` is the assignment the assignor computed for the current ``generation``;
``owners`` is the ownership registry (the paper's): which member holds each partition right now.
A partition is granted to its target member only while nobody else holds it, so two members
never own one partition at once. A rebalance (a member joins, leaves, times out, changes its
subscription; a subscribed topic appears, grows or goes) recomputes ``target`` and bumps the
generation when it changed. Members then converge by heartbeats:

* each heartbeat reports the partitions the member still ``owned``; anything it no longer reports
  is released;
* the answer's ``revoke`` lists what it holds but must give up, ``assignment`` what it may hold
  now (kept plus newly granted), ``pending`` what it waits for (still held by others).

In the **cooperative** protocol (cooperative-sticky) ``revoke`` is only what moved; everything
else is kept throughout. In the **eager** protocol (range, round-robin, sticky) every member that
held partitions when the target changed is in ``awaiting_revoke``: it must give up everything
(report an empty ``owned``) before it is granted anything again.

**Static members** (``instance_id``) that rejoin with an empty member id within the session
timeout replace their previous incarnation: a new member id, the same target and partitions, no
rebalance and no new generation; the old member id is fenced (FENCED_INSTANCE_ID).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Collection, Iterable, Mapping

from coordinator.groups.assignors import ASSIGNORS, MemberSubscription
from coordinator.groups.model import (
    COOPERATIVE,
    DEFAULT_ASSIGNOR,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    JoinParams,
    LiveTopics,
    Member,
    MemberAssignment,
    heartbeat_interval_ms,
    protocol_of,
    sorted_partitions,
)
from services import errors
from services.clock import Clock
from services.topic_partition import TopicPartition

#: Replaced member ids remembered for FENCED_INSTANCE_ID answers (per group, oldest dropped).
MAX_FENCED = 1000


class JoinKind(enum.Enum):
    """What a JoinGroup means for the group (:meth:`GroupState.classify_join`)."""

    NEW = "new"  # a new member: new member id, new lease, rebalance
    REJOIN = "rejoin"  # a known member joining again: same id and lease
    REPLACE = "replace"  # a static member's restart: new id and lease, same assignment


def new_member_id(params: JoinParams) -> str:
    """Kafka's shape: the instance id (static) or client id, a dash, a uuid."""
    return f"{params.instance_id or params.client_id or 'member'}-{uuid.uuid4()}"


class GroupState:
    """One group's membership and assignment. See the module docstring. Not thread-safe."""

    def __init__(self, group_id: str, clock: Clock) -> None:
        self.group_id = group_id
        self.clock = clock
        self.generation = 0
        #: Kafka name of the group's assignor; "" until a member first joined.
        self.assignor = ""
        self.members: dict[str, Member] = {}
        self.target: dict[str, frozenset[TopicPartition]] = {}
        self.owners: dict[TopicPartition, str] = {}
        #: Eager protocol: members that must give up everything before new grants.
        self.awaiting_revoke: set[str] = set()
        #: What the current target was computed from (volatile: after a failover the first
        #: rebalance recomputes it, and an unchanged input gives an unchanged target).
        self.inputs: tuple | None = None
        #: Wall-clock ms when the group last lost its last member (offset retention starts then).
        self.empty_since_ms: int | None = None
        #: Member ids replaced by a static member's restart -> instance id (volatile).
        self.fenced: dict[str, str] = {}

    def copy(self) -> GroupState:
        """An independent copy (members, frozensets and keys are immutable and shared)."""
        other = GroupState(self.group_id, self.clock)
        other.generation, other.assignor, other.empty_since_ms = (
            self.generation,
            self.assignor,
            self.empty_since_ms,
        )
        other.members, other.target, other.owners = dict(self.members), dict(self.target), dict(self.owners)
        other.awaiting_revoke, other.inputs = set(self.awaiting_revoke), self.inputs
        other.fenced = dict(self.fenced)
        return other

    # -- queries ------------------------------------------------------------------------------------

    @property
    def protocol(self) -> str:
        return protocol_of(self.assignor or DEFAULT_ASSIGNOR)

    @property
    def state_name(self) -> str:
        """Empty (no members), Stable (everyone holds exactly its target) or PreparingRebalance."""
        if not self.members:
            return EMPTY
        held: dict[str, set[TopicPartition]] = {}
        for tp, owner in self.owners.items():
            held.setdefault(owner, set()).add(tp)
        if self.awaiting_revoke or any(
            held.get(m, set()) != self.target.get(m, frozenset()) for m in self.members
        ):
            return PREPARING_REBALANCE
        return STABLE

    def owned_by(self, member_id: str) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, owner in self.owners.items() if owner == member_id)

    def member_by_instance(self, instance_id: str) -> Member | None:
        return next((m for m in self.members.values() if instance_id and m.instance_id == instance_id), None)

    def ensure_member(self, member_id: str, instance_id: str = "") -> Member:
        """The member, or FENCED_INSTANCE_ID (a replaced incarnation) / UNKNOWN_MEMBER_ID."""
        member = self.members.get(member_id)
        if member is not None:
            if instance_id and member.instance_id != instance_id:
                raise errors.FencedInstanceIdError(
                    f"member {member_id} of group {self.group_id} has instance id {member.instance_id!r}, "
                    f"not {instance_id!r}"
                )
            return member
        if member_id in self.fenced or self.member_by_instance(instance_id) is not None:
            raise errors.FencedInstanceIdError(
                f"member {member_id} of group {self.group_id} was replaced by a newer incarnation of "
                f"static member {instance_id or self.fenced.get(member_id)}"
            )
        raise errors.UnknownMemberIdError(
            f"member {member_id!r} is not in group {self.group_id} "
            "(it left, timed out or was removed); join again"
        )

    def poll_expired(self, member_id: str) -> bool:
        """True when the member has not polled for longer than its max.poll.interval.ms."""
        member = self.members[member_id]
        return (self.clock.monotonic() - member.last_poll) * 1000 > member.max_poll_interval_ms

    # -- joining --------------------------------------------------------------------------------

    def classify_join(self, params: JoinParams) -> tuple[JoinKind, Member | None]:
        """What ``params`` means here, with the member it concerns (None for NEW); raises
        UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID / INCONSISTENT_GROUP_PROTOCOL."""
        existing: Member | None
        if params.member_id:
            member = self.ensure_member(params.member_id, params.instance_id)
            kind, existing = JoinKind.REJOIN, member
        else:
            existing = self.member_by_instance(params.instance_id)
            kind = JoinKind.NEW if existing is None else JoinKind.REPLACE
        self._ensure_compatible_assignor(params.assignor, existing)
        return kind, existing

    def _ensure_compatible_assignor(self, requested: str, existing: Member | None) -> None:
        others = [m for m in self.members.values() if existing is None or m.member_id != existing.member_id]
        if requested and others and requested != self.assignor:
            raise errors.InconsistentGroupProtocolError(
                f"group {self.group_id} uses the {self.assignor} assignor; this member asks for {requested}"
            )

    def join(
        self, params: JoinParams, topics: Mapping[str, int], *, member_id: str = "", lease_id: int = 0
    ) -> tuple[MemberAssignment, Member | None]:
        """Apply a join; returns the member's answer and the member it replaced (REPLACE), whose
        lease the caller should revoke. ``member_id`` and ``lease_id`` are the new member's
        (NEW and REPLACE); a REJOIN keeps its own."""
        kind, existing = self.classify_join(params)
        if kind is JoinKind.NEW:
            self._add(self._member(params, member_id, lease_id), topics)
            replaced = None
        elif kind is JoinKind.REPLACE:
            assert existing is not None
            self._replace(existing, self._member(params, member_id, lease_id), topics)
            replaced = existing
        else:
            assert existing is not None
            self._update(existing, params, topics)
            member_id = existing.member_id
        return self.assignment_for(member_id), replaced

    def _member(self, params: JoinParams, member_id: str, lease_id: int) -> Member:
        return Member(
            member_id=member_id,
            instance_id=params.instance_id,
            client_id=params.client_id,
            host=params.host,
            subscription=params.subscription,
            session_timeout_ms=params.session_timeout_ms,
            max_poll_interval_ms=params.max_poll_interval_ms,
            assignor=params.assignor or self.assignor or DEFAULT_ASSIGNOR,
            lease_id=lease_id,
            last_poll=self.clock.monotonic(),
        )

    def _add(self, member: Member, topics: Mapping[str, int]) -> None:
        if not self.members:
            self.assignor = member.assignor
            self.awaiting_revoke.clear()
        self.members[member.member_id] = member
        self.empty_since_ms = None
        self.rebalance(topics)

    def _replace(self, old: Member, new: Member, topics: Mapping[str, int]) -> None:
        """A static member's restart: the new incarnation takes over the old one's target and the
        partitions it held that are still its own (the rest is released: nobody consumes them)."""
        del self.members[old.member_id]
        self.members[new.member_id] = dataclasses.replace(new, assignor=self.assignor or new.assignor)
        target = self.target.pop(old.member_id, frozenset())
        self.target[new.member_id] = target
        for tp in self.owned_by(old.member_id):
            if tp in target and old.member_id not in self.awaiting_revoke:
                self.owners[tp] = new.member_id
            else:
                del self.owners[tp]
        self.awaiting_revoke.discard(old.member_id)
        self._remember_fenced(old)
        if old.subscription != new.subscription:
            self.rebalance(topics, force=True)

    def _remember_fenced(self, old: Member) -> None:
        self.fenced[old.member_id] = old.instance_id
        while len(self.fenced) > MAX_FENCED:
            del self.fenced[next(iter(self.fenced))]

    def _update(self, member: Member, params: JoinParams, topics: Mapping[str, int]) -> None:
        """A known member joining again: new settings; a rebalance if its subscription changed."""
        updated = dataclasses.replace(
            member,
            client_id=params.client_id,
            host=params.host,
            subscription=params.subscription,
            session_timeout_ms=params.session_timeout_ms,
            max_poll_interval_ms=params.max_poll_interval_ms,
            last_poll=self.clock.monotonic(),
        )
        if params.assignor and len(self.members) == 1:
            self.assignor = params.assignor  # the only member may switch the group's assignor
            updated = dataclasses.replace(updated, assignor=params.assignor)
        self.members[member.member_id] = updated
        if updated.subscription != member.subscription or updated.assignor != member.assignor:
            self.rebalance(topics, force=True)

    # -- heartbeats ---------------------------------------------------------------------------

    def heartbeat(
        self,
        member_id: str,
        generation: int,
        owned: Collection[TopicPartition],
        *,
        polled: bool,
        instance_id: str = "",
    ) -> MemberAssignment:
        """Record what the member still holds, release the rest, grant what is free."""
        member = self.ensure_member(member_id, instance_id)
        if generation > self.generation:
            raise errors.IllegalGenerationError(
                f"generation {generation} is ahead of group {self.group_id}'s generation {self.generation}"
            )
        if polled:
            self.members[member_id] = dataclasses.replace(member, last_poll=self.clock.monotonic())
        self.release_unreported(member_id, owned)
        return self.assignment_for(member_id)

    def release_unreported(self, member_id: str, owned: Collection[TopicPartition]) -> None:
        """Forget the member's partitions it no longer reports (it has given them up)."""
        still = set(owned)
        for tp in self.owned_by(member_id) - still:
            del self.owners[tp]
        if member_id in self.awaiting_revoke and not self.owned_by(member_id):
            self.awaiting_revoke.discard(member_id)

    def assignment_for(self, member_id: str) -> MemberAssignment:
        """The member's answer now; grants (records as owned) the free partitions of its target."""
        owned = self.owned_by(member_id)
        target = self.target.get(member_id, frozenset())
        if not owned:
            self.awaiting_revoke.discard(member_id)  # nothing left to give up
        if member_id in self.awaiting_revoke:
            revoke, grants = owned, frozenset[TopicPartition]()
        else:
            revoke = owned - target
            grants = frozenset(tp for tp in target - owned if tp not in self.owners)
        for tp in grants:
            self.owners[tp] = member_id
        assignment = (owned - revoke) | grants
        member = self.members[member_id]
        return MemberAssignment(
            member_id=member_id,
            generation=self.generation,
            assignor=self.assignor,
            assignment=sorted_partitions(assignment),
            revoke=sorted_partitions(revoke),
            pending=sorted_partitions(target - assignment),
            heartbeat_interval_ms=heartbeat_interval_ms(member.session_timeout_ms),
        )

    # -- leaving --------------------------------------------------------------------------------

    def remove(self, member_id: str, topics: Mapping[str, int]) -> Member | None:
        """Remove a member (left, session expired, poll timeout); its partitions are free at once.
        Returns the member, or None if it was not in the group."""
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        for tp in self.owned_by(member_id):
            del self.owners[tp]
        self.awaiting_revoke.discard(member_id)
        if not self.members:
            self.empty_since_ms = self.clock.time_ms()
        self.rebalance(topics)
        return member

    def leave(self, member_id: str, instance_id: str, topics: Mapping[str, int]) -> Member:
        """LeaveGroup: by member id, or by instance id alone (Kafka's static-member leave)."""
        if not member_id and instance_id:
            member = self.member_by_instance(instance_id)
            if member is None:
                raise errors.UnknownMemberIdError(
                    f"no member of group {self.group_id} has instance id {instance_id}"
                )
            member_id = member.member_id
        self.ensure_member(member_id, instance_id)
        removed = self.remove(member_id, topics)
        assert removed is not None
        return removed

    # -- assignment -------------------------------------------------------------------------------

    def resolved(self, topics: Mapping[str, int]) -> list[MemberSubscription]:
        """Members as the assignor sees them: subscriptions resolved against ``topics`` (patterns
        looked up when ``topics`` is a :class:`LiveTopics` that has them matched, else matched now)."""
        live = topics if isinstance(topics, LiveTopics) else LiveTopics(topics)
        return [
            MemberSubscription(m.member_id, live.select(m.subscription), m.instance_id)
            for m in self.members.values()
        ]

    def rebalance(self, topics: Mapping[str, int], *, force: bool = False) -> bool:
        """Recompute the target from the members and ``topics`` (live topic -> partition count;
        the manager passes a :class:`LiveTopics` with the patterns matched off the event loop)
        unless neither changed since the last time; bump the generation if the target changed.
        Returns whether it did."""
        members = self.resolved(topics)
        counts = _subscribed_counts(members, topics)
        inputs = (
            tuple(sorted((m.member_id, m.instance_id, tuple(sorted(m.topics))) for m in members)),
            tuple(counts.items()),
            self.assignor,
        )
        if inputs == self.inputs and not force:
            return False
        self.inputs = inputs
        assign = ASSIGNORS[self.assignor or DEFAULT_ASSIGNOR]
        target = assign(members, counts, self.target) if members else {}
        if target == self.target:
            return False
        self.target = dict(target)
        self.generation += 1
        if self.protocol != COOPERATIVE:
            self.awaiting_revoke = set(self.owners.values())
        return True

    def drop_unknown_owners(self) -> None:
        """Forget ownership by members that are gone (after loading a partial write)."""
        self.owners = {tp: m for tp, m in self.owners.items() if m in self.members}
        self.awaiting_revoke &= set(self.members)

    # -- commits ---------------------------------------------------------------------------------

    def ensure_can_commit(self, member_id: str, generation: int, instance_id: str = "") -> None:
        """Generation fencing of a commit (Kafka's rules): a standalone commit (no member id,
        generation -1) only while the group has no members; a member's only at the current
        generation."""
        if not member_id and generation < 0:
            if self.members:
                raise errors.UnknownMemberIdError(
                    f"group {self.group_id} has active members; commits without a member id and generation "
                    "(standalone consumers) are accepted only while it has none"
                )
            return
        self.ensure_member(member_id, instance_id)
        if generation != self.generation:
            raise errors.IllegalGenerationError(
                f"generation {generation} is not group {self.group_id}'s current generation "
                f"{self.generation}; heartbeat to learn the new one"
            )

    def commit_conflict(self, member_id: str, tp: TopicPartition) -> str | None:
        """The other member holding ``tp``, if any: only its holder (or anyone, while nobody holds
        it) may commit a partition."""
        owner = self.owners.get(tp)
        return owner if owner is not None and owner != member_id else None


def _subscribed_counts(members: Iterable[MemberSubscription], topics: Mapping[str, int]) -> dict[str, int]:
    names = set().union(*(m.topics for m in members))
    return {t: topics[t] for t in sorted(names)}
