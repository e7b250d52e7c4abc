"""Channels to the etcd endpoints: TLS, channel options, failover and retry pacing.

:class:`EndpointPool` holds one lazily created ``grpc.aio`` channel per endpoint and a *current*
endpoint. Calls go to the current one; when it fails with UNAVAILABLE the pool moves on to the
next, so a dead member costs one fast failure, not every call. The streams (watch, keep-alive)
ask the pool for a channel each time they reconnect, and so follow the same failover.

Must be used from one event loop (``grpc.aio`` channels belong to the loop that created them).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from . import _rpc

log = logging.getLogger(__name__)

# Why each option:
# * reconnect backoff: grpc's default grows to 120 s, so a channel that saw etcd down for a
#   while could keep failing calls long after etcd came back; cap it at 1 s.
# * keepalive pings: find a dead or partitioned member on an idle watch stream within ~15 s
#   instead of the kernel's TCP timeout. etcd refuses pings more often than every 5 s
#   (--grpc-keepalive-min-time) and pings without an active stream, so 10 s and only with calls.
# * receive size: watch responses and large ranges can exceed grpc's 4 MiB default; etcd's own
#   client allows up to 2 GiB as well.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_receive_message_length", 2**31 - 1),
)

#: Metadata for long-lived streams: etcd then ends the stream with "no leader" when its member
#: loses the raft leader, instead of leaving a watch silently stalled on a partitioned member.
REQUIRE_LEADER_METADATA = (("hasleader", "true"),)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS for the etcd client connection.

    ``ca_file``: CA bundle that signs the etcd server certificates (``None``: system roots);
    ``cert_file``/``key_file``: client certificate and key, for etcd's ``--client-cert-auth``;
    ``server_name``: the name to verify in the server certificate when it differs from the
    endpoint host (e.g. connecting by IP address).
    """

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials with the files read now (a missing file fails at client creation)."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS cert_file and key_file must be given together")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )


def tls_from_files(
    ca_file: str | Path | None = None, cert_file: str | Path | None = None, key_file: str | Path | None = None
) -> TlsConfig | None:
    """A service's ``etcd_ca_file``/``etcd_cert_file``/``etcd_key_file`` settings as a TlsConfig,
    or ``None`` (plaintext) when none is set."""
    if not (ca_file or cert_file or key_file):
        return None
    return TlsConfig(ca_file=ca_file, cert_file=cert_file, key_file=key_file)


def _read(path: str | Path | None) -> bytes | None:
    return Path(path).read_bytes() if path is not None else None


def parse_endpoints(endpoints: list[str] | tuple[str, ...] | str) -> tuple[tuple[str, ...], bool]:
    """``host:port`` targets from a list or a comma-separated string; also whether any said https.

    ``http://`` and ``https://`` schemes are accepted (etcd's own URL form) and stripped.
    """
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    targets: list[str] = []
    wants_tls = False
    for item in (i.strip() for i in items):
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if sep:
            if scheme not in ("http", "https"):
                raise ValueError(f"unsupported etcd endpoint scheme in {item!r}")
            wants_tls |= scheme == "https"
            item = rest
        targets.append(item.rstrip("/"))
    if not targets:
        raise ValueError("at least one etcd endpoint is required")
    return tuple(targets), wants_tls


class Stubs:
    """The four service stubs bound to one channel."""

    __slots__ = ("channel", "endpoint", "kv", "lease", "maintenance", "watch")

    def __init__(self, channel: grpc.aio.Channel, endpoint: str) -> None:
        self.channel = channel
        self.endpoint = endpoint
        self.kv = _rpc.KVStub(channel)
        self.watch = _rpc.WatchStub(channel)
        self.lease = _rpc.LeaseStub(channel)
        self.maintenance = _rpc.MaintenanceStub(channel)


class EndpointPool:
    """One channel per endpoint, created on first use, and the endpoint calls currently go to."""

    def __init__(self, endpoints: tuple[str, ...], tls: TlsConfig | None) -> None:
        self.endpoints = endpoints
        self._credentials = tls.credentials() if tls is not None else None
        self._options = CHANNEL_OPTIONS
        if tls is not None and tls.server_name:
            self._options += (("grpc.ssl_target_name_override", tls.server_name),)
        self._stubs: dict[int, Stubs] = {}
        self._current = 0

    @property
    def current_endpoint(self) -> str:
        return self.endpoints[self._current]

    def stubs(self) -> Stubs:
        """Stubs for the current endpoint."""
        index = self._current
        stubs = self._stubs.get(index)
        if stubs is None:
            stubs = Stubs(self._open_channel(self.endpoints[index]), self.endpoints[index])
            self._stubs[index] = stubs
        return stubs

    def fail_over(self, failed: Stubs) -> None:
        """Move to the next endpoint, unless someone already moved away from ``failed``."""
        if len(self.endpoints) == 1 or self._stubs.get(self._current) is not failed:
            return
        self._current = (self._current + 1) % len(self.endpoints)
        log.info("etcd endpoint %s failed; switching to %s", failed.endpoint, self.current_endpoint)

    async def close(self) -> None:
        stubs, self._stubs = list(self._stubs.values()), {}
        for item in stubs:
            await item.channel.close()

    def _open_channel(self, target: str) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(target, self._credentials, options=self._options)
        return grpc.aio.insecure_channel(target, options=self._options)


class Backoff:
    """Delays between reconnect attempts: exponential from ``initial`` to ``maximum``, with jitter
    so that many clients do not reconnect in lockstep after an etcd restart."""

    def __init__(self, initial: float = 0.05, maximum: float = 1.0, factor: float = 2.0) -> None:
        self._initial, self._maximum, self._factor = initial, maximum, factor
        self._next = initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._maximum, self._next * self._factor)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self._initial
