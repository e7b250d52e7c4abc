from __future__ import annotations

import errno
import os

import pytest

from services.errors import InvalidConfigError, KafkaStorageError, UnknownTopicOrPartitionError
from storage_node.log import checkpoint, files
from storage_node.log.log_manager import LogManager
from storage_node.log.time_index import TimeIndex
from tests.unit.storage_node.log_testkit import (
    commit_every_append,
    make_batch,
    offsets_in,
    open_files_under,
    read_all,
)


@pytest.fixture
def dirs(tmp_path):
    return [tmp_path / "d0", tmp_path / "d1", tmp_path / "d2"]


def _manager(dirs, clock, **kwargs):
    manager = LogManager(dirs, clock, {"segment.bytes": "2000"}, **kwargs)
    manager.load()
    return manager


def test_new_partitions_go_to_the_dir_with_fewest_partitions(dirs, clock):
    manager = _manager(dirs, clock)
    placed = [manager.create_partition("orders", p).directory.parent for p in range(7)]
    assert placed == [dirs[0], dirs[1], dirs[2], dirs[0], dirs[1], dirs[2], dirs[0]]
    manager.delete_partition("orders", 1)
    assert manager.create_partition("audit", 0).directory.parent == dirs[1]
    manager.get("orders", 0).append(make_batch(2))
    described = manager.describe_log_dirs()
    assert [len(d.partitions) for d in described] == [3, 2, 2]
    assert all(d.free_bytes > 0 for d in described)
    orders_0 = described[0].partitions[0]
    assert (orders_0.topic, orders_0.partition, orders_0.log_end_offset) == ("orders", 0, 2)
    assert orders_0.size_in_bytes == described[0].total_bytes == len(make_batch(2))
    manager.close()


def test_create_is_idempotent_and_applies_new_configs(dirs, clock):
    manager = _manager(dirs, clock)
    first = manager.create_partition("t", 0, {"retention.ms": "1000"})
    again = manager.create_partition("t", 0, {"retention.ms": "5000"})
    assert again is first and first.config.retention_ms == 5000 and first.config.segment_bytes == 2000
    with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
        manager.create_partition("t", 1, {"retention.ms": "soon"})
    assert manager.get("t", 0).config.retention_ms == 5000  # a rejected config changes nothing
    manager.update_topic_config("t", {"retention.ms": "7"})
    assert first.config.retention_ms == 7
    manager.close()


def test_unknown_partitions_are_reported(dirs, clock):
    manager = _manager(dirs, clock)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get("nope", 0)
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.delete_partition("nope", 0)
    with pytest.raises(InvalidConfigError):
        LogManager(dirs, clock, {"segment.bytes": "1"})


def test_reload_finds_every_partition_in_every_dir(dirs, clock):
    manager = _manager(dirs, clock)
    for p in range(5):
        partition_log = manager.create_partition("orders", p)
        for _ in range(p + 1):
            partition_log.append(make_batch(2))
    manager.create_partition("my-topic", 12)
    where = {(pl.topic, pl.partition): pl.directory for pl in manager.partitions()}
    manager.delete_partition("orders", 4)
    manager.close()

    reloaded = LogManager(dirs, clock, {"segment.bytes": "2000"})
    assert reloaded.load() == [("my-topic", 12), ("orders", 0), ("orders", 1), ("orders", 2), ("orders", 3)]
    for partition_log in reloaded.partitions():
        assert partition_log.directory == where[(partition_log.topic, partition_log.partition)]
    for p in range(4):
        assert offsets_in(read_all(reloaded.get("orders", p))) == list(range(2 * (p + 1)))
    reloaded.close()


def test_load_finishes_interrupted_partition_deletes_and_rejects_duplicates(dirs, clock):
    manager = _manager(dirs, clock)
    manager.create_partition("t", 0).append(make_batch(1))
    manager.close()
    (dirs[1] / "t-5.0123abcd-delete").mkdir()
    (dirs[1] / "t-5.0123abcd-delete" / "00000000000000000000.log").write_bytes(b"x")
    reloaded = LogManager(dirs, clock)
    assert reloaded.load() == [("t", 0)]
    assert not (dirs[1] / "t-5.0123abcd-delete").exists()
    reloaded.close()
    (dirs[2] / "t-0").mkdir()
    with pytest.raises(KafkaStorageError, match="two log dirs"):
        LogManager(dirs, clock).load()


