from __future__ import annotations

import errno
import os
import random
import threading

import pytest

from services.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from services.records import Compression, RecordBatchBuilder, TimestampType, iter_batches
from storage_node.log import files
from storage_node.log.partition_log import RECOVERY_CHECKPOINT_INTERVAL_MS, AppendInfo, PartitionLog
from tests.unit.storage_node.log_testkit import (
    batches_in,
    config,
    make_batch,
    offsets_in,
    open_log,
    read_all,
    snapshot_dir,
)


@pytest.fixture
def log_dir(tmp_path):
    return tmp_path / "t-0"


def test_appends_assign_dense_offsets_across_several_batches(log_dir, clock):
    partition_log = open_log(log_dir, clock)
    payload = make_batch(3) + make_batch(1) + make_batch(5, compression=Compression.GZIP)
    info = partition_log.append(payload, leader_epoch=7)
    assert info == AppendInfo(
        first_offset=0, last_offset=8, log_append_time=-1, record_count=9, log_start_offset=0, batch_count=3
    )
    info = partition_log.append(make_batch(2, compression=Compression.ZSTD))
    assert (info.first_offset, info.last_offset) == (9, 10)
    data = read_all(partition_log)
    assert offsets_in(data) == list(range(11))
    assert [b.partition_leader_epoch for b in batches_in(data)] == [7, 7, 7, 0]
    for batch in batches_in(data):
        batch.validate(deep=True)  # offsets rewritten in place, CRC still valid
    assert partition_log.log_end_offset == partition_log.high_watermark == 11


def test_log_append_time_stamps_batches_with_the_clock(log_dir, clock):
    partition_log = open_log(log_dir, clock, config(message_timestamp_type="LogAppendTime"))
    info = partition_log.append(make_batch(2, timestamp=5))
    assert info.log_append_time == clock.time_ms()
    (batch,) = batches_in(read_all(partition_log))
    batch.validate()
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in batch.records()] == [clock.time_ms()] * 2


def test_roll_by_size_keeps_segments_within_segment_bytes(log_dir, clock):
    batch = make_batch(2)
    partition_log = open_log(log_dir, clock, config(segment_bytes=len(batch) * 3 + 10))
    for _ in range(10):
        partition_log.append(batch)
    segments = partition_log.segments
    assert [s.base_offset for s in segments] == [0, 6, 12, 18]
    assert all(s.size <= len(batch) * 3 + 10 for s in segments)
    assert offsets_in(read_all(partition_log)) == list(range(20))


def test_roll_by_time_on_append_and_on_tick(log_dir, clock):
    partition_log = open_log(log_dir, clock, config(segment_ms=1000))
    partition_log.append(make_batch(1, timestamp=clock.time_ms()))
    clock.advance(999)
    partition_log.append(make_batch(1, timestamp=clock.time_ms()))
    assert partition_log.segment_count == 1
    clock.advance(2)
    partition_log.append(make_batch(1, timestamp=clock.time_ms()))
    assert [s.base_offset for s in partition_log.segments] == [0, 2]
    assert not partition_log.maybe_roll()
    clock.advance(1001)
    assert partition_log.maybe_roll()
    assert [s.base_offset for s in partition_log.segments] == [0, 2, 3]
    assert not partition_log.maybe_roll()  # an empty active segment is never rolled


def test_roll_when_an_index_is_full(log_dir, clock):
    partition_log = open_log(log_dir, clock, config(segment_index_bytes=24, index_interval_bytes=0))
    for _ in range(8):
        partition_log.append(make_batch(1))
    assert partition_log.segment_count > 2
    assert offsets_in(read_all(partition_log)) == list(range(8))


def test_read_bounds_and_out_of_range(log_dir, clock):
    partition_log = open_log(log_dir, clock)
    partition_log.append(make_batch(3) + make_batch(3))
    info = partition_log.read(6, 1000)
    assert info.slice is None
    assert (info.log_start_offset, info.log_end_offset, info.high_watermark) == (0, 6, 6)
    for bad in (-1, 7):
        with pytest.raises(OffsetOutOfRangeError, match="log start offset 0, log end offset 6"):
            partition_log.read(bad, 1000)
    assert offsets_in(partition_log.read(4, 1).slice.read_bytes()) == [3, 4, 5]
    assert offsets_in(partition_log.read(0, 10_000, max_offset=3).slice.read_bytes()) == [0, 1, 2]
    assert partition_log.read(3, 10_000, max_offset=3).slice is None


