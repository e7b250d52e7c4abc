"""Recovery at open: one test per crash point, corruption at random positions in a loop."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time

import pytest

from services.records import iter_batches
from storage_node.log import files
from storage_node.log.loader import load_log
from tests.unit.storage_node.log_testkit import batches_in, config, make_batch, offsets_in, open_log, read_all

CFG = dict(segment_bytes=1500, index_interval_bytes=120)


def _fill(log_dir, clock, batches=40, seed=0):
    """A log of several segments with random batch sizes; returns the batches' (offsets, values)."""
    rng = random.Random(seed)
    partition_log = open_log(log_dir, clock, config(**CFG))
    appended = []
    for i in range(batches):
        count = rng.randint(1, 4)
        info = partition_log.append(
            make_batch(count, value_size=rng.randint(5, 60), tag=i, timestamp=clock.time_ms() + i)
        )
        appended.append(list(range(info.first_offset, info.last_offset + 1)))
    return partition_log, appended


def _crash(partition_log):
    """Drop the log without close(): no flush, no checkpoint, no clean-shutdown marker."""
    for segment in partition_log.segments:
        segment.log.release_handle()


def _segment_files(log_dir):
    return sorted(p for p in log_dir.iterdir() if p.suffix == files.LOG_FILE_SUFFIX)


