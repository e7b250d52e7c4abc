"""The log's side of replication: leader epochs, a follower's byte-for-byte append, truncation,
the high watermark and its checkpoint."""

from __future__ import annotations

import os

import pytest

from services.errors import CorruptRecordError
from services.records import set_base_offset
from storage_node.log import files
from storage_node.log.leader_epochs import LEADER_EPOCH_CHECKPOINT_FILE, EpochEndOffset
from tests.unit.storage_node.log_testkit import batches_in, config, make_batch, open_log, read_all


@pytest.fixture
def leader(tmp_path, clock):
    return open_log(tmp_path / "leader" / "t-0", clock, commit_appends=False)


@pytest.fixture
def follower(tmp_path, clock):
    return open_log(tmp_path / "follower" / "t-0", clock, commit_appends=False)


def test_appends_record_their_leader_epoch_and_it_survives_a_reopen(leader, clock):
    leader.append(make_batch(3), leader_epoch=0)
    leader.append(make_batch(2), leader_epoch=0)
    leader.append(make_batch(4), leader_epoch=3)
    assert leader.leader_epochs.entries == ((0, 0), (3, 5))
    assert [b.partition_leader_epoch for b in batches_in(read_all(leader))] == [0, 0, 3]
    assert leader.end_offset_for_epoch(0) == EpochEndOffset(0, 5)
    assert leader.end_offset_for_epoch(3) == EpochEndOffset(3, 9)
    leader.close()
    reopened = open_log(leader.directory, clock, commit_appends=False)
    assert reopened.leader_epochs.entries == ((0, 0), (3, 5))


def test_assign_leader_epoch_marks_the_start_of_an_epoch_before_any_append(leader):
    leader.append(make_batch(3), leader_epoch=1)
    leader.assign_leader_epoch(4)
    assert leader.latest_epoch == 4
    assert leader.end_offset_for_epoch(1) == EpochEndOffset(1, 3)


def test_a_follower_copies_the_leaders_bytes_unchanged(leader, follower):
    leader.append(make_batch(3, tag=1), leader_epoch=0)
    leader.append(make_batch(5, tag=2), leader_epoch=2)
    data = read_all(leader)
    info = follower.append_replicated(data)
    assert (info.first_offset, info.last_offset, info.batch_count) == (0, 7, 2)
    assert read_all(follower) == data
    assert follower.leader_epochs.entries == leader.leader_epochs.entries
    assert follower.high_watermark == 0  # a follower learns it from its leader


def test_a_follower_append_that_does_not_continue_the_log_is_refused_whole(leader, follower):
    leader.append(make_batch(3), leader_epoch=0)
    leader.append(make_batch(2), leader_epoch=0)
    first, second = (bytes(b.buffer) for b in batches_in(read_all(leader)))
    with pytest.raises(CorruptRecordError, match="starts at offset 3, expected 0"):
        follower.append_replicated(second)
    follower.append_replicated(first)
    with pytest.raises(CorruptRecordError, match="starts at offset 0, expected 3"):
        follower.append_replicated(first)
    assert follower.log_end_offset == 3


def test_a_follower_refuses_a_corrupt_batch_and_epochs_that_go_back(leader, follower):
    leader.append(make_batch(3), leader_epoch=5)
    good = read_all(leader)
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="corrupt"):
        follower.append_replicated(bytes(bad))
    follower.append_replicated(good)
    older = bytearray(make_batch(1))
    set_base_offset(older, 3)  # partition leader epoch 0 < 5 (the CRC does not cover it)
    with pytest.raises(CorruptRecordError, match="below the log's latest 5"):
        follower.append_replicated(bytes(older))
    assert follower.log_end_offset == 3
    assert follower.append_replicated(b"").batch_count == 0


