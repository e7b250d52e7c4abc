"""Benchmark: the SDK's per-record costs -- ``Producer.send()`` and the consumer's decode.

Three measures, each printed as microseconds per record and records per second:

* **send, in process** (``inproc``): ``Producer.send(topic, value)`` with the defaults, 200-byte
  values, the network out of the way: the topic's metadata is cached up front and, instead of
  the sender routine, the loop drains the accumulator every ``--drain-every`` records the way
  the sender does (ready, drain, build each batch's bytes, resolve its result, release its
  buffer memory). What is left is the caller's thread's cost per record plus the batch build;
  the ceiling the SDK puts on any producer whatever the wire does. ``keyed``: the same with a
  key per record (10 bytes, murmur2 over 16 partitions).
* **send, against a cluster** (``cluster``): a real local cluster (etcd, coordinator, storage
  node, gateway on loopback: ``launcher.local_cluster``), ``Producer(servers=...)`` with every
  setting at its default (acks=all, idempotent, linger 5 ms, 16 KiB batches), ``send()`` per
  record then ``flush()``: the issue's "SDK with its defaults" figure. Also printed: the CPU
  the SDK's process spent per record (application and I/O thread), steadier than wall time on
  a shared machine.
* **one record per request, in process** (``unbatched``): the paper's unbatched producer
  (``acks=0, batch_size=1, linger_ms=0, max_in_flight=16``, ``partition=0``), the network out
  of the way as above, but with the real sender: its passes write each request's frame
  directly (``Sender._write_direct``) to a connection that keeps nothing. CPU of the caller's
  ``send()`` and of the sender's passes per record, measured apart (one thread runs both, so
  no lock or wakeup waits in it): the SDK's share of compare.py's "produce, unbatched" row.
* **decode** (``decode``): what the consumer does per record once a fetch answer is in memory,
  through the consumer's own code: buffer the answer as a ``PartitionRecords`` (walk the
  batches, check each CRC) and take its records 500 at a time as ``poll`` does (each batch
  decoded straight into ``ConsumerRecord``s by ``RecordBatchView.read_consumer_records``).

Each in-process figure is the best of ``--repeat`` runs with the cyclic GC paused, as ``timeit``
does, in CPU time of the measuring thread (the machine is shared: wall time varies with the
load, the CPU a record costs much less). ``TRIBUTARY_NO_EXTENSIONS=1`` measures the pure-Python record codec.

    python bench/sdk_send.py                     # inproc, keyed, unbatched, decode
    python bench/sdk_send.py --cluster           # and the real cluster run
    python bench/sdk_send.py --only cluster --records 1000000
    python bench/sdk_send.py --only sync --records 5000

* **one acks=1 send at a time** (``sync``): a real local cluster as above, ``Producer(acks=1,
  linger_ms=0)``, ``send(...).get()`` one record after the other (the issue's "sync acks=1"
  target, 5,000/s): sends per second, the round trip's p50/p99, and the CPU each process spent
  per send (the SDK's process, the gateway, the storage node; from /proc), which bounds the rate
  as much as the hops do.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gateway.client import Producer
from gateway.client.accumulator import RecordAccumulator
from gateway.client.dataport import RawTransport
from gateway.client.fetcher import PartitionRecords
from gateway.client.producer import ProducerConfig, ProducerCore
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.structs import TopicPartition
from services.records import RecordBatchBuilder
from services.records.record import speedups_enabled

if TYPE_CHECKING:  # imported where a cluster starts
    from launcher.local_cluster import LocalCluster

TOPIC = "bench-sdk-send"


def payloads(count: int, size: int) -> list[bytes]:
    """``count`` distinct values of ``size`` bytes (a counter, padded), cycled by the loops."""
    return [(b"%08d" % i).ljust(size, b"x") for i in range(count)]


def offline_producer(partitions: int = 1, **settings) -> Producer:
    """A ``Producer`` whose sender never runs: metadata of ``TOPIC`` (1 partition) is cached, so
    ``send()`` never needs the network (no I/O thread is started)."""
    config = ProducerConfig.from_kwargs({"servers": "127.0.0.1:1", **settings})
    producer = Producer.__new__(Producer)
    producer.config = config
    producer._core = ProducerCore(config)
    producer._closed = True  # close() must not reach for the absent I/O thread
    metadata = producer._core.client.metadata
    metadata._partition_counts[TOPIC] = partitions
    metadata._fetched_ms[TOPIC] = time.time_ns() // 1_000_000 + 10**12  # never stale
    return producer


def drain(accumulator: RecordAccumulator, base_offsets: dict) -> int:
    """What the sender does with every queued batch once acknowledged; returns the batches."""
    now_ms = time.time_ns() // 1_000_000
    accumulator.begin_flush()
    try:
        ready = accumulator.ready(now_ms).ready
        plans = accumulator.drain(ready, now_ms, max_request_size=1 << 30, max_requests=1 << 30)
    finally:
        accumulator.end_flush()
    batches = 0
    for _topic, partitions in plans:
        for partition, queued in partitions.items():
            for batch in queued:
                batch.close()
                offset = base_offsets.get(partition, 0)
                accumulator.complete(batch)
                batch.result.complete(offset, -1, 0)
                base_offsets[partition] = offset + batch.record_count
                batches += 1
    return batches


def bench_inproc(
    records: int, values: list[bytes], drain_every: int, keys: list[bytes] | None = None
) -> tuple[float, object]:
    """Seconds to ``send()`` ``records`` values (defaults) and settle them, network aside; with
    ``keys``, each record has one of them (partitioned by murmur2 over 16 partitions)."""
    producer = offline_producer(partitions=16 if keys else 1)
    core = producer._core
    send = producer.send
    offsets: dict = {}
    n = len(values)
    future = None
    started = time.thread_time()
    for i in range(records):
        future = send(TOPIC, values[i % n], keys[i % n]) if keys else send(TOPIC, values[i % n])
        if i % drain_every == drain_every - 1:
            drain(core.accumulator, offsets)
    drain(core.accumulator, offsets)
    elapsed = time.thread_time() - started
    return elapsed, (future.get(0) if future is not None else None)


class _NullConnection:
    """A raw data connection that takes frames and keeps nothing (for ``bench_unbatched``)."""

    broken = False

    def __init__(self) -> None:
        self._correlation = 0
        self.frames = 0

    def backlogged(self) -> bool:
        return False

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def send_nowait(self, frame, correlation_id, answer=None):
        self.frames += 1
        return None

    def flush(self) -> None:
        pass


class _NullRawTransport:
    """What the sender's direct path uses of ``RawTransport``, over a ``_NullConnection``."""

    preserves_order = True

    def __init__(self) -> None:
        self.connection = _NullConnection()

    def writer_now(self) -> _NullConnection:
        return self.connection

    write_request = staticmethod(RawTransport.write_request)


