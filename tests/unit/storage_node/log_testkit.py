"""Shared helpers for the storage-node log tests (Kafka's ``LogTestUtils``)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from services.clock import ManualClock
from services.records import Compression, RecordBatchBuilder, RecordBatchView, iter_batches, set_base_offset
from storage_node.log.config import LogConfig
from storage_node.log.partition_log import PartitionLog
from storage_node.log.segment import Segment


def make_batch(
    count: int = 1,
    *,
    timestamp: int = 1_700_000_000_000,
    value_size: int = 20,
    timestamps: list[int] | None = None,
    compression: Compression = Compression.NONE,
    tag: int = 0,
) -> bytes:
    """A producer batch (base offset 0) of ``count`` records; values encode ``tag`` and index."""
    builder = RecordBatchBuilder(compression=compression)
    for i in range(count):
        ts = timestamps[i] if timestamps is not None else timestamp
        value = f"{tag}:{i}:".encode().ljust(value_size, b"x")
        builder.append(value, timestamp=ts, key=b"k%d" % i)
    return builder.build()


def config(**overrides) -> LogConfig:
    """A LogConfig from Kafka names written with underscores: ``config(segment_bytes=1000)``."""
    return LogConfig.from_dict({k.replace("_", "."): v for k, v in overrides.items()})


def open_log(
    directory: Path,
    clock: ManualClock,
    cfg: LogConfig | None = None,
    *,
    topic: str = "t",
    partition: int = 0,
    commit_appends: bool = True,
    **kwargs,
) -> PartitionLog:
    """Open a partition log; with ``commit_appends`` every append is committed at once (the high
    watermark follows the log end, as when this replica is the whole ISR), which is what tests of
    the log's own mechanics (retention, reads, delete-records) assume."""
    partition_log = PartitionLog.open(directory, topic, partition, cfg or config(), clock, **kwargs)
    if commit_appends:
        commit_every_append(partition_log)
    return partition_log


def commit_every_append(partition_log: PartitionLog) -> PartitionLog:
    """Move the high watermark to the log end after every append (a sole in-sync replica)."""

    def commit(log: PartitionLog, end: int) -> None:
        log.maybe_increment_high_watermark(end)

    partition_log.add_append_listener(commit)
    return partition_log


def open_segment(
    directory: Path, base_offset: int, clock: ManualClock, cfg: LogConfig | None = None
) -> Segment:
    directory.mkdir(parents=True, exist_ok=True)
    return Segment.open(directory, base_offset, cfg or config(), clock)


def fill_segment(
    segment: Segment,
    batches: int,
    *,
    start_offset: int | None = None,
    records_per_batch: int = 3,
    timestamp: int = 1_000,
    rng: random.Random | None = None,
    value_size: int = 20,
) -> list[tuple[int, int, int]]:
    """Append batches with offsets stamped as the partition log would; returns
    ``(base_offset, position, size)`` per batch."""
    offset = segment.next_offset if start_offset is None else start_offset
    placed = []
    for i in range(batches):
        count = rng.randint(1, records_per_batch) if rng else records_per_batch
        size = rng.randint(5, value_size) if rng else value_size
        ts = timestamp + (rng.randint(-5, 20) if rng else i)
        data = bytearray(make_batch(count, timestamp=ts, value_size=size, tag=offset))
        set_base_offset(data, offset)
        position = segment.append(data, offset, offset + count - 1, ts)
        placed.append((offset, position, len(data)))
        offset += count
    return placed


def batches_in(data: bytes) -> list[RecordBatchView]:
    return list(iter_batches(data))


def offsets_in(data: bytes) -> list[int]:
    """Every record offset in concatenated batches, decoding the records."""
    return [record.offset for batch in iter_batches(data) for record in batch.records()]


def read_all(partition_log: PartitionLog, start: int | None = None) -> bytes:
    """Every batch from ``start`` (default log start) to the log end, via read()."""
    offset = partition_log.log_start_offset if start is None else start
    out = bytearray()
    while offset < partition_log.log_end_offset:
        info = partition_log.read(offset, 1 << 20)
        if info.slice is None:
            break
        data = info.slice.read_bytes()
        out += data
        offset = batches_in(data)[-1].next_offset
    return bytes(out)


def snapshot_dir(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` (recursively) and its bytes."""
    paths = sorted(p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): p.read_bytes() for p in paths}


def open_files_under(directory: Path) -> set[str]:
    """``"fd -> path"`` of every file under ``directory`` this process holds open. Only those: the
    process's other descriptors come and go with other threads and with the garbage collector
    closing files of earlier tests."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile (the listing's own descriptor, among others)
        if target.startswith(str(directory)):
            found.add(f"{fd} -> {target}")
    return found