def test_truncation_forgets_the_epochs_past_the_cut(leader):
    leader.append(make_batch(3), leader_epoch=0)
    leader.append(make_batch(3), leader_epoch=2)
    leader.append(make_batch(3), leader_epoch=4)
    leader.truncate_to(6)
    assert leader.log_end_offset == 6
    assert leader.leader_epochs.entries == ((0, 0), (2, 3))
    # the checkpoint on disk agrees once the log is flushed
    leader.flush()
    assert (leader.directory / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == "0\n2\n0 0\n2 3\n"


def test_moving_the_log_start_trims_the_epochs(leader, clock):
    leader = open_log(leader.directory, clock, config(segment_bytes=len(make_batch(2)) * 2))
    for epoch in (0, 0, 1, 1, 2, 2):
        leader.append(make_batch(2), leader_epoch=epoch)
    leader.delete_records_before(5)
    assert leader.leader_epochs.entries == ((1, 5), (2, 8))


def test_truncate_fully_and_start_at_restarts_an_empty_log(follower, leader, clock):
    leader.append(make_batch(4), leader_epoch=1)
    follower.append_replicated(read_all(leader))
    follower.truncate_fully_and_start_at(100)
    assert (follower.log_start_offset, follower.log_end_offset, follower.high_watermark) == (100, 100, 100)
    assert follower.leader_epochs.entries == ()
    assert [p.name for p in follower.directory.iterdir() if p.suffix == ".log"] == [
        files.log_file(follower.directory, 100).name
    ]
    follower.close()
    reopened = open_log(follower.directory, clock, commit_appends=False)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (100, 100)


def test_the_high_watermark_only_moves_forward_on_a_leader_and_is_clamped(leader):
    leader.append(make_batch(5), leader_epoch=0)
    assert leader.high_watermark == 0
    assert leader.maybe_increment_high_watermark(3)
    assert not leader.maybe_increment_high_watermark(2)
    assert leader.high_watermark == 3
    assert leader.maybe_increment_high_watermark(50)
    assert leader.high_watermark == 5  # never past the log end
    leader.update_high_watermark(1)  # a follower copies its leader's, also backwards
    assert leader.high_watermark == 1


def test_a_lone_log_reopens_with_its_high_watermark_at_the_log_start_or_the_one_given(leader, clock):
    for _ in range(5):
        leader.append(make_batch(1), leader_epoch=0)
    leader.maybe_increment_high_watermark(4)
    assert leader.high_watermark_checkpoint_due
    leader.high_watermark_checkpointed(4)
    assert not leader.high_watermark_checkpoint_due
    leader.close()
    assert open_log(leader.directory, clock, commit_appends=False).high_watermark == 0
    reopened = open_log(leader.directory, clock, commit_appends=False, high_watermark=9)
    assert reopened.high_watermark == 5  # the log dir's checkpoint, clamped to the log


def test_epochs_of_batches_recovered_after_an_unclean_shutdown_are_relearned(leader, clock):
    leader.append(make_batch(2), leader_epoch=0)
    leader.flush()
    leader.append(make_batch(2), leader_epoch=7)  # unflushed, its epoch entry then lost
    (leader.directory / LEADER_EPOCH_CHECKPOINT_FILE).write_text("0\n1\n0 0\n")
    crashed = open_log(leader.directory, clock, commit_appends=False)
    assert crashed.leader_epochs.entries == ((0, 0), (7, 2))


def test_a_log_written_before_epochs_were_kept_is_scanned_once(leader, clock):
    leader.append(make_batch(2), leader_epoch=0)
    leader.append(make_batch(2), leader_epoch=3)
    leader.close()
    os.unlink(leader.directory / LEADER_EPOCH_CHECKPOINT_FILE)
    reopened = open_log(leader.directory, clock, commit_appends=False)
    assert reopened.leader_epochs.entries == ((0, 0), (3, 2))


def test_a_torn_tail_takes_its_epoch_with_it(leader, clock):
    leader.append(make_batch(2), leader_epoch=0)
    leader.append(make_batch(2), leader_epoch=9)
    segment_file = files.log_file(leader.directory, 0)
    size = segment_file.stat().st_size
    os.truncate(segment_file, size - 5)  # tear the last batch; no clean shutdown marker
    crashed = open_log(leader.directory, clock, commit_appends=False)
    assert crashed.log_end_offset == 2
    assert crashed.leader_epochs.entries == ((0, 0),)


def test_a_former_leader_that_wrote_nothing_in_its_epoch_forgets_that_epoch_when_truncated(leader):
    """It led epoch 5 without appending, then follows a leader that never had epoch 5: the
    leader answers that the follower's epoch 4 history ends at the log end, so "truncate to the
    log end" must drop the empty epoch 5, or every fetch would diverge again (Kafka's rule)."""
    leader.append(make_batch(3), leader_epoch=4)
    leader.assign_leader_epoch(5)
    assert leader.latest_epoch == 5
    leader.truncate_to(leader.log_end_offset)
    assert leader.leader_epochs.entries == ((4, 0),)
    assert leader.log_end_offset == 3
