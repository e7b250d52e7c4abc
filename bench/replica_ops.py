"""What operating a replicated cluster costs: a rolling restart, and moving replicas.

On a local cluster (3 storage nodes, then a 4th; 1 coordinator; 1 gateway; all on this machine):

* **rolling restart** -- an ``acks=all`` producer paced at ``--rate`` records/s to a 6-partition
  RF 3 topic (``min.insync.replicas=2``); first ``--steady-s`` seconds of steady state, then each
  node in turn stopped with SIGTERM (controlled shutdown) and started again once back in every
  ISR. Throughput and p99 latency during the restart against steady state; failed sends.
* **moving 1 GiB** -- ``--move-mb`` of data (default 1024) in a 4-partition RF 1 topic on node
  0, reassigned to node 3 (added empty): the time to move it all unthrottled, and with
  ``--throttle-mb`` MB/s (to check the throttle holds: the expected time is size / rate).

    python bench/replica_ops.py                     # writes bench/reports/replica-ops-<date>.md
    python bench/replica_ops.py --move-mb 256 --throttle-mb 50
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.reporting import load_line, write_report
from gateway.client import Admin, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec

RECORD_BYTES = 200
MOVE_PARTITIONS = 4


class PacedLoad(threading.Thread):
    """acks=all sends at a fixed rate; each acknowledgement's latency and time."""

    def __init__(self, servers: str, topic: str, rate: int, partitions: int) -> None:
        super().__init__(daemon=True)
        self.servers, self.topic, self.rate, self.partitions = servers, topic, rate, partitions
        self.samples: list[tuple[float, float]] = []  # (acknowledged at, latency s)
        self.failures = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def stop(self) -> None:
        self._halt.set()

    def _done(self, sent_at: float, error, _metadata) -> None:
        now = time.monotonic()
        with self._lock:
            if error is None:
                self.samples.append((now, now - sent_at))
            else:
                self.failures += 1

    def run(self) -> None:
        value = b"x" * RECORD_BYTES
        with Producer(servers=self.servers, acks="all", linger_ms=5, delivery_timeout_ms=120_000) as producer:
            start = time.monotonic()
            seq = 0
            while not self._halt.is_set():
                ahead = start + seq / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                sent_at = time.monotonic()
                producer.send(
                    self.topic,
                    value,
                    partition=seq % self.partitions,
                    on_delivery=lambda e, m, t=sent_at: self._done(t, e, m),
                )
                seq += 1
            producer.flush(120)

    def window(self, start: float, end: float) -> tuple[float, float]:
        """Acknowledged records/s and p99 latency (ms) between two instants."""
        with self._lock:
            inside = [lat for at, lat in self.samples if start <= at < end]
        if not inside:
            return 0.0, 0.0
        p99 = statistics.quantiles(inside, n=100)[98] if len(inside) >= 100 else max(inside)
        return len(inside) / (end - start), p99 * 1000


def full_isrs(admin: Admin, topic: str, replicas: int) -> bool:
    (description,) = admin.describe_topics([topic])
    return all(p.leader >= 0 and len(p.isr) == replicas for p in description.partitions)


def wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def rolling_restart(cluster: LocalCluster, admin: Admin, rate: int, steady_s: float) -> dict:
    topic = f"rolling-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 6, 3, {"min.insync.replicas": "2"})])
    wait(lambda: full_isrs(admin, topic, 3), 30, "full ISRs")
    load = PacedLoad(cluster.gateway, topic, rate, 6)
    load.start()
    time.sleep(2)  # warm-up: connections, metadata
    steady_start = time.monotonic()
    time.sleep(steady_s)
    restart_start = time.monotonic()
    for node in range(3):
        cluster.storage_nodes[node].stop(timeout=60)
        cluster.start_storage_node(node)
        wait(lambda: full_isrs(admin, topic, 3), 60, f"node {node} back in every ISR")
    restart_end = time.monotonic()
    admin.elect_leaders([topic])
    load.stop()
    load.join(150)
    steady = load.window(steady_start, restart_start)
    during = load.window(restart_start, restart_end)
    return {
        "steady": steady,
        "during": during,
        "restart_s": restart_end - restart_start,
        "failures": load.failures,
    }


