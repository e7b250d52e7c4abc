"""A cluster holding many partitions still works, end to end (issue 21): real etcd, coordinator,
three storage nodes and a gateway, with :data:`PARTITIONS` (20,000) partitions created in the
fixture (two topics of 10,000, created side by side, replication factor 1, a few bytes each).

* metadata: every partition is listed with a live leader, leaders spread over the three nodes;
* produce and fetch: one request carrying records for a thousand partitions of each topic,
  read back at their offsets;
* a consumer group over a pattern matching both topics: two members split every partition
  between them, each exactly once;
* a storage-node restart: the node comes back with every partition it held, each led again,
  its records still there.

What it costs on this 2-core machine: ~40 s of wall time with other work running beside it
(the fixture's creates ~14 s, the restart ~13 s, the pattern group ~7 s, the cluster's stop
~5 s). At 4,000 partitions it took 55-60 s, and 20,000 four minutes and a failed group, before
the costs that grew with the partitions were cut (issue 21): batched creates, partition deltas
of metadata, the sticky assignor's balance pass (minutes at 20,000 partitions), idle partitions
closing without fsyncs. Metadata waits poll every half second: each poll lists 20,000
partitions. bench/scale.py measures 40,000.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.proto import gateway_grpc, pb
from tests.support.wait import CLUSTER_ERRORS, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 20_000
TOPICS = ("scale.alpha", "scale.beta")
PER_TOPIC = PARTITIONS // len(TOPICS)
#: Partitions (per topic) a produce and fetch covers: every STRIDE-th one.
STRIDE = 10
CALL_TIMEOUT = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # The launcher's lease TTL (6 s): a node applying thousands of roles at once holds its event
    # loop for seconds (two fsyncs per partition it starts leading), past a 2 s lease on a busy
    # machine -- then its partitions go offline for a moment and the checks below see that.
    spec = LocalClusterSpec(storage_nodes=3, coordinators=1, gateways=1, session_timeout_s=6)
    with LocalCluster(tmp_path_factory.mktemp("scale"), spec) as local:
        yield local


@pytest.fixture(scope="module")
def stub(cluster):
    options = [("grpc.max_receive_message_length", 1 << 27)]
    with grpc.insecure_channel(cluster.gateway, options=options) as channel:
        yield gateway_grpc.GatewayStub(channel)


#: How often waits poll the metadata of every partition (each poll lists 20,000 of them).
METADATA_POLL_S = 0.5


@pytest.fixture(scope="module")
def topics(stub):
    def create(name: str) -> None:
        stub.CreateTopic(
            pb.CreateTopicRequest(name=name, partitions=PER_TOPIC, replication_factor=1),
            timeout=CALL_TIMEOUT * 3,
        )

    with ThreadPoolExecutor(len(TOPICS)) as pool:  # side by side: the controller batches both
        list(pool.map(create, TOPICS))
    wait_until(
        lambda: _leaderless(stub) == 0,
        timeout=90,
        what="every partition led",
        tolerate=CLUSTER_ERRORS,
        interval=METADATA_POLL_S,
    )
    return TOPICS


def _metadata(stub) -> dict[str, list]:
    response = stub.GetMetadata(pb.GetMetadataRequest(topics=list(TOPICS)), timeout=CALL_TIMEOUT)
    return {t.name: list(t.partitions) for t in response.topics}


def _leaderless(stub) -> int:
    return sum(1 for parts in _metadata(stub).values() for p in parts if p.leader < 0)


def _produce(stub, topic: str, value: bytes) -> dict[int, int]:
    """One record to every STRIDE-th partition, in one request (then one request for those that
    failed with a retriable error -- a partition just led may not know its role yet, as a
    client's retry covers): partition -> offset."""
    pending = list(range(0, PER_TOPIC, STRIDE))
    offsets: dict[int, int] = {}

    def attempt() -> bool:
        response = stub.Produce(
            pb.ProduceRequest(
                topic=topic,
                records=[pb.ProduceRecord(value=value, partition=p) for p in pending],
                acks=pb.ACKS_LEADER,
                timeout_ms=10_000,  # answer the partitions not ready yet as failed; asked again
            ),
            timeout=CALL_TIMEOUT,
        )
        failed = {r.partition: r.error for r in response.partitions if r.HasField("error")}
        assert all(error.retriable for error in failed.values()), failed
        offsets.update((r.partition, r.offset) for r in response.records if r.partition not in failed)
        pending[:] = sorted(failed)
        return not pending

    wait_until(attempt, timeout=90, what=f"records produced to {topic}", tolerate=CLUSTER_ERRORS)
    return offsets


def _fetch(stub, offsets: dict[str, dict[int, int]]) -> dict[tuple[str, int], list[bytes]]:
    request = pb.FetchRequest(
        partitions=[
            pb.FetchPartition(topic=topic, partition=p, offset=offset)
            for topic, by_partition in offsets.items()
            for p, offset in by_partition.items()
        ],
        max_bytes=64 << 20,
    )
    response = stub.Fetch(request, timeout=CALL_TIMEOUT)
    return {(r.topic, r.partition): [rec.value for rec in r.records] for r in response.partitions}


def test_metadata_lists_every_partition_led_and_spread(stub, topics):
    metadata = _metadata(stub)
    assert {name: len(parts) for name, parts in metadata.items()} == dict.fromkeys(TOPICS, PER_TOPIC)
    leaders = [p.leader for parts in metadata.values() for p in parts]
    assert min(leaders) >= 0
    per_node = {node: leaders.count(node) for node in set(leaders)}
    assert set(per_node) == {0, 1, 2} and max(per_node.values()) - min(per_node.values()) <= 2, per_node


def test_one_request_produces_to_a_thousand_partitions_and_fetches_them_back(stub, topics):
    offsets = {topic: _produce(stub, topic, f"v-{topic}".encode()) for topic in topics}
    assert all(len(by_partition) == PER_TOPIC // STRIDE for by_partition in offsets.values())
    assert all(offset >= 0 for by_partition in offsets.values() for offset in by_partition.values())
    fetched = _fetch(stub, offsets)
    assert len(fetched) == len(TOPICS) * PER_TOPIC // STRIDE
    assert all(values[:1] == [f"v-{topic}".encode()] for (topic, _), values in fetched.items())


def test_a_pattern_group_splits_every_partition_between_its_members(cluster, stub, topics):
    from gateway.client import Consumer

    group = "scale-pattern-group"
    # No auto-commit: this checks the assignment; committing 10,000 positions per member every
    # few seconds (one etcd key each) is a different cost.
    consumers = [
        Consumer(
            servers=cluster.gateway,
            group_id=group,
            session_timeout_ms=30_000,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        for _ in range(2)
    ]
    try:
        for consumer in consumers:
            consumer.subscribe(pattern=r"scale\..*")

        def split() -> bool:
            for consumer in consumers:
                consumer.poll(timeout_ms=50, max_records=1)
            assigned = [consumer.assignment() for consumer in consumers]
            return all(assigned) and sum(map(len, assigned)) == PARTITIONS

        wait_until(split, timeout=60, what="both members assigned", tolerate=CLUSTER_ERRORS)
        first, second = (consumer.assignment() for consumer in consumers)
        assert not first & second
        assert {tp.topic for tp in first | second} == set(TOPICS)
        assert len(first | second) == PARTITIONS
        _commit_every_partition(stub, group, consumers)
    finally:
        for consumer in consumers:
            consumer.close()


def _committed(stub, group: str) -> dict[tuple[str, int], tuple[int, int]]:
    response = stub.FetchCommittedOffsets(
        pb.FetchCommittedOffsetsRequest(group_id=group), timeout=CALL_TIMEOUT
    )
    return {(o.topic, o.partition): (o.offset, o.commit_timestamp) for o in response.offsets}


def _commit_every_partition(stub, group: str, consumers) -> None:
    """Each member commits all 10,000 of its partitions in one request (the etcd writes go in
    parallel transactions of 100), and every offset reads back; committing them again unchanged
    writes nothing (the stored timestamps stay), one changed offset is written."""
    for consumer in consumers:
        consumer.commit({tp: tp.partition + 1 for tp in consumer.assignment()})
    committed = _committed(stub, group)
    assert len(committed) == PARTITIONS
    assert all(offset == partition + 1 for (_, partition), (offset, _) in committed.items())
    first = consumers[0]
    moved = min(first.assignment())
    first.commit({tp: tp.partition + 1 + (tp == moved) for tp in first.assignment()})
    again = _committed(stub, group)
    key = (moved.topic, moved.partition)
    assert again[key][0] == moved.partition + 2
    assert {k: v for k, v in again.items() if k != key} == {k: v for k, v in committed.items() if k != key}


def test_a_storage_node_restarts_with_every_partition(cluster, stub, topics):
    before = _metadata(stub)
    held = {(name, p.partition) for name, parts in before.items() for p in parts if list(p.replicas) == [1]}
    assert held and all(p.leader == 1 for parts in before.values() for p in parts if list(p.replicas) == [1])
    offsets = {topic: _produce(stub, topic, b"before-restart") for topic in topics}
    cluster.storage_nodes[1].stop()
    cluster.start_storage_node(1, timeout=120)
    wait_until(
        lambda: _leaderless(stub) == 0,
        timeout=60,
        what="every partition led again",
        tolerate=CLUSTER_ERRORS,
        interval=METADATA_POLL_S,
    )
    after = _metadata(stub)
    assert {(name, p.partition) for name, parts in after.items() for p in parts if p.leader == 1} == held

    def all_back() -> bool:
        # A partition's records are readable again once its new leader term set the high
        # watermark (a moment after it leads): wait for every one.
        fetched = _fetch(stub, offsets)
        return len(fetched) == len(offsets) * (PER_TOPIC // STRIDE) and all(
            values[:1] == [b"before-restart"] for values in fetched.values()
        )

    wait_until(
        all_back,
        timeout=30,
        what="every record fetched after the restart",
        tolerate=CLUSTER_ERRORS,
        interval=METADATA_POLL_S,
    )
