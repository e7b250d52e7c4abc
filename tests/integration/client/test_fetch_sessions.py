"""Fetch sessions (KIP-227, data protocol version 3) under a real consumer: positions that change
mid-session (seeks, a reassignment), a gateway killed mid-session, leaders moving between
storage nodes, and a gateway speaking version 2. Every test checks the consumed sequence: each
partition's records exactly once, in offset order, from where the consumer was put.

These tests break their own cluster (a gateway killed, leaders moved), so they share one of
their own: two storage nodes (topics replicated on both), two gateways, the raw data path.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.dataport import protocol as dp
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=2, session_timeout_s=2)
    with LocalCluster(tmp_path_factory.mktemp("fetch-sessions-cluster"), spec) as local:
        yield local


def new_topic(cluster, partitions: int, replication: int = 1) -> str:
    name = f"fs-{uuid.uuid4().hex[:8]}"
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(name, partitions, replication)])
    return name


def produce(cluster, topic: str, partitions: int, per_partition: int, start: int = 0) -> None:
    """``per_partition`` records to each partition, valued ``p<partition>-<n>``, in small batches
    (so a fetch of a few KB takes a few of them)."""
    with Producer(servers=cluster.gateway, acks="all", linger_ms=0, batch_size=600) as producer:
        for n in range(start, start + per_partition):
            for p in range(partitions):
                producer.send(topic, b"p%d-%d" % (p, n), partition=p)
        producer.flush(timeout=60)


class Ledger:
    """What a consumer must read next per partition; fails at the first record out of place."""

    def __init__(self) -> None:
        self.next: dict[TopicPartition, int] = {}
        self.read = 0

    def put(self, tp: TopicPartition, offset: int) -> None:
        self.next[tp] = offset

    def take(self, polled: dict) -> None:
        for tp, records in polled.items():
            for record in records:
                expected = self.next.get(tp)
                assert record.offset == expected, f"{tp}: read offset {record.offset}, expected {expected}"
                assert record.value == b"p%d-%d" % (tp.partition, record.offset)
                self.next[tp] = record.offset + 1
                self.read += 1

    def done(self, ends: dict[TopicPartition, int]) -> bool:
        return all(self.next.get(tp) == end for tp, end in ends.items())


def poll_until(
    consumer: Consumer, ledger: Ledger, ends: dict[TopicPartition, int], timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while not ledger.done(ends):
        if time.monotonic() > deadline:
            behind = {
                str(tp): (ledger.next.get(tp), end) for tp, end in ends.items() if ledger.next.get(tp) != end
            }
            raise AssertionError(f"stuck: (next, end) {behind}")
        ledger.take(consumer.poll(timeout_ms=200))
    ledger.take(consumer.poll(timeout_ms=100))  # nothing more may come


def raw_fetcher(consumer: Consumer):
    raw = consumer._core._fetcher._raw
    assert raw is not None
    return raw


def small_fetches(cluster, **settings) -> Consumer:
    """A consumer whose fetches take a few batches at a time, so a topic takes many fetches."""
    return Consumer(
        servers=cluster.gateway,
        auto_offset_reset="earliest",
        fetch_max_bytes=4096,
        max_partition_fetch_bytes=1024,
        max_poll_records=7,
        fetch_max_wait_ms=100,
        **settings,
    )


def test_seeks_and_a_reassignment_mid_session_read_every_record_once_in_order(cluster):
    partitions, per_partition = 40, 25
    topic = new_topic(cluster, partitions)
    produce(cluster, topic, partitions, per_partition)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ledger = Ledger()
    with small_fetches(cluster) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
            ledger.put(tp, 0)
        for _ in range(6):
            ledger.take(consumer.poll(timeout_ms=200))
        # seeks mid-session: some forward (records skipped), some back (records read again)
        for tp in tps[:5]:
            target = min(ledger.next[tp] + 3, per_partition)
            consumer.seek(tp, target)
            ledger.put(tp, target)
        for tp in tps[5:8]:
            consumer.seek(tp, 1)
            ledger.put(tp, 1)
        for _ in range(6):
            ledger.take(consumer.poll(timeout_ms=200))
        # a reassignment: a third of the partitions go away, then come back where they were
        consumer.assign(tps[::3])
        for _ in range(4):
            ledger.take(consumer.poll(timeout_ms=200))
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, ledger.next[tp])
        # records arriving mid-session are read too
        produce(cluster, topic, partitions, 5, start=per_partition)
        poll_until(consumer, ledger, {tp: per_partition + 5 for tp in tps})
        raw = raw_fetcher(consumer)
        # each seek abandons the fetch in flight, and the next one is a full fetch
        assert raw.incremental_fetches > 0 and raw.full_fetches > 0, "the fetches ran in sessions"


def test_a_gateway_killed_mid_session_loses_and_repeats_nothing(cluster):
    # far more than the consumer buffers (two small chunks per partition) when the gateway dies
    partitions, per_partition = 24, 300
    topic = new_topic(cluster, partitions)
    produce(cluster, topic, partitions, per_partition)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends = {tp: per_partition for tp in tps}
    ledger = Ledger()
    with small_fetches(cluster, request_timeout_ms=5000, retry_backoff_ms=50) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
            ledger.put(tp, 0)
        while ledger.read < 200:
            ledger.take(consumer.poll(timeout_ms=200))
        raw = raw_fetcher(consumer)
        full_before = raw.full_fetches
        cluster.restart_gateway(0, kill=True)
        poll_until(consumer, ledger, ends)
        assert raw.full_fetches > full_before, "a new connection starts with a full fetch"
        assert raw._link.opened >= 2


def _led_by(admin: Admin, topic: str) -> dict[int, int]:
    return {p.partition: p.leader for p in admin.describe_topics([topic])[0].partitions}


def test_leaders_moving_between_storage_nodes_mid_session(cluster):
    partitions, per_partition = 8, 40
    topic = new_topic(cluster, partitions, replication=2)
    produce(cluster, topic, partitions, per_partition)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ledger = Ledger()
    with Admin(servers=cluster.gateway) as admin, small_fetches(cluster, retry_backoff_ms=50) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
            ledger.put(tp, 0)
        while ledger.read < 100:
            ledger.take(consumer.poll(timeout_ms=200))
        before = _led_by(admin, topic)
        assert min(before.values()) >= 0
        # every partition's preferred leader becomes its other replica, then is elected
        description = admin.describe_topics([topic])[0]
        moves = {
            TopicPartition(topic, p.partition): [r for r in p.replicas if r != p.leader] + [p.leader]
            for p in description.partitions
        }
        assert all(error is None for error in admin.alter_partition_reassignments(moves).values())
        wait_until(lambda: not admin.list_partition_reassignments([topic]), timeout=20, what="reassigned")
        moving = threading.Thread(target=lambda: admin.elect_leaders([topic]))
        moving.start()
        for _ in range(10):  # consuming while leadership moves
            ledger.take(consumer.poll(timeout_ms=100))
        moving.join()
        wait_until(
            lambda: all(leader not in (-1, before[p]) for p, leader in _led_by(admin, topic).items()),
            timeout=20,
            what="every partition led by its other replica",
        )
        produce(cluster, topic, partitions, 10, start=per_partition)
        poll_until(consumer, ledger, {tp: per_partition + 10 for tp in tps})
        assert raw_fetcher(consumer).incremental_fetches > 0


def test_a_client_speaking_version_2_fetches_without_sessions(cluster, monkeypatch):
    partitions = 6
    topic = new_topic(cluster, partitions)
    produce(cluster, topic, partitions, 10)
    monkeypatch.setattr(dp, "MAX_VERSION", 2)  # this process's SDK offers versions 1..2
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ledger = Ledger()
    with small_fetches(cluster) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
            ledger.put(tp, 0)
        poll_until(consumer, ledger, {tp: 10 for tp in tps})
        raw = raw_fetcher(consumer)
        connection = raw._link._connection
        assert connection is not None and connection.version == 2
        assert raw.full_fetches == raw.incremental_fetches == 0


def test_read_committed_mid_session_sees_commits_and_never_aborted_records(cluster):
    """The last stable offset moving and aborted transactions reach a read_committed consumer
    whose fetches run in a session: an open transaction holds its partitions back, its commit
    releases them in the next fetches, an aborted one's records never show."""
    partitions = 12
    topic = new_topic(cluster, partitions)
    got: list[bytes] = []
    producer = Producer(servers=cluster.gateway, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    with producer, small_fetches(cluster, isolation_level="read_committed") as consumer:
        producer.init_transactions()
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])

        def read(expect: int) -> None:
            deadline = time.monotonic() + 20
            while len(got) < expect:
                assert time.monotonic() < deadline, f"read {len(got)} of {expect}"
                for records in consumer.poll(timeout_ms=100).values():
                    got.extend(r.value for r in records)

        producer.begin_transaction()
        for i in range(24):
            producer.send(topic, b"c1-%d" % i, partition=i % partitions)
        producer.commit_transaction()
        read(24)
        producer.begin_transaction()
        for i in range(24):
            producer.send(topic, b"ab-%d" % i, partition=i % partitions)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(24):
            producer.send(topic, b"c2-%d" % i, partition=i % partitions)
        producer.flush()
        for _ in range(5):  # open: nothing of it may be read yet
            for records in consumer.poll(timeout_ms=100).values():
                got.extend(r.value for r in records)
        assert len(got) == 24
        producer.commit_transaction()
        read(48)
        for records in consumer.poll(timeout_ms=300).values():
            got.extend(r.value for r in records)
        assert raw_fetcher(consumer).incremental_fetches > 0
    assert sorted(got) == sorted([b"c1-%d" % i for i in range(24)] + [b"c2-%d" % i for i in range(24)])
