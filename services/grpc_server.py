"""gRPC plumbing shared by every service: the server factory, error translation, shutdown.

* :func:`create_server` builds a ``grpc.aio`` server with health checking and reflection, binds
  an address (port 0 in tests) and returns the server with the port actually bound, as gRPC's own
  examples do (``create_server(addr) -> (server, port)``).
* :func:`translate_errors` wraps a servicer method so domain code raises the taxonomy from
  ``services.errors`` and the client sees the right status + ``ErrorInfo``; anything unexpected
  is logged with its traceback and answered as ``UNKNOWN_SERVER_ERROR`` instead of a bare
  gRPC "Exception calling application".
* every method :func:`create_server` hosts decodes its own request bodies
  (:func:`decoding_requests`), so a body that is not the method's message is answered
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

from services import errors

log = logging.getLogger(__name__)

#: Message size limits: record batches may be up to tens of MiB (max.message.bytes and fetch
#: max_bytes), far above gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
DEFAULT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
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


async def create_server(
    address: str,
    registrations: Iterable[ServiceRegistration],
    *,
    interceptors: Iterable[grpc.aio.ServerInterceptor] = (),
    options: Iterable[tuple[str, int]] = DEFAULT_OPTIONS,
) -> GrpcServer:
    """Build, bind and start a server; ``address`` may use port 0 (the bound port is returned).

    Registers grpc.health.v1 (every service SERVING once started) and server reflection.
    """
    server = grpc.aio.server(interceptors=list(interceptors), options=list(options))
    registrar = _DecodingRegistrar(server)
    registrations = list(registrations)
    names = []
    for reg in registrations:
        reg.add_to_server(reg.servicer, registrar)
        names.append(reg.service_name)
    # The asyncio servicer: the sync one runs each Watch in a pool thread that blocks until the
    # status changes (a watcher kept a thread, and process exit waited for it).
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registrar)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME]
        ),
        registrar,
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind gRPC server to {address}")
    await server.start()
    hosted = GrpcServer(server=server, port=port, health=health_servicer, service_names=names)
    await hosted.set_serving(True)
    return hosted


class _DecodingRegistrar:
    """Stands in for the server while the generated ``add_*_to_server`` functions register their
    method handlers, and registers :func:`decoding_requests` versions of them instead.

    Done once at registration rather than in an interceptor: an interceptor runs for every call,
    and with grpc.aio that costs ~10% of a small call's rate even when it returns the handler
    unchanged (measured with health checks on loopback).
    """

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, generic_handlers) -> None:
        self._server.add_generic_rpc_handlers(tuple(_DecodingGenericHandler(h) for h in generic_handlers))

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        self._server.add_registered_method_handlers(
            service_name,
            {
                name: decoding_requests(handler, f"/{service_name}/{name}")
                for name, handler in method_handlers.items()
            },
        )


class _DecodingGenericHandler(grpc.GenericRpcHandler):
    """A generic handler whose method handlers decode their own requests (memoised per method)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._decoding: dict[str, object] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        handler = self._decoding.get(method)
        if handler is None:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            handler = self._decoding[method] = decoding_requests(handler, method)
        return handler


def decoding_requests(handler, method: str | bytes):
    """``handler`` decoding its own request bodies, so one that is not the method's message is
    answered INVALID_ARGUMENT with reason ``INVALID_REQUEST`` (and the parser's explanation), as
    a Kafka broker answers a request it cannot parse -- not grpc.aio's UNKNOWN "Unexpected
    DecodeError".

    The method's deserializer is taken out of the handler (gRPC then hands over the raw bytes) and
    run in front of the behaviour: for a streamed request, per message as the handler reads. Each
    wrapper is of the behaviour's own kind (a coroutine, an async generator, or a coroutine writing
    with ``context.write``). Sync behaviours are returned unchanged: gRPC calls some of them on
    the event loop's thread with a context whose ``abort`` waits on that loop. Every servicer
    here, health and reflection included, is async.
    """
    if handler is None or handler.request_deserializer is None:
        return handler
    arity = _arity(handler)
    behavior = getattr(handler, arity)
    if inspect.isasyncgenfunction(behavior):
        wrap = _ASYNC_GENERATOR_WRAPPERS[arity]
    elif inspect.iscoroutinefunction(behavior):
        wrap = _COROUTINE_WRAPPERS[arity]
    else:
        return handler
    decode = _RequestDecoder(method, handler.request_deserializer)
    return _replaced(handler, request_deserializer=None, **{arity: wrap(behavior, decode)})


