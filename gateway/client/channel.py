"""Connections to the gateways: one gRPC channel per address, failover, and error translation.

Gateways are stateless and interchangeable, so a client sticks to one (the *current* endpoint)
and moves to the next when a call fails at the transport level (the gateway is gone: UNAVAILABLE
with no Tributary error detail). A failed endpoint is skipped for a short, growing quarantine;
when every endpoint is quarantined the one that comes back soonest is tried anyway, so a client
never refuses to try.

This is the one place where ``grpc.RpcError`` becomes the typed error (``error_from_rpc``, which
keeps the server's message and chains the original); everything above sees only
:class:`~services.errors.TributaryError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import grpc

from gateway.client.credentials import TokenSource, bearer_call_credentials
from gateway.client.errors import NetworkError, TributaryError, error_from_rpc
from services.client_id import CLIENT_ID_METADATA_KEY
from services.proto import gateway_grpc
from services.telemetry import client_interceptors
from services.tls import ClientTls, grpc_channel_credentials

log = logging.getLogger(__name__)

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
_MAX_MESSAGE_BYTES = 128 * 1024 * 1024

#: Channel settings: big messages (fetches and batches of tens of MiB), fast reconnects (a
#: restarted gateway on loopback is back within a second or two; gRPC's default backoff grows to
#: two minutes), and no transparent retries -- the producer and consumer decide what to retry.
#: ``min_reconnect_backoff_ms`` is, despite its name, gRPC core's *connect timeout* (its
#: MIN_CONNECT_TIMEOUT: an attempt may take max(this, the backoff)); at 100 ms a loaded host or a
#: distant one (TCP, TLS and HTTP/2 handshakes in that time) failed "connection attempt timed out
#: before receiving SETTINGS frame". A refused connection still fails at once.
CONNECT_TIMEOUT_MS = 5_000
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
)

QUARANTINE_S = 0.5
MAX_QUARANTINE_S = 5.0


def is_transport_failure(exc: grpc.RpcError) -> bool:
    """True when the call never reached a working gateway, or the gateway went away during it (as
    opposed to the gateway answering with an error): UNAVAILABLE, or CANCELLED by the server (a
    gateway shutting down cancels its open streams), without our ``ErrorInfo`` detail. Calls the
    client cancels itself end in ``asyncio.CancelledError``, never here."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return False
    trailers = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else ()
    # Each entry is a (key, value) pair (grpc-stubs types the sync API's entries without __iter__).
    pairs = cast("Iterable[tuple[str, object]]", trailers or ())
    return not any(key == _STATUS_DETAILS_KEY for key, _ in pairs)


class IdentifiedStub:
    """A ``GatewayStub`` whose every call carries the client's metadata (its ``client_id``), so
    each call site -- unary calls here, the producer's ``ProduceStream`` -- sends it without
    passing it. Cheaper than an interceptor, which grpc.aio runs as extra coroutines per call."""

    def __init__(self, stub: gateway_grpc.GatewayStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)
        metadata = self._metadata

        def call(*args, **kwargs):
            kwargs.setdefault("metadata", metadata)
            return method(*args, **kwargs)

        call.__name__ = name
        setattr(self, name, call)  # built once per method
        return call


@dataclass
class Endpoint:
    """One gateway address with its channel and stub, and its quarantine state."""

    address: str
    channel: grpc.aio.Channel
    stub: IdentifiedStub
    failures: int = 0
    down_until: float = 0.0
    streams: list = field(default_factory=list)


