"""Gateways going away under a running client: retries keep what was acknowledged, failover
keeps the client going. These tests break their own cluster, so they do not share one."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=1, coordinators=1, gateways=2, session_timeout_s=2)
    # Each LocalCluster has its own etcd, so no unique cluster name is needed.
    with LocalCluster(tmp_path_factory.mktemp("faults-cluster"), spec) as local:
        yield local


def new_topic(servers: str) -> str:
    name = f"faults-{uuid.uuid4().hex[:8]}"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(name, PARTITIONS)])
    return name


def read_everything(servers: str, topic: str, at_least: int) -> dict[int, list[bytes]]:
    got: dict[int, list[bytes]] = defaultdict(list)
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < at_least and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend(r.value for r in records)
        for _ in range(3):  # and whatever duplicates follow
            for tp, records in consumer.poll(timeout_ms=300).items():
                got[tp.partition].extend(r.value for r in records)
    return got


@pytest.mark.parametrize("acks", [1, "all"])
def test_gateway_restart_during_a_produce_loop_loses_nothing_acknowledged(cluster, acks):
    """Over the SDK's default data path (the raw listener, which the launcher's gateways offer):
    the killed gateway's connection breaks, unanswered requests are retried, and the producer
    reconnects to the restarted gateway (its data listener on a new port, from its metadata)."""
    topic = new_topic(cluster.gateway)
    restarted = threading.Event()
    futures: list = []

    def restart_while_flowing():
        # Once records flow (some acknowledged), not after a fixed time: under load the whole
        # loop once finished before a timed restart, which then interrupted nothing.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(futures) > 2_000 and futures[1_000].done()):
            time.sleep(0.01)
        cluster.restart_gateway(0, kill=True)
        restarted.set()

    with Producer(
        servers=cluster.gateway,
        acks=acks,
        linger_ms=2,
        batch_size=4096,
        delivery_timeout_ms=60_000,
        retry_backoff_ms=50,
    ) as producer:
        restarter = threading.Thread(target=restart_while_flowing)
        restarter.start()
        # At least 20,000 records, and 2,000 more after the restart (bounded: 60 s).
        deadline = time.monotonic() + 60
        after_restart = 0
        i = 0
        while (i < 20_000 or after_restart < 2_000) and time.monotonic() < deadline:
            value = b"seq-%06d" % i
            key = b"k%d" % (i % 50)
            futures.append(producer.send(topic, value, key=key))
            if restarted.is_set():
                after_restart += 1
            i += 1
            if i % 500 == 0:
                time.sleep(0.02)  # keep the loop running across the restart
        total = i
        restarter.join()
        producer.flush(timeout=90)
        metrics = producer.metrics()
        reconnects = producer._core.sender.transport.connections_opened - 1
    assert restarted.is_set() and after_restart >= 2_000, (restarted.is_set(), after_restart)
    for future in futures:
        future.get(0)  # raises if any record was not acknowledged
    # A request in flight at the kill is retried; one sent after it waits for the new connection.
    assert metrics["batches-retried"] > 0 or reconnects > 0, (
        f"the restart should have interrupted the producer: {metrics}, reconnects {reconnects}"
    )

    got = read_everything(cluster.gateway, topic, total)
    values = [v for vs in got.values() for v in vs]
    counts = Counter(values)
    assert set(counts) == {b"seq-%06d" % i for i in range(total)}, "every acknowledged record is there"
    duplicates = sum(c - 1 for c in counts.values())
    print(f"\nrestart under load: {total} records, {duplicates} duplicates, producer {metrics}")
    for partition, partition_values in got.items():
        first_seen = list(dict.fromkeys(partition_values))
        assert first_seen == sorted(first_seen), f"partition {partition}: order kept (first occurrences)"


def test_two_gateways_one_killed_the_client_keeps_going(cluster):
    servers = cluster.servers
    assert len(servers.split(",")) == 2
    topic = new_topic(servers)
    with (
        Producer(servers=servers, linger_ms=2, retry_backoff_ms=50) as producer,
        Consumer(servers=servers, auto_offset_reset="earliest") as consumer,
    ):
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        before = [producer.send(topic, b"before-%d" % i, key=b"%d" % i) for i in range(1000)]
        producer.flush(timeout=30)
        seen = Counter()
        deadline = time.monotonic() + 30
        while sum(seen.values()) < 1000 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen.update(r.value for r in records)

        cluster.gateways[0].kill()  # the gateway both clients were using
        after = [producer.send(topic, b"after-%d" % i, key=b"%d" % i) for i in range(1000)]
        producer.flush(timeout=60)
        deadline = time.monotonic() + 60
        while sum(seen.values()) < 2000 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen.update(r.value for r in records)
    assert all(f.succeeded() for f in before + after)
    expected = {b"before-%d" % i for i in range(1000)} | {b"after-%d" % i for i in range(1000)}
    assert set(seen) == expected