def test_read_continues_into_the_next_segment(log_dir, clock):
    batch = make_batch(2)
    partition_log = open_log(log_dir, clock, config(segment_bytes=len(batch) * 2))
    for _ in range(6):
        partition_log.append(batch)
    assert partition_log.segment_count == 3
    for offset in range(12):
        data = partition_log.read(offset, len(batch) * 10).slice.read_bytes()
        assert offsets_in(data)[0] == offset - offset % 2


def test_list_offsets_and_offset_for_timestamp_match_an_oracle(log_dir, clock):
    rng = random.Random(4)
    partition_log = open_log(log_dir, clock, config(segment_bytes=2000, index_interval_bytes=150))
    records = []
    for _ in range(120):
        count = rng.randint(1, 4)
        timestamps = [rng.randint(10_000, 20_000) for _ in range(count)]
        info = partition_log.append(make_batch(count, timestamps=timestamps))
        records += [(info.first_offset + i, ts) for i, ts in enumerate(timestamps)]
    assert partition_log.segment_count > 3
    assert partition_log.list_offset_earliest() == 0
    assert partition_log.list_offset_latest() == len(records)
    for target in [rng.randint(9_000, 21_000) for _ in range(200)]:
        expected = next(((o, ts) for o, ts in records if ts >= target), None)
        assert partition_log.offset_for_timestamp(target) == expected
    partition_log.delete_records_before(100)
    target = min(ts for o, ts in records)
    assert partition_log.offset_for_timestamp(target)[0] >= 100


def _corrupt_crc(batch: bytes) -> bytes:
    data = bytearray(batch)
    data[-1] ^= 0xFF
    return bytes(data)


def _wrong_magic(batch: bytes) -> bytes:
    data = bytearray(batch)
    data[16] = 1
    return bytes(data)


def _count_disagrees_with_bytes(batch: bytes) -> bytes:
    # Claim 4 records where 3 are encoded, keeping lastOffsetDelta consistent and the CRC valid.
    import crc32c

    data = bytearray(batch)
    data[57:61] = (4).to_bytes(4, "big")
    data[23:27] = (3).to_bytes(4, "big")
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


def _count_disagrees_with_offset_delta() -> bytes:
    builder = RecordBatchBuilder()
    builder.append(b"v", timestamp=1)
    import crc32c

    data = bytearray(builder.build())
    data[23:27] = (5).to_bytes(4, "big")
    data[17:21] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
    return bytes(data)


@pytest.mark.parametrize(
    "payload, error",
    [
        pytest.param(b"", InvalidRecordError, id="empty"),
        pytest.param(_corrupt_crc(make_batch(3)), CorruptRecordError, id="crc"),
        pytest.param(_wrong_magic(make_batch(3)), CorruptRecordError, id="magic"),
        pytest.param(_count_disagrees_with_bytes(make_batch(3)), CorruptRecordError, id="count-vs-bytes"),
        pytest.param(_count_disagrees_with_offset_delta(), InvalidRecordError, id="count-vs-delta"),
        pytest.param(make_batch(3)[:-5], CorruptRecordError, id="truncated"),
        pytest.param(make_batch(3) + b"\x00" * 7, CorruptRecordError, id="trailing-bytes"),
        pytest.param(make_batch(1) + _corrupt_crc(make_batch(2)), CorruptRecordError, id="second-batch-bad"),
        pytest.param(make_batch(2) + make_batch(400, value_size=100), RecordTooLargeError, id="oversized"),
        pytest.param(make_batch(1, timestamp=-5), InvalidTimestampError, id="negative-timestamp"),
    ],
)
def test_bad_input_is_rejected_and_nothing_is_written(log_dir, clock, payload, error):
    partition_log = open_log(log_dir, clock, config(max_message_bytes=20_000))
    partition_log.append(make_batch(2))
    before = snapshot_dir(log_dir)
    with pytest.raises(error):
        partition_log.append(payload)
    assert snapshot_dir(log_dir) == before
    assert partition_log.log_end_offset == 2
    assert partition_log.append(make_batch(1)).first_offset == 2


