"""TLS for Tributary's listeners and clients: gRPC credentials and asyncio SSL contexts built
from PEM files, with certificate rotation without a restart.

A listener takes a certificate chain and its key, and optionally the CA bundle its clients'
certificates must chain to (then a client certificate is required: mutual TLS). When the files
change on disk, new connections get the new certificate and the new client CAs, a CA removed
from the file included (gRPC asks on every handshake; the raw listener's handshakes move to the
newest context made by :class:`ReloadingSslContext`); connections already open keep theirs. A
half-written or mismatched pair is never taken: the files are checked first (the stdlib ``ssl``
module loads them), and until they check out the previous certificate stays.

Clients verify the server against a CA bundle (or the system's trust store) and may present
their own certificate for mutual TLS. Names follow Kafka's client settings: ``ssl_cafile``,
``ssl_certfile``, ``ssl_keyfile``.

Between the cluster's own processes (the internal ports: a storage node's gRPC port and its
fetch/data port, a coordinator's gRPC port) the same pieces make mutual TLS: each process has a
*member certificate* (:class:`MemberTls`, from the ``internal_tls_*`` settings of
:class:`MemberTlsConfig`) that it presents both on its internal ports and to the members it
connects to, and it accepts only peers whose certificate chains to the *cluster CA*. Keep that CA
apart from the one that signs application clients' certificates for the gateway: an internal port
authorizes nothing, so whoever it lets in may read and write every partition. Internal clients
pick up rotated member certificates on their next connection (:class:`ReloadingClientContext`
for raw connections; gRPC channels read the files when they are opened).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from services.config import ConfigError, InternalPortTlsConfig, MemberTlsConfig

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
    and its own certificate and key for mutual TLS (optional); ``server_name``: the name a
    server's certificate must carry, instead of the host dialled (None: that host)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None

    def expected_name(self, host: str) -> str:
        """The name the certificate of the server at ``host`` is checked for."""
        return self.server_name or host


@dataclass(frozen=True, slots=True)
class MemberTls:
    """Mutual TLS between cluster members: this process's member certificate and key (served on
    its internal ports, presented to the members it connects to) and the cluster CA every peer's
    certificate must chain to. ``require_client_cert`` off: internal ports take TLS clients
    without a certificate too (server authentication only)."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    require_client_cert: bool = True
    #: The name members' certificates are checked for (None: the host dialled).
    server_name: str | None = None

    @property
    def server(self) -> ServerTls:
        """The internal listeners' TLS."""
        return ServerTls(self.cert_file, self.key_file, self.ca_file if self.require_client_cert else None)

    @property
    def client(self) -> ClientTls:
        """The TLS of this process's connections to other members."""
        return ClientTls(self.ca_file, self.cert_file, self.key_file, self.server_name)


def member_tls_problem(config: MemberTlsConfig) -> str | None:
    """What is wrong with a config's ``internal_tls_*`` settings (None: fine, or all unset)."""
    given = {
        "--internal-tls-cert-file": config.internal_tls_cert_file,
        "--internal-tls-key-file": config.internal_tls_key_file,
        "--internal-tls-ca-file": config.internal_tls_ca_file,
    }
    missing = [flag for flag, path in given.items() if path is None]
    if len(missing) == len(given):
        if isinstance(config, InternalPortTlsConfig) and not config.internal_tls_require_client_cert:
            return "--internal-tls-require-client-cert false needs internal TLS (its certificate, key and CA)"
        if config.internal_tls_server_name:
            return "--internal-tls-server-name needs internal TLS (its certificate, key and CA)"
        return None
    if missing:
        return (
            "internal TLS needs --internal-tls-cert-file, --internal-tls-key-file and "
            f"--internal-tls-ca-file together; {', '.join(missing)} not given"
        )
    ca_file = config.internal_tls_ca_file
    problem = server_tls_problem(config.internal_tls_cert_file, config.internal_tls_key_file, ca_file)
    if problem is None:
        try:
            ssl.create_default_context(cafile=str(ca_file))
        except (ssl.SSLError, OSError) as exc:
            problem = f"TLS CA file {ca_file}: {exc}"
    return f"internal TLS: {problem}" if problem is not None else None


def member_tls(config: MemberTlsConfig) -> MemberTls | None:
    """The member TLS a config asks for, or None (internal connections in plaintext).

    Raises :class:`~services.config.ConfigError` for settings :func:`member_tls_problem` refuses.
    """
    problem = member_tls_problem(config)
    if problem is not None:
        raise ConfigError(problem)
    cert, key, ca = config.internal_tls_cert_file, config.internal_tls_key_file, config.internal_tls_ca_file
    if cert is None or key is None or ca is None:
        return None
    require = config.internal_tls_require_client_cert if isinstance(config, InternalPortTlsConfig) else True
    return MemberTls(
        cert, key, ca, require_client_cert=require, server_name=config.internal_tls_server_name or None
    )


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


def _stamp(paths: tuple[Path | None, ...]) -> tuple[tuple[int, int, int], ...]:
    """What tells that files changed: modification time, and inode and size (a file replaced by a
    rename -- how certificates are best rotated, and how Kubernetes updates a mounted Secret --
    within the file system's timestamp granularity still counts)."""
    stamps = []
    for path in paths:
        if path is None:
            stamps.append((0, 0, 0))
        else:
            stat = os.stat(path)
            stamps.append((stat.st_mtime_ns, stat.st_ino, stat.st_size))
    return tuple(stamps)