def test_tick_rolls_idle_segments_applies_retention_and_flushes(dirs, clock):
    manager = _manager(dirs, clock)
    partition_log = manager.create_partition(
        "t", 0, {"segment.ms": "1000", "retention.ms": "5000", "flush.ms": "500"}
    )
    commit_every_append(partition_log)
    partition_log.append(make_batch(3, timestamp=clock.time_ms()))
    assert manager.tick().rolled == 0
    clock.advance(1001)
    result = manager.tick()
    assert (result.rolled, result.flushed, result.deleted_segments) == (1, 1, 0)
    assert partition_log.recovery_point == 3
    clock.advance(5000)
    assert manager.tick().deleted_segments == 1
    assert partition_log.log_start_offset == 3 == partition_log.log_end_offset
    manager.close()


def test_open_file_handles_are_bounded(dirs, clock):
    manager = _manager(dirs, clock, max_open_segments=3)
    batch = make_batch(2, value_size=200)
    partition_log = manager.create_partition("t", 0, {"segment.bytes": str(len(batch))})
    for _ in range(10):
        partition_log.append(batch)
    assert partition_log.segment_count == 10
    assert sum(s.log.has_open_handle for s in partition_log.segments) <= 3
    assert offsets_in(read_all(partition_log)) == list(range(20))  # evicted handles reopen
    assert sum(s.log.has_open_handle for s in partition_log.segments) <= 3
    manager.close()


def test_delete_partition_removes_its_directory(dirs, clock):
    manager = _manager(dirs, clock)
    partition_log = manager.create_partition("t", 0)
    partition_log.append(make_batch(1))
    directory = partition_log.directory
    manager.delete_partition("t", 0)
    assert not directory.exists()
    assert manager.partitions() == []
    assert files.parse_partition_dir_name(directory.name) == ("t", 0)
    manager.close()


def test_a_new_partition_writes_its_checkpoints_without_fsync(dirs, clock, monkeypatch):
    """A new log's checkpoints say what their absence says (offset 0): written without fsyncs
    (four per partition were most of what creating thousands of partitions cost a node), but
    written, so a full disk fails the create rather than the first append."""

    manager = _manager(dirs[:1], clock)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    partition_log = manager.create_partition("fresh", 0)
    monkeypatch.undo()
    assert len(synced) == 1  # the log dir, so the new partition's directory survives a crash
    assert (partition_log.directory / files.RECOVERY_POINT_CHECKPOINT_FILE).exists()
    partition_log.append(make_batch(3))
    manager.close()
    reopened = _manager(dirs[:1], clock)
    assert reopened.get("fresh", 0).log_end_offset == 3
    reopened.close()


def test_reopening_rewrites_no_checkpoint_that_already_holds_its_value(dirs, clock, monkeypatch):
    first = _manager(dirs[:1], clock)
    first.create_partition("kept", 0).append(make_batch(3))
    first.close()
    written = []
    real_write = checkpoint.write_atomically
    monkeypatch.setattr(
        checkpoint, "write_atomically", lambda p, d, **kw: (written.append(p.name), real_write(p, d, **kw))
    )
    reopened = _manager(dirs[:1], clock)
    assert reopened.get("kept", 0).log_end_offset == 3
    assert not [name for name in written if "offset-checkpoint" in name or "recovery" in name], written
    reopened.close()


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    "failing_point",
    [
        "checkpoint",  # the first data written: the log-start checkpoint
        "time_index",  # creating the second index file, after the .log is open
        "recovery_checkpoint",  # the second checkpoint, after the first succeeded
    ],
)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_create_partition_on_a_full_disk_keeps_no_file_open(
    dirs, clock, monkeypatch, failing_point, existing
):
    """Issue item 7: each failed CreatePartition retry on a full disk left a segment file open."""
    if existing:  # a partition directory with data, not loaded yet (as after a restart)
        first = _manager(dirs[:1], clock)
        first.create_partition("full", 0).append(make_batch(3))
        first.close()
        for name in (files.LOG_START_OFFSET_CHECKPOINT_FILE, files.RECOVERY_POINT_CHECKPOINT_FILE):
            (dirs[0] / "full-0" / name).unlink()  # missing: the open writes both again
    manager = LogManager(dirs[:1], clock, {"segment.bytes": "2000"})
    real_write = checkpoint.write_atomically
    writes = []

    def second_write_fails(path, data, **kwargs):
        writes.append(path)
        if path.name == files.RECOVERY_POINT_CHECKPOINT_FILE:  # the second, the first succeeding
            _no_space()
        real_write(path, data, **kwargs)

    if failing_point == "checkpoint":
        monkeypatch.setattr(checkpoint, "write_atomically", _no_space)
    elif failing_point == "recovery_checkpoint":
        monkeypatch.setattr(checkpoint, "write_atomically", second_write_fails)
    else:
        monkeypatch.setattr(TimeIndex, "open", classmethod(_no_space))
    before = open_files_under(dirs[0])
    for _ in range(20):
        with pytest.raises(KafkaStorageError, match="No space left"):
            manager.create_partition("full", 0)
    assert open_files_under(dirs[0]) == before
    assert len(manager.handle_cache) == 0
    with pytest.raises(UnknownTopicOrPartitionError):
        manager.get("full", 0)
    partition_dir = dirs[0] / "full-0"
    assert partition_dir.exists() == existing  # a directory only this call created is removed
    if existing:
        assert not [p for p in partition_dir.iterdir() if p.name.endswith(files.TEMP_FILE_SUFFIX)]
    monkeypatch.undo()  # the disk has room again: the same call succeeds
    assert manager.create_partition("full", 0).log_end_offset == (3 if existing else 0)
    manager.close()