def test_control_batches_from_producers_are_refused(log_dir, clock):
    builder = RecordBatchBuilder(is_control=True)
    builder.append(b"\x00\x00\x00\x00", timestamp=1, key=b"\x00\x00\x00\x00")
    with pytest.raises(InvalidRecordError):
        open_log(log_dir, clock).append(builder.build())


def test_retention_by_time_never_deletes_the_active_segment(log_dir, clock):
    batch_size = len(make_batch(1))
    partition_log = open_log(log_dir, clock, config(segment_bytes=batch_size * 2, retention_ms=10_000))
    for _ in range(6):
        partition_log.append(make_batch(1, timestamp=clock.time_ms()))
        clock.advance(1000)
    assert partition_log.segment_count == 3
    assert partition_log.delete_old_segments() == 0
    clock.advance(10_000 - 4000)  # segment 0's newest record (t0+1000) is now 10001 ms old
    assert partition_log.delete_old_segments() == 1
    assert partition_log.log_start_offset == 2
    clock.advance(1_000_000)
    assert partition_log.delete_old_segments() == 1  # everything is expired, the active stays
    assert [s.base_offset for s in partition_log.segments] == [4]
    assert offsets_in(read_all(partition_log)) == [4, 5]
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.read(3, 100)


def test_retention_by_size(log_dir, clock):
    batch_size = len(make_batch(1))
    partition_log = open_log(
        log_dir, clock, config(segment_bytes=batch_size * 2, retention_bytes=batch_size * 5)
    )
    for _ in range(10):
        partition_log.append(make_batch(1))
    assert partition_log.size_in_bytes == 10 * batch_size
    assert partition_log.delete_old_segments() == 2  # deleting a third would go under the limit
    assert partition_log.size_in_bytes == 6 * batch_size
    assert partition_log.log_start_offset == 4
    partition_log.update_config(config(segment_bytes=batch_size * 2, retention_bytes=0))
    assert partition_log.delete_old_segments() == 2
    assert partition_log.segment_count == 1 and partition_log.segments[0].base_offset == 8


def test_compact_only_topics_ignore_time_and_size_retention(log_dir, clock):
    batch_size = len(make_batch(1))
    partition_log = open_log(
        log_dir,
        clock,
        config(segment_bytes=batch_size, retention_bytes=0, retention_ms=0, cleanup_policy="compact"),
    )
    for _ in range(4):
        partition_log.append(make_batch(1, timestamp=0))
    assert partition_log.delete_old_segments() == 0
    partition_log.delete_records_before(2)
    assert [s.base_offset for s in partition_log.segments] == [2, 3]


def test_delete_records_before_moves_the_log_start_and_survives_reopen(log_dir, clock):
    batch_size = len(make_batch(2))
    partition_log = open_log(log_dir, clock, config(segment_bytes=batch_size * 2))
    for _ in range(5):
        partition_log.append(make_batch(2))
    with pytest.raises(OffsetOutOfRangeError):
        partition_log.delete_records_before(11)
    assert partition_log.delete_records_before(5) == 5
    assert [s.base_offset for s in partition_log.segments] == [4, 8]  # 0-3 wholly below 5
    with pytest.raises(OffsetOutOfRangeError, match="log start offset 5"):
        partition_log.read(4, 100)
    assert offsets_in(partition_log.read(5, 100).slice.read_bytes())[0] == 4  # the batch holding 5
    assert partition_log.delete_records_before(3) == 5  # never moves back
    partition_log.close()
    reopened = open_log(log_dir, clock, config(segment_bytes=batch_size * 2))
    assert reopened.log_start_offset == 5
    # The high watermark is the log manager's to checkpoint (per log dir): a lone log reopens
    # with it at its log start, and its leader moves it on.
    reopened.maybe_increment_high_watermark(reopened.log_end_offset)
    assert reopened.delete_records_before(10) == 10
    assert reopened.read(10, 100).slice is None


