"""A compacted topic through the SDK, against real processes: read from the beginning, a consumer
gets the latest value per key (a deleted key not at all, once its tombstone is gone)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec


@pytest.fixture(scope="module")
def compact_cluster(tmp_path_factory):
    spec = LocalClusterSpec(
        storage_nodes=1,
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--log-cleaner-backoff-ms", "50", "--maintenance-interval-ms", "100"],
    )
    with LocalCluster(tmp_path_factory.mktemp("compaction-cluster"), spec) as local:
        yield local


def _consume_from_beginning(servers: str, topic: str, end_offset: int) -> list:
    """Every record of partition 0 from the earliest offset up to ``end_offset``."""
    records = []
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end_offset and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        assert consumer.position(tp) >= end_offset, "the consumer steps over the compacted holes"
    return records


def _log_bytes(cluster: LocalCluster, topic: str) -> int:
    total = 0
    for path in cluster.data_dir.glob(f"storage-*/{topic}-0/*.log"):
        # the cleaner may delete a segment it replaced between the listing and the stat
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def test_the_sdk_reads_the_latest_value_per_key_of_a_compacted_topic(compact_cluster):
    servers = compact_cluster.gateway
    topic = f"compact-{uuid.uuid4().hex[:8]}"
    with Admin(servers=servers) as admin:
        admin.create_topics(
            [
                NewTopic(
                    topic,
                    1,
                    1,
                    {
                        "cleanup.policy": "compact",
                        "segment.bytes": "8192",
                        "min.cleanable.dirty.ratio": "0.01",
                        "delete.retention.ms": "0",
                    },
                )
            ]
        )
    latest: dict[bytes, bytes | None] = {}
    produced = 0
    with Producer(servers=servers, linger_ms=2, compression="lz4") as producer:
        for i in range(3000):
            key = b"user-%d" % (i % 50)
            value = b"profile-%d" % i
            producer.send(topic, value, key=key)
            latest[key] = value
            produced += len(key) + len(value)
        for i in range(10):  # delete ten users
            producer.send(topic, None, key=b"user-%d" % i)
            latest[b"user-%d" % i] = None
        # Fill a few more segments so the tombstones leave the active segment.
        for i in range(600):
            key = b"filler-%d" % (i % 5)
            producer.send(topic, b"x" * 20, key=key)
            latest[key] = b"x" * 20
        producer.flush(timeout=30)
        end = producer.send(topic, b"last", key=b"last").get(10).offset + 1
        latest[b"last"] = b"last"

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _log_bytes(compact_cluster, topic) > produced / 3:
        time.sleep(0.1)
    assert 0 < _log_bytes(compact_cluster, topic) < produced / 3, "the files on disk shrink"

    records = _consume_from_beginning(servers, topic, end)
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)) and offsets[-1] == end - 1
    seen = {}
    for record in records:
        seen[record.key] = record.value
    assert {k: v for k, v in seen.items() if v is not None} == {
        k: v for k, v in latest.items() if v is not None
    }
    assert len(records) < 3000 / 2, "superseded values are gone from the cleaned part"


def test_topics_describe_shows_the_cleaners_progress(compact_cluster):
    servers = compact_cluster.gateway
    topic = f"progress-{uuid.uuid4().hex[:8]}"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(topic, 2, 1, {"cleanup.policy": "compact", "segment.bytes": "4096"})])
    with Producer(servers=servers, linger_ms=2) as producer:
        for i in range(400):
            producer.send(topic, b"value-%d" % i, key=b"k%d" % (i % 4), partition=0)
            if i % 40 == 39:
                producer.flush(timeout=30)  # many batches, so segments roll

    def describe() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "gateway.cli.main", "topics", "describe", topic],
            capture_output=True,
            text=True,
            env={**os.environ, "TRIBUTARY_GATEWAY": servers},
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    deadline = time.monotonic() + 20
    text = describe()
    while "compacted below 0)" in text.splitlines()[2] and time.monotonic() < deadline:
        time.sleep(0.2)
        text = describe()
    lines = text.splitlines()
    assert "CLEANER" in lines[1]
    assert "dirty" in lines[2] and "compacted below 0)" not in lines[2], text  # partition 0 was cleaned
    assert "dirty 0% (compacted below 0)" in lines[3], text  # partition 1 holds nothing


def test_the_spark_sources_range_reader_steps_over_the_holes(compact_cluster):
    """The executor side of the Spark source (``read_range``, what each task runs) over a
    compacted partition: it ends at the range end, holes and all, with each key's latest row."""
    from spark_jobs.offsets import OffsetRange
    from spark_jobs.range_reader import RangeReadSettings, read_range

    servers = compact_cluster.gateway
    topic = f"spark-{uuid.uuid4().hex[:8]}"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {"cleanup.policy": "compact", "segment.bytes": "4096"})])
    latest: dict[bytes, bytes] = {}
    with Producer(servers=servers, linger_ms=2) as producer:
        for i in range(600):
            key, value = b"k%d" % (i % 6), b"value-%d" % i
            producer.send(topic, value, key=key)
            latest[key] = value
            if i % 60 == 59:
                producer.flush(timeout=30)
        end = producer.send(topic, b"end", key=b"end").get(10).offset + 1
        latest[b"end"] = b"end"
    data_dir = compact_cluster.data_dir
    deadline = time.monotonic() + 20
    while (
        not list(data_dir.glob(f"storage-*/{topic}-0/cleaner-offset-checkpoint"))
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert list(data_dir.glob(f"storage-*/{topic}-0/cleaner-offset-checkpoint")), "a cleaning round ran"

    def read() -> list[dict]:
        settings = RangeReadSettings(servers=servers, poll_timeout_ms=20_000)
        return [
            row for batch in read_range(OffsetRange(topic, 0, 0, end), settings) for row in batch.to_pylist()
        ]

    # The checkpoint is written before the first swap: read until the swap has landed.
    rows = read()
    while len(rows) >= 600 / 2 and time.monotonic() < deadline + 20:
        time.sleep(0.2)
        rows = read()
    offsets = [row["offset"] for row in rows]
    assert offsets == sorted(set(offsets)) and offsets[-1] == end - 1
    assert len(rows) < 600 / 2, "the range reader got the compacted log"
    assert {row["key"]: row["value"] for row in rows} == latest
