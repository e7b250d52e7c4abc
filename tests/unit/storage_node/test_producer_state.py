"""Idempotence and transactions in the log: the producer state, its snapshots and recovery, the
last stable offset and the aborted-transaction index."""

from __future__ import annotations

import pytest

from services import errors
from services.records import RecordBatchBuilder, iter_batches
from storage_node.log.producer_state import (
    BatchFacts,
    ProducerStateManager,
    snapshot_offsets,
)
from tests.unit.storage_node.log_testkit import config, open_log, read_all

PID = 42


def producer_batch(count=1, *, pid=PID, epoch=0, seq=0, transactional=False, tag=b"v") -> bytes:
    builder = RecordBatchBuilder(
        producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional
    )
    for i in range(count):
        builder.append(tag + b"%d" % i, timestamp=1_700_000_000_000)
    return builder.build()


def facts(seq, count=1, *, pid=PID, epoch=0, transactional=False, control=False) -> BatchFacts:
    return BatchFacts(pid, epoch, seq, count, transactional, control, 1)


@pytest.fixture
def plog(tmp_path, clock):
    return open_log(tmp_path / "t-0", clock)


# ---- the pure state ---------------------------------------------------------------------------


def test_sequences_must_follow_and_duplicates_of_the_last_five_runs_are_recognised():
    state = ProducerStateManager(None)
    assert state.check(facts(0, 3)) is None
    state.update(facts(0, 3), 0, 2)
    for n in range(1, 6):
        # another producer's record between each two: every batch starts a run of its own
        state.update(facts(3 * n, 3), 4 * n, 4 * n + 2)
    # the oldest kept run is the second batch; the first fell out of the window of five
    assert state.check(facts(3, 3)).first_offset == 4
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        state.check(facts(0, 3))
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="sent sequence 19 after 17"):
        state.check(facts(19))
    assert state.check(facts(18)) is None


def test_a_request_of_many_batches_is_one_run_so_each_batch_retried_alone_is_recognised():
    # A producer sends 40 batches of 3 records in one request (offsets follow sequences), its
    # answer is lost, and it retries batch by batch: every one is a duplicate with its offsets.
    state = ProducerStateManager(None)
    for n in range(40):
        state.check(facts(3 * n, 3))
        state.update(facts(3 * n, 3), 100 + 3 * n, 100 + 3 * n + 2)
    for n in (0, 17, 39):
        duplicate = state.check(facts(3 * n, 3))
        assert (duplicate.first_offset, duplicate.last_offset) == (100 + 3 * n, 102 + 3 * n)
    first, last = state.check_payload([facts(0, 3), facts(3, 3)])[:2]
    assert (first, last) == (100, 105)
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        state.check(facts(121))  # a gap after the run
    assert state.check(facts(120)) is None


def test_on_a_log_append_time_topic_runs_join_only_batches_stamped_alike():
    state = ProducerStateManager(None, log_append_time=True)
    state.update(BatchFacts(PID, 0, 0, 2, False, False, 5_000), 0, 1)
    state.update(BatchFacts(PID, 0, 2, 2, False, False, 5_000), 2, 3)  # same append
    state.update(BatchFacts(PID, 0, 4, 2, False, False, 6_000), 4, 5)  # a later append
    assert state.check(BatchFacts(PID, 0, 2, 2, False, False, 1)).max_timestamp == 5_000
    assert state.check(BatchFacts(PID, 0, 4, 2, False, False, 1)).max_timestamp == 6_000
    assert len(state.producers[PID].batches) == 2


def test_epochs_unknown_producers_and_wrapping_sequences():
    state = ProducerStateManager(None)
    with pytest.raises(errors.UnknownProducerIdError):
        state.check(facts(5))
    state.update(facts(0, 1, epoch=3), 0, 0)
    with pytest.raises(errors.InvalidProducerEpochError):
        state.check(facts(1, epoch=2))
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="starts epoch 4 at sequence 1"):
        state.check(facts(1, epoch=4))
    assert state.check(facts(0, epoch=4)) is None
    state.update(facts(2**31 - 2, 1, epoch=3, pid=7), 1, 1)
    state.update(facts(2**31 - 1, 1, epoch=3, pid=7), 2, 2)
    assert state.check(facts(0, epoch=3, pid=7)) is None  # after 2**31 - 1 comes 0


