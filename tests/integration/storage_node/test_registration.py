"""Storage node membership in a real etcd: register, refuse a duplicate id, leave on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import grpc
import pytest

from launcher.processes import ServiceStartError, start_service
from services.etcd.client import EtcdClient
from services.proto import pb, storage_grpc
from tests.support.wait import wait_until


def _broker(etcd, cluster, node_id):
    async def get():
        async with EtcdClient(etcd.endpoint, prefix=f"/tributary/{cluster}/") as client:
            kv = await client.get(f"brokers/{node_id}")
            return json.loads(kv.value) if kv else None

    return asyncio.run(get())


def _start(tmp_path, etcd, cluster, name, node_id=1, ttl=2):
    return start_service(
        name,
        "storage_node.main",
        [
            "--node-id",
            str(node_id),
            "--log-dirs",
            str(tmp_path / name),
            "--etcd-endpoints",
            etcd.endpoint,
            "--cluster",
            cluster,
            "--session-timeout-s",
            str(ttl),
            "--rack",
            "r1",
        ],
        tmp_path / "run",
    )


def test_register_refuse_duplicate_and_leave_on_sigterm(tmp_path, etcd):
    cluster = f"reg-{uuid.uuid4().hex[:8]}"
    first = _start(tmp_path, etcd, cluster, "first")
    try:
        info = _broker(etcd, cluster, 1)
        assert info == {
            "node_id": 1,
            "host": "127.0.0.1",
            "grpc_port": first.info["grpc_port"],
            "fetch_port": first.info["fetch_port"],
            "rack": "r1",
        }
        with pytest.raises(ServiceStartError) as refused:
            _start(tmp_path, etcd, cluster, "second")
        assert "already registered" in str(refused.value)
        # The first node's registration is untouched by the refused one.
        assert _broker(etcd, cluster, 1)["grpc_port"] == first.info["grpc_port"]
    finally:
        assert first.stop() == 0
    # SIGTERM revokes the lease: the key is gone at once, not after the TTL.
    assert _broker(etcd, cluster, 1) is None


def test_kill_9_registration_expires_with_the_lease(tmp_path, etcd):
    cluster = f"reg-{uuid.uuid4().hex[:8]}"
    node = _start(tmp_path, etcd, cluster, "killed", node_id=2, ttl=2)
    assert _broker(etcd, cluster, 2) is not None
    killed_at = time.monotonic()
    node.kill()
    wait_until(lambda: _broker(etcd, cluster, 2) is None, timeout=6, interval=0.1)
    assert time.monotonic() - killed_at < 5
    node = _start(tmp_path, etcd, cluster, "killed-again", node_id=2, ttl=2)
    node.kill()
    # Restarted at once, the node waits out its previous registration's lease instead of
    # refusing to start, then registers afresh.
    restarted_at = time.monotonic()
    again = _start(tmp_path, etcd, cluster, "again", node_id=2)
    assert time.monotonic() - restarted_at < 8
    try:
        assert _broker(etcd, cluster, 2)["grpc_port"] == again.info["grpc_port"]
    finally:
        again.stop()


def test_an_etcd_outage_is_logged_once_then_counted_not_every_retry(tmp_path, etcd_factory):
    """Issue item 8: the node wrote a warning per 0.5 s retry for as long as etcd was down."""
    etcd = etcd_factory()
    cluster = f"reg-{uuid.uuid4().hex[:8]}"
    node = _start(tmp_path, etcd, cluster, "outage", node_id=3, ttl=2)
    channel = grpc.insecure_channel(f"127.0.0.1:{node.info['grpc_port']}")
    stub = storage_grpc.StorageNodeStub(channel)
    try:
        stub.CreatePartition(pb.CreatePartitionRequest(topic="during", partition=0), timeout=5)
        logged_before = len(node.log_file.read_text().splitlines())
        etcd.kill()
        down_until = time.monotonic() + 6  # 3 TTLs: the lease is lost and re-registering retries
        while time.monotonic() < down_until:  # the node keeps serving meanwhile
            started = time.monotonic()
            stub.DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=5)
            assert time.monotonic() - started < 1.0
            time.sleep(0.2)
        etcd.start()
        wait_until(
            lambda: any("registered as brokers/3" in line for line in _lines_since(node, logged_before)),
            timeout=20,
            interval=0.1,
        )
        assert _broker(etcd, cluster, 3)["grpc_port"] == node.info["grpc_port"]
    finally:
        channel.close()
        node.stop()
    outage = [line for line in _lines_since(node, logged_before) if "etcd not reachable" in line]
    # One line when it started, one with the count when it ended: not one per retry (~16 of them).
    assert len(outage) == 2, outage
    (summary,) = [line for line in outage if "more in the last" in line]
    assert int(summary.rsplit("(", 1)[1].split()[0]) >= 8


def _lines_since(node, first: int) -> list[str]:
    return node.log_file.read_text().splitlines()[first:]
