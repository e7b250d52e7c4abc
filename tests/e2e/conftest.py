"""End-to-end fixtures: a real local cluster and a real local Spark (``local[2]``), shared.

JVM and cluster start-up cost seconds each, so one of each serves every e2e test; tests isolate
themselves with fresh topics (``make_topic``) and temporary directories.

* ``cluster`` / ``servers`` / ``admin`` -- etcd, a coordinator, two storage nodes, a gateway.
* ``spark`` -- a SparkSession with the tributary source registered and Python worker logging on
  (``spark.tvf.python_worker_logs()``), so tests can read what executors logged.
* ``produce(topic, count, ...)`` -- sends records and returns what landed where.
* ``delete_records(topic, partition, before)`` -- Kafka's DeleteRecords through the SDK's
  ``Admin.delete_records``: records below ``before`` are gone, as retention would delete them.

Helpers that are not fixtures live in :mod:`tests.e2e.helpers`.
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

import pytest

from gateway.client import Admin, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from spark_jobs.session import spark_session


class Produced(NamedTuple):
    key: bytes | None
    value: bytes
    partition: int
    offset: int
    timestamp: int
    headers: tuple


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=1, session_timeout_s=2)
    # Each LocalCluster has its own etcd, so no unique cluster name is needed.
    with LocalCluster(tmp_path_factory.mktemp("e2e-cluster"), spec) as local:
        yield local


@pytest.fixture(scope="session")
def servers(cluster) -> str:
    return cluster.servers


@pytest.fixture(scope="session")
def admin(servers):
    with Admin(servers=servers) as client:
        yield client


@pytest.fixture(scope="session")
def spark():
    session = spark_session("tributary-e2e", master="local[2]")
    yield session
    session.stop()


@pytest.fixture
def make_topic(admin):
    """``make_topic(partitions=1, **configs) -> name``: a fresh topic for one test."""

    def create(partitions: int = 1, **configs) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        topic_configs = {k.replace("_", "."): str(v) for k, v in configs.items()}
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs)])
        return name

    return create


@pytest.fixture
def produce(servers):
    """``produce(topic, count, start=0, timestamps=None, partition=None) -> [Produced]``.

    Keys cycle over 13 values plus a null key every 10th record; every 3rd record has two headers.
    """

    def send(
        topic: str, count: int, *, start: int = 0, timestamps=None, partition: int | None = None
    ) -> list[Produced]:
        sent = []
        with Producer(servers=servers, linger_ms=5) as producer:
            for i in range(start, start + count):
                key = None if i % 10 == 0 else f"key-{i % 13}".encode()
                headers = (("h1", f"{i}".encode()), ("h2", None)) if i % 3 == 0 else ()
                ts = timestamps[i - start] if timestamps is not None else None
                future = producer.send(
                    topic,
                    f"value-{i}".encode(),
                    key=key,
                    headers=headers or None,
                    partition=partition,
                    timestamp=ts,
                )
                sent.append((key, f"value-{i}".encode(), headers, future))
            producer.flush(timeout=60)
        return [
            Produced(k, v, f.get(10).partition, f.get(10).offset, f.get(10).timestamp, h)
            for k, v, h, f in sent
        ]

    return send


@pytest.fixture
def delete_records(admin):
    def delete(topic: str, partition: int, before: int) -> int:
        tp = TopicPartition(topic, partition)
        return admin.delete_records({tp: before})[tp]

    return delete
