"""The source meeting a batch no consumer can read: a clear error naming the batch, no crash.

Its own one-node cluster, because planting the batch (as an older storage node stored it)
restarts the node; the shared Spark session reads from it.
"""

from __future__ import annotations

import json
import struct
import uuid

import crc32c
import pytest

from gateway.client import Admin, NewTopic, Producer
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests import batch_faults
from tests.e2e.helpers import read_topic
from tests.integration.old_batches import plant
from tests.support.wait import wait_until


def poisoned(count: int) -> bytes:
    """CRC right, one record more than the header counts: what the old framing check let in."""
    bad = bytearray(batch_faults.good(count))
    struct.pack_into(">i", bad, 57, count - 1)
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))
    return bytes(bad)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """``(servers, topic)``: offsets 0-10 good, 11-16 a batch no consumer can read, 17-18 good."""
    spec = LocalClusterSpec(storage_nodes=1, coordinators=1, gateways=1, session_timeout_s=2)
    with LocalCluster(tmp_path_factory.mktemp("corrupt-read-cluster"), spec) as cluster:
        topic = f"c-{uuid.uuid4().hex[:8]}"
        with Admin(servers=cluster.gateway) as admin:
            admin.create_topics([NewTopic(topic, 1)])
        with Producer(servers=cluster.gateway, linger_ms=0) as producer:
            for i in range(11):
                producer.send(topic, b"good-%d" % i, partition=0).get(timeout=30)
        assert plant(cluster, 0, topic, 0, [poisoned(6), batch_faults.good(2)]) == 11
        with Admin(servers=cluster.gateway) as admin:
            wait_until(
                lambda: admin.list_topics(),
                timeout=30.0,
                what="the cluster answering again",
                interval=0.1,
                tolerate=(Exception,),
            )
        yield cluster.gateway, topic


def test_the_read_fails_naming_the_batch_and_the_worker_reads_on(spark, planted):
    servers, topic = planted
    with pytest.raises(Exception) as caught:
        read_topic(spark, servers, subscribe=topic, startingOffsets="earliest").collect()
    message = str(caught.value)
    assert "CorruptRecordError" in message
    assert f"offsets 11..16 of {topic}-0" in message
    assert "exited unexpectedly" not in message  # the Python worker raised; it did not die
    # The same session reads the records in front of the batch, and those after it.
    ends = json.dumps({topic: {"0": 11}})
    before = read_topic(spark, servers, subscribe=topic, startingOffsets="earliest", endingOffsets=ends)
    assert [r.value for r in before.orderBy("offset").collect()] == [b"good-%d" % i for i in range(11)]
    starts = json.dumps({topic: {"0": 17}})
    after = read_topic(spark, servers, subscribe=topic, startingOffsets=starts).collect()
    assert sorted(r.offset for r in after) == [17, 18]
