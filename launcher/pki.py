"""The local cluster's certificates (``tributary cluster up --secure``): a CA of its own, a
certificate for the gateways (127.0.0.1 and localhost) and one for the cluster's admin client,
made once in ``<data dir>/tls/`` and reused on every later ``cluster up``.

Made with ``cryptography``: ECDSA P-256 keys, SHA-256 signatures, a year of validity. Keys are
written readable by their owner only. This is for a cluster on one machine; a real deployment
brings certificates from its own CA (see the README's security section).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 365


@dataclass(frozen=True, slots=True)
class LocalPki:
    """Where the files are."""

    ca_file: Path
    gateway_cert: Path
    gateway_key: Path
    client_cert: Path
    client_key: Path

    def client_settings(self) -> dict[str, str]:
        """The SDK / CLI settings of the admin client."""
        return {
            "security_protocol": "SSL",
            "ssl_cafile": str(self.ca_file),
            "ssl_certfile": str(self.client_cert),
            "ssl_keyfile": str(self.client_key),
        }


def local_pki(directory: Path) -> LocalPki:
    """The certificates in ``directory``, made first if they are not all there."""
    pki = LocalPki(
        directory / "ca.pem",
        directory / "gateway.pem",
        directory / "gateway.key",
        directory / "admin.pem",
        directory / "admin.key",
    )
    if all(
        p.is_file() for p in (pki.ca_file, pki.gateway_cert, pki.gateway_key, pki.client_cert, pki.client_key)
    ):
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    _make(pki)
    return pki


def _make(pki: LocalPki) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tributary local cluster"),
                x509.NameAttribute(NameOID.COMMON_NAME, common),
            ]
        )

    def write_key(key, path: Path) -> None:
        data = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("Tributary local CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def issue(common: str, usage, san: list | None) -> tuple:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    gateway_key, gateway = issue(
        "gateway",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")],
    )
    client_key, client = issue("admin", ExtendedKeyUsageOID.CLIENT_AUTH, None)
    pem = serialization.Encoding.PEM
    pki.ca_file.write_bytes(ca.public_bytes(pem))
    pki.gateway_cert.write_bytes(gateway.public_bytes(pem))
    write_key(gateway_key, pki.gateway_key)
    pki.client_cert.write_bytes(client.public_bytes(pem))
    write_key(client_key, pki.client_key)
