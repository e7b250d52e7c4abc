"""gRPC plumbing shared by every service: the server factory, error translation, shutdown.

* :func:`create_server` builds a ``grpc.aio`` server with health checking and reflection, binds
  an address (port 0 in tests) and returns the server with the port actually bound, as gRPC's own
  examples do (``create_server(addr) -> (server, port)``).
* :func:`translate_errors` wraps a servicer method so domain code raises the taxonomy from
  ``services.errors`` and the client sees the right status + ``ErrorInfo``; anything unexpected
  is logged with its traceback and answered as ``UNKNOWN_SERVER_ERROR`` instead of a bare
  gRPC "Exception calling application".
* every method :func:`create_server` hosts decodes its own request bodies
  (:mod:`services.grpc_decoding`), so a body that is not the method's message is answered
  INVALID_ARGUMENT with reason ``INVALID_REQUEST``; grpc.aio's own answer would be UNKNOWN.
* :func:`run_until_signalled` serves until SIGTERM/SIGINT, flips health to NOT_SERVING, lets
  in-flight calls finish within a grace period, then runs the service's own cleanup.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from services import errors, reflection_v1
from services.client_id import client_id_from_metadata
from services.grpc_decoding import DecodingRegistrar

log = logging.getLogger(__name__)

#: Message size limits: record batches may be up to tens of MiB (max.message.bytes and fetch
#: max_bytes), far above gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
DEFAULT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    # Let clients ping every second while a call is open (long polls, acks=all waits): that is
    # how a client finds a paused or cut-off peer (INTERNAL_CHANNEL_OPTIONS). gRPC's defaults
    # would answer such pings with GOAWAY after two.
    ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
    ("grpc.http2.max_ping_strikes", 0),
)

#: Channels between services: besides the message limits, keepalive pings while a call is open,
#: so a call to a peer that stopped answering (SIGSTOP, a cut link) fails UNAVAILABLE within
#: ~4 s and is retried elsewhere, instead of waiting out its whole deadline.
INTERNAL_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 2_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    # What actually bounds the wait for a ping's answer in gRPC core (keepalive_timeout alone
    # did not: a call to a SIGSTOPped peer waited its whole deadline).
    ("grpc.http2.ping_timeout_ms", 2_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    # gRPC core's connect timeout, despite the name (see gateway/client/channel.py): 100 ms failed
    # connects to a peer that was merely slow to finish the HTTP/2 handshake under load.
    ("grpc.min_reconnect_backoff_ms", 2_000),
    ("grpc.max_reconnect_backoff_ms", 1_000),
)


@dataclass
class ServiceRegistration:
    """One servicer to host: the generated ``add_*_to_server`` function, the servicer, its name."""

    add_to_server: Callable[[object, Any], None]  # given a stand-in for the server
    servicer: object
    service_name: str


@dataclass
class GrpcServer:
    """A started server, the port it bound, and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: list[str] = field(default_factory=list)
    #: The plaintext health-only server and its port (``health_address``), if any.
    health_server: grpc.aio.Server | None = None
    health_port: int = 0

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.service_names]:
            await self.health.set(name, status)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting calls; give in-flight ones ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self.health_server is not None:
            await self.health_server.stop(0)


async def create_server(
    address: str,
    registrations: Iterable[ServiceRegistration],
    *,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
    options: Iterable[tuple[str, int]] = DEFAULT_OPTIONS,
    credentials: grpc.ServerCredentials | None = None,
    health_address: str | None = None,
) -> GrpcServer:
    """Build, bind and start a server; ``address`` may use port 0 (the bound port is returned).
    With ``credentials`` (:mod:`services.tls`) the port speaks TLS only. With ``health_address``
    a second server there serves the same health statuses, and nothing else, in plaintext (for
    probes that cannot speak TLS).

    Registers grpc.health.v1 (every service SERVING once started) and server reflection (v1 and
    v1alpha).
    """
    server = grpc.aio.server(interceptors=list(interceptors), options=list(options))
    registrar = DecodingRegistrar(server)
    registrations = list(registrations)
    names = []
    for reg in registrations:
        reg.add_to_server(reg.servicer, registrar)
        names.append(reg.service_name)
    # The asyncio servicer: the sync one runs each Watch in a pool thread that blocks until the
    # status changes (a watcher kept a thread, and process exit waited for it).
    health_servicer = health.aio.HealthServicer()
    # The registrar stands in for the server (it has the registration methods the function calls).
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registrar)  # type: ignore[arg-type]
    # Reflection under both names: v1 for current tools, v1alpha for older ones.
    reflection_servicer = reflection.aio.ReflectionServicer(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection_v1.SERVICE_NAME,
            reflection.SERVICE_NAME,
        ]
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection_servicer, registrar)
    reflection_v1.add_v1_to_server(reflection_servicer, registrar)
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind gRPC server to {address}")
    health_server, health_port = None, 0
    if health_address is not None:
        health_server, health_port = await _start_health_only(health_address, health_servicer)
    await server.start()
    hosted = GrpcServer(
        server=server,
        port=port,
        health=health_servicer,
        service_names=names,
        health_server=health_server,
        health_port=health_port,
    )
    await hosted.set_serving(True)
    return hosted


def health_address(config) -> str | None:
    """The health-only port's address of a service config (``health_port`` on ``host``), or None."""
    port = getattr(config, "health_port", None)
    return None if port is None else f"{config.host}:{port}"


async def _start_health_only(
    address: str, health_servicer: health.aio.HealthServicer
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the health port to {address}")
    await server.start()
    return server, port


def _unexpected(method_name: str, exc: BaseException, context) -> errors.TributaryError:
    try:
        caller = f" (client {client_id_from_metadata(context.invocation_metadata())!r} at {context.peer()})"
    except Exception:  # noqa: BLE001 -- a context without metadata must not hide the error
        caller = ""
    log.exception("unexpected error in %s%s", method_name, caller, exc_info=exc)
    return errors.TributaryError(f"{type(exc).__name__}: {exc}")


def translate_errors(method):
    """Decorate an async servicer method (unary or streaming) to map errors once, at the edge."""
    name = method.__qualname__

    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except errors.TributaryError as exc:
                await errors.abort_with_error(context, exc)
            except (grpc.aio.AbortError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 -- the edge: answer, never crash
                await errors.abort_with_error(context, _unexpected(name, exc, context))

        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except errors.TributaryError as exc:
            await errors.abort_with_error(context, exc)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 -- the edge: answer, never crash
            await errors.abort_with_error(context, _unexpected(name, exc, context))

    return unary_wrapper


async def run_until_signalled(
    server: GrpcServer,
    cleanup: Callable[[], Awaitable[None]] | None = None,
    *,
    grace: float = 5.0,
    stop_event: asyncio.Event | None = None,
    before_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop_event``), then shut down gracefully.

    Order matters: ``before_stop`` runs while the server still serves (a storage node's
    controlled shutdown: its partitions move elsewhere first), then health goes NOT_SERVING (load
    balancers stop routing), in-flight calls get ``grace`` seconds, then the service's cleanup
    (flush logs, revoke leases) runs.
    """
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    terminated = asyncio.ensure_future(server.server.wait_for_termination())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({terminated, stopper}, return_when=asyncio.FIRST_COMPLETED)
    log.info("shutting down")
    if before_stop is not None:
        try:
            await before_stop()
        except Exception:
            log.exception("preparing to stop failed; stopping anyway")
    await server.stop(grace)
    log.info("gRPC server stopped")
    stopper.cancel()
    terminated.cancel()
    if cleanup is not None:
        await cleanup()
