"""What the gateway's client-quota check costs per request (a micro-benchmark, in process).

Each case is what the gateway does for one produce or fetch request, timed over many calls:

* no quota anywhere (the default): the one test a request pays;
* quotas exist, none for this client: a dict lookup of its remembered resolution;
* a byte-rate quota: lookup, counting the bytes on the sliding windows, the throttle time, and
  the time the answer says the client is held;
* the first request of a client, or the first after a quota change: resolving its quotas in
  Kafka's eight-level order, among 1,000 entities;
* a request_percentage quota: running the request's coroutine under the loop-time meter (three
  awaits, as a produce has), against running it bare;
* the protobuf sizes the gRPC path reads under a quota (``ByteSize()`` of a 16 KiB produce
  request, of a typed fetch answer of 1,000 records).

    python bench/quotas.py              # writes bench/reports/quotas-<date>.md
    python bench/quotas.py --calls 200000
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.reporting import load_line, write_report
from gateway.server.loop_time import LoopTime, timed
from gateway.server.quotas import ClientQuotas
from services.proto import pb
from services.quotas import CONSUMER_BYTE_RATE, DEFAULT, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, QuotaEntity
from services.records import RecordBatchBuilder


def per_call_us(action: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """The best of ``rounds`` runs of ``calls`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            action()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


def many_entities(count: int) -> list[tuple[QuotaEntity, dict[str, float]]]:
    entries = [(QuotaEntity(f"user-{n}", None), {PRODUCER_BYTE_RATE: 1e6}) for n in range(count // 2)]
    entries += [(QuotaEntity(None, f"client-{n}"), {CONSUMER_BYTE_RATE: 1e6}) for n in range(count // 2)]
    return entries


def measure(calls: int) -> list[tuple[str, float, str]]:
    rows: list[tuple[str, float, str]] = []
    quotas = ClientQuotas()

    def check_only() -> object:
        return quotas.configured and quotas.client("User:alice", "app")

    rows.append(("no quota configured (the default)", per_call_us(check_only, calls), "one attribute test"))

    quotas.update([*many_entities(1000), (QuotaEntity(None, "limited"), {PRODUCER_BYTE_RATE: 1e12})])
    quotas.client("User:alice", "app")  # resolved once, remembered
    rows.append(
        (
            "quotas exist, none applies to this client",
            per_call_us(lambda: quotas.client("User:alice", "app"), calls),
            "remembered resolution (None)",
        )
    )

    def produce_check() -> int:
        quota = quotas.client("User:alice", "limited")
        assert quota is not None
        quota.record_produce_bytes(16_500)
        return quota.held_ms(quota.produce)

    rows.append(
        (
            "producer_byte_rate applies: lookup, count, throttle, answer's hold",
            per_call_us(produce_check, calls),
            "per produce request",
        )
    )

    counter = iter(range(10**9))

    def first_request() -> object:
        return quotas.client("User:alice", f"new-{next(counter)}")  # a client never seen: resolved

    rows.append(
        (
            "first request of a client (resolution among 1,000 entities, 3 keys)",
            per_call_us(first_request, max(1, calls // 10)),
            "once per client and quota change",
        )
    )

    timing = ClientQuotas()
    timing.update([(QuotaEntity(DEFAULT, None), {REQUEST_PERCENTAGE: 1e9})])

    async def request() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    async def bare() -> None:
        await request()

    async def metered() -> None:
        quota = timing.client("User:alice", "app")
        assert quota is not None
        spent = LoopTime()
        await timed(request(), spent)
        quota.record_loop_time(spent.seconds)

    async def run(coroutine_function, count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            await coroutine_function()
        return (time.perf_counter() - started) / count * 1e6

    loop_calls = max(1, calls // 5)
    bare_us = min(asyncio.run(run(bare, loop_calls)) for _ in range(3))
    metered_us = min(asyncio.run(run(metered, loop_calls)) for _ in range(3))
    rows.append(
        (
            "request_percentage applies: loop-time meter on a 3-await request",
            metered_us - bare_us,
            f"{metered_us:.1f} us metered against {bare_us:.1f} us bare",
        )
    )

    builder = RecordBatchBuilder()
    while builder.size_in_bytes() < 16_384:
        builder.append(b"v" * 200, timestamp=1_700_000_000_000)
    produce = pb.ProduceRequest(
        topic="t", batches=[pb.PartitionBatches(partition=0, record_batches=builder.build())]
    )
    rows.append(
        (
            "ByteSize() of a 16 KiB produce request (gRPC)",
            per_call_us(produce.ByteSize, calls),
            "unary, stream",
        )
    )
    fetch = pb.FetchResponse(
        partitions=[
            pb.FetchPartitionResult(
                topic="t",
                partition=0,
                records=[pb.ConsumedRecord(offset=n, value=b"v" * 200) for n in range(1000)],
            )
        ]
    )
    rows.append(
        (
            "ByteSize() of a typed fetch answer, 1,000 records (gRPC)",
            per_call_us(fetch.ByteSize, max(1, calls // 100)),
            "typed Fetch under a consumer quota",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=100_000, help="calls per timed run (best of 5)")
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    rows = measure(args.calls)
    lines = [
        f"# Client quota check, {datetime.date.today().isoformat()}",
        "",
        "What the gateway adds to one produce or fetch request for client quotas "
        f"(`python bench/quotas.py`, in process, best of 5 runs of {args.calls:,} calls; Python "
        f"{sys.version.split()[0]}). {load_line(load_at_start)}",
        "",
        "| case | us per request | note |",
        "|---|--:|---|",
        *(f"| {case} | {us:.2f} | {note} |" for case, us, note in rows),
    ]
    write_report(lines, "quotas", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
