from __future__ import annotations

import gc
import os

import pytest

from services.errors import CorruptRecordError, KafkaStorageError
from services.records import RecordBatchView
from storage_node.log.file_records import FileHandleCache, FileRecords, FileSlice, SegmentFileGoneError
from tests.unit.storage_node.log_testkit import make_batch


def test_append_returns_positions_and_slice_is_bounded_by_size(tmp_path):
    records = FileRecords.open(tmp_path / "0.log")
    assert records.append(b"abc") == 0
    assert records.append(memoryview(b"defgh")) == 3
    assert records.size == 8
    file_slice = records.slice(2, 100)
    assert isinstance(file_slice, FileSlice)
    assert (file_slice.position, file_slice.length) == (2, 6)
    assert file_slice.read_bytes() == b"cdefgh"
    assert records.read(1, 3) == b"bcd"
    buffer = bytearray(4)
    assert records.read_into(4, buffer) == 4 and bytes(buffer) == b"efgh"
    with pytest.raises(ValueError):
        records.slice(9, 1)


def test_slice_is_frozen_and_sendfile_ready(tmp_path):
    records = FileRecords.open(tmp_path / "0.log")
    records.append(b"0123456789")
    file_slice = records.slice(3, 4)
    with pytest.raises(AttributeError):
        file_slice.length = 1
    read_fd, write_fd = os.pipe()
    try:
        sent = os.sendfile(write_fd, file_slice.fileno(), file_slice.position, file_slice.length)
        assert sent == 4 and os.read(read_fd, 10) == b"3456"
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_reading_a_slice_of_a_shrunken_file_fails_loudly(tmp_path):
    records = FileRecords.open(tmp_path / "0.log")
    records.append(b"x" * 100)
    file_slice = records.slice(50, 50)
    assert records.truncate_to(60) == 40
    with pytest.raises(KafkaStorageError, match="shrank"):
        file_slice.read_bytes()


def test_truncate_to_rejects_growing(tmp_path):
    records = FileRecords.open(tmp_path / "0.log")
    records.append(b"x" * 10)
    with pytest.raises(ValueError):
        records.truncate_to(11)
    assert records.truncate_to(0) == 10 and records.size == 0 and (tmp_path / "0.log").stat().st_size == 0


def test_batches_stops_at_a_partial_tail_and_raises_on_an_impossible_length(tmp_path):
    batch = make_batch(3)
    records = FileRecords.open(tmp_path / "0.log")
    records.append(batch)
    records.append(batch)
    records.append(batch[:30])  # torn write
    found = [(position, RecordBatchView(data).size_in_bytes) for position, data in records.batches()]
    assert found == [(0, len(batch)), (len(batch), len(batch))]
    assert [p for p, _ in records.batch_headers()] == [0, len(batch)]
    bad = bytearray(batch)
    bad[8:12] = (5).to_bytes(4, "big")
    other = FileRecords.open(tmp_path / "1.log")
    other.append(batch)
    other.append(bad)
    with pytest.raises(CorruptRecordError):
        list(other.batches())


def test_slices_outlive_deletion_and_handle_eviction(tmp_path):
    records = FileRecords.open(tmp_path / "0.log")
    records.append(b"payload")
    file_slice = records.slice(0, 7)
    records.delete_file()
    assert not (tmp_path / "0.log").exists()
    assert file_slice.read_bytes() == b"payload"  # the open file keeps the inode alive
    with pytest.raises(SegmentFileGoneError):
        records.slice(0, 1)


def test_handle_cache_bounds_open_handles_and_reopens_lazily(tmp_path):
    cache = FileHandleCache(max_open=2)
    all_records = [FileRecords.open(tmp_path / f"{i}.log", handle_cache=cache) for i in range(5)]
    for i, records in enumerate(all_records):
        records.append(b"data%d" % i)
    gc.collect()
    assert sum(r.has_open_handle for r in all_records) == 2
    assert cache.evictions >= 3
    assert all_records[0].slice(0, 5).read_bytes() == b"data0"  # reopened on use
    assert sum(r.has_open_handle for r in all_records) == 2
    assert all_records[0].has_open_handle


def test_handle_cache_keeps_the_most_recently_used_across_repeated_touches(tmp_path):
    # Touching the most recent file again is a no-op (the append fast path), which must leave
    # the order right: a, b, then a (several times), then c evicts b, not a.
    cache = FileHandleCache(max_open=2)
    a, b, c = (FileRecords.open(tmp_path / f"{name}.log", handle_cache=cache) for name in "abc")
    a.append(b"a1")
    b.append(b"b1")
    for value in (b"a2", b"a3", b"a4"):
        a.append(value)
    c.append(b"c1")
    assert (a.has_open_handle, b.has_open_handle, c.has_open_handle) == (True, False, True)
    b.append(b"b2")  # reopened; now a goes
    assert (a.has_open_handle, b.has_open_handle, c.has_open_handle) == (False, True, True)
    c.close()  # forgotten by the cache: a later touch of it must not be skipped
    assert a.slice(0, 8).read_bytes() == b"a1a2a3a4" and len(cache) == 2


def test_handle_cache_releases_the_least_recently_used_a_tenth_of_the_bound_at_once(tmp_path):
    # Uses of members in turn (appends to many partitions) reorder nothing under a lock: each
    # use stamps the file. An eviction must still release the least recently used by those
    # stamps -- here the 10 files used only once, oldest first -- and a tenth of the bound at
    # once, never a file in use.
    cache = FileHandleCache(max_open=20)
    files = [FileRecords.open(tmp_path / f"{i}.log", handle_cache=cache) for i in range(20)]
    for round_ in range(3):
        for records in files[:10]:  # the first ten used again, in turn
            records.append(b"r%d" % round_)
    newest = FileRecords.open(tmp_path / "20.log", handle_cache=cache)
    assert [i for i, r in enumerate(files) if not r.has_open_handle] == [10, 11]
    assert newest.has_open_handle and len(cache) == 19 and cache.evictions == 2
    assert files[10].slice(0, 0).length == 0 and files[10].has_open_handle  # reopened on use
    assert len(cache) == 20


@pytest.mark.parametrize("walk", ["batch_headers", "batches"])
def test_a_walk_keeps_reading_its_own_file_when_the_handle_is_released_or_deleted_meanwhile(tmp_path, walk):
    # A walk holds its descriptor across yields. The handle cache (another thread) or a delete
    # drops the FileRecords' reference meanwhile; if that was the file's last reference the
    # descriptor would be closed and its number handed to the next open -- here a decoy file of
    # other bytes -- so the walk would fail with EBADF or read the decoy's bytes.
    records = FileRecords.open(tmp_path / "0.log")
    # Each batch larger than a walk's read-ahead, so the walk reads the file again after the drop.
    batches = [make_batch(60, value_size=20_000, tag=i) for i in range(4)]
    for batch in batches:
        records.append(batch)
    positions = []
    walker = getattr(records, walk)(0)
    positions.append(next(walker)[0])
    records.release_handle()
    records.delete_file()
    gc.collect()
    decoys = [os.open(tmp_path / f"decoy-{i}", os.O_RDWR | os.O_CREAT) for i in range(4)]
    try:
        for fd in decoys:
            os.write(fd, b"\xff" * 4096)
        positions.extend(position for position, _ in walker)
    finally:
        for fd in decoys:
            os.close(fd)
    expected, position = [], 0
    for batch in batches:
        expected.append(position)
        position += len(batch)
    assert positions == expected