def bench_unbatched(records: int, values: list[bytes]) -> tuple[float, tuple[float, float]]:
    """CPU seconds of ``send()`` and the sender's passes for ``records`` one-record requests
    at acks=0; returns (their sum, (send() seconds, sender seconds))."""
    settings = dict(
        acks=0, batch_size=1, linger_ms=0, max_in_flight=16, max_request_size=len(values[0]) + 100
    )
    producer = offline_producer(**settings)
    core = producer._core
    transport = _NullRawTransport()
    sender = Sender(
        client=core.client,
        accumulator=core.accumulator,
        policy=RetryPolicy(retries=0),
        transport=transport,
        acks=0,
        max_in_flight=16,
        max_request_size=settings["max_request_size"],
    )
    send = producer.send
    n = len(values)
    in_send = 0.0
    in_sender = 0.0

    async def run() -> None:
        nonlocal in_send, in_sender
        step = 100  # records appended between two sender passes (the I/O thread's pace)
        for start in range(0, records, step):
            started = time.thread_time()
            for i in range(start, min(start + step, records)):
                send(TOPIC, values[i % n], partition=0)
            between = time.thread_time()
            while sender._send_ready(core.clock.time_ms()) == 0:
                pass
            in_send += between - started
            in_sender += time.thread_time() - between

    asyncio.run(run())
    assert transport.connection.frames == records, transport.connection.frames
    return in_send + in_sender, (in_send, in_sender)


