"""The local cluster's certificates (``tributary cluster up --secure``), made in ``<data dir>/tls/``
and reused on every later ``cluster up``. Two CAs, for two kinds of trust:

* the **client CA** (``ca.pem``) signs the gateways' certificate (127.0.0.1 and localhost) and the
  admin client's; applications verify the gateways with it and the gateways take clients it
  signed (mutual TLS on the public ports, the principal from the certificate's subject);
* the **cluster CA** (``cluster-ca.pem``) signs the *member certificates*
  (``members/<process>.pem``): one per coordinator, storage node and gateway, each valid as
  server and as client, presented on and to the internal ports (mutual TLS between members). An
  internal port authorizes nothing, so it must not accept what the client CA signs: an
  application holding a client certificate would otherwise read partitions straight off a
  storage node. The CLI gets a member certificate of its own (``members/operator.pem``) for the
  admin paths that ask storage nodes directly (``topics describe``, ``top``).

Member certificates are made when a process first needs one, so the cluster CA's key stays in
the folder (``cluster-ca.key``, owner-only like every key): on one machine that is what lets a
later ``cluster up`` add a storage node. A real deployment keeps its CA keys elsewhere and brings
the files (see the README's security section).

Made with ``cryptography``: ECDSA P-256 keys, SHA-256 signatures, a year of validity.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

VALID_DAYS = 365
#: The member certificate the CLI presents to storage nodes and coordinators.
OPERATOR = "operator"
ORGANIZATION = "Tributary local cluster"


@dataclass(frozen=True, slots=True)
class LocalPki:
    """Where the files are."""

    ca_file: Path
    gateway_cert: Path
    gateway_key: Path
    client_cert: Path
    client_key: Path
    cluster_ca_file: Path
    cluster_ca_key: Path

    @property
    def members_dir(self) -> Path:
        return self.cluster_ca_file.parent / "members"

    def client_settings(self) -> dict[str, str]:
        """The SDK / CLI settings of the admin client."""
        return {
            "security_protocol": "SSL",
            "ssl_cafile": str(self.ca_file),
            "ssl_certfile": str(self.client_cert),
            "ssl_keyfile": str(self.client_key),
        }

    def member(self, name: str) -> tuple[Path, Path]:
        """The member certificate and key of process ``name`` (made on first use)."""
        cert, key = self.members_dir / f"{name}.pem", self.members_dir / f"{name}.key"
        if not (cert.is_file() and key.is_file()):
            self.renew_member(name)
        return cert, key

    def renew_member(self, name: str) -> tuple[Path, Path]:
        """A new certificate and key for member ``name`` (a new serial number), replacing the
        files in place: the process's listeners pick them up for new connections."""
        cert, key = self.members_dir / f"{name}.pem", self.members_dir / f"{name}.key"
        self.members_dir.mkdir(parents=True, exist_ok=True)
        ca_key, ca = load_ca(self.cluster_ca_file, self.cluster_ca_key)
        member_key, member = issue_certificate(ca_key, ca, name, server=True, client=True)
        write_key(member_key, key)
        write_certificate(member, cert)
        return cert, key

    def member_args(self, name: str) -> list[str]:
        """A service's flags for mutual TLS on its internal connections, as member ``name``."""
        cert, key = self.member(name)
        return [
            "--internal-tls-cert-file",
            str(cert),
            "--internal-tls-key-file",
            str(key),
            "--internal-tls-ca-file",
            str(self.cluster_ca_file),
        ]

    def operator_settings(self) -> dict[str, str]:
        """The CLI's TLS to storage nodes and coordinators: the operator's member certificate."""
        cert, key = self.member(OPERATOR)
        return {"ssl_cafile": str(self.cluster_ca_file), "ssl_certfile": str(cert), "ssl_keyfile": str(key)}


def local_pki(directory: Path) -> LocalPki:
    """The certificates in ``directory``, each set made first if it is not all there (a folder
    from before the cluster CA existed keeps its client CA and gets a cluster CA beside it)."""
    pki = LocalPki(
        directory / "ca.pem",
        directory / "gateway.pem",
        directory / "gateway.key",
        directory / "admin.pem",
        directory / "admin.key",
        directory / "cluster-ca.pem",
        directory / "cluster-ca.key",
    )
    directory.mkdir(parents=True, exist_ok=True)
    if not all(
        p.is_file() for p in (pki.ca_file, pki.gateway_cert, pki.gateway_key, pki.client_cert, pki.client_key)
    ):
        _make_client_side(pki)
    if not (pki.cluster_ca_file.is_file() and pki.cluster_ca_key.is_file()):
        ca_key, ca = make_ca("Tributary local cluster CA")
        write_key(ca_key, pki.cluster_ca_key)
        write_certificate(ca, pki.cluster_ca_file)
    return pki


def _make_client_side(pki: LocalPki) -> None:
    ca_key, ca = make_ca("Tributary local CA")
    gateway_key, gateway = issue_certificate(ca_key, ca, "gateway", server=True, client=False)
    client_key, client = issue_certificate(ca_key, ca, "admin", server=False, client=True, loopback=False)
    write_certificate(ca, pki.ca_file)
    write_certificate(gateway, pki.gateway_cert)
    write_key(gateway_key, pki.gateway_key)
    write_certificate(client, pki.client_cert)
    write_key(client_key, pki.client_key)


# ---- making certificates ------------------------------------------------------------------------


def _name(common: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _validity(builder):
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=VALID_DAYS)
    )


def make_ca(common: str) -> tuple[EllipticCurvePrivateKey, x509.Certificate]:
    """A new self-signed CA: its key and certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
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
    )
    return key, _validity(builder).sign(key, hashes.SHA256())


def issue_certificate(
    ca_key: EllipticCurvePrivateKey,
    ca: x509.Certificate,
    common: str,
    *,
    server: bool,
    client: bool,
    loopback: bool = True,
    dns_names: tuple[str, ...] = (),
) -> tuple[EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate for ``common`` signed by ``ca``; ``loopback``: valid for 127.0.0.1 and
    localhost (what a server's address is checked against), and for ``dns_names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    san: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    if loopback:
        san += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return key, _validity(builder).sign(ca_key, hashes.SHA256())


def load_ca(cert_file: Path, key_file: Path) -> tuple[EllipticCurvePrivateKey, x509.Certificate]:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(key_file.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_file} is not the EC key of a local cluster CA")
    return key, x509.load_pem_x509_certificate(cert_file.read_bytes())


def write_certificate(cert: x509.Certificate, path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    _replace(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def write_key(key: EllipticCurvePrivateKey, path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _replace(path, data, 0o600)


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` whole or not at all (a running service may be reading it: rotation)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)
