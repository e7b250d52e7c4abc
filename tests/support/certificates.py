"""Certificates for TLS tests, made with the local cluster's PKI code (``launcher/pki.py``): a
CA in a folder, and certificates it signs, as PEM files named after their common name."""

from __future__ import annotations

import ssl
from pathlib import Path

from launcher.pki import issue_certificate, load_ca, make_ca, write_certificate, write_key


def new_ca(directory: Path, name: str) -> Path:
    """A CA ``<name>.pem`` / ``<name>.key`` in ``directory``; returns the certificate's path."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = make_ca(name)
    write_key(key, directory / f"{name}.key")
    write_certificate(cert, directory / f"{name}.pem")
    return directory / f"{name}.pem"


def new_certificate(
    directory: Path, ca: str, name: str, *, loopback: bool = True, dns_names: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """A certificate for ``name`` (server and client; valid for 127.0.0.1 and localhost unless
    ``loopback`` is off, and for ``dns_names``) signed by CA ``ca`` of ``directory``:
    ``(<name>.pem, <name>.key)``, replaced in place if they exist."""
    ca_key, ca_cert = load_ca(directory / f"{ca}.pem", directory / f"{ca}.key")
    key, cert = issue_certificate(
        ca_key, ca_cert, name, server=True, client=True, loopback=loopback, dns_names=dns_names
    )
    write_key(key, directory / f"{name}.key")
    write_certificate(cert, directory / f"{name}.pem")
    return directory / f"{name}.pem", directory / f"{name}.key"


def der(path: Path) -> bytes:
    """A PEM certificate file's DER bytes (what ``getpeercert(binary_form=True)`` returns)."""
    return ssl.PEM_cert_to_DER_cert(path.read_text())
