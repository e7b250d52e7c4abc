"""The group state machine: joins, heartbeats and hand-offs, leaves, timeouts, static members,
generation fencing, and the etcd writes and reloads around it (all pure: a manual clock)."""

from __future__ import annotations

import pytest

from coordinator.groups import keys
from coordinator.groups.model import (
    COOPERATIVE_STICKY,
    EMPTY,
    PREPARING_REBALANCE,
    RANGE,
    STABLE,
    JoinParams,
    OffsetRecord,
    Subscription,
)
from coordinator.groups.offsets import expired_offsets, offsets_of_deleted_topics
from coordinator.groups.state import GroupState, JoinKind
from services import errors
from services.clock import ManualClock
from services.etcd.values import KeyValue
from services.topic_partition import TopicPartition as TP

TOPICS = {"t": 6}


def params(
    member_id="", *, instance="", topics=("t",), pattern="", assignor=COOPERATIVE_STICKY, poll_ms=300_000
):
    sub = Subscription((), pattern) if pattern else Subscription(tuple(topics))
    return JoinParams(
        "g",
        member_id=member_id,
        instance_id=instance,
        client_id="cli",
        subscription=sub,
        assignor=assignor,
        session_timeout_ms=10_000,
        max_poll_interval_ms=poll_ms,
    )


class Group:
    """A GroupState with helpers that act like members following the protocol."""

    def __init__(self, assignor=COOPERATIVE_STICKY):
        self.clock = ManualClock()
        self.state = GroupState("g", self.clock)
        self.assignor = assignor
        self.owned: dict[str, set] = {}
        self.revoked: dict[str, list] = {}
        self._next_lease = 100

    def join(self, name="", *, instance="", topics=TOPICS, **kw):
        self._next_lease += 1
        answer, _replaced = self.state.join(
            params(instance=instance, assignor=self.assignor, **kw),
            topics,
            member_id=name or f"m{self._next_lease}",
            lease_id=self._next_lease,
        )
        self.owned[answer.member_id] = set(answer.assignment)
        return answer

    def beat(self, member_id, *, generation=None):
        answer = self.state.heartbeat(
            member_id,
            self.state.generation if generation is None else generation,
            self.owned[member_id],
            polled=True,
        )
        self.revoked.setdefault(member_id, []).extend(answer.revoke)
        self.owned[member_id] = set(answer.assignment)  # commit + release the revoked ones
        return answer

    def settle(self, rounds=6):
        for _ in range(rounds):
            for member_id in list(self.state.members):
                self.beat(member_id)


def assert_exclusive(group: Group):
    """Members never hold one partition at once, and the registry agrees with them."""
    seen: dict = {}
    for member_id, tps in group.owned.items():
        if member_id not in group.state.members:
            continue
        for tp in tps:
            assert tp not in seen, f"{tp} held by {seen[tp]} and {member_id}"
            seen[tp] = member_id
            assert group.state.owners[tp] == member_id


def test_three_members_get_two_partitions_each():
    g = Group()
    for name in ("a", "b", "c"):
        g.join(name)
    g.settle()
    assert {m: len(tps) for m, tps in g.owned.items()} == {"a": 2, "b": 2, "c": 2}
    assert g.state.state_name == STABLE
    assert_exclusive(g)


def test_cooperative_fourth_member_only_moved_partitions_are_revoked():
    g = Group()
    for name in ("a", "b", "c"):
        g.join(name)
    g.settle()
    before = {m: set(tps) for m, tps in g.owned.items()}
    generation = g.state.generation
    g.revoked.clear()
    answer = g.join("d")
    assert g.state.generation == generation + 1
    assert answer.assignment == () and len(answer.pending) == 1  # held by its old owner for now
    g.settle()
    revoked = [tp for tps in g.revoked.values() for tp in tps]
    assert revoked == list(g.owned["d"]) and len(revoked) == 1
    for m in "abc":  # everything else stayed put
        assert before[m] - set(revoked) <= g.owned[m]
    assert_exclusive(g)


def test_cooperative_partition_moves_only_after_the_owner_releases_it():
    g = Group()
    g.join("a")
    g.settle()
    d = g.join("d")
    moving = set(d.pending)
    # a has not heartbeat yet: d still waits, and a is told to revoke.
    assert g.beat("d").assignment == ()
    a = g.state.heartbeat("a", g.state.generation, g.owned["a"], polled=True)
    assert set(a.revoke) == moving and not moving & set(a.assignment)
    assert g.beat("d").assignment == ()  # still held: a has not reported the smaller set
    g.state.heartbeat("a", g.state.generation, set(a.assignment), polled=True)
    assert set(g.beat("d").assignment) == moving


def test_eager_members_revoke_everything_before_new_grants():
    g = Group(assignor=RANGE)
    g.join("a")
    g.join("b")
    g.settle()
    g.revoked.clear()
    g.join("c")
    first = g.beat("a")
    assert set(first.revoke) == {TP("t", p) for p in range(3)} and first.assignment == ()
    g.settle()
    assert {m: sorted(tp.partition for tp in tps) for m, tps in g.owned.items()} == {
        "a": [0, 1],
        "b": [2, 3],
        "c": [4, 5],
    }
    assert len(g.revoked["a"]) == 3 and len(g.revoked["b"]) == 3
    assert_exclusive(g)


