"""The controller's rules for a leader's AlterPartition: who may join an ISR."""

import pytest

from coordinator.isr_changes import IsrChange, validated_isr_change
from coordinator.metadata import MetadataState
from coordinator.model import PartitionRecord, PartitionStatus, RegisteredBroker, TopicRecord
from services import errors


def _state() -> MetadataState:
    state = MetadataState()
    state.topics = {"t": TopicRecord("t", "id", 3, {}, ((1, 2, 3),))}
    state.partitions = {"t": {0: PartitionRecord((1, 2, 3), 1, 4, (1, 3), PartitionStatus.ONLINE, 9)}}
    state.brokers = {b: RegisteredBroker(b, "h", 1, 2) for b in (1, 2, 3)}
    return state


def test_a_caught_up_follower_joins():
    _, proposed = validated_isr_change(_state(), 1, IsrChange("t", 0, 4, 9, (1, 2, 3)))
    assert proposed.isr == (1, 2, 3)


def test_a_node_in_controlled_shutdown_may_not_join_the_isr_again():
    # dropped from the ISR as it stops, it must not be added back while it still fetches
    with pytest.raises(errors.IneligibleReplicaError, match="shutting down"):
        validated_isr_change(_state(), 1, IsrChange("t", 0, 4, 9, (1, 2, 3)), shutting_down={2})
    # it leaving, or others changing, is still accepted
    _, proposed = validated_isr_change(_state(), 1, IsrChange("t", 0, 4, 9, (1,)), shutting_down={2})
    assert proposed.isr == (1,)
