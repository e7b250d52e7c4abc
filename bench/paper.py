"""The 2011 Kafka paper's section 5, through the Python SDK against a local cluster.

The paper's setup: one producer publishes 200-byte messages to one broker, sending them one per
request ("batch size 1") and 50 per request; one consumer then reads every message back with
fetches of about 200 KB. Kafka 0.7 reached 50,000 msg/s unbatched, 400,000 msg/s batched and
22,000 msg/s consumed -- with a producer that never waited for an acknowledgement.

What runs here (each producer row writes its own single-partition topic):

* **unbatched, acks=0** -- one record per Produce request (``batch_size=1``, ``linger_ms=0``,
  a request holds one batch), pipelined on the ProduceStream with up to 16 requests in flight
  and no acknowledgement awaited beyond the gateway taking it: the paper's producer.
* **unbatched, acks=1** -- the same, but each request waits until the leader wrote it; with
  per-partition order kept that is one request in flight at a time (``max_in_flight`` 1 in
  effect): a round trip per message.
* **batched 50, acks=0 / acks=1** -- client-built RecordBatch v2 of exactly 50 records, one batch
  per request (``batch_size`` sized to hold 50 of these records, ``linger_ms`` long enough to
  fill it).
* **SDK defaults** -- ``acks=all``, 16 KB batches, 5 ms linger, several batches per request:
  what an application gets without tuning (no paper figure).
* **consume** -- one consumer reading a topic of ``--consume-messages`` messages (written with
  the SDK defaults) from the start with 200 KB fetches (``max_partition_fetch_bytes`` =
  ``fetch_max_bytes`` = 200 KB, up to 1,000 records per poll), records decoded client-side.

Every topic is read back and checked: the message count and an order-independent checksum
(sum of CRC-32s) of the values must equal what was sent. MB/s counts the 200-byte payloads.

    python bench/paper.py                      # 10,000 per producer row, 100,000 consumed; own cluster
    python bench/paper.py --messages 200000
    python bench/paper.py --gateway 127.0.0.1:9092   # an existing cluster
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
import zlib
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.accumulator import estimate_record_size
from services.records import RecordBatchBuilder

MESSAGE_BYTES = 200
BATCH_RECORDS = 50
FETCH_BYTES = 200 * 1024
PAPER = {"unbatched": 50_000, "batched": 400_000, "consume": 22_000}


@dataclass
class Row:
    name: str
    messages: int
    seconds: float
    paper: int | None
    checked: str = ""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.rate * MESSAGE_BYTES / 1e6


def message(i: int) -> bytes:
    """200 bytes, distinct per message, not trivially compressible."""
    head = b"%012d|" % i
    body = bytes((33 + (i * 31 + j * 7) % 90) for j in range(MESSAGE_BYTES - len(head)))
    return head + body


def batch_size_for(records: int) -> int:
    """The ``batch_size`` that makes the accumulator close a batch after exactly ``records``.

    A record is appended while the batch's encoded size plus the record's size estimate fits;
    so the size after ``records - 1`` records plus one estimate admits the last one, and the
    next record (which would need one more encoded record's worth) does not fit.
    """
    builder = RecordBatchBuilder()
    now = int(time.time() * 1000)
    for i in range(records - 1):
        builder.append(message(i), timestamp=now)
    return builder.size_in_bytes() + estimate_record_size(None, message(0), 0)


def produce(servers: str, topic: str, values: list[bytes], **settings) -> tuple[float, float]:
    """Send ``values`` to partition 0; returns (seconds, records per request)."""
    with Producer(servers=servers, **settings) as producer:
        producer.send(topic, b"warm-up", partition=0).get(30)  # metadata and the stream are up
        before = producer.metrics()
        start = time.perf_counter()
        futures = [producer.send(topic, value, partition=0) for value in values]
        producer.flush(timeout=600)
        elapsed = time.perf_counter() - start
        after = producer.metrics()
    failed = [f for f in futures if not f.succeeded()]
    if failed:
        raise SystemExit(f"{len(failed)} messages failed on {topic}: {failed[0].exception}")
    requests = after["requests"] - before["requests"]
    return elapsed, len(values) / max(1, requests)


def consume(servers: str, topic: str, expected: int) -> tuple[float, int, int]:
    """Read ``topic`` from the start; returns (seconds, count, checksum) of the values after warm-up."""
    count = checksum = 0
    tp = TopicPartition(topic, 0)
    with Consumer(
        servers=servers,
        max_partition_fetch_bytes=FETCH_BYTES,
        fetch_max_bytes=FETCH_BYTES,
        max_poll_records=1000,
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1)  # after the warm-up record
        start = time.perf_counter()
        deadline = time.monotonic() + 600
        while count < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                count += len(records)
                for record in records:
                    checksum += zlib.crc32(record.value)
        elapsed = time.perf_counter() - start
    return elapsed, count, checksum


def new_topic(admin: Admin, label: str) -> str:
    name = f"paper-{label}-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(name, 1)])
    return name


def run(servers: str, count: int, consume_count: int) -> list[Row]:
    values = [message(i) for i in range(count)]
    checksum = sum(zlib.crc32(v) for v in values)
    one_per_request = dict(batch_size=1, linger_ms=0, max_request_size=MESSAGE_BYTES + 100)
    fifty = batch_size_for(BATCH_RECORDS)
    batched = dict(batch_size=fifty, linger_ms=50, max_request_size=fifty)
    experiments = [
        (
            "produce, unbatched (1/request), acks=0, pipelined",
            "unbatched",
            dict(acks=0, max_in_flight=16, **one_per_request),
        ),
        ("produce, unbatched (1/request), acks=1, 1 in flight", "unbatched", dict(acks=1, **one_per_request)),
        (
            "produce, batched (50/batch), acks=0, pipelined",
            "batched",
            dict(acks=0, max_in_flight=16, **batched),
        ),
        ("produce, batched (50/batch), acks=1", "batched", dict(acks=1, **batched)),
        ("produce, SDK defaults (acks=all, 16 KB, 5 ms)", None, {}),
    ]
    rows: list[Row] = []
    with Admin(servers=servers) as admin:
        for name, paper_key, settings in experiments:
            topic = new_topic(admin, str(len(rows)))
            print(f"  {name} ...", file=sys.stderr, flush=True)
            seconds, per_request = produce(servers, topic, values, **settings)
            row = Row(
                name,
                count,
                seconds,
                PAPER.get(paper_key) if paper_key else None,
                f"{per_request:.1f} records/request",
            )
            check(servers, topic, count, checksum, row)
            rows.append(row)
        rows.append(consume_row(servers, admin, consume_count))
    return rows


def check(servers: str, topic: str, count: int, checksum: int, row: Row) -> None:
    _, got, got_checksum = consume(servers, topic, count)
    if got != count or got_checksum != checksum:
        raise SystemExit(
            f"{topic}: read back {got} of {count} messages, checksum {got_checksum} != {checksum}"
        )
    row.checked += f"; read back {got}/{count}, checksum ok"


def consume_row(servers: str, admin: Admin, count: int) -> Row:
    """The consumer experiment on its own topic, filled quickly with the SDK's default batching."""
    values = [message(i) for i in range(count)]
    checksum = sum(zlib.crc32(v) for v in values)
    topic = new_topic(admin, "consume")
    print(f"  consume: filling {topic} with {count:,} messages ...", file=sys.stderr, flush=True)
    produce(servers, topic, values)
    seconds, got, got_checksum = consume(servers, topic, count)
    if got != count or got_checksum != checksum:
        raise SystemExit(
            f"{topic}: read back {got} of {count} messages, checksum {got_checksum} != {checksum}"
        )
    return Row(
        f"consume, {FETCH_BYTES // 1024} KB fetches",
        got,
        seconds,
        PAPER["consume"],
        f"read {got}/{count}, checksum ok",
    )


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'experiment':52} {'messages':>9} {'seconds':>8} {'msg/s':>9} {'MB/s':>7} "
        f"{'Kafka 2011':>11} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        paper = f"{row.paper:,}" if row.paper else "-"
        ratio = f"{row.rate / row.paper:.2f}" if row.paper else "-"
        print(
            f"{row.name:52} {row.messages:>9,} {row.seconds:>8.2f} {row.rate:>9,.0f} {row.mb_per_s:>7.2f} "
            f"{paper:>11} {ratio:>6}"
        )
    print()
    for row in rows:
        print(f"{row.name}: {row.checked}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for what each row measures.",
    )
    parser.add_argument(
        "--messages", type=int, default=10_000, metavar="N", help="messages per producer row (default 10000)"
    )
    parser.add_argument(
        "--consume-messages",
        type=int,
        default=100_000,
        metavar="N",
        help="messages the consumer row reads (default 100000)",
    )
    parser.add_argument("--gateway", help="use this cluster (host:port) instead of starting a local one")
    parser.add_argument("--storage-nodes", type=int, default=1, help="storage nodes of the local cluster")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.consume_messages < 1:
        parser.error("--messages and --consume-messages must be at least 1")
    print(
        f"{args.messages:,} messages of {MESSAGE_BYTES} bytes per row; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    if args.gateway:
        rows = run(args.gateway, args.messages, args.consume_messages)
    else:
        from launcher.local_cluster import LocalCluster, LocalClusterSpec

        with tempfile.TemporaryDirectory(prefix="tributary-paper-") as directory:
            print("  starting a local cluster ...", file=sys.stderr, flush=True)
            with LocalCluster(directory, LocalClusterSpec(storage_nodes=args.storage_nodes)) as cluster:
                rows = run(cluster.gateway, args.messages, args.consume_messages)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
