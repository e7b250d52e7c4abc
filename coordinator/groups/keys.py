"""Consumer groups in etcd: key layout, values, the writes a state change needs, loading. Pure.

Keys are relative to the cluster prefix ``/tributary/<cluster>/``:

======================================  ===========================================  =====================
key                                     value                                        lifetime
======================================  ===========================================  =====================
``groups/<g>``                          JSON: generation, assignor, target           persistent
                                        ({member: {topic: [p, ...]}}),
                                        awaiting_revoke, empty_since_ms
``groups/<g>/members/<member_id>``      JSON: instance_id, client_id, host,          the member's lease
                                        subscription {topics, pattern},
                                        session_timeout_ms, max_poll_interval_ms,
                                        assignor
``groups/<g>/owners/<topic>/<p>``       the owning member id (text)                  the owner's lease
``groups/<g>/offsets/<topic>/<p>``      JSON: offset, metadata, commit_timestamp,    persistent
                                        generation
======================================  ===========================================  =====================

The active controller holds one lease per member (TTL = the member's session timeout, rounded up
to whole seconds) and refreshes it on each of the member's heartbeats. A member that stops
heartbeating loses its lease: etcd deletes its member key and its owner keys in one revision,
and the controller, watching ``groups/``, removes it and rebalances. Everything a new active
controller needs to carry a group on is here: members (with their lease ids), the generation and
target, the ownership registry and the committed offsets.

Group ids and topic names contain no ``/`` (both are validated), so keys split unambiguously.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.groups.model import Member, OffsetRecord, Subscription
from coordinator.groups.state import GroupState
from services.clock import Clock
from services.etcd.txn import Op
from services.etcd.values import KeyValue
from services.topic_partition import TopicPartition

GROUPS = "groups/"
MEMBERS = "members"
OWNERS = "owners"
OFFSETS = "offsets"


class BadGroupValueError(ValueError):
    """A group key's value is not in the format this module writes."""


def group_key(group_id: str) -> str:
    return f"{GROUPS}{group_id}"


def group_prefix(group_id: str) -> str:
    """Prefix of every key below the group (with the trailing slash: exactly this group)."""
    return f"{GROUPS}{group_id}/"


def member_key(group_id: str, member_id: str) -> str:
    return f"{group_prefix(group_id)}{MEMBERS}/{member_id}"


def owner_key(group_id: str, tp: TopicPartition) -> str:
    return f"{group_prefix(group_id)}{OWNERS}/{tp.topic}/{tp.partition}"


def offset_key(group_id: str, tp: TopicPartition) -> str:
    return f"{group_prefix(group_id)}{OFFSETS}/{tp.topic}/{tp.partition}"


@dataclass(frozen=True, slots=True)
class GroupKey:
    """What a key under ``groups/`` names: ``kind`` is group, member, owner, offset or other."""

    kind: str
    group_id: str = ""
    member_id: str = ""
    tp: TopicPartition | None = None


def parse_group_key(key: str) -> GroupKey:
    if not key.startswith(GROUPS):
        return GroupKey("other")
    parts = key[len(GROUPS) :].split("/")
    if len(parts) == 1 and parts[0]:
        return GroupKey("group", parts[0])
    if len(parts) == 3 and parts[1] == MEMBERS and parts[2]:
        return GroupKey("member", parts[0], member_id=parts[2])
    if len(parts) == 4 and parts[1] in (OWNERS, OFFSETS) and parts[3].isdigit():
        kind = "owner" if parts[1] == OWNERS else "offset"
        return GroupKey(kind, parts[0], tp=TopicPartition(parts[2], int(parts[3])))
    return GroupKey("other")


