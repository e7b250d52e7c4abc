"""kill -9 of a partition leader while the gateway streams acks=all appends to it over the data
port (``gateway/server/node_appends.py``): no acknowledged record is lost, and the appends did go
over the port (not the gRPC fallback). The long fault loop is ``test_chaos.py``."""

from __future__ import annotations

import time

from gateway.client import Admin
from services.proto import pb
from tests.support.wait import wait_until

from ._chaos import (
    ProduceHistory,
    ProducerLoad,
    check_acknowledged,
    check_dense,
    describe,
    quote,
    read_logs,
)
from ._replication import new_topic, start_cluster, storage_stub

PARTITIONS = 2
RECORDS = 3000
SETTINGS = {
    "acks": "all",
    "linger_ms": 2,
    "max_in_flight": PARTITIONS,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 45_000,
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 500,
}


def _data_port_appends(cluster, node_id: int) -> int:
    return (
        storage_stub(cluster, node_id)
        .DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=5)
        .traffic.data_port_appends
    )


def test_killing_a_leader_mid_stream_loses_no_acknowledged_record(tmp_path):
    with start_cluster(tmp_path) as cluster, Admin(servers=cluster.gateway) as admin:
        topic = new_topic(
            admin,
            partitions=PARTITIONS,
            replication_factor=3,
            min_insync_replicas=2,
            message_timestamp_type="LogAppendTime",
        )
        history = ProduceHistory()
        load = ProducerLoad(
            0,
            servers=cluster.gateway,
            topic=topic,
            partitions=PARTITIONS,
            count=RECORDS,
            duration_s=6.0,
            history=history,
            settings=SETTINGS,
            flush_timeout_s=60,
        )
        load.start()
        try:
            wait_until(lambda: len(history.acks) >= RECORDS // 4, timeout=30, what="a quarter acknowledged")
            victim = describe(admin, topic)[0].leader
            assert _data_port_appends(cluster, victim) > 0, "the leader was sent appends over its data port"
            cluster.storage_nodes[victim].kill()
            killed_at = time.monotonic()
            wait_until(
                lambda: all(p.leader not in (victim, -1) for p in describe(admin, topic).values()),
                timeout=30,
                what="new leaders",
            )
            load.join(timeout=90)
            assert not load.is_alive() and load.error is None, load.error
        finally:
            load.abort()
        assert time.monotonic() - killed_at < 90
        assert not history.failures, quote([f"{v!r}: {why}" for v, why in history.failures.items()])
        assert len(history.acks) == RECORDS
        survivors = [n for n in cluster.storage_nodes if n != victim]
        assert sum(_data_port_appends(cluster, n) for n in survivors) > 0, "new leaders took port appends"
        logs = read_logs(cluster.gateway, topic, PARTITIONS, timeout_s=30)
        violations = check_acknowledged(history.acks, logs) + check_dense(logs)
        assert not violations, quote(violations)
