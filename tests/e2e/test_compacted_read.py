"""The Spark source reads a compacted topic (issue 15): after the cleaner ran, a batch read from
the beginning gives the latest value of every key, steps over the offsets compaction removed, and
a deleted key is gone once its tombstone is."""

from __future__ import annotations

import time
import uuid

import pytest

from gateway.client import Admin, NewTopic, Producer
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests.e2e.helpers import read_topic


@pytest.fixture(scope="module")
def compact_cluster(tmp_path_factory):
    spec = LocalClusterSpec(
        storage_nodes=1,
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--log-cleaner-backoff-ms", "50", "--maintenance-interval-ms", "100"],
    )
    with LocalCluster(tmp_path_factory.mktemp("spark-compaction"), spec) as local:
        yield local


def test_spark_reads_the_latest_value_per_key(spark, compact_cluster):
    servers = compact_cluster.gateway
    topic = f"table-{uuid.uuid4().hex[:8]}"
    configs = {"cleanup.policy": "compact", "segment.bytes": "8192", "min.cleanable.dirty.ratio": "0.01"}
    configs["delete.retention.ms"] = "0"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, configs)])
    latest: dict[bytes, bytes | None] = {}
    sent = []
    # Batches below segment.bytes (a batch larger than a segment is refused, as in Kafka).
    with Producer(servers=servers, linger_ms=2, batch_size=4096) as producer:
        for i in range(2000):
            key = b"row-%d" % (i % 40)
            sent.append(producer.send(topic, b"version-%d" % i, key=key))
            latest[key] = b"version-%d" % i
        for i in range(5):
            sent.append(producer.send(topic, None, key=b"row-%d" % i))
            latest[b"row-%d" % i] = None
        for i in range(400):  # roll past the tombstones so they can be cleaned too
            sent.append(producer.send(topic, b"f" * 30, key=b"filler-%d" % (i % 3)))
            latest[b"filler-%d" % (i % 3)] = b"f" * 30
        end = producer.send(topic, b"end", key=b"end").get(10).offset + 1
        latest[b"end"] = b"end"
    assert end == len(sent) + 1 and all(f.get(10).offset >= 0 for f in sent), "every record appended"

    def rows() -> list:
        return read_topic(spark, servers, subscribe=topic).collect()

    deadline = time.monotonic() + 30
    found = rows()
    while len(found) > 1000 and time.monotonic() < deadline:  # until the cleaner has run
        time.sleep(0.5)
        found = rows()
    assert len(found) < 1000, f"{len(found)} rows: the cleaner did not run"
    offsets = [r.offset for r in found]
    assert offsets == sorted(set(offsets)) and offsets[-1] == end - 1
    assert len(offsets) < end, "holes where compaction removed records"
    values: dict[bytes, bytes | None] = {}
    for row in found:
        values[bytes(row.key)] = bytes(row.value) if row.value is not None else None
    assert {k: v for k, v in values.items() if v is not None} == {
        k: v for k, v in latest.items() if v is not None
    }
