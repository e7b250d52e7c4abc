"""Consumer position state: assignment, seek, resets, epochs, pause/resume."""

import pytest

from gateway.client.errors import IllegalStateError
from gateway.client.structs import TopicPartition
from gateway.client.subscription import SubscriptionState, SubscriptionType

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_new_partitions_await_the_default_reset():
    state = SubscriptionState("earliest")
    state.assign_from_user([A0, A1])
    assert state.subscription_type is SubscriptionType.USER_ASSIGNED
    assert state.partitions_awaiting_reset() == {A0: ("earliest", 0), A1: ("earliest", 0)}
    assert state.fetchable_partitions() == []


def test_reassignment_keeps_the_state_of_partitions_kept():
    state = SubscriptionState()
    state.assign_from_user([A0, A1])
    state.seek(A0, 42)
    state.pause(A0)
    state.assign_from_user([A0, B0])
    assert state.assigned_partitions() == {A0, B0}
    assert state.position(A0) == 42 and state.is_paused(A0)
    assert state.position(B0) is None


def test_empty_assignment_is_no_subscription():
    state = SubscriptionState()
    state.assign_from_user([A0])
    state.assign_from_user([])
    assert state.subscription_type is SubscriptionType.NONE


def test_seek_sets_the_position_and_bumps_the_epoch():
    state = SubscriptionState()
    state.assign_from_user([A0])
    state.seek(A0, 10)
    assert state.position(A0) == 10
    assert state.state(A0).epoch == 1
    assert A0 in state.fetchable_partitions()
    with pytest.raises(ValueError):
        state.seek(A0, -1)


def test_unassigned_partitions_are_an_illegal_state():
    state = SubscriptionState()
    state.assign_from_user([A0])
    with pytest.raises(IllegalStateError):
        state.seek(B0, 1)
    with pytest.raises(IllegalStateError):
        state.position(B0)


def test_a_reset_result_applies_only_for_its_epoch():
    state = SubscriptionState("latest")
    state.assign_from_user([A0])
    strategy, epoch = state.partitions_awaiting_reset()[A0]
    state.seek(A0, 5)  # the application moved while the lookup was in flight
    assert not state.complete_reset(A0, epoch, 100)
    assert state.position(A0) == 5
    state.request_reset(A0, "earliest")
    strategy, epoch = state.partitions_awaiting_reset()[A0]
    assert strategy == "earliest"
    assert state.complete_reset(A0, epoch, 0)
    assert state.position(A0) == 0


def test_advance_only_moves_forward():
    state = SubscriptionState()
    state.assign_from_user([A0])
    state.seek(A0, 10)
    state.advance(A0, 15)
    state.advance(A0, 12)
    assert state.position(A0) == 15
    assert state.state(A0).epoch == 1, "consuming is not a seek"


def test_paused_partitions_are_not_fetchable():
    state = SubscriptionState()
    state.assign_from_user([A0, A1])
    state.seek(A0, 0)
    state.seek(A1, 0)
    state.pause(A1)
    assert state.fetchable_partitions() == [A0]
    assert state.paused_partitions() == {A1}
    state.resume(A1)
    assert set(state.fetchable_partitions()) == {A0, A1}


def test_watermarks():
    state = SubscriptionState()
    state.assign_from_user([A0])
    assert state.high_watermark(A0) is None
    state.update_watermarks(A0, 100, 3)
    assert state.high_watermark(A0) == 100


def test_unknown_reset_strategy_is_refused():
    with pytest.raises(ValueError, match="auto_offset_reset"):
        SubscriptionState("smallest")
