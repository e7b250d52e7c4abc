"""Helpers for the log cleaner's tests: keyed batches, a compacted log, reading it back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from services.clock import ManualClock
from services.records import Compression, RecordBatchBuilder, iter_batches
from storage_node.log.cleaner.cleaner import CleanResult, clean_partition
from storage_node.log.partition_log import PartitionLog
from tests.unit.storage_node.log_testkit import config, open_log, read_all

#: (key, value or None for a tombstone)
KeyValue = tuple[bytes | None, bytes | None]


def keyed_batch(
    records: Sequence[KeyValue],
    *,
    timestamp: int,
    compression: Compression = Compression.NONE,
    producer: tuple[int, int, int] | None = None,
    transactional: bool = False,
) -> bytes:
    builder = RecordBatchBuilder(compression=compression)
    if producer is not None:
        builder.set_producer_state(*producer, is_transactional=transactional)
    for key, value in records:
        builder.append(value, timestamp=timestamp, key=key)
    return builder.build()


def compacted_log(directory: Path, clock: ManualClock, *, topic: str = "t", **overrides) -> PartitionLog:
    settings = {"cleanup_policy": "compact", "segment_bytes": 1024, "delete_retention_ms": 1000}
    settings.update(overrides)
    return open_log(directory, clock, config(**settings), topic=topic)


def clean(partition_log: PartitionLog, *, map_memory_bytes: int = 1 << 20, **kwargs) -> CleanResult | None:
    return clean_partition(
        partition_log, map_memory_bytes=map_memory_bytes, now_ms=partition_log.clock.time_ms(), **kwargs
    )


def clean_fully(partition_log: PartitionLog, **kwargs) -> list[CleanResult]:
    """Clean until a round finds nothing dirty (a small map takes several rounds)."""
    results: list[CleanResult] = []
    for _ in range(1000):
        result = clean(partition_log, **kwargs)
        if result is None:
            return results
        results.append(result)
    raise AssertionError("cleaning never finished")


def records_of(partition_log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, validating every batch's CRC on the way."""
    out = []
    for batch in iter_batches(read_all(partition_log)):
        batch.validate(deep=True)
        for record in batch.records():
            out.append((record.offset, record.key, record.value))
    return out


def latest_per_key(
    produced: list[tuple[int, bytes | None, bytes | None]],
) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in produced:
        if key is not None:
            latest[key] = (offset, value)
    return latest
