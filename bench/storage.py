"""Storage node benchmark: append rate and fetch-port rate, sendfile versus read+send.

Runs real storage node processes (standalone, no etcd) on loopback and prints a table:

* append: 16 KiB record batches (200-byte records) to 1 and to 16 partitions, with and without
  fsync-before-ack, through the StorageNode gRPC service and through the data port with the
  gateway's own client (``--append-via``; several batches per request, several requests in
  flight), plus requests of one batch each, 64 in flight (the gateway's usual append, where the
  per-request cost shows: ``--small-requests``), with the storage process's CPU seconds per GB
  appended (every record of every batch is validated: that is where the append path's own work
  shows, and CPU per GB is steadier than the rate on a machine shared with other work);
* fetch: one reader pulling a partition through the fetch port with 1 MiB fetches, served with
  ``os.sendfile`` and, in the same run, with read+send; the storage process's CPU seconds per GB
  served come from /proc/<pid>/stat.

    python bench/storage.py                 # small default (256 MiB fetched per mode)
    python bench/storage.py --fetch-mib 2048 --append-mib 1024
    python bench/storage.py --skip-fetch --append-mib 64          # the append paths only

Targets (issue 3, 2-core machine): appends >= 300 MB/s without fsync; fetch via sendfile >= 1 GB/s
and at least 3x less CPU per GB than read+send.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from gateway.server.node_appends import NodeAppends
from launcher.processes import start_service
from services.acks import Acks
from services.fetchport import protocol
from services.proto import pb, storage_grpc
from services.records import RecordBatchBuilder

BATCH_BYTES = 16 * 1024
RECORD_BYTES = 200
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def build_batch() -> bytes:
    builder = RecordBatchBuilder()
    now = int(time.time() * 1000)
    i = 0
    while builder.size_in_bytes() + RECORD_BYTES + 20 < BATCH_BYTES:
        builder.append(os.urandom(RECORD_BYTES), timestamp=now, key=b"key-%d" % i)
        i += 1
    return builder.build()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def start_node(run_dir: Path, data_dir: Path, name: str, *flags: str):
    return start_service(
        name,
        "storage_node.main",
        [
            "--node-id",
            "0",
            "--log-dirs",
            str(data_dir),
            "--standalone",
            "true",
            "--log-level",
            "WARNING",
            *flags,
        ],
        run_dir,
    )


async def append_phase(
    port: int,
    partitions: int,
    total_bytes: int,
    batch: bytes,
    batches_per_request: int,
    in_flight: int,
    *,
    data_port: int = 0,
) -> tuple[float, int]:
    """Append ``total_bytes``; with ``data_port`` over the node's data port through the gateway's
    own client (``gateway/server/node_appends.py``), else through gRPC ``StorageNode.Append``."""
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}",
        options=[("grpc.max_send_message_length", 1 << 27), ("grpc.max_receive_message_length", 1 << 27)],
    ) as channel:
        stub = storage_grpc.StorageNodeStub(channel)
        appends = NodeAppends("127.0.0.1", data_port) if data_port else None
        topic = f"append-{partitions}-{time.monotonic_ns()}"
        for p in range(partitions):
            await stub.CreatePartition(
                pb.CreatePartitionRequest(topic=topic, partition=p, configs={"segment.bytes": str(1 << 30)})
            )
        per_partition = max(1, batches_per_request // partitions)
        payload = batch * per_partition
        request = pb.AppendRequest(
            acks=pb.ACKS_ALL,
            partitions=[
                pb.PartitionAppend(topic=topic, partition=p, record_batches=payload)
                for p in range(partitions)
            ],
        )
        request_bytes = len(payload) * partitions
        requests = max(in_flight, total_bytes // request_bytes)
        queue = iter(range(requests))

        payloads = {p: payload for p in range(partitions)}

        async def worker():
            for _ in queue:
                if appends is not None:
                    results = await appends.append(topic, payloads, acks=Acks.ALL, timeout_s=30)
                    if results is None or any(r.error for r in results.values()):
                        raise RuntimeError(f"append failed: {results}")
                    continue
                response = await stub.Append(request)
                for result in response.partitions:
                    if result.HasField("error"):
                        raise RuntimeError(f"append failed: {result.error}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
        if appends is not None:
            await appends.close()
        return elapsed, requests * per_partition * partitions


def prefill(port: int, topic: str, total_bytes: int, batch: bytes) -> None:
    async def run():
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 1 << 27)]
        ) as channel:
            stub = storage_grpc.StorageNodeStub(channel)
            await stub.CreatePartition(pb.CreatePartitionRequest(topic=topic, partition=0))
            payload = batch * 64
            for _ in range(max(1, total_bytes // len(payload))):
                response = await stub.Append(
                    pb.AppendRequest(
                        partitions=[pb.PartitionAppend(topic=topic, partition=0, record_batches=payload)]
                    )
                )
                assert not response.partitions[0].HasField("error"), response

    asyncio.run(run())


def _request_frame(correlation: int, topic: str, offset: int, max_bytes: int) -> bytes:
    return protocol.encode_request(protocol.FetchRequest(correlation, topic, 0, offset, max_bytes))


def _next_offset(records: memoryview, offset: int) -> int:
    """Walk batch headers to the offset after the last batch (no record decoding: we measure the node)."""
    position, next_offset = 0, offset
    while position + 61 <= len(records):
        base_offset, length = struct.unpack_from(">qi", records, position)
        (last_delta,) = struct.unpack_from(">i", records, position + 23)
        next_offset = base_offset + last_delta + 1
        position += 12 + length
    return next_offset


def read_all(fetch_port: int, topic: str, end_offset: int, max_bytes: int) -> tuple[int, float]:
    """One blocking reader: fetch until ``end_offset``; return (record bytes, seconds).

    One request in flight at a time, as a Kafka consumer has per broker; records land in one
    reused buffer and only batch headers are parsed, so the figure is the node's, not ours.
    """
    sock = socket.create_connection(("127.0.0.1", fetch_port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    buffer = bytearray(max_bytes + (1 << 20))
    view = memoryview(buffer)
    offset, total, correlation = 0, 0, 1
    started = time.perf_counter()
    sock.sendall(_request_frame(correlation, topic, offset, max_bytes))
    while offset < end_offset:
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        fixed = protocol.RESPONSE_FIXED_SIZE
        got = 0
        while got < fixed:
            got += sock.recv_into(view[got:fixed])
        prefix = protocol.response_prefix_length(view[:fixed])
        while got < prefix:
            got += sock.recv_into(view[got:prefix])
        header = protocol.decode_response_header(view[:prefix], size)
        if header.error_code:
            raise RuntimeError(f"fetch error {header.error_code}: {header.message}")
        while got < size:
            n = sock.recv_into(view[got:size])
            if n == 0:
                raise RuntimeError("fetch port closed the connection")
            got += n
        offset = _next_offset(view[prefix:size], offset)
        total += header.records_length
        if offset < end_offset:
            correlation += 1
            sock.sendall(_request_frame(correlation, topic, offset, max_bytes))
    elapsed = time.perf_counter() - started
    sock.close()
    return total, elapsed


def fetch_phase(run_dir: Path, data_dir: Path, topic: str, end_offset: int, zero_copy: bool, max_bytes: int):
    node = start_node(
        run_dir,
        data_dir,
        f"fetch-{'sendfile' if zero_copy else 'copy'}",
        "--fetch-zero-copy",
        "true" if zero_copy else "false",
    )
    try:
        read_all(node.info["fetch_port"], topic, min(end_offset, 2000), max_bytes)  # warm-up
        cpu_before = cpu_seconds(node.pid)
        total, elapsed = read_all(node.info["fetch_port"], topic, end_offset, max_bytes)
        cpu = cpu_seconds(node.pid) - cpu_before
    finally:
        node.stop()
    return total, elapsed, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--append-mib", type=int, default=256, help="MiB appended per append case")
    parser.add_argument("--fetch-mib", type=int, default=256, help="MiB in the fetched partition")
    parser.add_argument("--batches-per-request", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument(
        "--append-via",
        default="grpc,port",
        help="append paths to measure, comma-separated: grpc (StorageNode.Append), port (the data port)",
    )
    parser.add_argument(
        "--small-requests",
        type=int,
        default=20_000,
        help="requests of one batch each (the gateway's usual append), 64 in flight, per path; 0 = skip",
    )
    parser.add_argument("--skip-fetch", action="store_true", help="only the append cases")
    parser.add_argument(
        "--fetch-sizes", default="1,8", help="fetch max bytes to try, in MiB, comma-separated"
    )
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="tributary-bench-storage-"))
    vias = [v.strip() for v in args.append_via.split(",") if v.strip()]
    batch = build_batch()
    rows = []
    try:
        for fsync in (False, True):
            data_dir = scratch / f"append-{fsync}"
            node = start_node(
                scratch / "run",
                data_dir,
                f"append-{fsync}",
                "--flush-before-ack",
                "true" if fsync else "false",
            )
            try:
                cases = [
                    (p, args.batches_per_request, args.in_flight, args.append_mib << 20) for p in (1, 16)
                ]
                if args.small_requests:
                    cases.append((1, 1, 64, args.small_requests * len(batch)))
                for partitions, per_request, in_flight, total in cases:
                    for via in vias:
                        print(
                            f"append: {partitions} partition(s), {per_request} batch(es)/request, "
                            f"fsync-before-ack={fsync}, via {via} ...",
                            file=sys.stderr,
                        )
                        cpu_before = cpu_seconds(node.pid)
                        elapsed, batches = asyncio.run(
                            append_phase(
                                node.info["grpc_port"],
                                partitions,
                                total,
                                batch,
                                per_request,
                                in_flight,
                                data_port=node.info["fetch_port"] if via == "port" else 0,
                            )
                        )
                        cpu = cpu_seconds(node.pid) - cpu_before
                        mb = batches * len(batch) / 1e6
                        requests = batches // max(1, (per_request // partitions) * partitions)
                        case = (
                            f"append 16 KiB batches, {partitions} partition(s), {per_request}/request, "
                            f"fsync={'on' if fsync else 'off'}, {via}"
                        )
                        rows.append(
                            (
                                case,
                                f"{mb / elapsed:,.0f} MB/s",
                                f"{requests / elapsed:,.0f} req/s",
                                f"{cpu / (mb / 1000):.2f} CPU s/GB",
                            )
                        )
            finally:
                node.stop()
                shutil.rmtree(data_dir, ignore_errors=True)

        if args.skip_fetch:
            return _print(rows, {})
        fetch_dir = scratch / "fetch"
        node = start_node(scratch / "run", fetch_dir, "prefill")
        print(f"prefill {args.fetch_mib} MiB for the fetch phase ...", file=sys.stderr)
        try:
            prefill(node.info["grpc_port"], "fetch", args.fetch_mib << 20, batch)
            channel = grpc.insecure_channel(f"127.0.0.1:{node.info['grpc_port']}")
            end = (
                storage_grpc.StorageNodeStub(channel)
                .DescribePartitions(pb.DescribePartitionsRequest())
                .partitions[0]
                .log_end_offset
            )
            channel.close()
        finally:
            node.stop()
        cpu_per_gb = {}
        for fetch_mib in [int(x) for x in args.fetch_sizes.split(",")]:
            for zero_copy in (True, False):
                mode = "sendfile" if zero_copy else "read+send"
                print(f"fetch {fetch_mib} MiB requests via {mode} ...", file=sys.stderr)
                total, elapsed, cpu = fetch_phase(
                    scratch / "run", fetch_dir, "fetch", end, zero_copy, fetch_mib << 20
                )
                gb = total / 1e9
                cpu_per_gb[(fetch_mib, zero_copy)] = cpu / gb
                rows.append(
                    (
                        f"fetch 1 reader, {fetch_mib} MiB fetches, {mode}",
                        f"{gb / elapsed * 1000:,.0f} MB/s",
                        f"{total / len(batch) / elapsed:,.0f} batches/s",
                        f"{cpu / gb:.2f} CPU s/GB",
                    )
                )
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)

    return _print(rows, cpu_per_gb)


def _print(rows, cpu_per_gb) -> int:
    width = max(len(r[0]) for r in rows)
    print(f"\n{'case':<{width}}  {'rate':>12}  {'per second':>16}  {'storage CPU':>14}")
    for name, rate_text, batches_text, cpu_text in rows:
        print(f"{name:<{width}}  {rate_text:>12}  {batches_text:>16}  {cpu_text:>14}")
    print()
    for fetch_mib in sorted({k[0] for k in cpu_per_gb}):
        ratio = cpu_per_gb[(fetch_mib, False)] / max(cpu_per_gb[(fetch_mib, True)], 1e-9)
        print(
            f"{fetch_mib} MiB fetches: sendfile uses {ratio:.1f}x less storage-node CPU per GB than read+send"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
