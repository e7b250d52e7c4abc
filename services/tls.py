"""TLS for Tributary's listeners and clients: gRPC credentials and asyncio SSL contexts built
from PEM files, with certificate rotation without a restart.

A listener takes a certificate chain and its key, and optionally the CA bundle its clients'
certificates must chain to (then a client certificate is required: mutual TLS). When the files
change on disk, new connections get the new certificate (gRPC asks on every handshake; the raw
listener's context is reloaded by :class:`ReloadingSslContext`); connections already open keep
theirs. A half-written or mismatched pair is never taken: the files are checked first (the
stdlib ``ssl`` module loads them), and until they check out the previous certificate stays.

Clients verify the server against a CA bundle (or the system's trust store) and may present
their own certificate for mutual TLS. Names follow Kafka's client settings: ``ssl_cafile``,
``ssl_certfile``, ``ssl_keyfile``.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A listener's TLS files; ``client_ca_file`` set: clients must present a certificate."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclass(frozen=True, slots=True)
class ClientTls:
    """A client's TLS files: the CA to verify servers with (None: the system's trust store),
    and its own certificate and key for mutual TLS (optional)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


def server_tls_problem(
    cert_file: Path | None, key_file: Path | None, client_ca_file: Path | None
) -> str | None:
    """What is wrong with a listener's TLS settings (None: fine, or TLS off)."""
    if (cert_file is None) != (key_file is None):
        return "TLS needs both a certificate file and its key file"
    if client_ca_file is not None and cert_file is None:
        return "a client CA file (mutual TLS) needs the server's own certificate and key"
    for path in (cert_file, key_file, client_ca_file):
        if path is not None and not path.is_file():
            return f"TLS file {path} does not exist"
    if cert_file is not None and key_file is not None:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, OSError) as exc:
            return f"TLS certificate {cert_file} with key {key_file}: {exc}"
    return None


def _stamp(paths: tuple[Path | None, ...]) -> tuple[int, ...]:
    return tuple(os.stat(p).st_mtime_ns if p is not None else 0 for p in paths)


class _ServerFiles:
    """The listener's files as last loaded, and whether they changed since."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._paths = (tls.cert_file, tls.key_file, tls.client_ca_file)
        self._stamp: tuple[int, ...] | None = None

    def changed(self) -> bool:
        try:
            return _stamp(self._paths) != self._stamp
        except OSError:
            return False  # a file being replaced: keep what we have

    def load(self) -> tuple[bytes, bytes, bytes | None] | None:
        """The files' contents if they changed and check out, else None."""
        if not self.changed():
            return None
        try:
            stamp = _stamp(self._paths)
            problem = server_tls_problem(*self._paths)
            if problem is not None:
                raise ValueError(problem)
            cert = self.tls.cert_file.read_bytes()
            key = self.tls.key_file.read_bytes()
            ca = self.tls.client_ca_file.read_bytes() if self.tls.client_ca_file is not None else None
        except (OSError, ValueError) as exc:
            if self._stamp is None:
                raise
            log.warning("TLS files changed but cannot be used yet (keeping the current ones): %s", exc)
            return None
        if self._stamp is not None:
            log.info("TLS certificate %s reloaded: new connections use it", self.tls.cert_file)
        self._stamp = stamp
        return cert, key, ca


def grpc_server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials for ``add_secure_port`` that re-read the files when they change (gRPC asks
    at every new connection's handshake)."""
    files = _ServerFiles(tls)

    def configuration(loaded: tuple[bytes, bytes, bytes | None]):
        cert, key, ca = loaded
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    initial = files.load()
    assert initial is not None  # the first load either works or raises

    def fetch():
        loaded = files.load()
        return configuration(loaded) if loaded is not None else None

    return grpc.dynamic_ssl_server_credentials(
        configuration(initial), fetch, require_client_authentication=tls.client_ca_file is not None
    )


class ReloadingSslContext:
    """An asyncio server's SSL context whose certificate follows the files: call
    :meth:`maybe_reload` now and then (new handshakes use what it loaded)."""

    def __init__(self, tls: ServerTls) -> None:
        self._files = _ServerFiles(tls)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if tls.client_ca_file is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
        self.maybe_reload()

    def maybe_reload(self) -> bool:
        if self._files.load() is None:
            return False
        tls = self._files.tls
        self.context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            self.context.load_verify_locations(tls.client_ca_file)
        return True


def grpc_channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    """Channel credentials: verify the server with the CA (or the system's roots), present the
    client certificate if given."""

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca_file),
        private_key=read(tls.key_file),
        certificate_chain=read(tls.cert_file),
    )


def client_ssl_context(tls: ClientTls) -> ssl.SSLContext:
    """An SSL context for a raw (asyncio) client connection with the same trust as gRPC's."""
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file is not None else None)
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def client_tls_problem(tls: ClientTls) -> str | None:
    """What is wrong with a client's TLS files (None: fine)."""
    if (tls.cert_file is None) != (tls.key_file is None):
        return "ssl_certfile and ssl_keyfile go together"
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        if path is not None and not Path(path).is_file():
            return f"TLS file {path} does not exist"
    return None