def _arity(handler) -> str:
    if handler.request_streaming:
        return "stream_stream" if handler.response_streaming else "stream_unary"
    return "unary_stream" if handler.response_streaming else "unary_unary"


_HANDLER_FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _replaced(handler, *, request_deserializer, **behavior):
    """``handler`` with its deserializer and behaviour swapped (grpc's handlers are namedtuples)."""
    if hasattr(handler, "_replace"):
        return handler._replace(request_deserializer=request_deserializer, **behavior)
    ((arity, function),) = behavior.items()
    return _HANDLER_FACTORIES[arity](
        function, request_deserializer=request_deserializer, response_serializer=handler.response_serializer
    )


class _RequestDecoder:
    """One method's deserializer, turning any failure into the INVALID_REQUEST status."""

    def __init__(self, method: str | bytes, deserializer: Callable[[bytes], object]) -> None:
        self._method = method.decode() if isinstance(method, bytes) else method
        self._deserializer = deserializer
        message_class = getattr(deserializer, "__self__", None)
        descriptor = getattr(message_class, "DESCRIPTOR", None)
        self._message_name = getattr(descriptor, "full_name", "request message")

    def __call__(self, raw: bytes) -> tuple[object, grpc.Status | None]:
        """``(request, None)``, or ``(None, status)`` when ``raw`` does not decode."""
        try:
            return self._deserializer(raw), None
        except Exception as exc:  # noqa: BLE001 -- whatever the parser raises, the body is bad
            error = errors.InvalidRequestError(
                f"{self._method}: the {len(raw)}-byte request body is not a valid {self._message_name}: {exc}"
            )
            return None, errors.to_status(error)


async def _decoded_messages(raw_messages, context, decode: _RequestDecoder):
    async for raw in raw_messages:
        yield await _decoded(raw, context, decode)


async def _decoded(raw: bytes, context, decode: _RequestDecoder):
    request, status = decode(raw)
    if status is not None:
        await context.abort_with_status(status)  # raises
    return request


def _coroutine_unary_request(behavior, decode: _RequestDecoder):
    async def decoding(raw, context):
        return await behavior(await _decoded(raw, context, decode), context)

    return decoding


def _coroutine_stream_request(behavior, decode: _RequestDecoder):
    async def decoding(raw_messages, context):
        return await behavior(_decoded_messages(raw_messages, context, decode), context)

    return decoding


def _generator_unary_request(behavior, decode: _RequestDecoder):
    async def decoding(raw, context):
        async for response in behavior(await _decoded(raw, context, decode), context):
            yield response

    return decoding


def _generator_stream_request(behavior, decode: _RequestDecoder):
    async def decoding(raw_messages, context):
        async for response in behavior(_decoded_messages(raw_messages, context, decode), context):
            yield response

    return decoding


#: Unary responses, and streamed ones a coroutine writes with ``context.write``.
_COROUTINE_WRAPPERS = {
    "unary_unary": _coroutine_unary_request,
    "unary_stream": _coroutine_unary_request,
    "stream_unary": _coroutine_stream_request,
    "stream_stream": _coroutine_stream_request,
}
_ASYNC_GENERATOR_WRAPPERS = {
    "unary_stream": _generator_unary_request,
    "stream_stream": _generator_stream_request,
}


def _unexpected(method_name: str, exc: BaseException) -> errors.TributaryError:
    log.exception("unexpected error in %s", method_name, exc_info=exc)
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
                await errors.abort_with_error(context, _unexpected(name, exc))

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
            await errors.abort_with_error(context, _unexpected(name, exc))

    return unary_wrapper


async def run_until_signalled(
    server: GrpcServer,
    cleanup: Callable[[], Awaitable[None]] | None = None,
    *,
    grace: float = 5.0,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or ``stop_event``), then shut down gracefully.

    Order matters: health goes NOT_SERVING first (load balancers stop routing), in-flight calls
    get ``grace`` seconds, then the service's cleanup (flush logs, revoke leases) runs.
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
    await server.stop(grace)
    stopper.cancel()
    terminated.cancel()
    if cleanup is not None:
        await cleanup()
