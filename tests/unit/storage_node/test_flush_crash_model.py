"""Crash model of the flush policy (an adversarial check of ``PartitionLog.flush`` and
``loader.first_recovered_base``): the disk keeps of each segment file only what its last fsync
made durable, nothing of a file never synced. After random appends, rolls, flushes,
truncations and retention, a log opened from that disk must read every offset below its
checkpointed recovery point exactly as the live log did: a trusted (not recovered) segment
whose index was never synced would point reads into the wrong bytes."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from storage_node.log import checkpoint, files
from tests.unit.storage_node.log_testkit import config, make_batch, open_log


def _record_durable_contents(monkeypatch) -> dict[str, bytes]:
    """path -> the file's content at its last fsync, for every file fsynced from now on."""
    durable: dict[str, bytes] = {}
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        real_fsync(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(files.SEGMENT_FILE_SUFFIXES) and os.path.isfile(path):
            with open(path, "rb") as file:
                durable[path] = file.read()

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return durable


def _crashed_copy(directory: Path, durable: dict[str, bytes], target: Path) -> None:
    """``directory`` as a crash would leave it: each segment file as of its last fsync (empty if
    never synced); the other files (checkpoints, written whole and renamed) as they are."""
    shutil.copytree(directory, target)
    (target / files.CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
    for path in target.iterdir():
        if path.name.endswith(files.SEGMENT_FILE_SUFFIXES):
            path.write_bytes(durable.get(str(directory / path.name), b""))


def _first_batch_at(partition_log, offset: int) -> bytes:
    data = partition_log.read(offset, 1).slice.read_bytes()
    size = int.from_bytes(data[8:12], "big") + 12
    return data[:size]


@pytest.mark.parametrize("seed", range(120))
def test_every_offset_below_the_checkpointed_recovery_point_survives_a_crash(
    tmp_path, clock, monkeypatch, seed
):
    rng = random.Random(seed)
    directory = tmp_path / "t-0"
    durable = _record_durable_contents(monkeypatch)
    partition_log = open_log(directory, clock, config(segment_bytes=1200, index_interval_bytes=100))
    try:
        for step in range(rng.randrange(5, 60)):
            op = rng.random()
            if op < 0.55:
                partition_log.append(
                    make_batch(rng.randrange(1, 4), value_size=rng.randrange(10, 120), tag=step)
                )
            elif op < 0.75:
                clock.advance(rng.choice((10, 60_000)))
                partition_log.flush(policy=rng.random() < 0.7)
            elif op < 0.82:
                partition_log.roll()
            elif op < 0.92 and partition_log.log_end_offset > partition_log.log_start_offset:
                partition_log.truncate_to(
                    rng.randrange(partition_log.log_start_offset, partition_log.log_end_offset + 1)
                )
            elif (
                partition_log.segment_count > 2
                and partition_log.high_watermark > partition_log.log_start_offset
            ):
                partition_log.delete_records_before(
                    rng.randrange(partition_log.log_start_offset, partition_log.high_watermark + 1)
                )
        recovery_point = (
            checkpoint.read_offset_checkpoint(directory / files.RECOVERY_POINT_CHECKPOINT_FILE, "t", 0) or 0
        )
        start = partition_log.log_start_offset
        expected = {
            o: _first_batch_at(partition_log, o)
            for o in range(start, min(recovery_point, partition_log.log_end_offset))
        }
        crashed = tmp_path / "crashed" / "t-0"
        _crashed_copy(directory, durable, crashed)
    finally:
        partition_log.close()
    monkeypatch.undo()
    reopened = open_log(crashed, clock, config(segment_bytes=1200, index_interval_bytes=100))
    try:
        assert reopened.log_end_offset >= min(recovery_point, max(expected, default=-1) + 1)
        for offset, batch in expected.items():
            assert _first_batch_at(reopened, offset) == batch, (
                f"offset {offset} (recovery point {recovery_point})"
            )
    finally:
        reopened.close()


def test_a_segment_truncated_refilled_and_flushed_up_to_its_end_is_recovered_after_a_crash(
    tmp_path, clock, monkeypatch
):
    """The case the random walk seldom meets: a segment whose indexes were synced when it was
    inactive is truncated (a follower), refilled with batches of other sizes, rolled, and a flush
    ends exactly at its end. Its synced indexes point into the old batches; the flush left its
    new ones unsynced (it holds the last flushed offset), so recovery must rebuild them."""
    directory = tmp_path / "t-0"
    durable = _record_durable_contents(monkeypatch)
    cfg = config(segment_bytes=1200, index_interval_bytes=60)
    partition_log = open_log(directory, clock, cfg)
    try:
        while partition_log.segment_count < 3:
            partition_log.append(make_batch(1, value_size=30, timestamp=1_700_000_000_000))
        partition_log.flush()  # the first segment is before the tail: its indexes are synced
        first = partition_log.segments[0]
        assert first.offset_index.entries >= 2
        partition_log.truncate_to(first.base_offset + 2)
        for step in range(3):
            partition_log.append(
                make_batch(3, value_size=60, tag=step, timestamp=1_700_000_001_000 + step * 1000)
            )
        partition_log.roll()
        partition_log.flush()  # ends at the first segment's end: its new indexes stay unsynced
        recovery_point = partition_log.recovery_point
        assert partition_log.segments[1].base_offset == first.next_offset == recovery_point
        expected = {o: _first_batch_at(partition_log, o) for o in range(recovery_point)}
        timestamps = [s.largest_timestamp for s in partition_log.segments[:-1]]
        found = [
            s.find_offset_for_timestamp(1_700_000_002_500, s.base_offset) for s in partition_log.segments[:-1]
        ]
        crashed = tmp_path / "crashed" / "t-0"
        _crashed_copy(directory, durable, crashed)
    finally:
        partition_log.close()
    monkeypatch.undo()
    reopened = open_log(crashed, clock, cfg)
    try:
        for offset, batch in expected.items():
            assert _first_batch_at(reopened, offset) == batch, f"offset {offset}"
        # The time index too: retention.ms deletes by a segment's largest timestamp.
        assert [s.largest_timestamp for s in reopened.segments[:-1]] == timestamps
        assert [
            s.find_offset_for_timestamp(1_700_000_002_500, s.base_offset) for s in reopened.segments[:-1]
        ] == found
    finally:
        reopened.close()
