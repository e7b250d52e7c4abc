"""What full record validation costs on the storage node's append path (issue 12's benchmark).

The storage node walks every field of every record of a producer's batch before storing it
(``storage_node.log.validation.validate_producer_batches``, Kafka's LogValidator). This measures
that walk against the framing-only check it replaced (sizes, magic and CRC per batch), in CPU
seconds per GB of 16 KiB batches of 200-byte records, one 256 KiB request at a time. CPU time,
not wall time, so that a machine shared with other work still measures the code. Put beside the
whole append path's CPU per GB from ``bench/storage.py`` (its "storage CPU" column), the
difference is the share validation takes; the issue's target is at most 15%.

    python bench/validation.py
    TRIBUTARY_NO_EXTENSIONS=1 python bench/validation.py     # the pure-Python reference
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.records import iter_batches, speedups_enabled
from services.records.builder import RecordBatchBuilder
from storage_node.log.validation import validate_producer_batches

BATCH_BYTES = 16 << 10
BATCHES_PER_REQUEST = 16
ROUNDS = 2000


def one_batch() -> bytes:
    builder = RecordBatchBuilder()
    timestamp = int(time.time() * 1000)
    while builder.size_in_bytes() < BATCH_BYTES:
        builder.append(b"x" * 200, timestamp=timestamp)
    return builder.build()


def framing_only(data: bytes) -> None:
    for view in iter_batches(memoryview(data)):
        view.validate()  # size, magic, CRC


def full_validation(data: bytes) -> None:
    validate_producer_batches(data, max_message_bytes=1 << 20, segment_bytes=1 << 30)


def cpu_seconds_per_gb(check, payload: bytes, rounds: int) -> float:
    started = time.process_time()
    for _ in range(rounds):
        check(payload)
    return (time.process_time() - started) / (len(payload) * rounds / 1e9)


def main() -> None:
    payload = b"".join(one_batch() for _ in range(BATCHES_PER_REQUEST))
    rounds = ROUNDS if speedups_enabled() else ROUNDS // 20
    framing = cpu_seconds_per_gb(framing_only, payload, rounds)
    full = cpu_seconds_per_gb(full_validation, payload, rounds)
    print(f"C accelerator: {speedups_enabled()}")
    print(f"framing only (sizes, magic, CRC): {framing:.3f} CPU s/GB")
    print(f"full record validation:           {full:.3f} CPU s/GB (+{full - framing:.3f})")


if __name__ == "__main__":
    main()