def test_tick_forgets_idle_producers_every_check_interval(dirs, clock):
    from services.records.inplace import set_producer_state

    manager = _manager(
        dirs, clock, producer_id_expiration_ms=10_000, producer_id_expiration_check_interval_ms=1_000
    )
    partition_log = manager.create_partition("t", 0)
    for producer_id in (7, 8):
        batch = bytearray(make_batch(2, timestamp=clock.time_ms()))
        set_producer_state(batch, producer_id, 0, 0)
        partition_log.append(bytes(batch))
    clock.advance(9_000)
    batch = bytearray(make_batch(1, timestamp=clock.time_ms()))
    set_producer_state(batch, 8, 0, 2)  # producer 8 stays active
    partition_log.append(bytes(batch))
    manager.tick()
    assert set(partition_log.producer_state.producers) == {7, 8}  # not idle long enough yet
    clock.advance(2_000)
    manager.tick()
    assert set(partition_log.producer_state.producers) == {8}
    manager.close()


def test_partitions_open_in_parallel_at_load(dirs, clock):
    first = _manager(dirs, clock)
    for partition in range(12):
        first.create_partition("many", partition).append(make_batch(partition + 1))
    first.close()
    manager = LogManager(dirs, clock, {"segment.bytes": "2000"}, recovery_threads_per_dir=3)
    assert len(manager.load()) == 12
    assert [manager.get("many", p).log_end_offset for p in range(12)] == [p + 1 for p in range(12)]
    manager.close()
    with pytest.raises(ValueError, match="recovery threads"):
        LogManager(dirs, clock, recovery_threads_per_dir=0)


def test_high_watermarks_are_checkpointed_per_log_dir_and_survive_a_crash(dirs, clock, monkeypatch):
    manager = _manager(dirs[:2], clock)
    logs = [commit_every_append(manager.create_partition("hw", p)) for p in range(4)]
    for index, partition_log in enumerate(logs):
        for _ in range(index + 1):
            partition_log.append(make_batch(2))
    written = []
    real_write = checkpoint.write_atomically
    monkeypatch.setattr(
        checkpoint, "write_atomically", lambda p, d, **kw: (written.append(p), real_write(p, d, **kw))
    )
    manager.tick()
    assert sorted(written) == sorted(d / files.HIGH_WATERMARK_CHECKPOINT_FILE for d in dirs[:2])
    written.clear()
    manager.tick()
    assert written == [], "nothing moved: nothing written"
    logs[1].append(make_batch(2))
    manager.tick()
    assert written == [logs[1].directory.parent / files.HIGH_WATERMARK_CHECKPOINT_FILE]
    assert checkpoint.read_offsets_checkpoint(written[0]) == {("hw", 1): 6, ("hw", 3): 8}
    logs[2].append(make_batch(2))  # moved after the last tick: lost with the crash
    # A crash: no close; the logs reopen from the files as they are.
    for partition_log in logs:
        for segment in partition_log.segments:
            segment.close()
    crashed = _manager(dirs[:2], clock)
    assert [crashed.get("hw", p).high_watermark for p in range(4)] == [2, 6, 6, 8]
    crashed.close()
    assert [_manager(dirs[:2], clock).get("hw", p).high_watermark for p in range(4)] == [2, 6, 6, 8]