class GatewayPool:
    """Channels to every gateway address; ``call`` runs one RPC on the current endpoint.

    Must be created and used on one event loop (gRPC asyncio channels belong to their loop).
    """

    def __init__(
        self,
        addresses: list[str],
        *,
        monotonic: Callable[[], float] = time.monotonic,
        client_id: str = "",
        tls: ClientTls | None = None,
        token_source: TokenSource | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("at least one gateway address is needed")
        self._monotonic = monotonic
        #: Sent with every call (``tributary-client-id``): the gateway logs it, and groups show it.
        self.metadata: tuple[tuple[str, str], ...] = (
            ((CLIENT_ID_METADATA_KEY, client_id),) if client_id else ()
        )
        self._credentials = grpc_channel_credentials(tls) if tls is not None else None
        if self._credentials is not None and token_source is not None:
            # The token rides on every call as standard call credentials, what any language's
            # gRPC library sends for ``authorization: Bearer``.
            self._credentials = grpc.composite_channel_credentials(
                self._credentials, bearer_call_credentials(token_source)
            )
        self.endpoints = [self._open(address) for address in addresses]
        self._current = 0
        self._closed = False

    def _open(self, address: str) -> Endpoint:
        # With an OpenTelemetry SDK configured by the application, every call is a CLIENT span
        # whose context travels in the metadata (W3C traceparent) to the gateway; without one
        # there are no interceptors at all.
        interceptors = client_interceptors(address) or None
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(
                address, self._credentials, options=list(CHANNEL_OPTIONS), interceptors=interceptors
            )
        else:
            channel = grpc.aio.insecure_channel(
                address, options=list(CHANNEL_OPTIONS), interceptors=interceptors
            )
        stub = IdentifiedStub(gateway_grpc.GatewayStub(channel), self.metadata)
        return Endpoint(address=address, channel=channel, stub=stub)

    @property
    def addresses(self) -> list[str]:
        return [endpoint.address for endpoint in self.endpoints]

    def current(self) -> Endpoint:
        """The endpoint to use now: the current one unless quarantined, else the next healthy one."""
        now = self._monotonic()
        count = len(self.endpoints)
        for step in range(count):
            endpoint = self.endpoints[(self._current + step) % count]
            if endpoint.down_until <= now:
                self._current = (self._current + step) % count
                return endpoint
        soonest = min(range(count), key=lambda i: self.endpoints[i].down_until)
        self._current = soonest
        return self.endpoints[soonest]

    def mark_failed(self, endpoint: Endpoint) -> None:
        """Quarantine ``endpoint`` (0.5 s, doubling up to 5 s) and move on to the next one."""
        endpoint.failures += 1
        quarantine = min(MAX_QUARANTINE_S, QUARANTINE_S * 2 ** (endpoint.failures - 1))
        endpoint.down_until = self._monotonic() + quarantine
        if len(self.endpoints) > 1:
            log.info("gateway %s unreachable; trying another for %.1fs", endpoint.address, quarantine)
        if self.endpoints[self._current] is endpoint:
            self._current = (self._current + 1) % len(self.endpoints)

    def mark_ok(self, endpoint: Endpoint) -> None:
        if endpoint.failures:
            endpoint.failures = 0
            endpoint.down_until = 0.0

    async def call(self, method: str, request, *, timeout: float, failover: bool = True):
        """Call ``Gateway.<method>(request)``; returns the response or raises ``TributaryError``.

        With ``failover`` (safe for reads, metadata and admin calls) a transport failure moves on
        to the next endpoint, trying each at most once. Produce calls pass ``failover=False``: the
        producer counts and backs off its own retries, and the next attempt goes to the next
        endpoint anyway.
        """
        attempts = len(self.endpoints) if failover else 1
        error: TributaryError | None = None
        for _ in range(attempts):
            endpoint = self.current()
            try:
                response = await getattr(endpoint.stub, method)(request, timeout=timeout)
            except grpc.RpcError as exc:
                error = self.translate(endpoint, exc)
                if not is_transport_failure(exc):
                    raise error from exc
                continue
            self.mark_ok(endpoint)
            return response
        assert error is not None
        raise error

    def translate(self, endpoint: Endpoint, exc: grpc.RpcError) -> TributaryError:
        """The typed error for a failed call; quarantines ``endpoint`` if it was unreachable."""
        if is_transport_failure(exc):
            self.mark_failed(endpoint)
            error = NetworkError(f"gateway {endpoint.address} unreachable: {exc.details()}")
            error.__cause__ = exc
            return error
        return error_from_rpc(exc)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for endpoint in self.endpoints:
            await endpoint.channel.close()
