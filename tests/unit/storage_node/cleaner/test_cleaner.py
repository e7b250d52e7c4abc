"""The log cleaner over real partition logs on disk (unit: one process, a manual clock)."""

from __future__ import annotations

import pytest

from services.errors import CorruptRecordError
from services.records import Compression, iter_batches
from storage_node.log.cleaner.cleaner import CLEANER_CHECKPOINT_FILE, plan
from tests.unit.storage_node.log_testkit import read_all

from .compaction_kit import clean, clean_fully, compacted_log, keyed_batch, latest_per_key, records_of


def _produce(partition_log, clock, rounds: int, keys: int, *, compression=Compression.NONE):
    produced = []
    for i in range(rounds):
        records = [(b"key-%d" % ((i * 3 + j) % keys), b"value-%d-%d" % (i, j)) for j in range(3)]
        info = partition_log.append(keyed_batch(records, timestamp=clock.time_ms(), compression=compression))
        produced += [(info.first_offset + j, k, v) for j, (k, v) in enumerate(records)]
        clock.advance(1)
    return produced


def test_cleaning_keeps_the_latest_value_of_every_key_at_its_offset(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    produced = _produce(partition_log, clock, 60, 7)
    partition_log.roll()
    before = partition_log.size_in_bytes
    results = clean_fully(partition_log)
    assert results and results[0].records_removed > 0
    after = records_of(partition_log)
    latest = latest_per_key(produced)
    assert {key: (offset, value) for offset, key, value in after} == latest
    assert [o for o, _, _ in after] == sorted(o for o, _ in latest.values())
    assert partition_log.size_in_bytes < before
    assert partition_log.log_end_offset == produced[-1][0] + 1
    assert (partition_log.directory / CLEANER_CHECKPOINT_FILE).exists()


def test_the_active_segment_is_never_cleaned(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock, segment_bytes=10_000_000)
    _produce(partition_log, clock, 20, 2)
    assert len(partition_log.segments) == 1
    assert clean(partition_log) is None
    assert len(records_of(partition_log)) == 60


def test_compressed_batches_are_recompressed_with_their_codec(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    produced = _produce(partition_log, clock, 40, 5, compression=Compression.GZIP)
    partition_log.roll()
    clean_fully(partition_log)
    data = read_all(partition_log)
    batches = list(iter_batches(data))
    assert all(b.compression == Compression.GZIP for b in batches if b.record_count)
    after = records_of(partition_log)
    assert {k: (o, v) for o, k, v in after} == latest_per_key(produced)


def test_tombstones_remove_a_key_and_go_after_delete_retention(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock, delete_retention_ms=10_000)
    for i in range(20):
        partition_log.append(keyed_batch([(b"a", b"a%d" % i), (b"b", b"b%d" % i)], timestamp=clock.time_ms()))
    partition_log.append(keyed_batch([(b"a", None)], timestamp=clock.time_ms()))
    partition_log.roll()
    clean_fully(partition_log)
    after = records_of(partition_log)
    assert [(k, v) for _, k, v in after] == [(b"b", b"b19"), (b"a", None)]  # tombstone kept for now
    clock.advance(10_001)
    partition_log.append(keyed_batch([(b"c", b"c")], timestamp=clock.time_ms()))
    partition_log.roll()
    # Nothing new is dirty for a and b; a round over the new segment removes the old tombstone.
    clean_fully(partition_log, part=None)
    after = records_of(partition_log)
    assert [(k, v) for _, k, v in after] == [(b"b", b"b19"), (b"c", b"c")]


def test_a_small_offset_map_cleans_in_several_rounds_with_the_same_result(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    produced = _produce(partition_log, clock, 80, 40)
    partition_log.roll()
    results = clean_fully(partition_log, map_memory_bytes=24 * 12)  # 10 keys per round
    assert len(results) > 1
    assert {k: (o, v) for o, k, v in records_of(partition_log)} == latest_per_key(produced)


def test_small_cleaned_segments_are_grouped(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock, segment_bytes=400)
    _produce(partition_log, clock, 80, 3)
    partition_log.roll()
    segments_before = len(partition_log.segments)
    clean_fully(partition_log)  # groups by original size: each segment was full
    assert len(partition_log.segments) == segments_before
    produced = _produce(partition_log, clock, 5, 3)
    partition_log.roll()
    clean_fully(partition_log)  # the next round regroups the now small cleaned segments
    assert len(partition_log.segments) <= 4  # one cleaned group, the new segments, the active one
    assert {k: v for _, k, v in records_of(partition_log)} == {
        k: v for k, (_, v) in latest_per_key(produced).items()
    }


def test_the_dirty_ratio_and_min_compaction_lag(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock, min_compaction_lag_ms=5_000)
    _produce(partition_log, clock, 40, 3)
    partition_log.roll()
    part = plan(partition_log, clock.time_ms())
    assert part.dirty_bytes == 0  # everything is younger than the lag
    assert clean(partition_log) is None
    clock.advance(5_001)
    part = plan(partition_log, clock.time_ms())
    assert part.dirty_ratio == 1.0
    assert clean(partition_log) is not None
    assert plan(partition_log, clock.time_ms()).dirty_bytes == 0


def test_reopening_a_cleaned_log_recovers_it_unchanged(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    _produce(partition_log, clock, 60, 7)
    partition_log.roll()
    clean_fully(partition_log)
    expected = records_of(partition_log)
    end = partition_log.log_end_offset
    # No clean close: every segment is recovered from scratch, gaps and all.
    for path in partition_log.directory.glob("*.index"):
        path.unlink()
    reopened = compacted_log(tmp_path / "t-0", clock)
    assert records_of(reopened) == expected
    assert reopened.log_end_offset == end


def test_a_compacted_log_keeps_its_gaps_through_recovery_after_the_policy_goes_back_to_delete(
    tmp_path, clock
):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    _produce(partition_log, clock, 60, 7)
    partition_log.roll()
    clean_fully(partition_log)
    expected = records_of(partition_log)
    for path in partition_log.directory.glob("*.index"):
        path.unlink()
    reopened = compacted_log(tmp_path / "t-0", clock, cleanup_policy="delete")
    assert records_of(reopened) == expected


def test_a_log_never_compacted_still_rejects_a_batch_that_skips_offsets(tmp_path, clock):
    """The dense-offset check that catches a corrupted base offset stays for other logs."""
    partition_log = compacted_log(tmp_path / "t-0", clock, cleanup_policy="delete")
    _produce(partition_log, clock, 60, 7)
    partition_log.roll()
    first = partition_log.segments[0]
    data = bytearray(first.log.path.read_bytes())
    second_batch = next(iter_batches(bytes(data))).size_in_bytes
    data[second_batch : second_batch + 8] = (10_000).to_bytes(8, "big")
    first.log.path.write_bytes(bytes(data))
    assert first.recover() > 0


def test_a_follower_copies_a_compacted_leaders_batches_across_the_gaps(tmp_path, clock):
    leader = compacted_log(tmp_path / "leader" / "t-0", clock)
    produced = _produce(leader, clock, 60, 7)
    leader.roll()
    clean_fully(leader)
    follower = compacted_log(tmp_path / "follower" / "t-0", clock)
    follower.append_replicated(read_all(leader))
    assert follower.log_end_offset == leader.log_end_offset
    assert records_of(follower) == records_of(leader)
    assert {k: (o, v) for o, k, v in records_of(follower)} == latest_per_key(produced)


def test_a_follower_of_a_log_that_is_not_compacted_still_refuses_a_gap(tmp_path, clock):
    leader = compacted_log(tmp_path / "leader" / "t-0", clock)
    _produce(leader, clock, 60, 7)
    leader.roll()
    clean_fully(leader)
    follower = compacted_log(tmp_path / "follower" / "t-0", clock, cleanup_policy="delete")
    with pytest.raises(CorruptRecordError):
        follower.append_replicated(read_all(leader))
    assert follower.log_end_offset == 0


def test_compact_delete_topics_get_both_compaction_and_time_retention(tmp_path, clock):
    partition_log = compacted_log(
        tmp_path / "t-0", clock, cleanup_policy="compact,delete", retention_ms=60_000
    )
    _produce(partition_log, clock, 60, 7)
    partition_log.roll()
    clean_fully(partition_log)
    assert partition_log.delete_old_segments() == 0  # nothing is old enough yet
    clock.advance(60_001)
    new = _produce(partition_log, clock, 10, 7)
    assert partition_log.delete_old_segments() >= 1
    assert partition_log.log_start_offset > 0
    assert min(o for o, _, _ in records_of(partition_log)) >= new[0][0] - 30  # only recent data left
    partition_log.roll()
    clean_fully(partition_log)
    assert {k: (o, v) for o, k, v in records_of(partition_log)} == latest_per_key(new)


def test_a_round_whose_segments_change_under_it_swaps_nothing_in(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock)
    produced = _produce(partition_log, clock, 60, 7)
    partition_log.roll()
    second = partition_log.segments[1].base_offset

    def retention_strikes(step: str) -> None:
        if step == "cleaned-written":
            partition_log.delete_records_before(second)  # deletes the first segment meanwhile

    result = clean(partition_log, on_step=retention_strikes)
    assert result is not None and not result.completed
    assert not list(partition_log.directory.glob("*.cleaned")) and not list(
        partition_log.directory.glob("*.swap")
    )
    assert records_of(partition_log) == [(o, k, v) for o, k, v in produced if o >= second]
    clean_fully(partition_log)  # the next round starts over from the new log start
    latest = {k: (o, v) for k, (o, v) in latest_per_key(produced).items() if o >= second}
    assert {k: (o, v) for o, k, v in records_of(partition_log)} == latest


def test_log_append_time_batches_keep_their_broker_timestamps_and_type(tmp_path, clock):
    partition_log = compacted_log(tmp_path / "t-0", clock, message_timestamp_type="LogAppendTime")
    _produce(partition_log, clock, 40, 3, compression=Compression.ZSTD)
    partition_log.roll()
    before = {
        r.offset: (r.key, r.value, r.timestamp)
        for b in iter_batches(read_all(partition_log))
        for r in b.records()
    }
    clean_fully(partition_log)
    batches = list(iter_batches(read_all(partition_log)))
    assert all(b.timestamp_type == 1 and b.compression == Compression.ZSTD for b in batches if b.record_count)
    after = {r.offset: (r.key, r.value, r.timestamp) for b in batches for r in b.records()}
    assert len(after) == 3 and all(before[offset] == record for offset, record in after.items())
