"""Benchmark: what the gateway and the storage node spend per produced record on the raw data path.

The SDK is left out: a bare raw-protocol client (``services/dataport``) sends pre-encoded produce
frames, built before the clock starts, to a real local cluster (etcd, coordinator, one storage
node, one gateway on loopback: ``launcher.local_cluster``). What is measured is the server side:
the CPU seconds the gateway and the storage node spend (``/proc/<pid>/stat``), per record and per
request, beside the wall-clock rate (which swings with the load of a shared machine; the CPU per
record much less).

Phases (``--phases``, each on a fresh topic, one partition per connection):

* ``unbatched-acks0``: one record per request, acks=0, every request written as fast as the
  gateway takes them (TCP back-pressure), ``--connections`` connections side by side; done when a
  last acks=1 request behind them on each connection is answered (a connection's requests to one
  partition are appended in order, so that answer means all before it were written).
* ``batched-acks0``: the same with ``--batch`` records per request.
* ``batched-acks1``: ``--batch`` records per request, acks=1, one request in flight per connection.
* ``unbatched-acks1``: one record per request, acks=1, one at a time (send, wait, send): the
  round trip.

    python bench/gateway_produce.py                                 # every phase, 1 connection
    python bench/gateway_produce.py --phases unbatched-acks0 --connections 2
    python bench/gateway_produce.py --profile /tmp/prof             # py-spy on gateway and node

``--partitions N``: each phase's topic has N partitions and each connection sends its requests to
them in turn (request i of connection c to partition (c + i) mod N), as ``bench/compare.py``'s
partitions experiment does (batched-acks1 with ``--flush-ms 1000`` is that experiment's produce
row, without the SDK): the node's per-request cost as the partitions a request may land on grow.
An acks=0 phase then ends with one acks=1 request per partition, all answered.

    python bench/gateway_produce.py --phases batched-acks1 --partitions 256 --flush-ms 1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.dataport import protocol as dp
from services.records import RecordBatchBuilder

PHASES = ("unbatched-acks0", "batched-acks0", "batched-acks1", "unbatched-acks1")
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, which: slice = slice(11, 13)) -> float:
    """User + system CPU of process ``pid`` so far (``which``: the /proc stat fields summed)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[which]) / _TICKS


def batch_bytes(records: int, value_size: int, seed: int) -> bytes:
    builder = RecordBatchBuilder()
    now = int(time.time() * 1000)
    for i in range(records):
        builder.append((b"%08d" % (seed + i)).ljust(value_size, b"x"), timestamp=now)
    return builder.build()


def produce_frame(topic: str, partition: int, data: bytes, acks: int, correlation_id: int) -> bytes:
    return dp.encode_produce_request(
        dp.ProduceRequest(correlation_id, acks, 30_000, topic, [(partition, data)])
    )


