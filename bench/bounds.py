"""How long the coordinator's request-bounded work takes (not tests): partition placement at the
limits, and subscription-pattern matching over many topics.

In-process (pure code, best of several runs):

1. **placement**: one topic of 10,000 partitions (the default per-topic limit) at replication
   factor 3 on 3 and 30 nodes -- placement, record encoding, the validate-only view, the response
   proto -- and the leader counts over 200,000 partitions (the default cluster limit). Each runs
   in a worker thread in the coordinator; these are the times the event loop no longer waits.
2. **patterns**: one pattern over 10,000 topics (ordinary, ``(a+)+``, a large counted repetition),
   100 distinct patterns through the group manager's matcher (first call, then cached), Python's
   ``re`` on the regression's input for comparison, and the rebalance that follows (100 members
   whose pattern selects all 10,000 topics), which also runs in a worker thread.

On a real cluster (embedded etcd, two coordinators, three storage nodes; ``--no-cluster`` skips):

3. **round trips**: a refused CreateTopic of 1,000,000 partitions (validate-only and real), the
   validate-only create of 10,000 partitions x RF 3, and a JoinGroup with ``(a+)+`` while the
   topic ``"a"*29 + "-"`` exists.

Usage::

    python -m bench.bounds [--no-cluster] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator import keys, serde
from coordinator.controller import _pending_view
from coordinator.groups.matcher import TopicMatcher
from coordinator.groups.model import JoinParams, LiveTopics, Subscription
from coordinator.groups.state import GroupState
from coordinator.metadata import leader_counts
from coordinator.model import TopicRecord
from coordinator.placement import assign_replicas
from services.clock import ManualClock
from services.topic_pattern import compile_topic_pattern


def best_of(repeat: int, work: Callable[[], Any]) -> float:
    """The fastest of ``repeat`` runs, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def line(what: str, seconds: float) -> None:
    print(f"  {what:<72} {seconds * 1000:9.1f} ms")


# ---------------------------------------------------------------------------------------------
# 1. placement
# ---------------------------------------------------------------------------------------------


def report_placement(repeat: int) -> None:
    print("placement (10,000 partitions x RF 3; each runs in a worker thread):")
    for nodes in (3, 30):
        racks = {n: f"r{n % 3}" for n in range(1, nodes + 1)}

        def place(racks: dict[int, str] = racks) -> object:
            return assign_replicas(racks, 10_000, 3, rng=random.Random(1))

        line(f"assign_replicas, {nodes} nodes on 3 racks", best_of(repeat, place))
    racks = {n: "" for n in range(1, 4)}
    assignment = tuple(tuple(r) for r in assign_replicas(racks, 10_000, 3, rng=random.Random(1)))
    record = TopicRecord("big", uuid.uuid4().hex, 3, {}, assignment)
    encoded = keys.encode_topic(record)
    line(f"encode_topic ({len(encoded) // 1024} KiB)", best_of(repeat, lambda: keys.encode_topic(record)))
    view = _pending_view(record)
    line("validate-only view", best_of(repeat, lambda: _pending_view(record)))
    line("response proto (serde.topic_to_proto)", best_of(repeat, lambda: serde.topic_to_proto(view)))
    topics = [
        TopicRecord(f"t{i}", "", 3, {}, tuple(assignment[j % 10_000] for j in range(1_000)))
        for i in range(200)
    ]
    line("leader counts over 200,000 partitions", best_of(repeat, lambda: leader_counts(topics)))


# ---------------------------------------------------------------------------------------------
# 2. patterns
# ---------------------------------------------------------------------------------------------


