"""Transaction coordinator benchmarks (not tests): how fast producer ids are handed out and how
many transactions the active controller completes per second.

Runs a real local cluster -- an embedded etcd (fsync on), two coordinators, storage nodes --
through ``deploy.processes`` (:class:`bench.coordinator.BenchCluster`), and prints a report:

1. **producer ids**: idempotent InitProducerId calls per second on the active controller, by
   ``--concurrency`` callers (one etcd write per ``producer_id_block_size`` ids).
2. **transactions**: ``--producers`` transactional ids, each running transactions back to back
   for ``--seconds``: AddPartitionsToTxn (``--partitions-per-txn`` partitions of a topic spread
   over the nodes), AddOffsetsToTxn, TxnOffsetCommit, EndTxn(commit) -- which answers once every
   marker is written and the offsets are committed. Transactions per second, and EndTxn p50 / p99.
   Markers of concurrent transactions share one WriteTxnMarkers request per node.

Usage::

    python -m bench.transactions [--nodes 3] [--concurrency 32] [--producers 1 16]
        [--partitions-per-txn 4] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc.aio

from bench.coordinator import ONLINE, BenchCluster, wait_until
from services.etcd.embedded import EmbeddedEtcd
from services.proto import coordinator_grpc, pb


async def bench_producer_ids(address: str, seconds: float, concurrency: int) -> float:
    """Idempotent InitProducerId calls per second."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorStub(channel)
        request = pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
        deadline = time.monotonic() + seconds
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await stub.InitProducerId(request, timeout=10)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


async def bench_transactions(
    address: str, topic: str, topic_partitions: int, producers: int, per_txn: int, seconds: float
) -> tuple[float, list[float]]:
    """Committed transactions per second, and each EndTxn's latency (seconds)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorStub(channel)
        deadline = time.monotonic() + seconds
        end_latencies: list[float] = []
        done = 0

        async def producer(index: int) -> None:
            nonlocal done
            tid = f"bench-{index}-{time.monotonic_ns()}"
            answer = await stub.InitProducerId(
                pb.InitProducerIdRequest(
                    transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
                ),
                timeout=10,
            )
            ids = {
                "transactional_id": tid,
                "producer_id": answer.producer_id,
                "producer_epoch": answer.producer_epoch,
            }
            partitions = [
                pb.TopicPartition(topic=topic, partition=(index * per_txn + p) % topic_partitions)
                for p in range(per_txn)
            ]
            group = f"bench-group-{index}"
            offset = 0
            while time.monotonic() < deadline:
                await stub.AddPartitionsToTxn(
                    pb.AddPartitionsToTxnRequest(**ids, partitions=partitions), timeout=10
                )
                await stub.AddOffsetsToTxn(pb.AddOffsetsToTxnRequest(**ids, group_id=group), timeout=10)
                offset += 1
                await stub.TxnOffsetCommit(
                    pb.TxnOffsetCommitRequest(
                        **ids,
                        group_id=group,
                        generation_id=-1,
                        offsets=[
                            pb.TxnOffset(topic=topic, partition=p.partition, offset=offset)
                            for p in partitions
                        ],
                    ),
                    timeout=10,
                )
                started = time.perf_counter()
                await stub.EndTxn(pb.EndTxnRequest(**ids, commit=True), timeout=30)
                end_latencies.append(time.perf_counter() - started)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(producer(i) for i in range(producers)))
        return done / (time.perf_counter() - started), end_latencies


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--partitions-per-txn", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-txn-") as tmp:
        run_dir = Path(tmp)
        with EmbeddedEtcd(run_dir / "etcd") as etcd:
            cluster = BenchCluster(run_dir, etcd, ttl=6)
            try:
                cluster.start(args.nodes)
                wait_until(lambda: cluster.active() is not None, 30, "an active controller")
                active = cluster.active_id()
                address = cluster.address(active)
                topic, topic_partitions = "bench-txn", max(args.nodes * 4, 12)
                cluster.stub(active).CreateTopic(
                    pb.CreateTopicRequest(name=topic, partitions=topic_partitions), timeout=60
                )
                wait_until(
                    lambda: all(
                        p.state == ONLINE for p in cluster.metadata(active, [topic]).topics[0].partitions
                    ),
                    60,
                    "the topic online",
                )
                rate = asyncio.run(bench_producer_ids(address, args.seconds, args.concurrency))
                print(f"producer ids: {rate:,.0f} InitProducerId/s ({args.concurrency} concurrent callers)")
                for producers in args.producers:
                    tps, latencies = asyncio.run(
                        bench_transactions(
                            address, topic, topic_partitions, producers, args.partitions_per_txn, args.seconds
                        )
                    )
                    p50, p99 = 1000 * statistics.median(latencies), 1000 * _percentile(latencies, 0.99)
                    print(
                        f"transactions: {producers} producers x {args.partitions_per_txn} partitions "
                        f"+ offsets: {tps:,.0f} committed/s; EndTxn p50 {p50:.1f} ms, p99 {p99:.1f} ms"
                    )
            finally:
                cluster.stop()


if __name__ == "__main__":
    main()
