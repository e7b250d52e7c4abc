"""What TLS costs, in one run:

* SDK produce and consume throughput against a local cluster in plaintext and against one with
  ``LocalClusterSpec(secure=True)`` (mutual TLS on the gateway's public ports and between every
  process on the internal ports), each on the raw data path (the SDK's default) and on gRPC;
* the storage node's fetch port alone: one partition read back end to end over one connection
  with the gateway's fetch client (``services.fetchport.client``), 1 MiB per request, with
  ``os.sendfile`` (plaintext, the default), with read + send (``fetch_zero_copy=false``: what
  leaving sendfile costs by itself) and with mutual TLS (records read, encrypted and sent in the
  process, decrypted by the client: what a gateway's or a follower's fetch pays).

    python bench/tls.py                     # writes bench/reports/tls-<date>.md
    python bench/tls.py --records 200000 --fetch-mib 256
"""

from __future__ import annotations

import argparse
import asyncio
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
from services.fetchport.client import FetchClient
from services.records import iter_batches
from services.tls import ClientTls, ReloadingClientContext

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


#: Fetch-port variants: (key, label, secure cluster, storage node flags).
FETCH_VARIANTS: tuple[tuple[str, str, bool, list[str]], ...] = (
    ("sendfile", "plaintext, os.sendfile (the default)", False, []),
    ("copy", "plaintext, read + send (fetch_zero_copy=false)", False, ["--fetch-zero-copy", "false"]),
    ("tls", "mutual TLS (read, encrypt, send)", True, []),
)
FETCH_RECORD_BYTES = 16 << 10
FETCH_REQUEST_BYTES = 1 << 20


def load_partition(servers: str, topic: str, total_bytes: int, settings: dict) -> int:
    """Write ``total_bytes`` of incompressible records to partition 0; returns the record count."""
    count = total_bytes // FETCH_RECORD_BYTES
    values = [os.urandom(FETCH_RECORD_BYTES) for _ in range(64)]
    with Producer(
        servers=servers, acks=1, linger_ms=5, batch_size=FETCH_REQUEST_BYTES, **settings
    ) as producer:
        for i in range(count):
            producer.send(topic, values[i % len(values)], partition=0)
        producer.flush(300)
    return count


async def read_partition(host: str, port: int, topic: str, end: int, tls: ClientTls | None) -> float:
    """Read the partition from offset 0 to ``end`` over one fetch-port connection; MiB/s."""
    client = FetchClient(host, port, max_connections=1, ssl=ReloadingClientContext(tls) if tls else None)
    offset, received = 0, 0
    started = time.perf_counter()
    while offset < end:
        result = await client.fetch(topic, 0, offset, max_bytes=FETCH_REQUEST_BYTES)
        error = result.header.error()
        if error is not None:
            raise error
        for batch in iter_batches(result.records, allow_partial_tail=True):
            offset = batch.last_offset + 1
        received += len(result.records)
    seconds = time.perf_counter() - started
    await client.close()
    return received / seconds / (1 << 20)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_fetch_port(total_bytes: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Per variant: (MiB/s the client read, storage node CPU seconds per GiB served)."""
    results: dict[str, tuple[float, float]] = {}
    for key, _, secure, flags in FETCH_VARIANTS:
        spec = LocalClusterSpec(
            storage_nodes=1, coordinators=1, gateways=1, secure=secure, storage_args=flags
        )
        with tempfile.TemporaryDirectory() as directory, LocalCluster(Path(directory), spec) as cluster:
            settings: dict[str, Any] = cluster.pki.client_settings() if cluster.pki is not None else {}
            tls = None
            if cluster.pki is not None:
                member = cluster.pki.operator_settings()
                tls = ClientTls(
                    Path(member["ssl_cafile"]), Path(member["ssl_certfile"]), Path(member["ssl_keyfile"])
                )
            topic = f"fetch-{uuid.uuid4().hex[:6]}"
            with Admin(servers=cluster.gateway, **settings) as admin:
                admin.create_topics([NewTopic(topic, 1)])
            end = load_partition(cluster.gateway, topic, total_bytes, settings)
            node = cluster.storage_nodes[0]
            best, cpu_per_gib = 0.0, 0.0
            for _ in range(rounds):
                cpu_before = cpu_seconds(node.pid)
                rate = asyncio.run(
                    read_partition(node.info["host"], node.info["fetch_port"], topic, end, tls)
                )
                if rate > best:
                    best = rate
                    cpu_per_gib = (cpu_seconds(node.pid) - cpu_before) / (total_bytes / (1 << 30))
            results[key] = (best, cpu_per_gib)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2, help="runs per measure; the best counts")
    parser.add_argument("--fetch-mib", type=int, default=256, help="MiB read back through the fetch port")
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    print("plaintext ...", flush=True)
    plain = measure(False, args.records, args.rounds)
    print("mutual TLS ...", flush=True)
    tls = measure(True, args.records, args.rounds)
    print("fetch port ...", flush=True)
    fetch = measure_fetch_port(args.fetch_mib << 20, args.rounds)
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
        "TLS: mutual TLS (ECDSA P-256) between the SDK and the gateway, and between the gateway, "
        f"the coordinator and the storage node (`cluster up --secure`). {load_line(load_at_start)}",
        "",
        "| measure (records/s) | plaintext | mutual TLS | ratio | >= 0.60? |",
        "|---|--:|--:|--:|:-:|",
        *rows,
        "",
        "## The storage node's fetch port",
        "",
        f"One partition of {args.fetch_mib} MiB ({FETCH_RECORD_BYTES >> 10} KiB incompressible records) read "
        f"back end to end over one connection, {FETCH_REQUEST_BYTES >> 20} MiB per request, by the "
        "gateway's fetch client in this process (which decrypts under TLS); best of "
        f"{args.rounds}. Each variant on a cluster of its own. Node CPU: the storage node's user + "
        "system CPU time during the read, per GiB served (the client's decryption is not in it).",
        "",
        "| fetch port | MiB/s | vs sendfile | node CPU s/GiB |",
        "|---|--:|--:|--:|",
        *(
            f"| {label} | {fetch[key][0]:,.0f} | {fetch[key][0] / fetch['sendfile'][0]:.2f} | "
            f"{fetch[key][1]:.2f} |"
            for key, label, _, _ in FETCH_VARIANTS
        ),
    ]
    write_report(lines, "tls", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