def fetch_answer(records: int, values: list[bytes], batch_records: int) -> bytes:
    """Concatenated batches of ``batch_records`` records: a fetch answer's bytes."""
    parts = []
    now = int(time.time() * 1000)
    offset = 0
    n = len(values)
    while offset < records:
        builder = RecordBatchBuilder(base_offset=offset)
        count = min(batch_records, records - offset)
        for i in range(count):
            builder.append(values[(offset + i) % n], timestamp=now + i)
        parts.append(builder.build())
        offset += count
    return b"".join(parts)


def bench_decode(raw: bytes, max_poll_records: int = 500) -> tuple[float, int]:
    """Seconds to turn ``raw`` into ConsumerRecords as the consumer's fetcher does."""
    started = time.thread_time()
    chunk = PartitionRecords(TopicPartition(TOPIC, 0), 0, raw, check_crcs=True)
    count = position = 0
    while True:
        records = chunk.take(max_poll_records, position)
        if not records:
            break
        position = records[-1].offset + 1
        count += len(records)
    return time.thread_time() - started, count


def best_of(repeat: int, fn, *args):
    best = None
    result = None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            elapsed, result = fn(*args)
        finally:
            gc.enable()
        best = elapsed if best is None else min(best, elapsed)
    return best, result


@contextlib.contextmanager
def one_node_cluster(prefix: str) -> Iterator[LocalCluster]:
    """A quiet local cluster of one storage node with the one-partition topic ``TOPIC``."""
    from gateway.client import Admin, NewTopic
    from launcher.local_cluster import LocalCluster, LocalClusterSpec

    quiet = ["--log-level", "WARNING"]
    spec = LocalClusterSpec(storage_nodes=1, storage_args=quiet, gateway_args=quiet, coordinator_args=quiet)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = LocalCluster(Path(tmp), spec)
        try:
            cluster.start()
            with Admin(servers=cluster.gateway) as admin:
                admin.create_topics([NewTopic(TOPIC, 1)])
            yield cluster
        finally:
            cluster.stop()


