"""TLS with client-certificate authentication against a real etcd (certificates made by openssl)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from services.etcd import EmbeddedEtcd, EmbeddedTls, EtcdClient, EtcdUnavailableError, TlsConfig

from ._support import run, take


def _openssl(*args: str, cwd: Path) -> None:
    # openssl is part of the test machine (as for tests/integration/gateway/test_tls.py): its
    # absence fails these tests rather than skipping them.
    assert shutil.which("openssl") is not None, "the openssl command is needed to make test certificates"
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certificates(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (P-256, 1 day)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=tributary-test-ca",
        cwd=folder,
    )
    (folder / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            *ec,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=tributary-{name}",
            cwd=folder,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            cwd=folder,
        )


def test_tls_with_client_certificates(tmp_path: Path, etcd_factory: Callable[..., EmbeddedEtcd]) -> None:
    _make_certificates(tmp_path)
    server = etcd_factory(
        tls=EmbeddedTls(tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt")
    )
    good = TlsConfig(
        ca_file=tmp_path / "ca.crt", cert_file=tmp_path / "client.crt", key_file=tmp_path / "client.key"
    )

    async def scenario() -> None:
        async with EtcdClient(server.endpoint, tls=good, timeout=2.0) as client:
            watch = await client.watch_prefix("brokers/")
            await client.put("brokers/1", "secure")
            assert (await client.get("brokers/1")).value == b"secure"  # type: ignore[union-attr]
            assert (await take(watch, 1))[0].kv.value == b"secure"
            await watch.cancel()
        for tls in (None, TlsConfig(ca_file=tmp_path / "ca.crt")):  # plaintext; TLS without a client cert
            async with EtcdClient(server.endpoint, tls=tls, timeout=2.0) as client:
                with pytest.raises(EtcdUnavailableError):
                    await client.get("brokers/1")

    run(scenario())


def test_storage_node_registers_over_tls(tmp_path: Path, etcd_factory: Callable[..., EmbeddedEtcd]) -> None:
    """A real storage node process given the etcd TLS settings registers itself (with a client
    certificate that etcd requires), and the registration is readable over TLS."""
    from launcher.processes import start_service
    from services.cluster_keys import cluster_prefix

    _make_certificates(tmp_path)
    server = etcd_factory(
        tls=EmbeddedTls(tmp_path / "server.crt", tmp_path / "server.key", tmp_path / "ca.crt")
    )
    tls = TlsConfig(
        ca_file=tmp_path / "ca.crt", cert_file=tmp_path / "client.crt", key_file=tmp_path / "client.key"
    )
    node = start_service(
        "tls-node",
        "storage_node.main",
        [
            "--node-id",
            "7",
            "--log-dirs",
            str(tmp_path / "data"),
            "--cluster",
            "tls",
            "--etcd-endpoints",
            server.endpoint,
            "--etcd-ca-file",
            str(tls.ca_file),
            "--etcd-cert-file",
            str(tls.cert_file),
            "--etcd-key-file",
            str(tls.key_file),
        ],
        tmp_path / "run",
    )

    async def registration() -> bytes | None:
        async with EtcdClient(server.endpoint, prefix=cluster_prefix("tls"), tls=tls, timeout=2.0) as client:
            kv = await client.get("brokers/7")
            return kv.value if kv else None

    try:
        value = run(registration())
        assert value is not None and b'"grpc_port": %d' % node.info["grpc_port"] in value
    finally:
        assert node.stop() == 0
    assert run(registration()) is None  # SIGTERM revoked the lease over the same TLS connection
