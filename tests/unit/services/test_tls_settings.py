"""TLS settings, the clients' and the services' internal (member) TLS: contradictions, half
configurations and missing files are refused, never ignored."""

import dataclasses

import pytest

from coordinator import main as coordinator_main
from coordinator.config import CoordinatorConfig
from gateway.client.client import client_tls
from gateway.client.consumer import ConsumerConfig
from gateway.client.producer import ProducerConfig
from gateway.server import main as gateway_main
from gateway.server.config import GatewayConfig
from services.config import ConfigError
from services.tls import ClientTls, MemberTls, member_tls, member_tls_problem, server_tls_problem
from storage_node import main as storage_main
from storage_node.config import StorageNodeConfig
from tests.support.certificates import new_ca, new_certificate


def test_plaintext_needs_no_files_and_refuses_them(tmp_path):
    assert client_tls("PLAINTEXT", None, None, None) is None
    with pytest.raises(ValueError, match="need security_protocol='SSL'"):
        client_tls("PLAINTEXT", str(tmp_path / "ca.pem"), None, None)
    with pytest.raises(ValueError, match="security_protocol must be one of"):
        client_tls("KERBEROS", None, None, None)
    with pytest.raises(ValueError, match="SASL_PLAINTEXT' is not supported: a bearer token sent without TLS"):
        client_tls("SASL_PLAINTEXT", None, None, None)


def test_ssl_checks_its_files(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    assert client_tls("ssl", str(ca), None, None) == ClientTls(ca, None, None)
    assert client_tls("SSL", None, None, None) == ClientTls()  # the system's roots
    with pytest.raises(ValueError, match="does not exist"):
        client_tls("SSL", str(tmp_path / "missing.pem"), None, None)
    with pytest.raises(ValueError, match="go together"):
        client_tls("SSL", str(ca), str(ca), None)


def test_producer_and_consumer_refuse_contradicting_settings(tmp_path):
    with pytest.raises(ValueError):
        ProducerConfig.from_kwargs({"ssl_cafile": str(tmp_path / "ca.pem")})
    with pytest.raises(ValueError):
        ConsumerConfig.from_kwargs({"security_protocol": "TLS"})


def test_server_settings(tmp_path):
    assert server_tls_problem(None, None, None) is None
    assert "both" in (server_tls_problem(tmp_path / "c.pem", None, None) or "")
    assert "needs the server's own" in (server_tls_problem(None, None, tmp_path / "ca.pem") or "")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    assert "TLS certificate" in (server_tls_problem(bad, bad, None) or "")


def _member_files(tmp_path):
    ca = new_ca(tmp_path, "cluster-ca")
    cert, key = new_certificate(tmp_path, "cluster-ca", "storage-0")
    return cert, key, ca


def test_internal_tls_is_all_three_files_or_none(tmp_path):
    cert, key, ca = _member_files(tmp_path)
    assert member_tls(StorageNodeConfig()) is None
    full = StorageNodeConfig(internal_tls_cert_file=cert, internal_tls_key_file=key, internal_tls_ca_file=ca)
    assert member_tls(full) == MemberTls(cert, key, ca, require_client_cert=True)
    assert member_tls(full).server.client_ca_file == ca  # mutual TLS on its ports
    assert member_tls(
        GatewayConfig(internal_tls_cert_file=cert, internal_tls_key_file=key, internal_tls_ca_file=ca)
    )
    for half in (
        {"internal_tls_cert_file": cert},
        {"internal_tls_cert_file": cert, "internal_tls_key_file": key},
        {"internal_tls_ca_file": ca},
    ):
        problem = member_tls_problem(CoordinatorConfig(**half))
        assert problem is not None and "together" in problem
        with pytest.raises(ConfigError, match="together"):
            member_tls(CoordinatorConfig(**half))
    assert "does not exist" in (
        member_tls_problem(
            StorageNodeConfig(
                internal_tls_cert_file=cert,
                internal_tls_key_file=key,
                internal_tls_ca_file=tmp_path / "no.pem",
            )
        )
        or ""
    )
    other_key = new_certificate(tmp_path, "cluster-ca", "other")[1]
    mismatched = StorageNodeConfig(
        internal_tls_cert_file=cert, internal_tls_key_file=other_key, internal_tls_ca_file=ca
    )
    assert "TLS certificate" in (member_tls_problem(mismatched) or "")
    not_a_ca = tmp_path / "garbage.pem"
    not_a_ca.write_text("garbage")
    assert "CA file" in (
        member_tls_problem(
            StorageNodeConfig(
                internal_tls_cert_file=cert, internal_tls_key_file=key, internal_tls_ca_file=not_a_ca
            )
        )
        or ""
    )
    # Turning client certificates off means nothing without internal TLS: refused, not ignored.
    assert "needs internal TLS" in (
        member_tls_problem(StorageNodeConfig(internal_tls_require_client_cert=False)) or ""
    )
    relaxed = member_tls(dataclasses.replace(full, internal_tls_require_client_cert=False))
    assert relaxed is not None and relaxed.server.client_ca_file is None


@pytest.mark.parametrize(
    "main",
    [storage_main.main, coordinator_main.main, gateway_main.main],
    ids=["storage", "coordinator", "gateway"],
)
def test_a_half_configured_internal_tls_stops_the_service_at_start(main, tmp_path, capsys):
    cert, _, _ = _member_files(tmp_path)
    assert main(["--internal-tls-cert-file", str(cert)]) == 2
    error = capsys.readouterr().err
    assert "--internal-tls-key-file" in error and "--internal-tls-ca-file" in error
