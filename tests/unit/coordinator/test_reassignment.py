"""Partition reassignment's pure decisions: validation, start, completion, cancel; the etcd
value round trip; automatic preferred-leader balance."""

import pytest

from coordinator import keys
from coordinator.leader_balance import imbalanced_partitions
from coordinator.metadata import MetadataState
from coordinator.model import PartitionRecord, PartitionStatus, RegisteredBroker, TopicRecord
from coordinator.partition_state import plan_node_sync
from coordinator.reassignment import (
    cancel_reassignment,
    plan_completion,
    start_reassignment,
    validate_target,
    with_assignment,
)
from services import errors

ONLINE = PartitionStatus.ONLINE
LIVE = {0, 1, 2, 3}


def topic(assignment, name="t", **configs):
    return TopicRecord(name, "id", len(assignment[0]), configs, tuple(tuple(r) for r in assignment))


def record(replicas, leader, isr, epoch=4, **extra):
    return PartitionRecord(tuple(replicas), leader, epoch, tuple(isr), ONLINE, 9, **extra)


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ((), errors.InvalidReplicaAssignmentError),
        ((1, 1), errors.InvalidReplicaAssignmentError),
        ((1, 7), errors.InvalidReplicaAssignmentError),
        ((3,), errors.InvalidReplicationFactorError),
    ],
)
def test_bad_targets_are_refused(target, error):
    t = topic([(0, 1)], **{"min.insync.replicas": "2"})
    with pytest.raises(error):
        validate_target(t, 0, record((0, 1), 0, (0, 1)), target, LIVE, 1)


def test_unknown_partitions_pending_and_running_moves_are_refused():
    t = topic([(0, 1)])
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        validate_target(None, 0, None, (1, 2), LIVE, 1)
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        validate_target(t, 1, None, (1, 2), LIVE, 1)
    with pytest.raises(errors.LeaderNotAvailableError):
        validate_target(t, 0, None, (1, 2), LIVE, 1)
    running = record((2, 3, 0, 1), 0, (0, 1), adding=(2, 3), removing=(0, 1))
    with pytest.raises(errors.ReassignmentInProgressError):
        validate_target(t, 0, running, (1, 2), LIVE, 1)
    validate_target(t, 0, record((0, 1), 0, (0, 1)), (2, 3), LIVE, 1)  # fine


def test_start_lists_target_then_removed_and_names_both():
    started = start_reassignment(record((0, 1), 0, (0, 1)), (1, 2), 5_000)
    assert started.replicas == (1, 2, 0)
    assert (started.adding, started.removing, started.throttle_bytes_per_s) == ((2,), (0,), 5_000)
    assert (started.leader, started.leader_epoch, started.isr) == (0, 4, (0, 1))
    assert started.target_replicas == (1, 2) and started.reassigning


def test_a_reorder_is_done_at_once():
    started = start_reassignment(record((0, 1), 0, (0, 1)), (1, 0), 5_000)
    assert started.replicas == (1, 0) and not started.reassigning and started.throttle_bytes_per_s == 0


def test_a_node_coming_back_is_no_longer_retired():
    started = start_reassignment(record((0, 1), 0, (0, 1), retired=(2, 3)), (0, 2), 0)
    assert started.retired == (3,)


def test_completion_waits_for_every_target_replica_in_sync():
    t = topic([(1, 2, 0)])
    moving = record((1, 2, 0), 0, (0, 1), adding=(2,), removing=(0,))
    assert plan_completion(t, 0, moving, LIVE) is None
    caught_up = record((1, 2, 0), 0, (0, 1, 2), adding=(2,), removing=(0,))
    done = plan_completion(t, 0, caught_up, LIVE)
    assert done is not None
    # The leader is removed: the first in-sync target replica leads, epoch bumped, confirmed first.
    assert (done.record.replicas, done.record.leader, done.record.leader_epoch) == ((1, 2), 1, 5)
    assert done.record.isr == (1, 2) and done.record.retired == (0,) and not done.record.reassigning
    assert (done.push_to, done.required, done.must_exist) == ((1,), 1, True)


def test_completion_keeps_a_leader_that_stays():
    t = topic([(2, 1, 0)])
    caught_up = record((2, 1, 0), 1, (0, 1, 2), adding=(2,), removing=(0,))
    done = plan_completion(t, 0, caught_up, LIVE)
    assert done is not None and done.required is None
    assert (done.record.leader, done.record.leader_epoch, done.record.isr) == (1, 4, (1, 2))


def test_completion_skips_stopping_target_leaders():
    t = topic([(1, 2, 0)])
    caught_up = record((1, 2, 0), 0, (0, 1, 2), adding=(2,), removing=(0,))
    done = plan_completion(t, 0, caught_up, LIVE, shutting_down={1})
    assert done is not None and done.record.leader == 2