def test_transactions_set_the_first_unstable_offset_and_aborts_are_returned():
    state = ProducerStateManager(None)
    state.update(facts(0, 2, transactional=True), 10, 11)
    state.update(facts(0, 1, pid=9, transactional=True), 12, 12)
    assert state.first_unstable_offset() == 10
    assert state.update(facts(-1, 1, control=True), 13, 13, marker_commit=True) is None
    assert state.first_unstable_offset() == 12
    aborted = state.update(facts(-1, 1, pid=9, control=True), 14, 14, marker_commit=False)
    assert (aborted.producer_id, aborted.first_offset, aborted.last_offset) == (9, 12, 14)
    assert state.first_unstable_offset() is None


# ---- the log ----------------------------------------------------------------------------------


def test_a_retried_batch_is_answered_with_its_first_offsets_and_not_written_again(plog):
    first = plog.append(producer_batch(3, seq=0))
    plog.append(producer_batch(2, seq=3))
    end = plog.log_end_offset
    retry = plog.append(producer_batch(3, seq=0))
    assert (retry.first_offset, retry.last_offset, retry.duplicate) == (
        first.first_offset,
        first.last_offset,
        True,
    )
    assert plog.log_end_offset == end
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        plog.append(producer_batch(1, seq=7))
    assert plog.log_end_offset == end
    # Several batches of one producer in a payload are appended as a unit; a resend of the unit
    # is answered whole; a unit starting with a duplicate and going on with new batches is not a
    # resend, and is refused.
    unit = plog.append(producer_batch(1, seq=5) + producer_batch(2, seq=6))
    assert (unit.first_offset, unit.last_offset) == (end, end + 2)
    again = plog.append(producer_batch(1, seq=5) + producer_batch(2, seq=6))
    assert again.duplicate and (again.first_offset, again.last_offset) == (end, end + 2)
    with pytest.raises(errors.DuplicateSequenceNumberError):
        plog.append(producer_batch(2, seq=6) + producer_batch(1, seq=8))
    with pytest.raises(errors.OutOfOrderSequenceNumberError, match="within one payload"):
        plog.append(producer_batch(1, seq=8) + producer_batch(1, seq=10))
    with pytest.raises(errors.InvalidRecordError, match="must all come from that one producer"):
        plog.append(producer_batch(1, seq=8) + producer_batch(1, pid=9, seq=0))
    assert plog.log_end_offset == end + 3


def test_a_retry_on_a_log_append_time_topic_is_answered_with_the_first_append_time(tmp_path, clock):
    # As Kafka's broker: the answer to a retry says what the first answer said, and what a
    # consumer will read -- not "no timestamp", which made the client report its own clock.
    directory = tmp_path / "t-0"
    plog = open_log(directory, clock, config(message_timestamp_type="LogAppendTime", segment_bytes=600))
    first = plog.append(producer_batch(2, seq=0, tag=b"x" * 40))
    assert first.log_append_time == clock.time_ms()
    clock.advance(5_000)
    retry = plog.append(producer_batch(2, seq=0, tag=b"x" * 40))
    assert retry.duplicate and retry.log_append_time == first.log_append_time
    [stored] = [b.max_timestamp for b in iter_batches(read_all(plog))]
    assert stored == first.log_append_time
    for i in range(1, 6):  # rolls segments: the state is snapshotted, then reloaded after a crash
        plog.append(producer_batch(2, seq=2 * i, tag=b"x" * 40))
    last = plog.append(producer_batch(2, seq=12, tag=b"x" * 40))
    crashed = open_log(directory, clock, config(message_timestamp_type="LogAppendTime", segment_bytes=600))
    clock.advance(5_000)
    assert crashed.append(producer_batch(2, seq=12, tag=b"x" * 40)).log_append_time == last.log_append_time
    crashed.close()  # a snapshot at the log end: the state below comes from it alone
    reopened = open_log(directory, clock, config(message_timestamp_type="LogAppendTime", segment_bytes=600))
    assert reopened.append(producer_batch(2, seq=12, tag=b"x" * 40)).log_append_time == last.log_append_time
    created = open_log(tmp_path / "u-0", clock)  # CreateTime: no broker time to report
    created.append(producer_batch(1))
    assert created.append(producer_batch(1)).log_append_time == -1


