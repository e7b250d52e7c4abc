"""TLS on the gateway's public ports (issue 16, first slice), with real processes: certificates
made by ``openssl`` for a CA, the gateway (127.0.0.1), a client, and a client of another CA.

* The SDK produces and reads back over TLS with mutual TLS, on the raw data path and on gRPC.
* A plaintext client, a client without a certificate, and one whose certificate another CA
  signed are all refused; so is a plaintext handshake on the raw data listener.
* Rotation: new certificate files are picked up by new connections (gRPC at the next handshake,
  the data listener within its reload period), while a producer connected before keeps working.
* The CLI talks TLS with ``--ssl-cafile/--ssl-certfile/--ssl-keyfile``.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.dataport import protocol as dp
from spark_jobs.cluster import ClusterView
from spark_jobs.group_offsets import GroupOffsets
from spark_jobs.offsets import OffsetRange
from spark_jobs.options import ReadOptions
from spark_jobs.range_reader import RangeReadSettings, read_range
from tests.support.wait import wait_until

TOPIC = "secret"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=directory,
    )  # fmt: skip


def make_cert(directory: Path, ca: str, name: str, *, server: bool, serial: int) -> None:
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", cwd=directory)  # fmt: skip
    extensions = directory / f"{name}.ext"
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        if server
        else "extendedKeyUsage=clientAuth\n"
    )
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-set_serial", str(serial), "-days", "2", "-extfile", extensions.name, "-out", f"{name}.pem",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture
def certs(tmp_path):
    directory = tmp_path / "certs"
    directory.mkdir()
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    make_cert(directory, "ca", "gateway", server=True, serial=1)
    make_cert(directory, "ca", "client", server=False, serial=2)
    make_cert(directory, "other-ca", "stranger", server=False, serial=3)
    return directory


def gateway_tls_args(certs: Path) -> list[str]:
    """The gateway's mutual-TLS flags for the certificates ``make_cert`` wrote."""
    return [
        "--tls-cert-file", str(certs / "gateway.pem"),
        "--tls-key-file", str(certs / "gateway.key"),
        "--tls-client-ca-file", str(certs / "ca.pem"),
    ]  # fmt: skip


def client_tls_settings(certs: Path, client: str = "client") -> dict[str, str]:
    """The SDK's settings for ``client``'s certificate."""
    return {
        "security_protocol": "SSL",
        "ssl_cafile": str(certs / "ca.pem"),
        "ssl_certfile": str(certs / f"{client}.pem"),
        "ssl_keyfile": str(certs / f"{client}.key"),
    }


@pytest.fixture
def cluster(tmp_path, certs):
    spec = LocalClusterSpec(
        storage_nodes=1,
        coordinators=1,
        gateways=1,
        gateway_args=gateway_tls_args(certs),
    )
    with LocalCluster(tmp_path / "cluster", spec) as local:
        yield local


tls_settings = client_tls_settings