def test_unclean_shutdown_recovers_everything_written(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, appended = _fill(log_dir, clock)
    _crash(partition_log)
    reopened = open_log(log_dir, clock, config(**CFG))
    assert reopened.log_end_offset == appended[-1][-1] + 1
    assert reopened.recovery_point == 0  # only a flush moves it
    assert offsets_in(read_all(reopened)) == list(range(reopened.log_end_offset))


def test_garbage_appended_to_the_active_segment_is_truncated(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, appended = _fill(log_dir, clock)
    _crash(partition_log)
    last = _segment_files(log_dir)[-1]
    size = last.stat().st_size
    with open(last, "ab") as f:
        f.write(os.urandom(777))
    reopened = open_log(log_dir, clock, config(**CFG))
    assert last.stat().st_size == size
    assert reopened.log_end_offset == appended[-1][-1] + 1
    assert reopened.append(make_batch(1)).first_offset == appended[-1][-1] + 1


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate-mid-entry", "zeroes"])
def test_a_deleted_or_corrupted_index_is_rebuilt_after_a_clean_shutdown(tmp_path, clock, damage):
    log_dir = tmp_path / "t-0"
    partition_log, _appended = _fill(log_dir, clock, batches=80)
    expected = read_all(partition_log)
    probes = {
        offset: partition_log.read(offset, 1).slice.position
        for offset in range(0, partition_log.log_end_offset, 7)
    }
    partition_log.close()
    for suffix in (files.INDEX_FILE_SUFFIX, files.TIME_INDEX_FILE_SUFFIX):
        for path in sorted(log_dir.glob(f"*{suffix}"))[:2]:
            if damage == "delete":
                path.unlink()
            elif damage == "garbage":
                path.write_bytes(random.Random(1).randbytes(path.stat().st_size or 24))
            elif damage == "truncate-mid-entry":
                path.write_bytes(path.read_bytes()[:-3])
            else:
                path.write_bytes(path.read_bytes() + bytes(24))
    reopened = open_log(log_dir, clock, config(**CFG))
    assert read_all(reopened) == expected
    for offset, position in probes.items():
        assert reopened.read(offset, 1).slice.position == position
    for segment in reopened.segments:
        segment.sanity_check()  # the rebuilt indexes are sound


@pytest.mark.parametrize("seed", range(20))
def test_corruption_at_a_random_position_keeps_exactly_the_records_before_it(tmp_path, clock, seed):
    rng = random.Random(seed)
    log_dir = tmp_path / "t-0"
    partition_log, _appended = _fill(log_dir, clock, seed=seed)
    _crash(partition_log)
    segment_paths = _segment_files(log_dir)
    victim = rng.choice(segment_paths)
    data = bytearray(victim.read_bytes())
    starts = []
    position = 0
    for batch in iter_batches(data):
        starts.append((position, batch.size_in_bytes, batch.base_offset))
        position += batch.size_in_bytes
    epoch_bytes = {start + i for start, _, _ in starts for i in range(12, 16)}  # outside the CRC
    where = rng.choice([p for p in range(len(data)) if p not in epoch_bytes])
    data[where] ^= 0xFF
    victim.write_bytes(data)
    first_lost = next(base for start, size, base in starts if start + size > where)

    reopened = open_log(log_dir, clock, config(**CFG))
    assert reopened.log_end_offset == first_lost
    assert offsets_in(read_all(reopened)) == list(range(first_lost))
    assert all(p.name <= victim.name for p in _segment_files(log_dir))  # later segments deleted
    assert reopened.append(make_batch(2)).first_offset == first_lost


def test_truncation_at_every_byte_of_the_last_batch(tmp_path, clock):
    source = tmp_path / "source" / "t-0"
    partition_log, _appended = _fill(source, clock, batches=12)
    _crash(partition_log)
    last = _segment_files(source)[-1]
    data = last.read_bytes()
    last_batch = batches_in(data)[-1]
    start = len(data) - last_batch.size_in_bytes
    for cut in range(start, len(data) + 1):
        log_dir = tmp_path / f"cut{cut}" / "t-0"
        shutil.copytree(source, log_dir)
        (log_dir / last.name).write_bytes(data[:cut])
        reopened = open_log(log_dir, clock, config(**CFG))
        expected_end = last_batch.next_offset if cut == len(data) else last_batch.base_offset
        assert reopened.log_end_offset == expected_end, cut
        assert offsets_in(read_all(reopened)) == list(range(expected_end))
        reopened.close()
        shutil.rmtree(log_dir.parent)


def _copy_if_still_there(source: str, destination: str) -> None:
    """Copy a file that may be renamed or removed while the directory is copied (a producer
    state snapshot's ``.tmp`` renamed into place): what a crash would leave either way."""
    try:
        shutil.copy2(source, destination)
    except FileNotFoundError:
        pass


def test_crash_mid_append_recovers_to_a_batch_boundary(tmp_path, clock):
    """Copy the files (without closing) while another thread appends, as a crash would leave
    them; every copy must recover to a prefix of what was appended, ending on a batch boundary."""
    cfg = config(segment_bytes=1_000_000, index_interval_bytes=200)
    log_dir = tmp_path / "live" / "t-0"
    partition_log = open_log(log_dir, clock, cfg)
    done = threading.Event()
    values: dict[int, bytes] = {}
    failures: list[BaseException] = []

    def writer():
        try:
            write_all()
        except BaseException as exc:  # noqa: BLE001 -- reported by the main thread below
            failures.append(exc)
        finally:
            done.set()  # also on failure, so the copy loop below cannot wait forever

    def write_all():
        for i in range(1500):
            # Mostly small batches (many index entries, rolls); now and then a big one, which a
            # concurrent copy can catch half-written, as a crash would leave it.
            size = 100_000 if i % 50 == 49 else 10 + i % 50
            batch = make_batch(1 + i % 3, value_size=size, tag=i)
            info = partition_log.append(batch)
            for offset, record in zip(
                range(info.first_offset, info.last_offset + 1), next(iter_batches(batch)).records()
            ):
                values[offset] = record.value

    thread = threading.Thread(target=writer)
    thread.start()
    copies = []
    # A bounded number of copies, each after the writer made progress, however fast or slow
    # the machine is (an unbounded copy loop against a starved writer fills the disk).
    while len(copies) < 8 and not done.is_set():
        mark = partition_log.log_end_offset
        while partition_log.log_end_offset < mark + 150 and not done.is_set():
            time.sleep(0.001)
        copy = tmp_path / f"copy{len(copies)}" / "t-0"
        shutil.copytree(log_dir, copy, dirs_exist_ok=True, copy_function=_copy_if_still_there)
        copies.append(copy)
    thread.join()
    assert not failures and copies
    for copy in copies:
        recovered = open_log(copy, clock, cfg)
        data = read_all(recovered)
        records = [r for batch in iter_batches(data) for r in batch.records()]
        assert [r.offset for r in records] == list(range(recovered.log_end_offset))
        assert all(r.value == values[r.offset] for r in records)
        recovered.close()


def test_crash_between_roll_and_write_keeps_the_empty_new_segment(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, appended = _fill(log_dir, clock, batches=10)
    partition_log.roll()
    _crash(partition_log)
    reopened = open_log(log_dir, clock, config(**CFG))
    assert reopened.segments[-1].size == 0
    assert reopened.segments[-1].base_offset == reopened.log_end_offset == appended[-1][-1] + 1
    assert reopened.append(make_batch(1)).first_offset == appended[-1][-1] + 1


def test_recovery_resumes_from_the_recovery_point(tmp_path, clock, monkeypatch):
    log_dir = tmp_path / "t-0"
    partition_log, _ = _fill(log_dir, clock, batches=60)
    partition_log.flush()
    flushed = partition_log.recovery_point
    partition_log.append(make_batch(2))
    _crash(partition_log)
    from storage_node.log.segment import Segment

    recovered = []
    original = Segment.recover

    def recording_recover(self, *args):
        recovered.append(self.base_offset)
        return original(self, *args)

    monkeypatch.setattr(Segment, "recover", recording_recover)
    reopened = open_log(log_dir, clock, config(**CFG))
    floor = max(s.base_offset for s in reopened.segments if s.base_offset <= flushed - 1)
    assert recovered == [s.base_offset for s in reopened.segments if s.base_offset >= floor]
    assert len(recovered) < reopened.segment_count
    assert reopened.recovery_point == flushed


def test_interrupted_operations_are_resolved_in_numbered_passes(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, _appended = _fill(log_dir, clock)
    expected = read_all(partition_log)
    partition_log.close()
    (log_dir / f"{files.RECOVERY_POINT_CHECKPOINT_FILE}{files.TEMP_FILE_SUFFIX}").write_text("junk")
    (log_dir / "00000000000000009999.log.deleted").write_bytes(b"old")
    (log_dir / "00000000000000009999.index.deleted").write_bytes(b"old")
    (log_dir / "00000000000000008888.log.cleaned").write_bytes(b"half")
    (log_dir / "00000000000000007777.index").write_bytes(bytes(8))  # orphan: no .log
    reopened = open_log(log_dir, clock, config(**CFG))
    names = {p.name for p in log_dir.iterdir()}
    assert not any(n.endswith((".tmp", ".deleted", ".cleaned")) for n in names)
    assert "00000000000000007777.index" not in names
    assert read_all(reopened) == expected


def test_a_swap_segment_replaces_the_segments_it_covers(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, _appended = _fill(log_dir, clock)
    segments = partition_log.segments
    first, second = segments[0], segments[1]
    # A "compacted" replacement for the first two segments: the same batches, one file.
    merged = first.log.read(0, first.size) + second.log.read(0, second.size)
    expected = read_all(partition_log)
    partition_log.close()
    (log_dir / f"{files.filename_prefix_from_offset(0)}.log.swap").write_bytes(merged)
    (log_dir / f"{files.filename_prefix_from_offset(0)}.index.swap").write_bytes(b"stale")
    reopened = open_log(log_dir, clock, config(**CFG))
    assert [s.base_offset for s in reopened.segments][:2] == [0, segments[2].base_offset]
    assert not list(log_dir.glob("*.swap"))
    assert read_all(reopened) == expected


def test_log_start_beyond_the_surviving_log_starts_an_empty_log_there(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, _appended = _fill(log_dir, clock, batches=10)
    end = partition_log.log_end_offset
    partition_log.delete_records_before(end)
    _crash(partition_log)
    for path in _segment_files(log_dir):
        path.write_bytes(b"")  # the disk lost everything
    reopened = open_log(log_dir, clock, config(**CFG))
    assert reopened.log_start_offset == reopened.log_end_offset == end
    assert reopened.append(make_batch(1)).first_offset == end


def test_a_malformed_checkpoint_means_full_recovery(tmp_path, clock):
    log_dir = tmp_path / "t-0"
    partition_log, appended = _fill(log_dir, clock, batches=10)
    partition_log.flush()
    _crash(partition_log)
    (log_dir / files.RECOVERY_POINT_CHECKPOINT_FILE).write_text("0\n1\nother 0 5\n")
    loaded = load_log(log_dir, "t", 0, config(**CFG), clock)
    assert loaded.recovery_point == 0 and not loaded.had_clean_shutdown
    assert loaded.next_offset == appended[-1][-1] + 1
    for segment in loaded.segments:
        segment.close()


@pytest.mark.parametrize("idle_roll", [False, True], ids=["active-tail", "rolled-at-the-recovery-point"])
def test_a_crash_losing_the_indexes_a_flush_left_unsynced_rebuilds_them(tmp_path, clock, idle_roll):
    """A flush leaves the indexes of the segment holding its last offset unsynced; a crash that
    loses them (here: all of them, the shortest prefix a crash can leave) must not leave a short
    index on a segment the next open trusts. With ``idle_roll``, a segment rolled after the flush
    starts exactly at the recovery point, so the unsynced segment is no longer the one holding
    the recovery point: the loader recovers from the one holding the last flushed offset."""
    log_dir = tmp_path / "t-0"
    partition_log, appended = _fill(log_dir, clock)
    partition_log.flush()
    if idle_roll:
        partition_log.roll()
        assert partition_log.segments[-1].base_offset == partition_log.recovery_point
    index_files = {
        index.path: index.path.read_bytes()
        for segment in partition_log.segments
        for index in (segment.offset_index, segment.time_index)
    }
    unsynced = [
        index.path
        for segment in partition_log.segments
        for index in (segment.offset_index, segment.time_index)
        if index._unsynced
    ]
    assert unsynced, "the flush left the last segment's indexes to recovery"
    _crash(partition_log)
    for path in unsynced:
        path.write_bytes(b"")  # the disk lost every entry written since the file's last fsync
    reopened = open_log(log_dir, clock, config(**CFG))
    for path, before in index_files.items():
        after = path.read_bytes()
        if path.suffix == files.TIME_INDEX_FILE_SUFFIX and after != before:
            # A recovered segment's time index ends with its largest timestamp, as a rolled one
            # does; the live active segment's had not been given that closing entry yet.
            assert after[: len(before)] == before and len(after) == len(before) + 12, path
        else:
            assert after == before, path
    assert offsets_in(read_all(reopened)) == list(range(appended[-1][-1] + 1))
    reopened.close()
