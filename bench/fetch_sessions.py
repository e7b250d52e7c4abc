"""Consume rate as partitions grow, with and without fetch sessions (KIP-227, data protocol v3).

One local cluster per mode (one storage node, one gateway; ``sessions`` as it ships, ``full``
with ``--data-fetch-sessions-per-connection 0`` so every fetch is a full one, as in protocol
version 2). For each partition count a topic gets ``--messages`` 200-byte messages spread evenly
over its partitions, then a fresh consumer with compare.py's settings (200 KB fetches, up to
1,000 records per poll) reads them all from the start, ``--rounds`` times; the best round is
reported, every record counted and checksummed.

    python bench/fetch_sessions.py                          # 1, 16, 256 partitions, both modes
    python bench/fetch_sessions.py --partitions 256 --modes sessions --rounds 5
    python bench/fetch_sessions.py --profile /tmp/prof      # py-spy of gateway, node, client
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers import FETCH_BYTES, PREFETCH_MESSAGES
from bench.profile_top import Profiler

MODES = {"sessions": [], "full": ["--data-fetch-sessions-per-connection", "0"]}
MESSAGE_BYTES = 200


def produce(servers: str, topic: str, partitions: int, values: list[bytes]) -> None:
    from gateway.client import Producer

    with Producer(servers=servers, acks=1, linger_ms=5, batch_size=256 << 10) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value, partition=i % partitions)
        producer.flush(timeout=120)


def consume(servers: str, topic: str, partitions: int, n: int) -> tuple[float, int, int]:
    """Seconds to read ``n`` records from the start, records read, their checksum."""
    from gateway.client import Consumer, TopicPartition

    count = total = 0
    with Consumer(
        servers=servers,
        max_partition_fetch_bytes=FETCH_BYTES,
        fetch_max_bytes=FETCH_BYTES,
        max_poll_records=PREFETCH_MESSAGES,
        auto_offset_reset="earliest",
    ) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        started = time.perf_counter()
        deadline = time.monotonic() + 120
        while count < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    total += zlib.crc32(record.value)
                count += len(records)
        return time.perf_counter() - started, count, total


def run_mode(mode: str, args, results: dict) -> None:
    from gateway.client import Admin, NewTopic
    from launcher.local_cluster import LocalCluster, LocalClusterSpec

    spec = LocalClusterSpec(
        storage_nodes=1,
        storage_args=["--log-level", "WARNING"],
        gateway_args=["--log-level", "WARNING", *MODES[mode]],
        coordinator_args=["--log-level", "WARNING"],
    )
    data_dir = Path(tempfile.mkdtemp(prefix=f"fetch-sessions-{mode}-"))
    try:
        with LocalCluster(data_dir, spec) as cluster:
            servers = cluster.gateway
            values = [(b"%08d" % i).ljust(MESSAGE_BYTES, b"x") for i in range(args.messages)]
            expected = sum(zlib.crc32(v) for v in values)
            for partitions in args.partitions:
                topic = f"fs-{partitions}-{uuid.uuid4().hex[:6]}"
                with Admin(servers=servers) as admin:
                    admin.create_topics([NewTopic(topic, partitions)])
                produce(servers, topic, partitions, values)
                consume(servers, topic, partitions, args.messages)  # warm-up (caches, connections)
                profiler = (
                    Profiler.start(Path(args.profile), f"{mode}-{partitions}", cluster, rate=500)
                    if args.profile
                    else None
                )
                if profiler is not None:
                    time.sleep(1.0)  # py-spy attaches
                best = None
                for _ in range(args.rounds):
                    seconds, count, total = consume(servers, topic, partitions, args.messages)
                    if count != args.messages or total != expected:
                        raise SystemExit(
                            f"{mode} {partitions}: read {count} records, checksum ok: {total == expected}"
                        )
                    best = seconds if best is None else min(best, seconds)
                if profiler is not None:
                    profiler.stop()
                assert best is not None
                rate = args.messages / best
                results[(mode, partitions)] = rate
                print(
                    f"{mode:>8} {partitions:>4} partitions: {rate:>10,.0f} msg/s (best of {args.rounds})",
                    flush=True,
                )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1,16,256", help="partition counts (default 1,16,256)")
    parser.add_argument("--messages", type=int, default=40_000, help="messages per topic (default 40,000)")
    parser.add_argument("--rounds", type=int, default=3, help="timed reads per topic; the best counts")
    parser.add_argument("--modes", default="sessions,full", help="sessions, full, or both")
    parser.add_argument(
        "--profile", metavar="DIR", help="py-spy raw profiles of the gateway, the node and the client"
    )
    args = parser.parse_args(argv)
    args.partitions = [int(p) for p in args.partitions.split(",") if p]
    results: dict = {}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}")
        run_mode(mode, args, results)
    one = {mode: rate for (mode, partitions), rate in results.items() if partitions == 1}
    for (mode, partitions), rate in sorted(results.items()):
        if mode in one and partitions > 1:
            print(f"{mode:>8} {partitions:>4} partitions: {one[mode] / rate:.2f}x slower than 1 partition")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
