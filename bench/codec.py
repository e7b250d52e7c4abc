"""Benchmark: the RecordBatch v2 codec (services.records) against kafka-python's pure-Python one.

Encodes and decodes records of ``--value-size`` bytes in batches of each ``--batch-sizes`` for
each ``--codecs``, ours and kafka-python's side by side, and prints one table. Then walks a
concatenated "fetch response" of 1000-record uncompressed batches with ``iter_batches`` and
iterates every record, the consumer path the 1 M records/s target is about.

* encode: build ``ceil(records / batch)`` batches from scratch (builder, append, build); each
  batch is dropped once built, as a producer frees it after sending. (Keeping all of them makes
  both sides ~25% slower on this machine, mostly page faults from the allocator, not codec work.)
* decode: view each built batch, check its CRC, iterate its records and touch each value.
* MB/s counts record value bytes (what a user sends), so both implementations are comparable.
* Each figure is the best of ``--repeat`` runs, ours and kafka-python's taking turns (so both
  see the same machine load), with the cyclic GC paused as ``timeit`` does; ratio = ours /
  kafka-python.

kafka-python's ``kafka.record`` is pure Python (it ships no C extension); like ours it uses the
``crc32c`` C package for checksums when installed, which this script reports. Ours runs its
per-record loops in the optional C accelerator (``services/records/_speedups.c``) when it is
built; the header line says which backend was used. ``TRIBUTARY_NO_EXTENSIONS=1 python
bench/codec.py`` measures the pure-Python code.

Run from the repository root: ``python bench/codec.py`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kafka.record import default_records as kp_records
from kafka.record import util as kp_util

from services.records import (
    Compression,
    RecordBatchBuilder,
    RecordBatchView,
    iter_batches,
    speedups_enabled,
)

BASE_TIMESTAMP = 1_700_000_000_000


def _make_payloads(count: int, value_size: int) -> list[tuple[bytes, bytes, int]]:
    # Distinct, mildly compressible values (like JSON-ish events), 16-byte keys, 1 ms apart.
    values = []
    for i in range(count):
        stem = f'{{"id":{i},"user":"u{i % 97}","event":"click","payload":"'.encode()
        filler = bytes((65 + (i * 7 + j) % 26) for j in range(max(0, value_size - len(stem) - 2)))
        values.append((f"key-{i:012d}".encode(), (stem + filler + b'"}')[:value_size], BASE_TIMESTAMP + i))
    return values


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def encode_ours(
    batches: list[list[tuple[bytes, bytes, int]]], codec: Compression, keep: list | None = None
) -> int:
    total = 0
    for batch in batches:
        builder = RecordBatchBuilder(compression=codec)
        append = builder.append
        for key, value, timestamp in batch:
            append(value, timestamp=timestamp, key=key)
        data = builder.build()
        total += len(data)
        if keep is not None:
            keep.append(data)
    return total


def encode_kafka_python(
    batches: list[list[tuple[bytes, bytes, int]]], codec: Compression, keep: list | None = None
) -> int:
    total = 0
    for batch in batches:
        builder = kp_records.DefaultRecordBatchBuilder(
            magic=2,
            compression_type=int(codec),
            is_transactional=False,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 30,
        )
        append = builder.append
        for offset, (key, value, timestamp) in enumerate(batch):
            append(offset, timestamp, key, value, [])
        data = bytes(builder.build())
        total += len(data)
        if keep is not None:
            keep.append(data)
    return total


def decode_ours(encoded: list[bytes]) -> int:
    total = 0
    for data in encoded:
        view = RecordBatchView(data)
        view.validate()
        for record in view:
            total += len(record.value or b"")
    return total


def decode_kafka_python(encoded: list[bytes]) -> int:
    total = 0
    for data in encoded:
        batch = kp_records.DefaultRecordBatch(data)
        if not batch.validate_crc():
            raise RuntimeError("kafka-python rejected a CRC")
        for record in batch:
            total += len(record.value or b"")
    return total


def walk_ours(fetch_buffer: bytes) -> int:
    count = 0
    for view in iter_batches(fetch_buffer):
        view.validate()
        for _record in view:
            count += 1
    return count


def _time_once(fn: Callable[[], object]) -> float:
    # Like timeit: the cyclic GC is paused while timing, so a collection triggered by one side's
    # garbage is not charged to whichever side happens to be running.
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    finally:
        gc.enable()


def _best_interleaved(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best time of each function, running them in turn so that both see the same machine load."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], _time_once(fn))
    return best


def _row(case: str, impl: str, records: int, value_bytes: int, seconds: float, ratio: str) -> str:
    rate = records / seconds
    mbps = value_bytes / seconds / 1e6
    return f"| {case:<24} | {impl:<12} | {rate:>14,.0f} | {mbps:>8.1f} | {ratio:>13} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="records per case (default 20000)")
    parser.add_argument("--value-size", type=int, default=200, help="value bytes per record (default 200)")
    parser.add_argument(
        "--batch-sizes", default="1,50,1000", help="records per batch, comma-separated (default 1,50,1000)"
    )
    parser.add_argument(
        "--codecs", default="none,snappy", help="codecs, comma-separated (default none,snappy)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the best counts (default 5)")
    args = parser.parse_args(argv)

    batch_sizes = [int(s) for s in args.batch_sizes.split(",")]
    codecs = [Compression.from_name(name) for name in args.codecs.split(",")]
    payloads = _make_payloads(args.records, args.value_size)
    value_bytes = sum(len(v) for _, v, _ in payloads)

    kp_crc = getattr(kp_util._crc32c, "__module__", "?")
    backend = "C accelerator (_speedups)" if speedups_enabled() else "pure Python"
    print(
        f"python {sys.version.split()[0]}; {args.records} records of {args.value_size} B per case; "
        f"best of {args.repeat}; ours: {backend}; kafka-python records module "
        f"{kp_records.__file__.rsplit(os.sep, 1)[-1]} (pure Python), its crc32c from {kp_crc}"
    )
    header = f"| {'case':<24} | {'impl':<12} | {'records/s':>14} | {'MB/s':>8} | {'ours/kafka-py':>13} |"
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")

    for codec in codecs:
        for batch_size in batch_sizes:
            batches = _chunks(payloads, batch_size)
            encoded: list[bytes] = []
            encode_ours(batches, codec, keep=encoded)
            theirs: list[bytes] = []
            encode_kafka_python(batches, codec, keep=theirs)
            if decode_ours(theirs) != value_bytes:
                raise RuntimeError("interop check failed: kafka-python batch read back wrong")
            if decode_kafka_python(encoded) != value_bytes:
                raise RuntimeError("interop check failed: our batch read back wrong by kafka-python")
            for direction, ours_call, theirs_call in (
                (
                    "encode",
                    partial(encode_ours, batches, codec),
                    partial(encode_kafka_python, batches, codec),
                ),
                ("decode", partial(decode_ours, encoded), partial(decode_kafka_python, encoded)),
            ):
                ours_s, theirs_s = _best_interleaved([ours_call, theirs_call], args.repeat)
                case = f"{direction} {codec.name.lower()} x{batch_size}"
                print(_row(case, "ours", args.records, value_bytes, ours_s, f"{theirs_s / ours_s:.2f}x"))
                print(_row(case, "kafka-python", args.records, value_bytes, theirs_s, ""))

    fetch_batches: list[bytes] = []
    encode_ours(_chunks(payloads, 1000), Compression.NONE, keep=fetch_batches)
    fetch = b"".join(fetch_batches)
    (walk_s,) = _best_interleaved([lambda: walk_ours(fetch)], args.repeat)
    print(_row("walk none x1000 (fetch)", "ours", args.records, value_bytes, walk_s, "-"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