def test_leave_frees_partitions_at_once_and_rebalances():
    g = Group()
    for name in ("a", "b", "c"):
        g.join(name)
    g.settle()
    generation = g.state.generation
    g.revoked.clear()
    g.state.leave("c", "", TOPICS)
    assert g.state.generation == generation + 1 and "c" not in g.state.members
    g.settle()
    assert sorted(len(g.owned[m]) for m in "ab") == [3, 3]
    assert not g.revoked.get("a") and not g.revoked.get("b")


def test_timeout_removal_and_unknown_member_afterwards():
    g = Group()
    g.join("a")
    g.join("b")
    g.settle()
    g.state.remove("b", TOPICS)  # its lease expired
    with pytest.raises(errors.UnknownMemberIdError):
        g.state.heartbeat("b", g.state.generation, set(), polled=True)
    g.settle()
    assert len(g.owned["a"]) == 6


def test_poll_interval_expiry():
    g = Group()
    g.state.join(params(poll_ms=1_000), TOPICS, member_id="a", lease_id=1)
    g.clock.advance(900)
    assert not g.state.poll_expired("a")
    g.state.heartbeat("a", g.state.generation, set(), polled=False)
    g.clock.advance(200)
    assert g.state.poll_expired("a")
    g.state.heartbeat("a", g.state.generation, set(), polled=True)
    assert not g.state.poll_expired("a")


def test_static_member_restart_keeps_assignment_without_rebalance():
    g = Group()
    g.join("a", instance="i-a")
    g.join("b", instance="i-b")
    g.settle()
    generation, owned_b = g.state.generation, set(g.owned["b"])
    assert g.state.classify_join(params(instance="i-b"))[0] is JoinKind.REPLACE
    answer, replaced = g.state.join(params(instance="i-b"), TOPICS, member_id="b2", lease_id=7)
    assert replaced.member_id == "b" and set(answer.assignment) == owned_b and answer.revoke == ()
    assert g.state.generation == generation and g.state.members["b2"].lease_id == 7
    with pytest.raises(errors.FencedInstanceIdError):
        g.state.heartbeat("b", generation, owned_b, polled=True)
    with pytest.raises(errors.FencedInstanceIdError):
        g.state.ensure_can_commit("b", generation, "i-b")


def test_known_instance_with_unknown_member_id_is_fenced():
    g = Group()
    g.join("a", instance="i-a")
    with pytest.raises(errors.FencedInstanceIdError):
        g.state.classify_join(params("zombie", instance="i-a"))


def test_stale_generation_commit_is_rejected():
    g = Group()
    g.join("a")
    g.settle()
    old = g.state.generation
    g.join("b")
    with pytest.raises(errors.IllegalGenerationError):
        g.state.ensure_can_commit("a", old)
    g.state.ensure_can_commit("a", g.state.generation)
    with pytest.raises(errors.UnknownMemberIdError):
        g.state.ensure_can_commit("nobody", g.state.generation)


def test_standalone_commits_only_while_empty():
    g = Group()
    g.state.ensure_can_commit("", -1)
    g.join("a")
    with pytest.raises(errors.UnknownMemberIdError):
        g.state.ensure_can_commit("", -1)


def test_commit_conflict_only_for_partitions_another_member_holds():
    g = Group()
    g.join("a")
    g.settle()
    g.join("b")
    tp = next(iter(g.state.target["b"]))
    assert g.state.commit_conflict("b", tp) == "a"  # still a's during the hand-off
    assert g.state.commit_conflict("a", tp) is None  # its holder may commit it (before releasing)


def test_inconsistent_assignor_is_refused():
    g = Group()
    g.join("a")
    with pytest.raises(errors.InconsistentGroupProtocolError):
        g.state.classify_join(params(assignor=RANGE))


def test_pattern_subscription_rebalances_when_a_matching_topic_appears():
    g = Group()
    g.join("a", pattern=r"orders\..*", topics={"orders.eu": 2})
    g.settle()
    generation = g.state.generation
    assert not g.state.rebalance({"orders.eu": 2, "other": 3})
    assert g.state.rebalance({"orders.eu": 2, "orders.us": 2, "other": 3})
    assert g.state.generation == generation + 1
    assert {tp.topic for tp in g.state.target[next(iter(g.state.members))]} == {"orders.eu", "orders.us"}


def test_added_partitions_rebalance_and_deleted_topics_are_revoked():
    g = Group()
    g.join("a", topics={"t": 6, "u": 2})
    g.settle()
    generation = g.state.generation
    assert g.state.rebalance({"t": 8})  # grew; and nobody subscribes to u anyway
    assert g.state.generation == generation + 1 and len(g.state.target["a"]) == 8
    g.settle()
    assert len(g.owned["a"]) == 8
    deleted = g.state.heartbeat("a", g.state.generation, g.owned["a"], polled=True)
    assert deleted.revoke == ()
    g.state.rebalance({})  # the topic was deleted
    answer = g.beat("a")
    assert len(answer.revoke) == 8 and answer.assignment == ()


