"""TLS settings: contradictions and missing files are refused, never ignored."""

import pytest

from gateway.client.client import client_tls
from gateway.client.consumer import ConsumerConfig
from gateway.client.producer import ProducerConfig
from services.tls import ClientTls, server_tls_problem


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