def report_patterns(repeat: int) -> None:
    names = [f"orders.region-{i % 50}.shard-{i}" for i in range(9_999)] + ["a" * 29 + "-"]
    print("patterns over 10,000 topics (RE2, full match):")
    for pattern in (r"orders\.region-1\..*", "(a+)+", "[a-z.-]{1,1000}[0-9]{1,5}"):
        compiled = compile_topic_pattern(pattern)
        line(f"select {pattern!r}", best_of(repeat, functools.partial(compiled.select, names)))
    started = time.perf_counter()
    re.fullmatch("(a+)+", "a" * 22 + "-")
    line(
        "Python re, (a+)+ over 'a'*22 + '-' (x2 per extra 'a': 'a'*29 is ~128x)",
        time.perf_counter() - started,
    )

    counts = dict.fromkeys(names, 1)
    patterns = [rf"orders\.region-{i}\..*" for i in range(100)]

    async def matcher_calls() -> tuple[float, float]:
        matcher = TopicMatcher(lambda: counts)
        started = time.perf_counter()
        await matcher.live_topics(patterns)
        first = time.perf_counter() - started
        started = time.perf_counter()
        await matcher.live_topics(patterns)
        return first, time.perf_counter() - started

    first, cached = asyncio.run(matcher_calls())
    line("100 patterns through the matcher, first call (worker thread)", first)
    line("the same again, names unchanged (cached, on the loop)", cached)

    live = LiveTopics(counts, {".*": frozenset(names)})
    state = GroupState("g", ManualClock())
    everything = Subscription((), ".*")
    for i in range(100):
        state.join(JoinParams("g", subscription=everything, assignor="range"), live, member_id=f"m{i:03d}")
    grown = LiveTopics({**counts, "extra": 1}, {".*": frozenset([*names, "extra"])})
    line(
        "rebalance (worker thread): 100 members, '.*' selects 10,000 topics (range)",
        best_of(min(repeat, 3), lambda: state.copy().rebalance(grown)),
    )


# ---------------------------------------------------------------------------------------------
# 3. round trips on a real cluster
# ---------------------------------------------------------------------------------------------


def report_round_trips(repeat: int) -> None:
    import grpc

    from bench.coordinator import BenchCluster
    from services.etcd.embedded import EmbeddedEtcd
    from services.proto import pb

    run_dir = Path(tempfile.mkdtemp(prefix="bench-bounds-"))
    with EmbeddedEtcd(run_dir / "etcd") as etcd:
        cluster = BenchCluster(run_dir, etcd, ttl=2)
        try:
            cluster.start(3)
            stub = cluster.stub(cluster.active() or "c1")
            print("round trips on a real cluster (median of repeats):")

            def timed(method, request, *, refused: bool) -> float:
                samples = []
                for _ in range(repeat):
                    started = time.perf_counter()
                    try:
                        method(request, timeout=30)
                        assert not refused, "expected a refusal"
                    except grpc.RpcError:
                        assert refused, "expected an answer"
                    samples.append(time.perf_counter() - started)
                return statistics.median(samples)

            million: dict[str, Any] = dict(name="million", partitions=1_000_000)
            line(
                "refused CreateTopic, 1,000,000 partitions, validate-only",
                timed(stub.CreateTopic, pb.CreateTopicRequest(**million, validate_only=True), refused=True),
            )
            line(
                "refused CreateTopic, 1,000,000 partitions",
                timed(stub.CreateTopic, pb.CreateTopicRequest(**million), refused=True),
            )
            largest = pb.CreateTopicRequest(
                name="largest", partitions=10_000, replication_factor=3, validate_only=True
            )
            line(
                "validate-only CreateTopic, 10,000 partitions x RF 3",
                timed(stub.CreateTopic, largest, refused=False),
            )
            stub.CreateTopic(pb.CreateTopicRequest(name="a" * 29 + "-", partitions=1), timeout=30)
            join = pb.JoinGroupRequest(
                group_id="g",
                client_id="bench",
                subscription=pb.Subscription(pattern="(a+)+"),
                session_timeout_ms=6000,
            )
            line("JoinGroup with (a+)+ (new member each time)", timed(stub.JoinGroup, join, refused=False))
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bounds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-cluster", action="store_true", help="only the in-process measurements")
    args = parser.parse_args(argv)
    report_placement(args.repeat)
    report_patterns(args.repeat)
    if not args.no_cluster:
        report_round_trips(args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
