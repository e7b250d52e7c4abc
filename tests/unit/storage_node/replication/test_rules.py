"""The replication rules, including both KIP-101 scenarios where truncating to the high
watermark loses acknowledged data or leaves replicas diverged."""

from __future__ import annotations

from storage_node.log.leader_epochs import UNDEFINED, EpochEndOffset, EpochEntry, LeaderEpochCache
from storage_node.replication.rules import (
    UNKNOWN_OFFSET,
    FollowerState,
    Truncation,
    diverging_epoch,
    high_watermark,
    may_join_isr,
    out_of_sync_followers,
    truncation_for_divergence,
)

LAG = 10_000


def cache(*entries: tuple[int, int]) -> LeaderEpochCache:
    return LeaderEpochCache(None, tuple(EpochEntry(*e) for e in entries))


# ---- caught up / ISR shrink -----------------------------------------------------------------


def test_a_fetch_at_the_log_end_is_caught_up_now():
    f = FollowerState(2)
    f.on_fetch(100, leader_log_end=100, now_ms=5_000)
    assert f.last_caught_up_ms == 5_000
    assert f.log_end_offset == 100


def test_a_fetch_reaching_the_previous_log_end_was_caught_up_at_the_previous_fetch():
    f = FollowerState(2)
    f.on_fetch(50, leader_log_end=100, now_ms=1_000)  # behind
    assert f.last_caught_up_ms == 0
    f.on_fetch(100, leader_log_end=180, now_ms=2_000)  # reached what the leader had at 1 s
    assert f.last_caught_up_ms == 1_000


def test_a_follower_that_keeps_falling_behind_is_never_caught_up():
    f = FollowerState(2)
    now = 0
    leader_end = 100
    for fetch_offset in range(10, 100, 10):
        f.on_fetch(fetch_offset, leader_end, now)
        leader_end += 100  # the leader grows faster than the follower fetches
        now += 2_000
    assert f.last_caught_up_ms == 0
    assert not f.is_caught_up(leader_end, now, LAG)


def test_out_of_sync_followers_leave_after_the_lag_time():
    followers = {2: FollowerState(2), 3: FollowerState(3)}
    followers[2].on_fetch(100, 100, now_ms=1_000)
    followers[3].on_fetch(100, 100, now_ms=1_000)
    leader_end = 200  # records arrived since
    followers[2].on_fetch(200, leader_end, now_ms=9_000)
    assert out_of_sync_followers((1, 2, 3), 1, followers, leader_end, 10_999, LAG) == ()
    assert out_of_sync_followers((1, 2, 3), 1, followers, leader_end, 11_001, LAG) == (3,)


def test_a_follower_at_the_log_end_is_in_sync_even_when_nothing_was_written_for_long():
    follower = FollowerState(2)
    follower.on_fetch(100, 100, now_ms=0)
    assert out_of_sync_followers((1, 2), 1, {2: follower}, 100, 1_000_000, LAG) == ()


def test_a_reset_follower_gets_a_full_lag_window_only_if_in_sync():
    follower = FollowerState(2, log_end_offset=80)
    follower.reset(50_000, in_sync=True)
    assert follower.log_end_offset == UNKNOWN_OFFSET
    assert follower.is_caught_up(100, 50_000 + LAG - 1, LAG)
    assert not follower.is_caught_up(100, 50_000 + LAG, LAG)
    follower.reset(50_000, in_sync=False)
    assert not follower.is_caught_up(100, 50_001, LAG)


# ---- high watermark / ISR expansion ---------------------------------------------------------


def test_high_watermark_is_the_smallest_log_end_in_the_maximal_isr():
    followers = {2: FollowerState(2, log_end_offset=70), 3: FollowerState(3, log_end_offset=40)}
    assert high_watermark(100, followers, (1, 2, 3)) == 40
    assert high_watermark(100, followers, (1, 2)) == 70  # 3 is not counted
    assert high_watermark(100, {}, (1,)) == 100  # the leader alone


def test_an_isr_follower_not_heard_from_since_the_election_holds_the_high_watermark():
    followers = {2: FollowerState(2)}
    assert high_watermark(100, followers, (1, 2)) == UNKNOWN_OFFSET


def test_may_join_isr_needs_the_high_watermark_and_the_leader_epoch_start():
    follower = FollowerState(2, log_end_offset=50)
    assert may_join_isr(follower, high_watermark=50, leader_epoch_start_offset=50)
    assert not may_join_isr(follower, high_watermark=51, leader_epoch_start_offset=0)
    assert not may_join_isr(follower, high_watermark=10, leader_epoch_start_offset=60)
    assert not may_join_isr(FollowerState(3), high_watermark=0, leader_epoch_start_offset=0)


# ---- divergence and truncation --------------------------------------------------------------


