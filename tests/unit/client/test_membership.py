"""The consumer's pure group state: what to revoke, assign or drop after each coordinator answer,
what heartbeats report, when they are due; auto-commit timing."""

import math

import pytest

from gateway.client.membership import (
    PENDING_HEARTBEAT_S,
    AutoCommitTimer,
    GroupMembership,
    RebalancePlan,
    changed_offsets,
)
from gateway.client.structs import TopicPartition
from services.errors import FencedInstanceIdError

T0, T1, T2, T3, T4, T5 = (TopicPartition("t", p) for p in range(6))


def joined(assignment=(), *, pending=(), generation=1, interval_ms=3000, now=0.0) -> GroupMembership:
    membership = GroupMembership(heartbeat_interval_ms=interval_ms)
    membership.request_join()
    membership.on_join("m-1", generation, assignment, pending, interval_ms, now)
    return membership


def apply(membership: GroupMembership) -> list[tuple[str, set]]:
    """Do what a consumer does with the plan, in order; returns the listener calls it would make."""
    calls = []
    plan = membership.plan()
    if plan.lost:
        calls.append(("lost", set(plan.lost)))
        membership.complete_loss(plan.lost)
    plan = membership.plan()
    if plan.revoked:
        calls.append(("revoked", set(plan.revoked)))
        membership.complete_revocation(plan.revoked)
    plan = membership.plan()
    if plan.assigned:
        calls.append(("assigned", set(plan.assigned)))
        membership.complete_assignment(plan.assigned)
    return calls


def test_first_join_assigns_everything_and_reports_it_owned_at_once():
    membership = joined([T0, T1])
    assert membership.plan() == RebalancePlan(1, assigned=frozenset({T0, T1}))
    # Granted partitions are ours before poll() applies them: leaving them out would release them.
    assert membership.owned_to_report() == [T0, T1]
    assert apply(membership) == [("assigned", {T0, T1})]
    assert membership.held == {T0, T1} and not membership.plan()


def test_cooperative_revokes_only_what_moved_and_keeps_reporting_it_until_given_up():
    membership = joined([T0, T1, T2])
    apply(membership)
    membership.on_heartbeat(2, [T0, T1], [], now=1.0)  # T2 moves to a new member
    assert membership.plan() == RebalancePlan(2, revoked=frozenset({T2}))
    assert membership.owned_to_report() == [T0, T1, T2], "still consumed until the consumer gives it up"
    assert apply(membership) == [("revoked", {T2})]
    assert membership.owned_to_report() == [T0, T1]
    assert membership.heartbeat_delay(now=1.0) == 0.0, "report the smaller owned set at once"
    membership.heartbeat_sent(1.0)
    assert membership.heartbeat_delay(now=1.0) == pytest.approx(3.0)


def test_eager_revokes_everything_then_assigns_the_new_set():
    membership = joined([T0, T1, T2])
    apply(membership)
    membership.on_heartbeat(2, [], [T0, T1], now=1.0)  # eager: everything revoked, nothing assigned
    assert apply(membership) == [("revoked", {T0, T1, T2})]
    assert membership.owned_to_report() == []
    membership.on_heartbeat(2, [T0, T1], [], now=1.1)
    assert apply(membership) == [("assigned", {T0, T1})]


def test_partitions_held_but_in_neither_list_are_revoked_too():
    membership = joined([T0, T1])
    apply(membership)
    membership.on_heartbeat(3, [T0], [], now=1.0)  # T1 in neither assignment nor revoke
    assert membership.plan().revoked == {T1}


def test_revocation_and_new_grants_in_one_answer_revoke_first():
    membership = joined([T0, T1])
    apply(membership)
    membership.on_heartbeat(2, [T0, T3], [], now=1.0)
    assert apply(membership) == [("revoked", {T1}), ("assigned", {T3})]


def test_a_grant_taken_back_before_poll_applied_it_is_never_seen():
    membership = joined([T0])
    apply(membership)
    membership.on_heartbeat(2, [T0, T1], [], now=1.0)  # T1 granted ...
    membership.on_heartbeat(3, [T0], [], now=1.1)  # ... and moved on before the next poll
    assert not membership.plan()
    assert membership.owned_to_report() == [T0], "not reported: the coordinator may give it to someone else"