def test_flush_messages_policy_moves_and_checkpoints_the_recovery_point(log_dir, clock):
    partition_log = open_log(log_dir, clock, config(flush_messages=5))
    partition_log.append(make_batch(3))
    assert partition_log.recovery_point == 0
    clock.advance(RECOVERY_CHECKPOINT_INTERVAL_MS)  # the checkpoint's interval from the open
    partition_log.append(make_batch(3))
    assert partition_log.recovery_point == 6
    text = (log_dir / files.RECOVERY_POINT_CHECKPOINT_FILE).read_text()
    assert text == "0\n1\nt 0 6\n"


def test_flush_ms_policy(log_dir, clock):
    partition_log = open_log(log_dir, clock, config(flush_ms=1000))
    partition_log.append(make_batch(1))
    assert not partition_log.maybe_flush()
    clock.advance(1000)
    assert partition_log.maybe_flush()
    assert partition_log.recovery_point == 1
    assert not partition_log.maybe_flush()  # nothing unflushed


def test_append_listeners_hear_every_append(log_dir, clock):
    partition_log = open_log(log_dir, clock)
    heard = []
    listener = lambda log, end: heard.append((log.name, end))  # noqa: E731
    partition_log.add_append_listener(listener)
    partition_log.append(make_batch(2))
    partition_log.append(make_batch(1))
    partition_log.remove_append_listener(listener)
    partition_log.append(make_batch(1))
    assert heard == [("t-0", 2), ("t-0", 3)]


def test_reads_during_concurrent_appends_see_whole_batches(log_dir, clock):
    batch = make_batch(2)
    partition_log = open_log(log_dir, clock, config(segment_bytes=len(batch) * 20, index_interval_bytes=200))
    stop = threading.Event()

    def writer():
        for _ in range(600):
            partition_log.append(batch)
        stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not stop.is_set() or reads < 10:
        end = partition_log.log_end_offset
        offset = random.randint(0, end)
        info = partition_log.read(offset, 5000)
        if info.slice is not None:
            offsets = offsets_in(info.slice.read_bytes())
            assert offsets[0] <= offset < offsets[-1] + 1 <= info.log_end_offset
            assert offsets == list(range(offsets[0], offsets[-1] + 1))
        reads += 1
    thread.join()
    assert offsets_in(read_all(partition_log)) == list(range(1200))


def test_truncate_to_for_replicas(log_dir, clock):
    batch = make_batch(2)
    partition_log = open_log(log_dir, clock, config(segment_bytes=len(batch) * 2))
    for _ in range(5):
        partition_log.append(batch)
    partition_log.truncate_to(4)
    assert partition_log.log_end_offset == 4 == partition_log.high_watermark
    assert [s.base_offset for s in partition_log.segments] == [0, 4]
    assert partition_log.append(batch).first_offset == 4
    assert offsets_in(read_all(partition_log)) == list(range(6))


