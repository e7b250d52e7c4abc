"""Request decoding for gRPC servers: an undecodable body is INVALID_ARGUMENT, not UNKNOWN.

grpc.aio deserializes a request before the servicer runs, and answers a body that fails to parse
with UNKNOWN "Unexpected <class DecodeError>" -- which a client cannot tell from a server bug. A
Kafka broker answers a request it cannot parse with INVALID_REQUEST. So every method hosted by
``services.grpc_server.create_server`` is registered through :class:`DecodingRegistrar`, which
swaps each handler for :func:`decoding_requests` of it: the handler gets no deserializer (gRPC
hands over the raw bytes) and the method's own deserializer runs in front of the behaviour, a
failure aborting the call with INVALID_ARGUMENT and the ``INVALID_REQUEST`` ErrorInfo.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import grpc

from services import errors


class DecodingRegistrar:
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
