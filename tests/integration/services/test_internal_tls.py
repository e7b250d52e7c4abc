"""Mutual TLS on the internal ports (issue 16, item 1), with real processes: one local cluster
made by ``LocalClusterSpec(secure=True)`` -- what ``tributary cluster up --secure`` starts --
shared by every test here (three storage nodes, a coordinator, a gateway).

* Produce (acks=all, replication factor 3) and consume work through it, and every internal
  link on the way runs TLS: the nodes count handshakes on their fetch/data ports (the gateway's
  appends and fetches, the followers' replication).
* Without a member certificate of the cluster CA -- plaintext, TLS without a certificate, or a
  certificate of the client CA that the gateway trusts -- nobody gets through a storage node's
  gRPC port, its fetch port or its data port, nor the coordinator's port: the handshake fails,
  nothing is served, nothing is written.
* Rotation: a storage node's member certificate replaced on disk is what new connections to its
  gRPC and fetch ports get, while the cluster keeps working.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from launcher.pki import LocalPki
from services.acks import Acks
from services.fetchport import append as append_frames
from services.fetchport import protocol
from services.proto import coordinator_grpc, pb, storage_grpc
from services.records import RecordBatchBuilder
from services.tls import ClientTls, client_ssl_context, grpc_channel_credentials
from tests.support.certificates import der
from tests.support.wait import wait_until

NODES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    spec = LocalClusterSpec(storage_nodes=NODES, coordinators=1, gateways=1, session_timeout_s=3, secure=True)
    with LocalCluster(tmp_path_factory.mktemp("secure-cluster"), spec) as local:
        yield local


@pytest.fixture(scope="module")
def pki(cluster) -> LocalPki:
    assert cluster.pki is not None
    return cluster.pki


@pytest.fixture(scope="module")
def topic(cluster, pki) -> str:
    name = f"vault-{uuid.uuid4().hex[:6]}"
    with Admin(servers=cluster.gateway, **pki.client_settings()) as admin:
        admin.create_topics([NewTopic(name, NODES, NODES)])  # each node leads one partition
        wait_until(
            lambda: all(len(p.isr) == NODES for p in admin.describe_topics([name])[0].partitions),
            timeout=20,
            what="every replica in sync",
        )
    return name


def operator(pki: LocalPki) -> ClientTls:
    """The CLI's member certificate (a member of the cluster CA)."""
    settings = pki.operator_settings()
    return ClientTls(
        Path(settings["ssl_cafile"]), Path(settings["ssl_certfile"]), Path(settings["ssl_keyfile"])
    )


def outsiders(pki: LocalPki) -> dict[str, ClientTls | None]:
    """Clients without a member certificate, all trusting the cluster CA (so a refusal is about
    them, not about the server): plaintext, TLS without a certificate, TLS with the admin's
    certificate of the client CA (good at the gateway, not inside)."""
    return {
        "plaintext": None,
        "no certificate": ClientTls(pki.cluster_ca_file),
        "client-CA certificate": ClientTls(pki.cluster_ca_file, pki.client_cert, pki.client_key),
    }


def node_address(cluster: LocalCluster, node_id: int, port: str) -> tuple[str, int]:
    info = cluster.storage_nodes[node_id].info
    return info["host"], int(info[port])


def node_stub(
    cluster: LocalCluster, node_id: int, tls: ClientTls | None
) -> tuple[grpc.Channel, storage_grpc.StorageNodeStub]:
    host, port = node_address(cluster, node_id, "grpc_port")
    target = f"{host}:{port}"
    channel = (
        grpc.secure_channel(target, grpc_channel_credentials(tls))
        if tls is not None
        else grpc.insecure_channel(target)
    )
    return channel, storage_grpc.StorageNodeStub(channel)


def traffic(cluster: LocalCluster, pki: LocalPki, node_id: int) -> pb.NodeTraffic:
    channel, stub = node_stub(cluster, node_id, operator(pki))
    with channel:
        return stub.DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=5).traffic


def log_end(cluster: LocalCluster, pki: LocalPki, node_id: int, topic: str, partition: int = 0) -> int:
    channel, stub = node_stub(cluster, node_id, operator(pki))
    request = pb.DescribePartitionsRequest(partitions=[pb.TopicPartition(topic=topic, partition=partition)])
    with channel:
        return stub.DescribePartitions(request, timeout=5).partitions[0].log_end_offset


def leader_of(cluster: LocalCluster, pki: LocalPki, topic: str) -> int:
    settings: dict[str, Any] = pki.client_settings()
    with Admin(servers=cluster.gateway, **settings) as admin:
        return admin.describe_topics([topic])[0].partitions[0].leader


def raw_exchange(address: tuple[str, int], tls: ClientTls | None, request: bytes) -> bytes:
    """Send ``request`` on a raw connection (TLS with ``tls``) and return what comes back before
    the server closes (b"" also when TLS refused us: the refusal is the handshake's)."""
    with socket.create_connection(address, timeout=10) as raw:
        sock: socket.socket = raw
        try:
            if tls is not None:
                sock = client_ssl_context(tls).wrap_socket(raw, server_hostname=address[0])
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer
        except (ssl.SSLError, ConnectionError):
            return b""


