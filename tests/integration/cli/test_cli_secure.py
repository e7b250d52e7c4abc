"""``tributary cluster up --secure``: one command for a local cluster with mutual TLS on its
gateway and between its processes -- CAs and certificates made in ``DIR/tls`` -- which the CLI
then uses by itself (from cluster.json), while a plaintext client is refused."""

from __future__ import annotations

import stat

import grpc
import pytest

from gateway.client import Admin
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster, read_cluster_file, read_launch_file
from services.proto import pb, storage_grpc
from tests.integration.cli.test_cli import ok, tributary


@pytest.fixture
def secure_dir(tmp_path):
    directory = tmp_path / "secure-cluster"
    try:
        ok(tributary(directory, "cluster", "up", "--secure"))
        yield directory
    finally:
        tributary(directory, "cluster", "down")
        LocalCluster.from_data_dir(directory).stop()


def test_a_secure_local_cluster_is_one_command(secure_dir):
    described = read_cluster_file(secure_dir)
    tls = described["tls"]
    assert tls["security_protocol"] == "SSL"
    assert stat.S_IMODE((secure_dir / "tls" / "admin.key").stat().st_mode) == 0o600
    assert read_launch_file(secure_dir)["spec"]["secure"] is True

    ok(tributary(secure_dir, "topics", "create", "vault", "--partitions", "2"))
    ok(tributary(secure_dir, "produce", "vault", stdin="a\nb\nc\n"))
    consumed = ok(
        tributary(
            secure_dir, "consume", "vault", "--from-beginning", "--max-messages", "3", "--timeout-ms", "20000"
        )
    ).stdout.split()
    assert sorted(consumed) == ["a", "b", "c"]
    status = ok(tributary(secure_dir, "cluster", "status")).stdout
    assert "under-replicated 0" in status

    # Mutual TLS inside: the storage node's port takes the CLI's member certificate (top asks it
    # directly) and nobody without one.
    assert "internal_tls" in described
    screen = ok(tributary(secure_dir, "top", "--iterations", "1")).stdout
    assert "unreachable" not in screen
    node = described["storage_nodes"]["0"]
    with (
        grpc.insecure_channel(f"127.0.0.1:{node['grpc_port']}") as plain_channel,
        pytest.raises(grpc.RpcError),
    ):
        storage_grpc.StorageNodeStub(plain_channel).DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=3)

    with (
        pytest.raises(TributaryError),
        Admin(servers=described["gateway"], request_timeout_ms=3_000) as plain,
    ):
        plain.list_topics()
    with Admin(servers=described["gateway"], **tls) as admin:
        assert "vault" in admin.list_topics()

    # A later `up` keeps the cluster secure and its certificates.
    ca = (secure_dir / "tls" / "ca.pem").read_bytes()
    ok(tributary(secure_dir, "cluster", "up"))
    assert (secure_dir / "tls" / "ca.pem").read_bytes() == ca
    assert read_cluster_file(secure_dir)["tls"] == tls