def test_leave_by_instance_id_alone():
    g = Group()
    g.join("a", instance="i-a")
    g.join("b")
    removed = g.state.leave("", "i-a", TOPICS)
    assert removed.member_id == "a" and set(g.state.members) == {"b"}
    with pytest.raises(errors.UnknownMemberIdError):
        g.state.leave("", "i-a", TOPICS)


def test_state_names():
    g = Group()
    assert g.state.state_name == EMPTY
    g.join("a")
    g.join("b")
    assert g.state.state_name == PREPARING_REBALANCE
    g.settle()
    assert g.state.state_name == STABLE


# ---- etcd writes and reloads ------------------------------------------------------------------------


def stored_kvs(ops, lease_of=None):
    """The keys a sequence of ops leaves (as etcd would), as KeyValues."""
    store = {}
    for op in ops:
        if op.kind == "put":
            store[op.key] = (op.value, op.lease)
        else:
            store.pop(op.key, None)
    return [KeyValue(k, v, 1, 5, 1, lease) for k, (v, lease) in store.items()]


def test_writes_then_reload_give_the_same_group():
    g = Group()
    for name in ("a", "b", "c"):
        g.join(name, instance=f"i-{name}" if name == "a" else "")
    g.settle()
    empty = GroupState("g", g.clock)
    ops = keys.plan_writes(empty, g.state)
    assert all(len(op.key) < 200 for op in ops)
    loaded, problems = keys.load_groups(stored_kvs(ops), g.clock)
    assert problems == []
    back = loaded["g"].state
    assert back.generation == g.state.generation and back.target == g.state.target
    assert back.owners == g.state.owners and back.members == g.state.members
    assert not back.rebalance(TOPICS), "a reload changes nothing"
    assert keys.plan_writes(g.state, g.state.copy()) == []


def test_reload_after_members_expired_drops_their_ownership():
    g = Group()
    g.join("a")
    g.join("b")
    g.settle()
    kvs = [
        kv
        for kv in stored_kvs(keys.plan_writes(GroupState("g", g.clock), g.state))
        if kv.lease != g.state.members["b"].lease_id
    ]  # b's lease expired during a failover
    back = keys.load_groups(kvs, g.clock)[0]["g"].state
    assert "b" not in back.members and set(back.owners.values()) == {"a"}
    assert back.rebalance(TOPICS) and back.target["a"] == frozenset(TP("t", p) for p in range(6))


def test_plan_writes_lists_only_what_changed():
    g = Group()
    g.join("a")
    g.settle()
    before = g.state.copy()
    g.state.heartbeat("a", g.state.generation, g.owned["a"], polled=True)
    assert keys.plan_writes(before, g.state) == []  # a steady heartbeat writes nothing
    g.join("b")
    changed = {op.key for op in keys.plan_writes(before, g.state)}
    assert keys.group_key("g") in changed and any("/members/" in k for k in changed)


def test_keys_parse_back():
    tp = TP("orders", 3)
    assert keys.parse_group_key(keys.offset_key("g1", tp)) == keys.GroupKey("offset", "g1", tp=tp)
    assert keys.parse_group_key(keys.owner_key("g1", tp)).kind == "owner"
    assert keys.parse_group_key(keys.member_key("g1", "m-1")) == keys.GroupKey(
        "member", "g1", member_id="m-1"
    )
    assert keys.parse_group_key(keys.group_key("g1")) == keys.GroupKey("group", "g1")
    assert keys.parse_group_key("topics/x").kind == "other"
    record = OffsetRecord(42, "meta", 1000, 3)
    assert keys.decode_offset(keys.encode_offset(record)) == record


# ---- offsets ------------------------------------------------------------------------------------------


def test_offsets_expire_only_once_the_group_is_empty():
    offsets = {
        TP("t", 0): OffsetRecord(5, commit_timestamp=1_000),
        TP("t", 1): OffsetRecord(5, commit_timestamp=9_000),
    }
    assert (
        expired_offsets(offsets, has_members=True, empty_since_ms=None, now_ms=10**9, retention_ms=10) == []
    )
    assert expired_offsets(
        offsets, has_members=False, empty_since_ms=None, now_ms=10_000, retention_ms=5_000
    ) == [TP("t", 0)]
    assert (
        expired_offsets(offsets, has_members=False, empty_since_ms=8_000, now_ms=12_000, retention_ms=5_000)
        == []
    )


def test_offsets_of_deleted_topics():
    offsets = {TP("t", 0): OffsetRecord(1), TP("t", 5): OffsetRecord(1), TP("gone", 0): OffsetRecord(1)}
    assert offsets_of_deleted_topics(offsets, {"t": 2}) == [TP("gone", 0), TP("t", 5)]