def test_cancel_goes_back_and_retires_the_added():
    t = topic([(1, 2, 0)])
    moving = record((1, 2, 0), 0, (0, 1), adding=(2,), removing=(0,), throttle_bytes_per_s=9)
    back = cancel_reassignment(t, 0, moving, LIVE)
    assert sorted(back.record.replicas) == [0, 1] and back.record.retired == (2,)
    assert (back.record.leader, back.record.leader_epoch, back.record.isr) == (0, 4, (0, 1))
    assert not back.record.reassigning and back.record.throttle_bytes_per_s == 0
    with pytest.raises(errors.NoReassignmentInProgressError):
        cancel_reassignment(t, 0, record((0, 1), 0, (0, 1)), LIVE)


def test_cancel_moves_leadership_off_an_added_replica_that_leads():
    t = topic([(2, 1, 0)])
    moving = record((2, 1, 0), 2, (2, 0, 1), adding=(2,), removing=(0,))
    back = cancel_reassignment(t, 0, moving, LIVE)
    assert (
        back.record.leader in (0, 1) and back.record.leader_epoch == 5 and back.required == back.record.leader
    )


def test_records_round_trip_through_etcd_values():
    full = record((1, 2, 0), 0, (0, 1), adding=(2,), removing=(0,), retired=(3,), throttle_bytes_per_s=7)
    decoded = keys.decode_partition(keys.encode_partition(full), mod_revision=9)
    assert decoded == full
    plain = record((0, 1), 0, (0, 1))
    assert b"adding" not in keys.encode_partition(plain)
    assert keys.decode_partition(keys.encode_partition(plain), mod_revision=9) == plain


def test_with_assignment_replaces_only_the_named_partitions():
    t = topic([(0, 1), (1, 2)])
    assert with_assignment(t, {1: (3, 2)}).assignment == ((0, 1), (3, 2))


def state_with(partitions, brokers=LIVE):
    state = MetadataState()
    for name, p, rec in partitions:
        count = max(q for n, q, _ in partitions if n == name) + 1
        state.topics[name] = topic([rec.replicas] * count, name=name)
        state.partitions.setdefault(name, {})[p] = rec
    state.brokers = {b: RegisteredBroker(b, "h", 1, 2) for b in brokers}
    return state


def test_node_sync_leaves_retired_copies_to_the_reassignment():
    state = state_with([("t", 0, record((1, 2), 1, (1, 2), retired=(0,)))])
    plan = plan_node_sync(state, 0, [("t", 0), ("gone", 0)])
    assert plan.delete == (("gone", 0),)


def test_leader_imbalance_above_the_percentage_is_handed_back():
    # Node 0 prefers 4 partitions, leads 2 of them: 50% imbalance.
    partitions = [("t", p, record((0, 1), 1 if p < 2 else 0, (0, 1))) for p in range(4)]
    state = state_with(partitions)
    assert imbalanced_partitions(state, 10) == [("t", 0), ("t", 1)]
    assert imbalanced_partitions(state, 50) == []  # not above 50%
    assert imbalanced_partitions(state, 10, shutting_down={0}) == []
    out_of_sync = state_with([("t", p, record((0, 1), 1, (1,))) for p in range(2)])
    assert imbalanced_partitions(out_of_sync, 10) == []


def test_changes_of_leader_or_isr_keep_a_move_and_retired_copies():
    from coordinator.partition_state import plan_partition, plan_preferred_leader

    t = topic([(4, 5, 6, 1, 2, 3)])
    moving = record(
        (4, 5, 6, 1, 2, 3),
        1,
        (1, 2, 3),
        adding=(4, 5, 6),
        removing=(1, 2, 3),
        retired=(9,),
        throttle_bytes_per_s=7,
    )
    live = {1, 2, 3, 4, 5, 6}
    planned = [
        plan_partition(t, 0, moving, live - {2}),  # a follower gone: ISR shrinks
        plan_partition(t, 0, moving, live - {1}),  # the leader gone: failover
        plan_partition(t, 0, moving, {4, 5, 6}),  # no in-sync replica left: offline
        plan_partition(t, 0, moving, live, shutting_down={1}),  # controlled shutdown
    ]
    preferred = plan_preferred_leader(
        t, 0, record((2, 1, 3, 4), 1, (1, 2, 3), adding=(4,), removing=(3,), retired=(9,)), live
    )
    assert not isinstance(preferred, errors.TributaryError)
    for transition in [*planned, preferred]:
        assert transition is not None
        kept = transition.record
        assert kept.reassigning and kept.retired == (9,), kept
    assert all(t.record.adding == (4, 5, 6) and t.record.throttle_bytes_per_s == 7 for t in planned if t)