def served_certificate(address: str, certs: Path, *, alpn: str | None) -> bytes:
    """The DER certificate a TLS handshake with ``address`` gets (as the client)."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(certs / "client.pem", certs / "client.key")
    if alpn:
        context.set_alpn_protocols([alpn])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as wrapped,
    ):
        certificate = wrapped.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def refused(**settings) -> bool:
    """Whether an Admin with these settings fails to list topics (quickly)."""
    try:
        with Admin(request_timeout_ms=3_000, **settings) as admin:
            admin.list_topics()
    except (TributaryError, OSError):
        return True
    return False


def test_tls_clients_work_and_others_are_refused_and_certificates_rotate(cluster, certs):
    settings = tls_settings(certs)
    with Admin(servers=cluster.gateway, **settings) as admin:
        admin.create_topics([NewTopic(TOPIC, 2)])
        metadata = admin.metadata()[0]
    assert metadata.brokers, "metadata over TLS"

    sent = {path: [f"{path}-{i}".encode() for i in range(50)] for path in ("auto", "grpc")}
    for path, values in sent.items():
        with Producer(servers=cluster.gateway, data_path=path, acks=1, **settings) as producer:
            for value in values:
                producer.send(TOPIC, value, partition=0)
            producer.flush(30)
    for path in ("auto", "grpc"):
        with Consumer(
            servers=cluster.gateway, data_path=path, auto_offset_reset="earliest", **settings
        ) as consumer:
            consumer.assign([TopicPartition(TOPIC, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < 100 and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    got.extend(r.value for r in records)
        assert got == sent["auto"] + sent["grpc"], f"read back over TLS ({path})"

    # The Spark source's planning and its tasks' reads, with the TLS options.
    options = ReadOptions.parse(
        {"subscribe": TOPIC, **{k.replace("_", "."): v for k, v in settings.items()}}, streaming=False
    )
    with ClusterView(cluster.gateway, security=options.security) as view:
        ends = view.offsets([TopicPartition(TOPIC, 0)], "latest")
    assert ends[TopicPartition(TOPIC, 0)] == 100
    read = read_range(
        OffsetRange(TOPIC, 0, 0, 100), RangeReadSettings(cluster.gateway, security=options.security)
    )
    assert [bytes(v) for batch in read for v in batch.column("value").to_pylist()] == sent["auto"] + sent[
        "grpc"
    ]

    # The loader's group-offset mirror, with the same options.
    with GroupOffsets(cluster.gateway, "tls-loader", security=options.security) as group:
        assert group.commit({TopicPartition(TOPIC, 0): 100}, metadata="batch 1") is True
        assert group.fetch([TopicPartition(TOPIC, 0)]) == {TopicPartition(TOPIC, 0): 100}

    # Refused: plaintext, no client certificate, a certificate of another CA.
    assert refused(servers=cluster.gateway)
    assert refused(servers=cluster.gateway, security_protocol="SSL", ssl_cafile=str(certs / "ca.pem"))
    assert refused(servers=cluster.gateway, **tls_settings(certs, "stranger"))
    data_address = cluster.gateways[0].info["data_port"]
    with socket.create_connection(("127.0.0.1", data_address), timeout=5) as plain:
        plain.sendall(dp.encode_handshake(dp.Handshake(dp.MIN_VERSION, dp.MAX_VERSION, "plain")))
        plain.settimeout(5)
        try:
            answer = plain.recv(64)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    assert dp.MAGIC.to_bytes(4, "big") not in answer, "a plaintext handshake must get no answer"

    # Rotation: new files, new connections get the new certificate; a producer connected before
    # keeps producing.
    early = Producer(servers=cluster.gateway, acks=1, **settings)
    early.send(TOPIC, b"before", partition=1).get(30)
    old_certificate = der(certs / "gateway.pem")
    assert served_certificate(cluster.gateway, certs, alpn="h2") == old_certificate
    make_cert(certs, "ca", "gateway", server=True, serial=99)
    new_certificate = der(certs / "gateway.pem")
    assert new_certificate != old_certificate
    wait_until(
        lambda: served_certificate(cluster.gateway, certs, alpn="h2") == new_certificate,
        timeout=10,
        what="gRPC serving the new certificate",
    )
    wait_until(
        lambda: served_certificate(f"127.0.0.1:{data_address}", certs, alpn=None) == new_certificate,
        timeout=15,
        what="the data listener serving the new certificate",
    )
    assert early.send(TOPIC, b"after", partition=1).get(30).offset >= 1
    early.close()

    # The CLI with the TLS options (and without: the gateway does not answer plaintext).
    cli = [sys.executable, "-m", "gateway.cli.main", "topics", "list", "--gateway", cluster.gateway]
    files = ["--ssl-cafile", settings["ssl_cafile"], "--ssl-certfile", settings["ssl_certfile"],
             "--ssl-keyfile", settings["ssl_keyfile"]]  # fmt: skip
    listed = subprocess.run([*cli, *files], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and TOPIC in listed.stdout.split(), listed.stderr
    plain_cli = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert plain_cli.returncode != 0 and "cannot reach" in plain_cli.stderr
