"""What TLS on the gateway costs: SDK produce and consume throughput against a local cluster with
plaintext gateways and against one with mutual TLS (``LocalClusterSpec(secure=True)``), in one
run, each on the raw data path (the SDK's default) and on gRPC.

    python bench/tls.py                     # writes bench/reports/tls-<date>.md
    python bench/tls.py --records 200000
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.reporting import load_line, write_report
from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec

RECORD_BYTES = 200


def produce(servers: str, topic: str, records: int, data_path: str, settings: dict) -> float:
    value = b"x" * RECORD_BYTES
    with Producer(servers=servers, acks=1, data_path=data_path, **settings) as producer:
        started = time.perf_counter()
        for _ in range(records):
            producer.send(topic, value, partition=0)
        producer.flush(120)
        return records / (time.perf_counter() - started)


def consume(servers: str, topic: str, records: int, data_path: str, settings: dict) -> float:
    with Consumer(
        servers=servers,
        data_path=data_path,
        auto_offset_reset="earliest",
        max_poll_records=10_000,
        fetch_max_bytes=1 << 20,
        **settings,
    ) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        count = 0
        started = time.perf_counter()
        while count < records:
            for batch in consumer.poll(timeout_ms=1000).values():
                count += len(batch)
        return records / (time.perf_counter() - started)


def measure(secure: bool, records: int, rounds: int) -> dict[str, float]:
    spec = LocalClusterSpec(storage_nodes=1, coordinators=1, gateways=1, secure=secure)
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory, LocalCluster(Path(directory), spec) as cluster:
        settings: dict[str, Any] = cluster.pki.client_settings() if cluster.pki is not None else {}
        with Admin(servers=cluster.gateway, **settings) as admin:
            for path in ("auto", "grpc"):
                best_in = best_out = 0.0
                for _ in range(rounds):
                    topic = f"tls-{uuid.uuid4().hex[:6]}"
                    admin.create_topics([NewTopic(topic, 1)])
                    best_in = max(best_in, produce(cluster.gateway, topic, records, path, settings))
                    best_out = max(best_out, consume(cluster.gateway, topic, records, path, settings))
                results[f"produce-{path}"] = best_in
                results[f"consume-{path}"] = best_out
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2, help="runs per measure; the best counts")
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    print("plaintext ...", flush=True)
    plain = measure(False, args.records, args.rounds)
    print("mutual TLS ...", flush=True)
    tls = measure(True, args.records, args.rounds)
    rows = []
    for key, label in (
        ("produce-auto", "produce, raw data path (SDK default)"),
        ("consume-auto", "consume, raw data path (SDK default)"),
        ("produce-grpc", "produce, gRPC"),
        ("consume-grpc", "consume, gRPC"),
    ):
        ratio = tls[key] / plain[key]
        rows.append(
            f"| {label} | {plain[key]:,.0f} | {tls[key]:,.0f} | {ratio:.2f} | "
            f"{'yes' if ratio >= 0.6 else 'no'} |"
        )
    lines = [
        f"# TLS benchmark, {datetime.date.today().isoformat()}",
        "",
        f"One storage node, one coordinator, one gateway and the client on {os.cpu_count()} cores "
        f"(loopback); {args.records:,} records of {RECORD_BYTES} bytes, acks=1, SDK defaults "
        f"otherwise; best of {args.rounds}. "
        "TLS: mutual TLS (ECDSA P-256) between the SDK and the gateway; the gateway's links to the "
        f"storage node stay plaintext. {load_line(load_at_start)}",
        "",
        "| measure (records/s) | plaintext | mutual TLS | ratio | >= 0.60? |",
        "|---|--:|--:|--:|:-:|",
        *rows,
    ]
    write_report(lines, "tls", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