def test_pending_partitions_make_heartbeats_prompt():
    membership = joined([T0], pending=[T1], now=5.0)
    assert membership.heartbeat_delay(now=5.0) == pytest.approx(PENDING_HEARTBEAT_S)
    assert membership.heartbeat_delay(now=5.5) == 0.0
    membership.on_heartbeat(1, [T0, T1], [], now=5.5)
    assert membership.heartbeat_delay(now=5.5) == pytest.approx(3.0)


def test_the_coordinator_may_shorten_but_not_lengthen_the_heartbeat_interval():
    shorter = GroupMembership(heartbeat_interval_ms=3000)
    shorter.on_join("m", 1, [], [], 2000, now=0.0)
    assert shorter.heartbeat_interval_ms == 2000
    longer = GroupMembership(heartbeat_interval_ms=500)
    longer.on_join("m", 1, [], [], 2000, now=0.0)
    assert longer.heartbeat_interval_ms == 500


def test_unknown_member_loses_everything_and_joins_afresh():
    membership = joined([T0, T1], generation=4)
    apply(membership)
    membership.poll_started()
    membership.on_member_lost()
    assert (membership.member_id, membership.generation, membership.needs_join) == ("", -1, True)
    assert membership.heartbeat_delay(now=0.0) == 0.0, "lost inside poll: join again at once"
    assert membership.owned_to_report() == []
    # Rejoined (the same partitions came back) before poll() dropped the lost ones:
    membership.on_join("m-2", 5, [T1, T2], [], 3000, now=1.0)
    assert apply(membership) == [("lost", {T0, T1}), ("assigned", {T1, T2})]
    assert membership.held == {T1, T2} and not membership.lost


def test_a_member_lost_outside_poll_rejoins_only_when_the_application_polls_again():
    membership = joined([T0])
    apply(membership)
    membership.on_member_lost()  # e.g. removed after max_poll_interval_ms without a poll
    assert membership.needs_join and membership.heartbeat_delay(now=0.0) == math.inf
    membership.poll_started()
    assert membership.heartbeat_delay(now=0.0) == 0.0
    membership.poll_finished()
    membership.poll_started()  # lost while a poll is in progress: join at once
    membership.on_member_lost()
    assert membership.heartbeat_delay(now=0.0) == 0.0


def test_fenced_loses_everything_and_stops():
    membership = joined([T0])
    apply(membership)
    error = FencedInstanceIdError("replaced")
    membership.on_fenced(error)
    assert membership.fatal is error and not membership.is_member and not membership.needs_join
    assert apply(membership) == [("lost", {T0})]


def test_a_partition_found_moved_by_a_commit_is_lost():
    membership = joined([T0, T1])
    apply(membership)
    membership.mark_moved([T1, T3])
    assert membership.plan().lost == {T1}, "only what is held can be lost"
    assert not membership.holds(T1) and membership.holds(T0)
    assert membership.owned_to_report() == [T0]
    assert apply(membership) == [("lost", {T1})], "not taken again from the stale answer"


def test_holds_covers_partitions_being_revoked():
    membership = joined([T0, T1])
    apply(membership)
    membership.on_heartbeat(2, [T0], [], now=1.0)
    assert membership.holds(T1), "a commit before giving it up is accepted"
    apply(membership)
    assert not membership.holds(T1)


def test_polled_is_true_once_per_poll_and_while_inside_one():
    membership = joined()
    assert membership.take_polled() is False
    membership.poll_started()
    membership.poll_finished()
    assert membership.take_polled() is True
    assert membership.take_polled() is False, "reset by the heartbeat that carried it"
    membership.poll_started()  # a long blocking poll: the application is polling
    assert membership.take_polled() is True and membership.take_polled() is True
    membership.poll_finished()
    assert membership.take_polled() is False


def test_leave_forgets_the_membership():
    membership = joined([T0])
    apply(membership)
    membership.leave()
    assert (membership.member_id, membership.generation, membership.held) == ("", -1, set())
    assert not membership.plan()


def test_auto_commit_timer():
    timer = AutoCommitTimer(5000, now=10.0)
    assert not timer.due(14.9) and timer.due(15.0)
    timer.reset(15.2)
    assert not timer.due(20.1) and timer.due(20.2)
    with pytest.raises(ValueError):
        AutoCommitTimer(0, now=0.0)


def test_changed_offsets_skips_what_was_committed_already():
    assert changed_offsets({T0: 5, T1: 7, T2: 0}, {T0: 5, T1: 6}) == {T1: 7, T2: 0}
