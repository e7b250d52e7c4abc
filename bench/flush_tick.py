"""Benchmark: what one ``LogManager.tick`` costs the storage node when every partition's
``flush.ms`` is due -- the periodic flush behind ``bench/compare.py``'s partitions experiment.

``--partitions`` logs in a temporary directory on the local disk; before each tick,
``--appends`` producer batches (``--records`` records of ``--value-size`` bytes) go to every
partition and a manual clock moves ``flush.ms`` on, so each tick flushes every partition. Reports
the process CPU (user + system, all threads: the fsyncs' kernel work is charged to the thread
calling them) and the wall time per tick and per flush, the first tick (which writes every
partition's first checkpoints) left out. Appends are outside the timing.

    python bench/flush_tick.py                        # 256 partitions, 10 ticks
    python bench/flush_tick.py --partitions 1 --ticks 50
    python bench/flush_tick.py --flush-threads 1      # the flushes one after another

Shared machine: alternate the variants compared (old, new, old, new) and read ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.clock import ManualClock
from services.records import RecordBatchBuilder
from storage_node.log.log_manager import DEFAULT_FLUSH_THREADS, LogManager


def _process_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _batch(records: int, value_size: int) -> bytes:
    builder = RecordBatchBuilder()
    for i in range(records):
        builder.append((b"%08d" % i).ljust(value_size, b"x"), timestamp=1_700_000_000_000)
    return builder.build()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=256)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--appends", type=int, default=5, help="batches per partition per tick")
    parser.add_argument("--records", type=int, default=50)
    parser.add_argument("--value-size", type=int, default=200)
    parser.add_argument("--flush-ms", type=int, default=1000)
    parser.add_argument("--flush-threads", type=int, default=DEFAULT_FLUSH_THREADS)
    parser.add_argument("--dir", type=Path, help="parent of the temporary log dir (default: the system's)")
    args = parser.parse_args()
    batch = _batch(args.records, args.value_size)
    cpu = wall = 0.0
    flushed = 0
    with tempfile.TemporaryDirectory(dir=args.dir) as log_dir:
        clock = ManualClock(1_700_000_000_000)
        manager = LogManager(
            [Path(log_dir)], clock, {"flush.ms": str(args.flush_ms)}, flush_threads=args.flush_threads
        )
        manager.load()
        logs = [manager.create_partition("bench", p) for p in range(args.partitions)]
        for tick in range(args.ticks + 1):
            for partition_log in logs:
                for _ in range(args.appends):
                    partition_log.append(batch)
            clock.advance(args.flush_ms)
            cpu_before, wall_before = _process_cpu_seconds(), time.perf_counter()
            result = manager.tick()
            if tick:  # the first tick writes every partition's first checkpoints
                cpu += _process_cpu_seconds() - cpu_before
                wall += time.perf_counter() - wall_before
                flushed += result.flushed
        manager.close()
    ticks = args.ticks
    print(
        f"{args.partitions} partitions, {args.flush_threads} flush threads: per tick "
        f"{cpu / ticks * 1e3:.1f} ms CPU, {wall / ticks * 1e3:.1f} ms wall, "
        f"{flushed / ticks:.0f} flushes; per flush {cpu / max(flushed, 1) * 1e6:.0f} us CPU"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