class RawClient:
    """One data connection: handshake, then frames out and answers in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, host: str, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(dp.encode_handshake(dp.Handshake(dp.MIN_VERSION, dp.MAX_VERSION, "bench")))
        answer = dp.decode_handshake_answer(await cls._read(reader))
        assert answer.error_code == 0, answer
        return cls(reader, writer)

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> bytes:
        (size,) = dp.SIZE.unpack(await reader.readexactly(4))
        return await reader.readexactly(size)

    async def answer(self) -> dp.ProduceResponse:
        body = await self._read(self.reader)
        response = dp.decode_produce_response(body)
        assert response.error_code == 0 and all(p.error_code == 0 for p in response.partitions), response
        return response

    def close(self) -> None:
        self.writer.close()


async def run_phase(phase: str, port: int, topic: str, args) -> int:
    """Send the phase's requests on ``args.connections`` connections; the records sent."""
    batch = 1 if phase.startswith("unbatched") else args.batch
    acks = 0 if phase.endswith("acks0") else 1
    requests = args.requests if batch == 1 else max(1, args.records_batched // batch)
    if phase == "unbatched-acks1":
        requests = args.lockstep
    partitions = args.partitions or args.connections
    clients = [await RawClient.connect("127.0.0.1", port) for _ in range(args.connections)]
    data = batch_bytes(batch, args.value_size, 0)

    def partition_of(index: int, i: int) -> int:
        """The partition of connection ``index``'s request ``i``."""
        return index if args.partitions is None else (index + i) % partitions

    async def drive(index: int, client: RawClient) -> None:
        if acks == 0:
            blob = b"".join(produce_frame(topic, partition_of(index, i), data, 0, i) for i in range(requests))
            # One acks=1 request behind them on each partition this connection wrote: its answer
            # means all before it on that partition were written.
            mine = sorted({partition_of(index, i) for i in range(requests)})
            finals = b"".join(produce_frame(topic, p, data, 1, requests + k) for k, p in enumerate(mine))
            writer = client.writer
            step = 1 << 16
            for start in range(0, len(blob), step):
                writer.write(blob[start : start + step])
                await writer.drain()
            writer.write(finals)
            for _ in mine:
                await client.answer()
        else:
            frames = [produce_frame(topic, partition_of(index, i), data, 1, i) for i in range(requests)]
            for frame in frames:
                client.writer.write(frame)
                await client.answer()

    try:
        await asyncio.gather(*(drive(i, c) for i, c in enumerate(clients)))
    finally:
        for client in clients:
            client.close()
    return requests * batch * args.connections


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument(
        "--requests", type=int, default=100_000, help="unbatched acks=0 requests per connection"
    )
    parser.add_argument(
        "--records-batched", type=int, default=1_000_000, help="records per connection, batched"
    )
    parser.add_argument("--lockstep", type=int, default=3_000, help="acks=1 one-at-a-time requests")
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--value-size", type=int, default=200)
    parser.add_argument(
        "--partitions",
        type=int,
        help="partitions per topic, each connection's requests to them in turn "
        "(default: one per connection, each connection to its own)",
    )
    parser.add_argument(
        "--flush-ms", type=int, help="the topics' flush.ms (compare.py's topics have 1000); default: none"
    )
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--repeat", type=int, default=1, help="run each phase this many times")
    parser.add_argument("--profile", type=Path, help="py-spy each phase into this directory")
    args = parser.parse_args()

    from gateway.client import Admin, NewTopic
    from launcher.local_cluster import LocalCluster, LocalClusterSpec

    quiet = ["--log-level", "WARNING"]
    spec = LocalClusterSpec(storage_nodes=1, storage_args=quiet, gateway_args=quiet, coordinator_args=quiet)
    with tempfile.TemporaryDirectory(prefix="gw-produce-") as tmp:
        cluster = LocalCluster(Path(tmp), spec)
        try:
            cluster.start()
            gateway = cluster.gateways[0]
            node = cluster.storage_nodes[0]
            port = gateway.info["data_port"]
            admin = Admin(servers=cluster.gateway)
            for run in range(args.repeat):
                for phase in args.phases.split(","):
                    topic = f"{phase}-{run}"
                    count = args.partitions or args.connections
                    configs = {} if args.flush_ms is None else {"flush.ms": str(args.flush_ms)}
                    admin.create_topics(
                        [NewTopic(topic, count, topic_configs=configs), NewTopic(topic + "-warm", count)]
                    )
                    # metadata, code paths; with --partitions, on the topic itself: every
                    # partition's first append (its segment files) before the clock starts
                    warm_topic = topic if args.partitions is not None else topic + "-warm"
                    asyncio.run(run_phase(phase, port, warm_topic, _warm(args)))
                    profiler = None
                    if args.profile is not None:
                        from bench.profile_top import Profiler

                        profiler = Profiler.start(
                            args.profile, f"{phase}-p{args.partitions or 1}", cluster, args.profile_rate
                        )
                    gw0, node0 = cpu_seconds(gateway.pid), cpu_seconds(node.pid)
                    gw_sys0 = cpu_seconds(gateway.pid, slice(12, 13))
                    node_sys0 = cpu_seconds(node.pid, slice(12, 13))
                    started = time.perf_counter()
                    records = asyncio.run(run_phase(phase, port, topic, args))
                    elapsed = time.perf_counter() - started
                    gw, nd = cpu_seconds(gateway.pid) - gw0, cpu_seconds(node.pid) - node0
                    gw_sys = cpu_seconds(gateway.pid, slice(12, 13)) - gw_sys0
                    node_sys = cpu_seconds(node.pid, slice(12, 13)) - node_sys0
                    if profiler is not None:
                        profiler.stop()
                    requests = records / (1 if phase.startswith("unbatched") else args.batch)
                    per_conn_us = elapsed * 1e6 / requests * args.connections
                    sys_share = gw_sys / max(gw, 1e-9)
                    print(
                        f"{phase:16s} x{args.connections} p{args.partitions or args.connections}: "
                        f"{records / elapsed:10,.0f} rec/s "
                        f"({requests / elapsed:8,.0f} req/s, {per_conn_us:7.1f} "
                        f"us/req/conn)  gateway {gw * 1e6 / records:6.2f} us/rec "
                        f"{gw * 1e6 / requests:6.1f} us/req ({gw / elapsed:.2f} core, sys {sys_share:.0%})  "
                        f"node {nd * 1e6 / records:6.2f} us/rec {nd * 1e6 / requests:6.1f} us/req "
                        f"({nd / elapsed:.2f} core, sys {node_sys / max(nd, 1e-9):.0%})",
                        flush=True,
                    )
            admin.close()
        finally:
            cluster.stop()
    return 0


def _warm(args):
    warm = argparse.Namespace(**vars(args))
    warm.requests, warm.records_batched, warm.lockstep = 100, 100 * args.batch, 20
    if args.partitions is not None:  # every partition written before the clock (see main)
        warm.requests = warm.lockstep = max(100, 2 * args.partitions)
        warm.records_batched = warm.requests * args.batch
    return warm


if __name__ == "__main__":
    sys.exit(main())