def test_kip101_scenario_1_truncating_to_the_high_watermark_would_lose_an_acknowledged_record():
    """Leader A and follower B both hold m0, m1 (epoch 0); A's high watermark is 2 (m1 was
    acknowledged), B's is still 1 because the fetch that would tell it was never answered. B
    restarts. Truncating to its high watermark would drop m1, and if A then died B would lead
    without an acknowledged record. By epoch, B asks A where epoch 0 ends: 2, its own log end,
    so it keeps m1."""
    a_epochs = cache((0, 0))
    b_epochs = cache((0, 0))
    b_log_end, b_high_watermark = 2, 1
    assert diverging_epoch(a_epochs, 2, fetch_offset=b_log_end, last_fetched_epoch=0) is None
    # (were the leader to answer anyway, B would keep everything it has)
    answer = a_epochs.end_offset_for(0, 2)
    assert truncation_for_divergence(b_epochs, b_log_end, answer) == Truncation(2, True)
    assert b_high_watermark < 2  # what truncating to the high watermark would have cut


def test_kip101_scenario_2_replicas_that_diverged_are_reconciled_by_epoch():
    """A (leader, epoch 0) holds m0, m1; B holds m0; both have high watermark 2 (A's view) and
    1. Both crash; B comes back first, leads epoch 1 and writes m2 at offset 1. A returns as
    follower: by its high watermark it would keep m1 at offset 1 and fetch from 2, diverging
    forever. By epoch, B says epoch 0 ended at 1, so A cuts at 1 and copies m2."""
    b_epochs = cache((0, 0), (1, 1))  # B: m0 in epoch 0, m2 at offset 1 in epoch 1
    b_log_end = 2
    a_epochs = cache((0, 0))  # A: m0, m1, both epoch 0
    a_log_end = 2
    answer = diverging_epoch(b_epochs, b_log_end, fetch_offset=a_log_end, last_fetched_epoch=0)
    assert answer == EpochEndOffset(0, 1)
    assert truncation_for_divergence(a_epochs, a_log_end, answer) == Truncation(1, True)


def test_a_follower_with_epochs_the_leader_never_had_cuts_where_their_shared_epoch_ends():
    leader = cache((0, 0), (3, 50))
    follower = cache((0, 0), (1, 30), (2, 40))  # epochs 1 and 2 never reached this leader
    answer = diverging_epoch(leader, 80, fetch_offset=45, last_fetched_epoch=2)
    assert answer == EpochEndOffset(0, 50)  # the leader's largest epoch <= 2 is 0, ending at 50
    cut = truncation_for_divergence(follower, 45, answer)
    assert cut == Truncation(30, True)  # our epoch 0 ended at 30
    follower.truncate_from_end(cut.offset)
    # next fetch: last epoch 0 at offset 30; the leader's epoch 0 runs to 50: no divergence
    assert diverging_epoch(leader, 80, fetch_offset=30, last_fetched_epoch=0) is None


def test_a_follower_whose_largest_older_epoch_differs_cuts_there_and_asks_again():
    # The leader answers with epoch 2; the follower has epochs 1 and 3 but not 2.
    follower = cache((1, 0), (3, 40))
    cut = truncation_for_divergence(follower, 60, EpochEndOffset(2, 50))
    assert cut == Truncation(40, False)  # the end of our epoch 1; ask again with epoch 1


def test_a_follower_ahead_of_the_leader_in_the_same_epoch_truncates_to_the_leader_end():
    # An unclean election: the new leader (epoch 2) had less of epoch 1 than this follower.
    leader = cache((0, 0), (1, 10), (2, 15))
    follower = cache((0, 0), (1, 10))
    answer = diverging_epoch(leader, 30, fetch_offset=20, last_fetched_epoch=1)
    assert answer == EpochEndOffset(1, 15)
    assert truncation_for_divergence(follower, 20, answer) == Truncation(15, True)


def test_no_divergence_while_the_follower_is_within_the_epoch():
    leader = cache((0, 0), (1, 10))
    assert diverging_epoch(leader, 30, fetch_offset=25, last_fetched_epoch=1) is None
    assert diverging_epoch(leader, 30, fetch_offset=10, last_fetched_epoch=0) is None


def test_a_follower_without_epochs_is_not_checked():
    assert diverging_epoch(cache((0, 0)), 30, fetch_offset=0, last_fetched_epoch=-1) is None


def test_an_epoch_above_every_leader_epoch_is_undefined_out_of_range():
    assert diverging_epoch(cache((0, 0)), 30, fetch_offset=40, last_fetched_epoch=5) is not None
    assert diverging_epoch(cache((0, 0)), 30, fetch_offset=40, last_fetched_epoch=5).undefined


def test_a_follower_whose_history_starts_after_the_answered_epoch_cuts_where_its_own_starts():
    # Our log holds epoch 4 from offset 100 on; the leader's epoch 2 runs to 120, so our
    # offsets 100..119 (epoch 4) are not the leader's.
    follower = cache((4, 100))
    assert truncation_for_divergence(follower, 150, EpochEndOffset(2, 120)) == Truncation(100, True)


def test_a_follower_without_epochs_cuts_to_the_leader_end_or_its_own():
    assert truncation_for_divergence(cache(), 150, EpochEndOffset(2, 120)) == Truncation(120, True)
    assert truncation_for_divergence(cache(), 110, EpochEndOffset(2, 120)) == Truncation(110, True)
    assert UNDEFINED.undefined