def test_produce_and_consume_run_through_mutual_tls_on_every_internal_link(cluster, pki, topic):
    settings = pki.client_settings()
    values = {p: [b"secret-%d-%d" % (p, i) for i in range(100)] for p in range(NODES)}
    with Producer(servers=cluster.gateway, acks="all", **settings) as producer:
        sent = {p: [producer.send(topic, v, partition=p) for v in vs] for p, vs in values.items()}
        producer.flush(30)
        for futures in sent.values():
            assert [future.get(10).offset for future in futures] == list(range(100))
    with Consumer(servers=cluster.gateway, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(NODES)])
        got: dict[int, list[bytes]] = {p: [] for p in range(NODES)}
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < 300 and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend(r.value for r in records)
    assert got == values
    # acks=all came back, so every replica has the records: the followers copied them.
    for p in range(NODES):
        assert all(log_end(cluster, pki, n, topic, p) == 100 for n in range(NODES))
    # ... over TLS, as did the gateway's appends and fetches: every node, leader of a partition
    # and follower of two, shook hands on its fetch/data port.
    assert all(traffic(cluster, pki, n).fetch_tls_handshakes >= 1 for n in range(NODES))


def test_no_internal_port_lets_in_a_client_without_a_member_certificate(cluster, pki, topic):
    leader = leader_of(cluster, pki, topic)
    end = log_end(cluster, pki, leader, topic)
    coordinator = f"127.0.0.1:{cluster.coordinators[0].info['grpc_port']}"
    start = traffic(cluster, pki, leader)

    for name, tls in outsiders(pki).items():
        # The storage node's gRPC port and the coordinator's.
        channel, stub = node_stub(cluster, leader, tls)
        with channel, pytest.raises(grpc.RpcError) as refused:
            stub.DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name
        credentials = grpc_channel_credentials(tls) if tls is not None else None
        to_coordinator = (
            grpc.secure_channel(coordinator, credentials)
            if credentials
            else grpc.insecure_channel(coordinator)
        )
        with to_coordinator, pytest.raises(grpc.RpcError) as refused:
            coordinator_grpc.CoordinatorStub(to_coordinator).GetMetadata(pb.GetMetadataRequest(), timeout=3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name

        # The fetch port: a fetch of the partition gets no answer frame.
        fetch = protocol.encode_request(protocol.FetchRequest(7, topic, 0, 0, 1 << 20))
        answer = raw_exchange(node_address(cluster, leader, "fetch_port"), tls, fetch)
        assert b"secret" not in answer and not _is_fetch_answer(answer), name

        # The data port: an append is not written.
        batch = RecordBatchBuilder()
        batch.append(b"intruder", timestamp=int(time.time() * 1000))
        append = append_frames.encode_request(
            append_frames.AppendRequest(
                9, Acks.LEADER, 5_000, (append_frames.PartitionAppend(topic, 0, batch.build()),)
            )
        )
        answer = raw_exchange(node_address(cluster, leader, "fetch_port"), tls, append)
        assert not _is_append_answer(answer), name

    # Every raw attempt (three clients, a fetch and an append each) failed at the handshake.
    after = wait_until(
        lambda: (
            (t := traffic(cluster, pki, leader)).fetch_tls_handshake_failures
            - start.fetch_tls_handshake_failures
            == 6
            and t
        ),
        timeout=10,
        what="six refused handshakes",
    )
    assert log_end(cluster, pki, leader, topic) == end, "nothing was written"
    assert after.data_port_appends == start.data_port_appends, "no append was taken"


def _is_fetch_answer(answer: bytes) -> bool:
    """Whether ``answer`` starts with a fetch response frame (size, correlation id 7)."""
    return len(answer) >= 8 and struct.unpack_from(">i", answer, 4)[0] == 7


def _is_append_answer(answer: bytes) -> bool:
    return len(answer) >= 8 and struct.unpack_from(">i", answer, 4)[0] in (
        9,
        append_frames.CONNECTION_ERROR_ID,
    )


def served_certificate(address: tuple[str, int], pki: LocalPki, *, alpn: str | None) -> bytes:
    """The DER certificate a member's TLS handshake with ``address`` gets."""
    context = client_ssl_context(operator(pki))
    if alpn:
        context.set_alpn_protocols([alpn])
    with (
        socket.create_connection(address, timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=address[0]) as wrapped,
    ):
        certificate = wrapped.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def test_a_rotated_member_certificate_is_served_to_new_connections(cluster, pki, topic):
    node = leader_of(cluster, pki, topic)
    name = f"storage-{node}"
    cert_file, _ = pki.member(name)
    grpc_address = node_address(cluster, node, "grpc_port")
    fetch_address = node_address(cluster, node, "fetch_port")
    old = der(cert_file)
    assert served_certificate(grpc_address, pki, alpn="h2") == old
    assert served_certificate(fetch_address, pki, alpn=None) == old
    settings = pki.client_settings()
    with Producer(servers=cluster.gateway, acks="all", **settings) as early:
        early.send(topic, b"before", partition=0).get(30)
        pki.renew_member(name)
        new = der(cert_file)
        assert new != old
        wait_until(
            lambda: served_certificate(grpc_address, pki, alpn="h2") == new,
            timeout=10,
            what="the gRPC port serving the new certificate",
        )
        wait_until(
            lambda: served_certificate(fetch_address, pki, alpn=None) == new,
            timeout=10,
            what="the fetch port serving the new certificate",
        )
        # The links opened before keep working (acks=all: the followers still copy).
        assert early.send(topic, b"after", partition=0).get(30).offset >= 1