def test_close_leaves_a_clean_shutdown_marker_and_reopen_skips_recovery(log_dir, clock, monkeypatch):
    partition_log = open_log(log_dir, clock)
    partition_log.append(make_batch(3))
    partition_log.close()
    assert (log_dir / files.CLEAN_SHUTDOWN_FILE).exists()
    from storage_node.log.segment import Segment

    def no_recovery(self, *args, **kwargs):
        raise AssertionError("recovery ran after a clean shutdown")

    monkeypatch.setattr(Segment, "recover", no_recovery)
    reopened = open_log(log_dir, clock)
    assert not (log_dir / files.CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is unclean
    assert reopened.recovery_point == reopened.log_end_offset == 3
    assert reopened.append(make_batch(1)).first_offset == 3


def test_closed_log_refuses_work_and_delete_removes_the_directory(log_dir, clock):
    partition_log = open_log(log_dir, clock)
    partition_log.append(make_batch(1))
    partition_log.close()
    with pytest.raises(Exception, match="closed"):
        partition_log.append(make_batch(1))
    reopened = open_log(log_dir, clock)
    reopened.delete()
    assert not log_dir.exists() and list(log_dir.parent.iterdir()) == []


def test_segment_files_are_named_by_base_offset(log_dir, clock):
    batch = make_batch(3)
    partition_log = open_log(log_dir, clock, config(segment_bytes=len(batch)))
    for _ in range(3):
        partition_log.append(batch)
    names = sorted(p.name for p in log_dir.iterdir() if p.suffix == ".log")
    assert names == ["00000000000000000000.log", "00000000000000000003.log", "00000000000000000006.log"]
    assert isinstance(partition_log, PartitionLog)
    assert len(list(iter_batches((log_dir / names[1]).read_bytes()))) == 1


def test_a_read_racing_with_retention_retries_and_reports_out_of_range(log_dir, clock):
    batch = make_batch(2)
    partition_log = open_log(log_dir, clock, config(segment_bytes=len(batch)))
    for _ in range(3):
        partition_log.append(batch)
    first = partition_log.segments[0]
    original_read = first.read

    def read_after_retention(*args, **kwargs):
        # The reader passed the bounds check and holds the segment; retention deletes it now.
        partition_log.delete_records_before(4)
        return original_read(*args, **kwargs)

    first.read = read_after_retention
    with pytest.raises(OffsetOutOfRangeError, match="log start offset 4"):
        partition_log.read(0, 100)
    assert offsets_in(partition_log.read(4, 100).slice.read_bytes()) == [4, 5]


def test_an_idle_log_flushes_and_closes_without_syncing_anything(log_dir, clock, monkeypatch):
    import os

    partition_log = open_log(log_dir, clock)
    partition_log.append(make_batch(3))
    partition_log.close()  # writes its checkpoints, snapshot and marker
    reopened = open_log(log_dir, clock)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    reopened.flush()
    assert synced == [], "nothing appended since the last flush: nothing to sync"
    reopened.close()
    assert synced == [], "the marker needs no fsync: what it vouches for is on disk already"
    monkeypatch.undo()
    again = open_log(log_dir, clock)
    assert again.log_end_offset == 3 and again.recovery_point == 3
    again.append(make_batch(2))
    synced.clear()
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    again.flush()
    assert synced, "new records are synced"
    assert again.recovery_point == 5


def test_policy_flushes_checkpoint_the_recovery_point_once_an_interval_and_close_always(log_dir, clock):
    """The flush policy's flushes rewrite the recovery-point checkpoint (two fsyncs) at most
    every RECOVERY_CHECKPOINT_INTERVAL_MS, counted from the open (which wrote it); the data is
    flushed every time, and a direct flush (close) writes the checkpoint whatever the interval."""
    path = log_dir / files.RECOVERY_POINT_CHECKPOINT_FILE
    partition_log = open_log(log_dir, clock, config(flush_ms=1000))
    partition_log.append(make_batch(1))
    clock.advance(1000)
    assert partition_log.maybe_flush()
    assert partition_log.recovery_point == 1  # flushed...
    assert path.read_text() == "0\n1\nt 0 0\n"  # ...but the open's checkpoint stands for an interval
    partition_log.append(make_batch(1))
    clock.advance(RECOVERY_CHECKPOINT_INTERVAL_MS - 1000)
    assert partition_log.maybe_flush()
    assert path.read_text() == "0\n1\nt 0 2\n"
    partition_log.append(make_batch(1))
    clock.advance(1000)
    assert partition_log.maybe_flush()
    assert partition_log.recovery_point == 3
    assert path.read_text() == "0\n1\nt 0 2\n"
    partition_log.append(make_batch(1))
    clock.advance(RECOVERY_CHECKPOINT_INTERVAL_MS)
    assert partition_log.maybe_flush()
    assert path.read_text() == "0\n1\nt 0 4\n"
    partition_log.append(make_batch(1))
    clock.advance(1000)
    assert partition_log.maybe_flush()
    assert path.read_text() == "0\n1\nt 0 4\n"
    partition_log.close()
    assert path.read_text() == "0\n1\nt 0 5\n"  # close's flush writes it


def test_a_truncation_lowers_the_recovery_checkpoint_at_once_whatever_the_interval(log_dir, clock):
    """After a cut below the checkpointed recovery point, the file never stays above the log's
    flushed history: a crash would skip recovering what was appended after the cut."""
    path = log_dir / files.RECOVERY_POINT_CHECKPOINT_FILE
    partition_log = open_log(log_dir, clock, config(flush_ms=1000))
    for _ in range(10):
        partition_log.append(make_batch(1))
    clock.advance(RECOVERY_CHECKPOINT_INTERVAL_MS)
    assert partition_log.maybe_flush()
    assert path.read_text() == "0\n1\nt 0 10\n"
    partition_log.truncate_to(3)
    assert path.read_text() == "0\n1\nt 0 3\n"  # written by the truncation itself
    partition_log.append(make_batch(2))
    clock.advance(1000)
    assert partition_log.maybe_flush()  # inside the interval: the checkpoint may wait...
    partition_log.append(make_batch(3))
    checkpointed = int(path.read_text().split()[-1])
    assert 3 <= checkpointed <= partition_log.recovery_point == 5  # ...but never above the flush
    partition_log.truncate_fully_and_start_at(2)
    assert path.read_text() == "0\n1\nt 0 2\n"
    partition_log.close()


def _record_segment_fsyncs(monkeypatch) -> list[str]:
    """The paths of the segment files (``.log``, ``.index``, ``.timeindex``) fsynced from now on."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(files.SEGMENT_FILE_SUFFIXES):
            synced.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return synced


def test_a_flush_leaves_the_indexes_of_the_segment_it_ends_in_to_recovery(log_dir, clock, monkeypatch):
    """A flush fsyncs the logs it covers and the indexes of every segment before the one holding
    its last offset: that one is where recovery after a crash starts, rebuilding its indexes. The
    first flush past it syncs them, and so does close (the clean-shutdown marker skips recovery)."""
    partition_log = open_log(log_dir, clock, config(segment_bytes=1500, index_interval_bytes=120))
    while partition_log.segment_count < 3:
        partition_log.append(make_batch(3, value_size=50))
    for _ in range(2):
        partition_log.append(make_batch(3, value_size=50))
    first, second, tail = partition_log.segments
    synced = _record_segment_fsyncs(monkeypatch)
    partition_log.flush()
    assert sorted(synced) == sorted(
        [str(s.log.path) for s in (first, second, tail)]
        + [str(s.offset_index.path) for s in (first, second)]
        + [str(s.time_index.path) for s in (first, second)]  # rolled: closed by the max timestamp
    )
    assert tail.offset_index.entries, "the tail has index entries, left unsynced"
    while partition_log.segment_count < 4:
        partition_log.append(make_batch(3, value_size=50))
    synced.clear()
    partition_log.flush()
    assert str(tail.offset_index.path) in synced and str(tail.time_index.path) in synced
    new_tail = partition_log.segments[-1]
    for _ in range(2):
        partition_log.append(make_batch(3, value_size=50))
    partition_log.flush()
    assert new_tail.offset_index.entries and str(new_tail.offset_index.path) not in synced
    synced.clear()
    partition_log.close()
    assert str(new_tail.offset_index.path) in synced
    assert set(synced) <= {str(new_tail.offset_index.path), str(new_tail.time_index.path)}


def test_a_failed_fsync_keeps_the_recovery_point_and_takes_the_log_offline(log_dir, clock, monkeypatch):
    """After a failed write-back Linux may drop the lost pages' dirty state, so a retried fsync
    can succeed without them: the recovery point (and its checkpoint) must never move past them,
    so the log refuses every later flush and append (Kafka takes the log dir offline)."""
    checkpoint_path = log_dir / files.RECOVERY_POINT_CHECKPOINT_FILE
    partition_log = open_log(log_dir, clock)
    partition_log.append(make_batch(3))
    partition_log.flush()
    checkpointed = checkpoint_path.read_text()
    partition_log.append(make_batch(2))

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(KafkaStorageError, match="Input/output error"):
        partition_log.flush()
    assert partition_log.recovery_point == 3 and partition_log.offline
    monkeypatch.undo()  # fsync works again, as a retry after a lost write-back would
    with pytest.raises(KafkaStorageError, match="failed"):
        partition_log.flush()
    with pytest.raises(KafkaStorageError):
        partition_log.append(make_batch(1))
    assert partition_log.recovery_point == 3
    assert checkpoint_path.read_text() == checkpointed
    partition_log.close()  # no clean-shutdown marker: the next open recovers the tail
    assert not (log_dir / files.CLEAN_SHUTDOWN_FILE).exists()
    reopened = open_log(log_dir, clock)
    assert reopened.recovery_point == 3 and not reopened.offline
    reopened.close()