def bench_cluster(records: int, values: list[bytes]) -> dict[str, float]:
    """A real local cluster; the default Producer sends ``records`` values then flushes."""
    with one_node_cluster("sdk-send-") as cluster, Producer(servers=cluster.gateway) as producer:
        producer.send(TOPIC, b"warm-up").get(30)  # metadata cached, stream open
        n = len(values)
        send = producer.send
        cpu_started = time.process_time()
        started = time.perf_counter()
        for i in range(records):
            future = send(TOPIC, values[i % n])
        sent = time.perf_counter() - started
        producer.flush(timeout=600)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        last = future.get(0)
    assert last.offset == records, f"last offset {last.offset}, expected {records}"
    return {"send_s": sent, "total_s": elapsed, "cpu_s": cpu}


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_sync(records: int, value: bytes) -> dict[str, float]:
    """A real local cluster; one acks=1 ``send(...).get()`` at a time, ``records`` times."""
    with one_node_cluster("sdk-sync-") as cluster:
        pids = {
            "sdk": os.getpid(),
            "gateway": cluster.gateways[0].pid,
            "node": next(iter(cluster.storage_nodes.values())).pid,
        }
        with Producer(servers=cluster.gateway, acks=1, linger_ms=0) as producer:
            for _ in range(100):  # warm: metadata cached, connection open, code paths hot
                producer.send(TOPIC, value, partition=0).get(30)
            cpu_before = {name: _process_cpu_s(pid) for name, pid in pids.items()}
            round_trips = []
            clock = time.perf_counter
            started = clock()
            for _ in range(records):
                sent = clock()
                producer.send(TOPIC, value, partition=0).get(30)
                round_trips.append(clock() - sent)
            elapsed = clock() - started
            cpu_after = {name: _process_cpu_s(pid) for name, pid in pids.items()}
    round_trips.sort()
    result = {
        "rate": records / elapsed,
        "p50_us": round_trips[len(round_trips) // 2] * 1e6,
        "p99_us": round_trips[int(len(round_trips) * 0.99)] * 1e6,
    }
    for name in pids:
        result[f"{name}_cpu_us"] = (cpu_after[name] - cpu_before[name]) / records * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--value-size", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--drain-every", type=int, default=10_000)
    parser.add_argument("--decode-batch", type=int, default=1000, help="records per fetched batch")
    parser.add_argument("--cluster", action="store_true", help="also run against a local cluster")
    parser.add_argument("--only", choices=("inproc", "keyed", "unbatched", "decode", "cluster", "sync"))
    args = parser.parse_args()
    values = payloads(1000, args.value_size)
    backend = "C accelerator" if speedups_enabled() else "pure Python"
    print(
        f"records codec: {backend}; {args.records:,} records of {args.value_size} bytes; "
        f"Python {sys.version.split()[0]}"
    )
    runs = (
        [args.only]
        if args.only
        else ["inproc", "keyed", "unbatched", "decode"] + (["cluster"] if args.cluster else [])
    )
    for run in runs:
        if run == "inproc":
            elapsed, metadata = best_of(args.repeat, bench_inproc, args.records, values, args.drain_every)
            print(
                f"send, in process:  {elapsed / args.records * 1e6:6.2f} us/record  "
                f"{args.records / elapsed:12,.0f} records/s   (last: {metadata})"
            )
        elif run == "keyed":
            keys = [b"user-%06d" % i for i in range(len(values))]
            elapsed, metadata = best_of(
                args.repeat, bench_inproc, args.records, values, args.drain_every, keys
            )
            print(
                f"send, keyed:       {elapsed / args.records * 1e6:6.2f} us/record  "
                f"{args.records / elapsed:12,.0f} records/s"
            )
        elif run == "unbatched":
            total, (in_send, in_sender) = best_of(args.repeat, bench_unbatched, args.records, values)
            print(
                f"1 record/request: {total / args.records * 1e6:6.2f} us/record  "
                f"{args.records / total:12,.0f} records/s   (last run: send() "
                f"{in_send / args.records * 1e6:.2f} us, sender {in_sender / args.records * 1e6:.2f} us;"
                " acks=0, a frame each)"
            )
        elif run == "decode":
            raw = fetch_answer(args.records, values, args.decode_batch)
            elapsed, count = best_of(args.repeat, bench_decode, raw)
            assert count == args.records, count
            print(
                f"consumer decode:   {elapsed / count * 1e6:6.2f} us/record  "
                f"{count / elapsed:12,.0f} records/s"
            )
        elif run == "sync":
            result = bench_sync(args.records, values[0])
            print(
                f"one acks=1 send at a time: {result['rate']:8,.0f} sends/s; round trip p50 "
                f"{result['p50_us']:.0f} us, p99 {result['p99_us']:.0f} us; CPU per send: SDK "
                f"{result['sdk_cpu_us']:.0f} us, gateway {result['gateway_cpu_us']:.0f} us, "
                f"node {result['node_cpu_us']:.0f} us"
            )
        else:
            result = bench_cluster(args.records, values)
            print(
                f"send, cluster:     {result['send_s'] / args.records * 1e6:6.2f} us/record in send(); "
                f"{args.records / result['total_s']:12,.0f} records/s to flush() done; the SDK's "
                f"process (both threads) {result['cpu_s'] / args.records * 1e6:.2f} us CPU/record"
            )


if __name__ == "__main__":
    main()