def fill(servers: str, topic: str, megabytes: int) -> None:
    value = b"y" * 100_000
    count = megabytes * 10
    with Producer(servers=servers, acks=1, linger_ms=20, batch_size=1_000_000) as producer:
        for seq in range(count):
            producer.send(topic, value, partition=seq % MOVE_PARTITIONS)
        producer.flush(600)


def move(admin: Admin, topic: str, target: int, throttle: int) -> float:
    started = time.monotonic()
    moves = {TopicPartition(topic, p): (target,) for p in range(MOVE_PARTITIONS)}
    outcomes = admin.alter_partition_reassignments(moves, throttle_bytes_per_second=throttle)
    assert all(error is None for error in outcomes.values()), outcomes
    wait(lambda: not admin.list_partition_reassignments([topic]), 3600, "the move")
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=2_000, help="records/s during the rolling restart")
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--move-mb", type=int, default=1024)
    parser.add_argument("--throttle-mb", type=float, default=100.0)
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)

    load_at_start = os.getloadavg()[0]
    spec = LocalClusterSpec(storage_nodes=3, coordinators=1, gateways=1, session_timeout_s=2)
    with tempfile.TemporaryDirectory() as directory, LocalCluster(Path(directory), spec) as cluster:
        admin = Admin(servers=cluster.gateway)
        print("rolling restart ...", flush=True)
        restart = rolling_restart(cluster, admin, args.rate, args.steady_s)
        print(f"filling {args.move_mb} MB ...", flush=True)
        cluster.start_storage_node(3)
        wait(lambda: len(admin.describe_cluster().brokers) == 4, 30, "node 3")
        topic = f"move-{uuid.uuid4().hex[:6]}"
        admin.create_topics([NewTopic(topic, MOVE_PARTITIONS, 1)])
        admin.alter_partition_reassignments({TopicPartition(topic, p): (0,) for p in range(MOVE_PARTITIONS)})
        wait(lambda: not admin.list_partition_reassignments([topic]), 60, "placed on node 0")
        fill(cluster.gateway, topic, args.move_mb)
        print("moving unthrottled ...", flush=True)
        unthrottled_s = move(admin, topic, 3, 0)
        throttle = int(args.throttle_mb * 1e6)
        print(f"moving back at {args.throttle_mb} MB/s ...", flush=True)
        throttled_s = move(admin, topic, 0, throttle)
        admin.close()

    size = args.move_mb * 1e6
    expected = size / throttle
    (s_rate, s_p99), (d_rate, d_p99) = restart["steady"], restart["during"]
    lines = [
        f"# Replica operations benchmark, {datetime.date.today().isoformat()}",
        "",
        f"3 storage nodes (then 4), 1 coordinator, 1 gateway and the clients on {os.cpu_count()} cores "
        f"(loopback). {load_line(load_at_start)}",
        "",
        "| measure | value | note |",
        "|---|--:|---|",
        f"| steady state, acks=all at {args.rate:,}/s offered | {s_rate:,.0f} rec/s, p99 {s_p99:.1f} ms | "
        "6 partitions, RF 3, min.insync.replicas=2 |",
        f"| during the rolling restart ({restart['restart_s']:.1f} s, 3 nodes) | {d_rate:,.0f} rec/s, "
        f"p99 {d_p99:.1f} ms | SIGTERM (controlled shutdown), restart, back in every ISR |",
        f"| sends failed during the restart | {restart['failures']} | |",
        f"| move {args.move_mb:,} MB (4 partitions) to a new node, unthrottled | {unthrottled_s:.1f} s "
        f"({size / unthrottled_s / 1e6:.0f} MB/s) | |",
        f"| move it back, throttle {args.throttle_mb:g} MB/s | {throttled_s:.1f} s "
        f"({size / throttled_s / 1e6:.0f} MB/s) | expected {expected:.1f} s at the throttle |",
    ]
    write_report(lines, "replica-ops", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