def test_the_state_survives_a_crash_and_a_clean_restart(tmp_path, clock):
    directory = tmp_path / "t-0"
    plog = open_log(directory, clock, config(segment_bytes=600))
    offsets = [plog.append(producer_batch(2, seq=2 * i, tag=b"x" * 40)).first_offset for i in range(6)]
    assert plog.segment_count > 1 and snapshot_offsets(directory)  # a snapshot at each roll
    crashed = open_log(directory, clock, config(segment_bytes=600))  # no close: replayed from a snapshot
    assert crashed.append(producer_batch(2, seq=10, tag=b"x" * 40)).duplicate
    assert crashed.append(producer_batch(2, seq=2, tag=b"x" * 40)).first_offset == offsets[1]
    crashed.close()
    reopened = open_log(directory, clock, config(segment_bytes=600))
    assert reopened.append(producer_batch(2, seq=12, tag=b"x" * 40)).first_offset == 12
    assert snapshot_offsets(directory)[-1] == 12  # the clean close wrote one at the log end


def test_a_follower_builds_the_same_state_from_the_batches_it_copies(tmp_path, clock):
    leader = open_log(tmp_path / "a" / "t-0", clock)
    follower = open_log(tmp_path / "b" / "t-0", clock, commit_appends=False)
    leader.append(producer_batch(2, seq=0))
    leader.append(producer_batch(2, seq=2, transactional=True))
    leader.append_marker(producer_id=PID, producer_epoch=0, commit=False, coordinator_epoch=3, leader_epoch=0)
    follower.append_replicated(read_all(leader))
    # the follower, become leader, recognises the retry of what its predecessor wrote
    assert follower.append(producer_batch(2, seq=2, transactional=True)).duplicate
    assert follower.aborted_transactions(0, 100) == leader.aborted_transactions(0, 100)
    assert [(a.first_offset, a.last_offset) for a in follower.aborted_transactions(0, 100)] == [(2, 4)]


def test_markers_end_transactions_move_the_last_stable_offset_and_index_aborts(plog, tmp_path, clock):
    plog.append(producer_batch(2, seq=0, transactional=True))  # 0..1, open
    plog.append(producer_batch(1, pid=7, seq=0))  # 2, not transactional
    assert plog.last_stable_offset == 0
    commit_at = plog.append_marker(
        producer_id=PID, producer_epoch=0, commit=True, coordinator_epoch=1, leader_epoch=0
    )
    assert commit_at == 3 and plog.last_stable_offset == plog.high_watermark == 4
    plog.append(producer_batch(2, seq=2, transactional=True))  # 4..5
    abort_at = plog.append_marker(
        producer_id=PID, producer_epoch=0, commit=False, coordinator_epoch=1, leader_epoch=0
    )
    assert [(a.first_offset, a.last_offset) for a in plog.aborted_transactions(0, 100)] == [(4, abort_at)]
    assert plog.aborted_transactions(7, 100) == []
    control = [b for b in iter_batches(read_all(plog)) if b.is_control]
    assert len(control) == 2 and all(b.is_transactional and b.producer_id == PID for b in control)
    # an older coordinator's marker, or one for an older producer epoch, is refused
    with pytest.raises(errors.TransactionCoordinatorFencedError):
        plog.append_marker(
            producer_id=PID, producer_epoch=0, commit=True, coordinator_epoch=0, leader_epoch=0
        )
    # the index survives a crash, and a truncation forgets the abort it cut
    crashed = open_log(plog.directory, clock)
    assert [(a.first_offset, a.last_offset) for a in crashed.aborted_transactions(0, 100)] == [(4, abort_at)]
    crashed.truncate_to(abort_at)
    crashed.maybe_increment_high_watermark(crashed.log_end_offset)
    assert crashed.aborted_transactions(0, 100) == []
    assert crashed.last_stable_offset == 4  # the transaction at 4 is open again


def test_truncation_rebuilds_the_producer_state(plog):
    plog.append(producer_batch(2, seq=0))
    plog.append(producer_batch(2, seq=2))
    plog.truncate_to(2)
    assert plog.append(producer_batch(2, seq=2)).first_offset == 2  # not a duplicate any more
    with pytest.raises(errors.OutOfOrderSequenceNumberError):
        plog.append(producer_batch(1, seq=7))


def test_idle_producers_expire(plog, clock):
    plog.append(producer_batch(1, seq=0))
    clock.advance(10_000_000_000)
    assert plog.expire_producers(1000) == [PID]
    with pytest.raises(errors.UnknownProducerIdError):
        plog.append(producer_batch(1, seq=1))