def test_a_partition_without_an_entry_reads_its_own_old_checkpoint(dirs, clock):
    manager = _manager(dirs[:1], clock)
    commit_every_append(manager.create_partition("old", 0)).append(make_batch(3))
    manager.close()
    # The layout before log-dir checkpoints: the partition directory's own file.
    (dirs[0] / files.HIGH_WATERMARK_CHECKPOINT_FILE).unlink()
    checkpoint.write_offset_checkpoint(dirs[0] / "old-0" / files.HIGH_WATERMARK_CHECKPOINT_FILE, "old", 0, 2)
    assert _manager(dirs[:1], clock).get("old", 0).high_watermark == 2


@pytest.mark.parametrize(
    "text",
    ["", "garbage", "1\n1\nt 0 5\n", "0\n2\nt 0 5\n", "0\n1\nt 0 -5\n", "0\n2\nt 0 5\nt 0 6\n"],
)
def test_a_malformed_log_dir_checkpoint_reads_as_empty(tmp_path, text):
    path = tmp_path / files.HIGH_WATERMARK_CHECKPOINT_FILE
    path.write_text(text)
    assert checkpoint.read_offsets_checkpoint(path) == {}


def test_a_batch_of_new_partitions_syncs_each_log_dir_once(dirs, clock, monkeypatch):
    manager = _manager(dirs[:2], clock)
    manager.create_partition("old", 0).append(make_batch(2))
    synced_dirs = []
    real_fsync_dir = checkpoint.fsync_dir
    monkeypatch.setattr(checkpoint, "fsync_dir", lambda d: (synced_dirs.append(d), real_fsync_dir(d)))
    outcomes = manager.create_partitions(
        [("new", p, {}) for p in range(6)] + [("old", 0, {}), ("bad", 0, {"retention.ms": "soon"})]
    )
    assert sorted(synced_dirs) == sorted(dirs[:2]), "one fsync per log dir, not one per partition"
    assert [type(o).__name__ for o in outcomes] == ["PartitionLog"] * 7 + ["InvalidConfigError"]
    assert outcomes[6].log_end_offset == 2  # the existing log, as it was
    manager.close()
    reopened = _manager(dirs[:2], clock)
    assert sorted(p.partition for p in reopened.partitions() if p.topic == "new") == list(range(6))
    reopened.close()


def test_tick_flushes_the_due_partitions_side_by_side_and_one_failure_spares_the_others(
    dirs, clock, monkeypatch
):
    """A tick's due flushes run in the flush threads, several at once; a partition whose fsync
    fails is counted, goes offline with its recovery point kept, and later ticks skip it while
    the other partitions keep flushing."""
    import threading

    manager = _manager(dirs, clock, flush_threads=3)
    logs = [manager.create_partition("t", p, {"flush.ms": "500"}) for p in range(6)]
    broken = logs[4]
    threads: set[str] = set()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        threads.add(threading.current_thread().name)
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(broken.directory) + "/"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for partition_log in logs:
        partition_log.append(make_batch(3))
    clock.advance(500)
    result = manager.tick()
    assert (result.flushed, result.failed) == (5, 1)
    assert [pl.recovery_point for pl in logs] == [3, 3, 3, 3, 0, 3]
    assert broken.offline
    assert threads and all(name.startswith("log-flush") for name in threads)
    monkeypatch.undo()
    for partition_log in logs:
        if partition_log is not broken:
            partition_log.append(make_batch(2))
    clock.advance(500)
    result = manager.tick()
    assert (result.flushed, result.failed) == (5, 0)
    assert [pl.recovery_point for pl in logs] == [5, 5, 5, 5, 0, 5]
    manager.close()
    marked = [(pl.directory / files.CLEAN_SHUTDOWN_FILE).exists() for pl in logs]
    assert marked == [True, True, True, True, False, True]  # the offline log is recovered at open