# ---- values ---------------------------------------------------------------------------------------


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _load(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadGroupValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadGroupValueError("expected a JSON object")
    return value


def _int(value: dict[str, Any], name: str, default: int | None = None) -> int:
    item = value.get(name, default)
    if isinstance(item, bool) or not isinstance(item, int):
        raise BadGroupValueError(f"field {name!r} must be an integer, got {item!r}")
    return item


def _encode_partitions(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(tps):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return by_topic


def _decode_partitions(value: Any) -> frozenset[TopicPartition]:
    if not isinstance(value, dict):
        raise BadGroupValueError("partitions must be an object of topic -> [partition, ...]")
    return frozenset(TopicPartition(str(t), int(p)) for t, ps in value.items() for p in ps)


@dataclass(frozen=True, slots=True)
class StoredGroupState:
    """The persistent part of :class:`GroupState` (the ``groups/<g>`` value)."""

    generation: int = 0
    assignor: str = ""
    target: Mapping[str, frozenset[TopicPartition]] = field(default_factory=dict)
    awaiting_revoke: frozenset[str] = frozenset()
    empty_since_ms: int | None = None

    @classmethod
    def of(cls, state: GroupState) -> StoredGroupState:
        return cls(
            state.generation,
            state.assignor,
            dict(state.target),
            frozenset(state.awaiting_revoke),
            state.empty_since_ms,
        )


def encode_group_state(stored: StoredGroupState) -> bytes:
    return _dump(
        {
            "generation": stored.generation,
            "assignor": stored.assignor,
            "target": {m: _encode_partitions(tps) for m, tps in sorted(stored.target.items())},
            "awaiting_revoke": sorted(stored.awaiting_revoke),
            "empty_since_ms": stored.empty_since_ms,
        }
    )


def decode_group_state(raw: bytes) -> StoredGroupState:
    value = _load(raw)
    target = value.get("target", {})
    if not isinstance(target, dict):
        raise BadGroupValueError("field 'target' must be an object")
    empty_since = value.get("empty_since_ms")
    return StoredGroupState(
        generation=_int(value, "generation", 0),
        assignor=str(value.get("assignor", "")),
        target={str(m): _decode_partitions(tps) for m, tps in target.items()},
        awaiting_revoke=frozenset(str(m) for m in value.get("awaiting_revoke", [])),
        empty_since_ms=empty_since if isinstance(empty_since, int) else None,
    )


def _stored_member(member: Member) -> dict[str, Any]:
    return {
        "instance_id": member.instance_id,
        "client_id": member.client_id,
        "host": member.host,
        "subscription": {"topics": list(member.subscription.topics), "pattern": member.subscription.pattern},
        "session_timeout_ms": member.session_timeout_ms,
        "max_poll_interval_ms": member.max_poll_interval_ms,
        "assignor": member.assignor,
    }


def encode_member(member: Member) -> bytes:
    return _dump(_stored_member(member))


def decode_member(member_id: str, raw: bytes, *, lease_id: int, last_poll: float) -> Member:
    value = _load(raw)
    subscription = value.get("subscription") or {}
    if not isinstance(subscription, dict):
        raise BadGroupValueError("field 'subscription' must be an object")
    return Member(
        member_id=member_id,
        instance_id=str(value.get("instance_id", "")),
        client_id=str(value.get("client_id", "")),
        host=str(value.get("host", "")),
        subscription=Subscription(
            tuple(str(t) for t in subscription.get("topics", [])), str(subscription.get("pattern", ""))
        ),
        session_timeout_ms=_int(value, "session_timeout_ms"),
        max_poll_interval_ms=_int(value, "max_poll_interval_ms"),
        assignor=str(value.get("assignor", "")),
        lease_id=lease_id,
        last_poll=last_poll,
    )


def encode_offset(record: OffsetRecord) -> bytes:
    return _dump(
        {
            "offset": record.offset,
            "metadata": record.metadata,
            "commit_timestamp": record.commit_timestamp,
            "generation": record.generation,
        }
    )


def decode_offset(raw: bytes) -> OffsetRecord:
    value = _load(raw)
    return OffsetRecord(
        _int(value, "offset"),
        str(value.get("metadata", "")),
        _int(value, "commit_timestamp", -1),
        _int(value, "generation", -1),
    )


# ---- writes ---------------------------------------------------------------------------------------


def plan_writes(before: GroupState, after: GroupState) -> list[Op]:
    """The etcd operations that turn what ``before`` stored into what ``after`` must store.

    Member keys go first and owner keys last, so that if the operations must be split over
    several transactions, a member key exists before any owner key under its lease. Whatever
    prefix of them lands, :func:`restore_group` makes a consistent group of it.
    """
    group_id = after.group_id
    ops = [
        Op.put(member_key(group_id, m.member_id), encode_member(m), m.lease_id)
        for m in after.members.values()
        if _member_changed(before.members.get(m.member_id), m)
    ]
    ops += [Op.delete(member_key(group_id, m)) for m in before.members if m not in after.members]
    if StoredGroupState.of(after) != StoredGroupState.of(before):
        ops.append(Op.put(group_key(group_id), encode_group_state(StoredGroupState.of(after))))
    ops += [
        Op.put(owner_key(group_id, tp), owner, after.members[owner].lease_id)
        for tp, owner in sorted(after.owners.items())
        if before.owners.get(tp) != owner
    ]
    ops += [Op.delete(owner_key(group_id, tp)) for tp in sorted(before.owners) if tp not in after.owners]
    return ops


def _member_changed(old: Member | None, new: Member) -> bool:
    return old is None or old.lease_id != new.lease_id or _stored_member(old) != _stored_member(new)


# ---- loading --------------------------------------------------------------------------------------


@dataclass
class LoadedGroup:
    """A group read back from etcd by :func:`load_groups`."""

    state: GroupState
    offsets: dict[TopicPartition, OffsetRecord]
    #: Mod revision of ``groups/<g>`` (0 when it does not exist): commits are guarded by it.
    state_revision: int
    has_state_key: bool


@dataclass
class _Collected:
    state: KeyValue | None = None
    members: list[KeyValue] = field(default_factory=list)
    owners: list[tuple[TopicPartition, KeyValue]] = field(default_factory=list)
    offsets: list[tuple[TopicPartition, KeyValue]] = field(default_factory=list)


def load_groups(kvs: Iterable[KeyValue], clock: Clock) -> tuple[dict[str, LoadedGroup], list[str]]:
    """Every group under ``groups/`` (keys relative to the cluster prefix), and a description of
    each key that was skipped because its value is not in this module's format."""
    collected: dict[str, _Collected] = {}
    for kv in kvs:
        parsed = parse_group_key(kv.key)
        if parsed.kind == "other":
            continue
        entry = collected.setdefault(parsed.group_id, _Collected())
        if parsed.kind == "group":
            entry.state = kv
        elif parsed.kind == "member":
            entry.members.append(kv)
        elif parsed.tp is None:  # owner and offset keys always name a partition
            continue
        elif parsed.kind == "owner":
            entry.owners.append((parsed.tp, kv))
        else:
            entry.offsets.append((parsed.tp, kv))
    problems: list[str] = []
    groups = {g: restore_group(g, c, clock, problems) for g, c in collected.items()}
    return groups, problems


def restore_group(group_id: str, collected: _Collected, clock: Clock, problems: list[str]) -> LoadedGroup:
    """A consistent :class:`GroupState` from whatever is stored: owners of members that are gone
    are dropped; the caller rebalances if the members no longer match the target."""
    state = GroupState(group_id, clock)
    if collected.state is not None:
        _decoded(collected.state, problems, lambda kv: _apply_stored(state, decode_group_state(kv.value)))
    now = clock.monotonic()
    for kv in collected.members:
        member_id = parse_group_key(kv.key).member_id
        member = _decoded(
            kv,
            problems,
            lambda kv, member_id=member_id: decode_member(
                member_id, kv.value, lease_id=kv.lease, last_poll=now
            ),
        )
        if member is not None:
            state.members[member_id] = member
    state.owners = {tp: kv.value.decode(errors="replace") for tp, kv in collected.owners}
    state.drop_unknown_owners()
    if not state.members and state.empty_since_ms is None and collected.state is not None:
        state.empty_since_ms = clock.time_ms()
    offsets = {
        tp: record
        for tp, kv in collected.offsets
        if (record := _decoded(kv, problems, lambda kv: decode_offset(kv.value))) is not None
    }
    revision = collected.state.mod_revision if collected.state is not None else 0
    return LoadedGroup(state, offsets, revision, collected.state is not None)


def _decoded(kv: KeyValue, problems: list[str], decode):
    """``decode(kv)``, or None with the problem noted: one bad key must not lose the group."""
    try:
        return decode(kv)
    except (BadGroupValueError, TypeError, ValueError) as exc:
        problems.append(f"{kv.key}: {exc}")
        return None


def _apply_stored(state: GroupState, stored: StoredGroupState) -> None:
    state.generation = stored.generation
    state.assignor = stored.assignor
    state.target = dict(stored.target)
    state.awaiting_revoke = set(stored.awaiting_revoke)
    state.empty_since_ms = stored.empty_since_ms
