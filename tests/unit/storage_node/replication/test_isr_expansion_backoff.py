"""A leader refused a follower's return to the ISR (INELIGIBLE_REPLICA: the follower is in
controlled shutdown) waits before asking again, instead of asking on every fetch."""

from __future__ import annotations

from services import errors
from services.fetchport.multi import PartitionFetch
from services.leader_and_isr import LeaderAndIsr
from storage_node.replication.partition import INELIGIBLE_BACKOFF_MS, Partition
from tests.unit.storage_node.log_testkit import open_log


def test_an_ineligible_follower_is_not_proposed_again_until_the_backoff_passes(tmp_path, clock):
    asked: list[tuple[int, ...]] = []
    leader = Partition(
        0,
        open_log(tmp_path / "t-0", clock, commit_appends=False),
        clock,
        send_isr_change=lambda partition, isr: asked.append(isr),
    )
    leader.apply_state(LeaderAndIsr("t", 0, (0, 1), 0, 3, (0,), 10))
    fetch = PartitionFetch("t", 0, 0, 1 << 20, current_leader_epoch=3)

    leader.read_for_follower(1, fetch)  # caught up: the leader asks to add it
    assert asked == [(0, 1)]
    leader.on_isr_change_failed((0, 1), errors.IneligibleReplicaError("replica 1 is shutting down"))
    for _ in range(5):  # it keeps fetching while it stops: no request per fetch
        leader.read_for_follower(1, fetch)
    assert asked == [(0, 1)]

    clock.advance(INELIGIBLE_BACKOFF_MS)
    leader.read_for_follower(1, fetch)
    assert asked == [(0, 1), (0, 1)]


def test_other_refusals_are_asked_again_at_the_next_fetch(tmp_path, clock):
    asked: list[tuple[int, ...]] = []
    leader = Partition(
        0,
        open_log(tmp_path / "t-0", clock, commit_appends=False),
        clock,
        send_isr_change=lambda partition, isr: asked.append(isr),
    )
    leader.apply_state(LeaderAndIsr("t", 0, (0, 1), 0, 3, (0,), 10))
    fetch = PartitionFetch("t", 0, 0, 1 << 20, current_leader_epoch=3)
    leader.read_for_follower(1, fetch)
    leader.on_isr_change_failed((0, 1), errors.CoordinatorNotAvailableError("no controller"))
    leader.read_for_follower(1, fetch)
    assert asked == [(0, 1), (0, 1)]
