"""What replication costs and how fast it recovers, through the Python SDK on a local cluster of
three storage nodes (all processes on this machine's cores, loopback).

In one run, side by side:

* **throughput** -- 200-byte records produced with the SDK defaults (16 KB batches, 5 ms linger)
  to a 1-partition topic: RF 1 with ``acks=1`` against RF 3 with ``acks=all`` and
  ``min.insync.replicas=2`` (the issue's target: at least half);
* **latency** -- ``acks=all`` produce latency (send to acknowledgement) of single records sent
  one at a time, p50 / p99, on RF 3 (and the same with ``acks=1`` on RF 1 for reference);
* **follower catch-up** -- a follower stopped (SIGSTOP) while the leader takes ``--catchup-mb``
  of data, then resumed: MB/s from its resumption to its log end equal to the leader's;
* **failover** -- kill -9 of a partition's leader, then the time to the first acknowledged
  ``acks=all`` produce on that partition (median of ``--failovers``; target: lease TTL + 1 s).

    python bench/replication.py                    # writes bench/reports/replication-<date>.md
    python bench/replication.py --records 200000 --failovers 10
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.reporting import load_line, runs, write_report
from gateway.client import Admin, NewTopic, Producer
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.proto import pb, storage_grpc

RECORD_BYTES = 200
TTL_S = 2


def new_topic(admin: Admin, replication_factor: int, **configs: str) -> str:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, replication_factor, configs)])
    return name


def throughput(servers: str, topic: str, records: int, acks) -> float:
    value = b"x" * RECORD_BYTES
    with Producer(servers=servers, acks=acks, linger_ms=5) as producer:
        started = time.perf_counter()
        futures = [producer.send(topic, value, partition=0) for _ in range(records)]
        producer.flush()
        elapsed = time.perf_counter() - started
    assert all(f.get(30).offset >= 0 for f in futures[-10:])
    return records / elapsed


def latencies(servers: str, topic: str, count: int, acks) -> list[float]:
    value = b"x" * RECORD_BYTES
    samples = []
    with Producer(servers=servers, acks=acks, linger_ms=0) as producer:
        producer.send(topic, value, partition=0).get(30)  # warm up the stream
        for _ in range(count):
            started = time.perf_counter()
            producer.send(topic, value, partition=0).get(30)
            samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def leader_of(admin: Admin, topic: str) -> tuple[int, list[int]]:
    p = admin.describe_topics([topic])[0].partitions[0]
    return p.leader, [r for r in p.replicas if r != p.leader]


def log_end(cluster: LocalCluster, node: int, topic: str) -> int:
    import grpc

    info = cluster.storage_nodes[node].info
    with grpc.insecure_channel(f"{info['host']}:{info['grpc_port']}") as channel:
        request = pb.DescribePartitionsRequest(partitions=[pb.TopicPartition(topic=topic, partition=0)])
        return (
            storage_grpc.StorageNodeStub(channel)
            .DescribePartitions(request, timeout=5)
            .partitions[0]
            .log_end_offset
        )


def catch_up(cluster: LocalCluster, admin: Admin, megabytes: int) -> tuple[float, float]:
    """(MB/s, seconds) for a follower resumed after the leader took ``megabytes`` without it."""
    topic = new_topic(admin, 3, **{"min.insync.replicas": "1"})
    leader, followers = leader_of(admin, topic)
    follower = followers[0]
    records = megabytes * (1 << 20) // RECORD_BYTES
    cluster.storage_nodes[follower].signal(signal.SIGSTOP)
    try:
        throughput(cluster.gateway, topic, records, 1)
        target = log_end(cluster, leader, topic)
    finally:
        started = time.perf_counter()
        cluster.storage_nodes[follower].signal(signal.SIGCONT)
    while log_end(cluster, follower, topic) < target:
        time.sleep(0.01)
    seconds = time.perf_counter() - started
    return megabytes / seconds, seconds


def failover_times(cluster: LocalCluster, admin: Admin, rounds: int) -> list[float]:
    topic = new_topic(admin, 3, **{"min.insync.replicas": "2"})
    times = []
    with Producer(servers=cluster.gateway, acks="all", linger_ms=0, delivery_timeout_ms=60_000) as producer:
        producer.send(topic, b"warm", partition=0).get(30)
        for _ in range(rounds):
            leader, _ = leader_of(admin, topic)
            killed = time.perf_counter()
            cluster.storage_nodes[leader].kill()
            producer.send(topic, b"after", partition=0).get(60)
            times.append(time.perf_counter() - killed)
            cluster.start_storage_node(leader)
            deadline = time.monotonic() + 60
            while len(admin.describe_topics([topic])[0].partitions[0].isr) < 3:
                assert time.monotonic() < deadline, "the restarted node did not rejoin the ISR"
                time.sleep(0.2)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--catchup-mb", type=int, default=100)
    parser.add_argument("--failovers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved throughput runs; the best counts")
    parser.add_argument("--report", type=Path, default=None, help="markdown report (default bench/reports/)")
    args = parser.parse_args(argv)

    load_at_start = os.getloadavg()[0]
    spec = LocalClusterSpec(storage_nodes=3, coordinators=1, gateways=1, session_timeout_s=TTL_S)
    with tempfile.TemporaryDirectory() as directory, LocalCluster(Path(directory), spec) as cluster:
        admin = Admin(servers=cluster.gateway)
        rf1 = new_topic(admin, 1)
        rf3 = new_topic(admin, 3, **{"min.insync.replicas": "2"})
        print("throughput ...", flush=True)
        bases, replicateds = [], []
        for _ in range(args.rounds):  # interleaved, so a burst of other load hits both alike
            bases.append(throughput(cluster.gateway, rf1, args.records, 1))
            replicateds.append(throughput(cluster.gateway, rf3, args.records, "all"))
        base, replicated = max(bases), max(replicateds)
        print("latency ...", flush=True)
        lat_all = latencies(cluster.gateway, rf3, args.latency_samples, "all")
        lat_one = latencies(cluster.gateway, rf1, args.latency_samples, 1)
        print("catch-up ...", flush=True)
        catch_mb_s, catch_s = catch_up(cluster, admin, args.catchup_mb)
        print("failover ...", flush=True)
        failovers = failover_times(cluster, admin, args.failovers)
        admin.close()

    ratio = replicated / base
    median_failover = statistics.median(failovers)
    lines = [
        f"# Replication benchmark, {datetime.date.today().isoformat()}",
        "",
        f"3 storage nodes, 1 coordinator, 1 gateway and the client on {os.cpu_count()} cores (loopback); "
        f"{RECORD_BYTES}-byte records through the Python SDK; lease TTL {TTL_S} s; throughput best of "
        f"{args.rounds} interleaved runs. {load_line(load_at_start)}",
        "",
        "| measure | value | target |",
        "|---|--:|---|",
        f"| RF 1, acks=1 throughput | {base:,.0f} rec/s ({base * RECORD_BYTES / 1e6:.1f} MB/s) | |",
        f"| RF 3, acks=all, min.insync.replicas=2 throughput | {replicated:,.0f} rec/s "
        f"({replicated * RECORD_BYTES / 1e6:.1f} MB/s) | |",
        f"| ratio RF 3 acks=all / RF 1 acks=1 | {ratio:.2f} | >= 0.50 |",
        f"| acks=all latency p50 / p99 (RF 3, one record at a time) | {percentile(lat_all, 50):.2f} / "
        f"{percentile(lat_all, 99):.2f} ms | |",
        f"| acks=1 latency p50 / p99 (RF 1, reference) | {percentile(lat_one, 50):.2f} / "
        f"{percentile(lat_one, 99):.2f} ms | |",
        f"| follower catch-up ({args.catchup_mb} MB behind) | {catch_mb_s:.0f} MB/s ({catch_s:.2f} s) | |",
        f"| kill -9 leader -> first acks=all ack, median of {len(failovers)} | {median_failover:.2f} s "
        f"(min {min(failovers):.2f}, max {max(failovers):.2f}) | <= TTL + 1 s = {TTL_S + 1} s |",
    ]
    lines += [
        "",
        "All throughput runs (rec/s): RF 1 acks=1 "
        + runs(bases)
        + "; RF 3 acks=all "
        + runs(replicateds)
        + ".",
    ]
    write_report(lines, "replication", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
