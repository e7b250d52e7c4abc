"""The SDK consumer meeting a batch an older storage node stored and no consumer can read.

The issue's case: good records at offsets 0-10, the bad batch at 11-16, good records after it.
The consumer returns 0-10, then raises CorruptRecordError naming the batch (offset 11, not 17 as
it used to) with the offset after it; nothing is skipped until the application seeks there. Its
own cluster (one storage node), because planting the batch restarts the node.
"""

from __future__ import annotations

import struct
import time
import uuid

import crc32c
import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import CorruptRecordError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests import batch_faults
from tests.integration.old_batches import plant
from tests.integration.responsiveness import PROBE_DEADLINE_S, while_repeating
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=1, coordinators=1, gateways=1, session_timeout_s=2)
    with LocalCluster(tmp_path_factory.mktemp("unreadable-cluster"), spec) as local:
        yield local


def poisoned(count: int) -> bytes:
    """CRC right, one record more than the header counts: what the old framing check let in."""
    bad = bytearray(batch_faults.good(count))
    struct.pack_into(">i", bad, 57, count - 1)
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))
    return bytes(bad)


@pytest.fixture(scope="module")
def topic(cluster):
    name = f"u-{uuid.uuid4().hex[:8]}"
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(name, 1)])
    with Producer(servers=cluster.gateway, linger_ms=0) as producer:
        for i in range(11):
            producer.send(name, b"good-%d" % i, partition=0).get(timeout=30)
    assert plant(cluster, 0, name, 0, [poisoned(6), batch_faults.good(2)]) == 11
    with Admin(servers=cluster.gateway) as admin:
        wait_until(
            lambda: admin.list_topics(),
            timeout=30.0,
            what="the cluster answering again",
            interval=0.1,
            tolerate=(Exception,),
        )
    return name


def poll_until_error(consumer: Consumer, timeout: float = 30.0) -> tuple[list, CorruptRecordError]:
    """Poll, collecting records, until a poll raises CorruptRecordError."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
        except CorruptRecordError as exc:
            return got, exc
    raise AssertionError(f"no CorruptRecordError within {timeout} s; got offsets {[r.offset for r in got]}")


def test_the_consumer_names_the_bad_batch_and_skips_it_only_when_told(cluster, topic):
    tp = TopicPartition(topic, 0)
    with Consumer(servers=cluster.gateway, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        got, error = poll_until_error(consumer)
        assert [r.offset for r in got] == list(range(11))
        assert (error.topic, error.partition, error.offset, error.next_offset) == (topic, 0, 11, 17)
        assert f"offsets 11..16 of {topic}-0" in str(error)
        assert consumer.position(tp) == 11

        # Every poll raises it again, quickly, and other clients are answered meanwhile.
        with Admin(servers=cluster.gateway) as admin:
            observed = while_repeating(
                lambda: poll_until_error(consumer)[1], lambda: admin.describe_topics([topic]), min_answers=3
            )
        assert observed.slowest_probe < PROBE_DEADLINE_S
        for seconds, again in observed.answers:
            assert isinstance(again, CorruptRecordError) and again.offset == 11
            assert seconds < PROBE_DEADLINE_S
        assert consumer.position(tp) == 11

        # The explicit skip, as Kafka users do it.
        consumer.seek(TopicPartition(error.topic, error.partition), error.next_offset)
        after = []
        wait_until(
            lambda: after.extend(consumer.poll(timeout_ms=500).get(tp, [])) or len(after) >= 2,
            timeout=30.0,
            interval=0.1,
            tolerate=(Exception,),
        )
        assert [r.offset for r in after] == [17, 18]


def test_poll_arrow_stops_at_the_bad_batch_in_the_same_way(cluster, topic):
    tp = TopicPartition(topic, 0)
    with Consumer(servers=cluster.gateway, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        offsets: list[int] = []
        deadline = time.monotonic() + 30
        with pytest.raises(CorruptRecordError) as raised:
            while time.monotonic() < deadline:
                offsets += consumer.poll_arrow(timeout_ms=500).column("offset").to_pylist()
        assert offsets == list(range(11))
        error = raised.value
        assert (error.topic, error.partition, error.offset, error.next_offset) == (topic, 0, 11, 17)
        assert consumer.position(tp) == 11
        consumer.seek(tp, error.next_offset)
        after: list[int] = []
        wait_until(
            lambda: (
                after.extend(consumer.poll_arrow(timeout_ms=500).column("offset").to_pylist())
                or len(after) >= 2
            ),
            timeout=30.0,
            interval=0.1,
            tolerate=(Exception,),
        )
        assert after == [17, 18]
