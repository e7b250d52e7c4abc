"""Benchmark: the storage node's partition log (storage_node.log) on a local disk.

Measures, for one partition in a temporary directory:

* append: ``PartitionLog.append`` of producer batches (``--records`` records of ``--value-size``
  bytes per batch), including the full validation it does (CRC + deep record decoding), offset
  stamping and the write; reported with and without deep validation's share.
* read: ``PartitionLog.read`` at random offsets (index lookup + header walk; a FileSlice, no
  bytes copied), then the same with the bytes copied out (``read_bytes``).
* recover: reopening after an unclean shutdown (every segment scanned and CRC-checked), and after
  a clean one (sanity checks only).
* group commit: N concurrent asyncio producers waiting for fsync, fsyncs per append.

Run from the repository root: ``python bench/storage_log.py`` (``--help`` for the options).
Numbers depend on the disk and page cache; the report prints what it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.clock import SystemClock
from services.records import Compression, RecordBatchBuilder, RecordBatchView
from storage_node.log import files
from storage_node.log.config import LogConfig
from storage_node.log.group_commit import GroupCommit
from storage_node.log.partition_log import PartitionLog


def _batch(records: int, value_size: int, compression: Compression) -> bytes:
    builder = RecordBatchBuilder(compression=compression)
    value = os.urandom(value_size // 2).hex().encode()[:value_size]
    for i in range(records):
        builder.append(value, timestamp=1_700_000_000_000 + i, key=b"key-%d" % i)
    return builder.build()


def _rate(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s"


def bench_append(directory: Path, batch: bytes, total_mb: int, config: LogConfig) -> PartitionLog:
    partition_log = PartitionLog.open(directory, "bench", 0, config, SystemClock())
    n = max(1, total_mb * 1024 * 1024 // len(batch))
    start = time.perf_counter()
    for _ in range(n):
        partition_log.append(batch)
    elapsed = time.perf_counter() - start
    records = RecordBatchView(batch).record_count * n
    validate_start = time.perf_counter()
    for _ in range(min(n, 200)):
        RecordBatchView(batch).validate(deep=True)
    deep_share = (time.perf_counter() - validate_start) / min(n, 200) * n / elapsed
    print(
        f"append   {n:>8} batches of {len(batch):>7} B: {_rate(n, elapsed)} batches, "
        f"{_rate(records, elapsed)} records, {n * len(batch) / elapsed / 1e6:,.0f} MB/s "
        f"(deep validation ~{deep_share:.0%} of it), {partition_log.segment_count} segments"
    )
    return partition_log


def bench_read(partition_log: PartitionLog, reads: int, max_bytes: int) -> None:
    rng = random.Random(0)
    end = partition_log.log_end_offset
    offsets = [rng.randrange(end) for _ in range(reads)]
    start = time.perf_counter()
    for offset in offsets:
        partition_log.read(offset, max_bytes)
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    copied = 0
    for offset in offsets:
        found = partition_log.read(offset, max_bytes).slice
        assert found is not None, f"offset {offset} was written above"
        copied += len(found.read_bytes())
    copy_elapsed = time.perf_counter() - start
    print(
        f"read     {reads:>8} random offsets, max_bytes {max_bytes}: {_rate(reads, elapsed)} slices "
        f"({elapsed / reads * 1e6:.0f} us each); with read_bytes {copied / copy_elapsed / 1e6:,.0f} MB/s"
    )


def bench_recover(directory: Path, config: LogConfig, size: int) -> None:
    clean = PartitionLog.open(directory, "bench", 0, config, SystemClock())
    clean.close()
    start = time.perf_counter()
    reopened = PartitionLog.open(directory, "bench", 0, config, SystemClock())
    clean_s = time.perf_counter() - start
    for segment in reopened.segments:  # crash: no close, no marker ...
        segment.log.release_handle()
    # ... and nothing flushed since the start, so every segment is scanned.
    (directory / files.RECOVERY_POINT_CHECKPOINT_FILE).unlink()
    start = time.perf_counter()
    recovered = PartitionLog.open(directory, "bench", 0, config, SystemClock())
    unclean_s = time.perf_counter() - start
    print(
        f"recover  {size / 1e6:,.0f} MB: unclean {unclean_s:.2f} s ({size / unclean_s / 1e6:,.0f} MB/s "
        f"scanned and CRC-checked), clean {clean_s * 1000:.1f} ms"
    )
    recovered.close()


def bench_group_commit(directory: Path, batch: bytes, producers: int, rounds: int) -> None:
    partition_log = PartitionLog.open(directory, "gc", 0, LogConfig.from_dict({}), SystemClock())
    group_commit = GroupCommit()

    async def producer():
        for _ in range(rounds):
            info = partition_log.append(batch)
            await group_commit.wait_durable(partition_log, info.last_offset)

    async def main():
        await asyncio.gather(*(producer() for _ in range(producers)))

    start = time.perf_counter()
    asyncio.run(main())
    elapsed = time.perf_counter() - start
    appends = producers * rounds
    print(
        f"commit   {producers} producers x {rounds} acks=all appends: {_rate(appends, elapsed)} acks, "
        f"{group_commit.flush_count} fsyncs ({group_commit.flush_count / appends:.2f} per append)"
    )
    partition_log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100, help="records per batch")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--total-mb", type=int, default=256)
    parser.add_argument("--segment-mb", type=int, default=64)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args(argv)
    batch = _batch(args.records, args.value_size, Compression.from_name(args.compression))
    config = LogConfig.from_dict({"segment.bytes": str(args.segment_mb * 1024 * 1024)})
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(
            f"python {sys.version.split()[0]}, data in {tmp}, {args.compression}, "
            f"{args.records} x {args.value_size} B records per batch"
        )
        partition_log = bench_append(Path(tmp) / "bench-0", batch, args.total_mb, config)
        bench_read(partition_log, args.reads, 1024 * 1024)
        size = partition_log.size_in_bytes
        partition_log.close()
        bench_recover(Path(tmp) / "bench-0", config, size)
        bench_group_commit(Path(tmp) / "gc-0", _batch(1, args.value_size, Compression.NONE), 50, 20)


if __name__ == "__main__":
    main()