class _ServerFiles:
    """The listener's files as last loaded, and whether they changed since."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._paths = (tls.cert_file, tls.key_file, tls.client_ca_file)
        self._stamp: tuple[tuple[int, int, int], ...] | None = None

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
    """An asyncio server's SSL context whose certificate and client CAs follow the files: call
    :meth:`maybe_reload` now and then (new handshakes use what it loaded).

    A reload builds a new context rather than loading into the listener's: OpenSSL's trust store
    only grows, so a CA removed from the file would otherwise stay trusted until a restart. The
    listener keeps :attr:`context`, whose server-name callback (called at every handshake, with
    or without SNI) hands the connection to the newest context before the certificates are
    exchanged."""

    def __init__(self, tls: ServerTls) -> None:
        self._files = _ServerFiles(tls)
        self.context = self._new_context()
        self._current = self.context
        self._load_into(self.context)  # the first load works or raises
        self.context.sni_callback = self._hand_over

    def maybe_reload(self) -> bool:
        context = self._new_context()
        if not self._load_into(context):
            return False
        self._current = context
        return True

    def _new_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self._files.tls.client_ca_file is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _load_into(self, context: ssl.SSLContext) -> bool:
        if self._files.load() is None:
            return False
        tls = self._files.tls
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.load_verify_locations(tls.client_ca_file)
        return True

    def _hand_over(self, connection: Any, server_name: str | None, listener: ssl.SSLContext) -> None:
        if self._current is not listener:
            connection.context = self._current


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


class ReloadingClientContext:
    """A raw client's SSL context (:func:`client_ssl_context`) that follows its files: each
    :attr:`context` read checks their modification times and rebuilds the context when they
    changed, so the next connection presents a rotated certificate. Until new files check out
    (a half-written pair), the previous context stays."""

    def __init__(self, tls: ClientTls) -> None:
        self.tls = tls
        #: The name to give ``open_connection(server_hostname=...)`` for a server at a host.
        self.server_hostname = tls.expected_name
        self._paths = (tls.ca_file, tls.cert_file, tls.key_file)
        self._stamp = _stamp(self._paths)
        self._context = client_ssl_context(tls)

    @property
    def context(self) -> ssl.SSLContext:
        try:
            stamp = _stamp(self._paths)
        except OSError:
            return self._context  # a file being replaced: keep what we have
        if stamp != self._stamp:
            try:
                self._context = client_ssl_context(self.tls)
                log.info("TLS client certificate %s reloaded: new connections use it", self.tls.cert_file)
            except (ssl.SSLError, OSError) as exc:
                log.warning(
                    "TLS client files changed but cannot be used yet (keeping the current ones): %s", exc
                )
                return self._context
            self._stamp = stamp
        return self._context


#: How long a gRPC channel replaced after a certificate rotation may finish the calls it carries.
RETIRED_CHANNEL_GRACE_S = 30.0
_retiring: set[asyncio.Task] = set()


class ChannelRotation:
    """For a cache of gRPC channels (one per peer, opened once): :meth:`rotated` says when the
    client's TLS files changed and check out, so the cache opens new channels, which present
    the rotated certificate (a channel keeps the credentials it was opened with), and retires the
    old ones (:func:`retire_channels`). The files are looked at most every ``check_interval_s``."""

    def __init__(self, tls: ClientTls | None, *, check_interval_s: float = 1.0) -> None:
        self._tls = tls
        self._paths = (tls.ca_file, tls.cert_file, tls.key_file) if tls is not None else ()
        self._interval = check_interval_s
        self._checked = time.monotonic()
        self._stamp = _stamp(self._paths) if tls is not None else ()

    def rotated(self) -> bool:
        if self._tls is None or time.monotonic() - self._checked < self._interval:
            return False
        self._checked = time.monotonic()
        try:
            stamp = _stamp(self._paths)
            if stamp == self._stamp:
                return False
            client_ssl_context(self._tls)  # a half-written pair: not yet
        except (OSError, ssl.SSLError):
            return False
        self._stamp = stamp
        log.info("TLS client certificate %s changed: new gRPC channels present it", self._tls.cert_file)
        return True


def retire_channels(channels: Iterable[grpc.aio.Channel], grace: float = RETIRED_CHANNEL_GRACE_S) -> None:
    """Close ``channels`` in the background once their calls end (at most ``grace`` s)."""
    loop = asyncio.get_running_loop()
    for channel in channels:
        task = loop.create_task(channel.close(grace))
        _retiring.add(task)
        task.add_done_callback(_retiring.discard)


def sync_channel(target: str, tls: ClientTls | None) -> grpc.Channel:
    """:func:`aio_channel` for synchronous callers (the CLI)."""
    if tls is None:
        return grpc.insecure_channel(target)
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else None
    return grpc.secure_channel(target, grpc_channel_credentials(tls), options=options)


def aio_channel(
    target: str,
    tls: ClientTls | None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``target``: TLS with ``tls`` (its files read now, so a channel
    opened after a rotation presents the new certificate; the server's certificate checked for
    ``tls.server_name`` when set), else plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)
    if tls.server_name:
        options = [*options, ("grpc.ssl_target_name_override", tls.server_name)]
    return grpc.aio.secure_channel(
        target, grpc_channel_credentials(tls), options=list(options), interceptors=interceptors
    )
