"""Tracing and latency metrics for ``grpc.aio`` calls: W3C trace context over gRPC metadata,
a server interceptor and client interceptors.

One produce becomes one trace: the SDK's client interceptor starts a CLIENT span and writes its
context into the call's metadata (``traceparent``/``tracestate``, plus ``baggage``, through the
global propagator, which is W3C trace context + baggage unless ``OTEL_PROPAGATORS`` says
otherwise); the gateway's server interceptor extracts it, starts the SERVER span as its child
and makes it current while the servicer runs, so the gateway's own client calls (Append to a
storage node) are children of it, and so on down to the storage node's append span.

Written here rather than taken from ``opentelemetry-instrumentation-grpc``: that package is a
beta (0.x) pinned to one SDK version, brings ``wrapt`` and the instrumentation framework, and
emits the pre-1.38 RPC conventions; ours is ~300 lines over grpc.aio's public interceptor API,
emits the current conventions (``rpc/dup`` for both, see ``names.py``), skips health and
reflection calls, and costs nothing when telemetry is off because it is then not installed.

Status and timing: a server span ends when the handler returns or raises (for streaming
responses, when the last message was produced); its status code is the one the handler set or
aborted with. A unary client span ends when the answer arrived; a streaming one when the call
is done (a done callback). Durations go to ``rpc.server.call.duration`` /
``rpc.client.call.duration`` (seconds) whether or not the span is sampled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.telemetry import names

log = logging.getLogger(__name__)

#: Services whose calls are neither traced nor timed: probes would drown the real calls.
UNOBSERVED_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)

#: Buckets for call durations in seconds: the conventions' advice, with finer steps below 5 ms
#: because a storage-node Append on loopback takes ~0.1-1 ms.
DURATION_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
DURATION_BUCKETS_MS = tuple(b * 1000 for b in DURATION_BUCKETS_S)

#: Codes that make a SERVER span an error (the conventions: the server's fault, not the caller's).
_SERVER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


# ---- propagation -------------------------------------------------------------------------------


class _MetadataGetter(Getter):
    """Reads trace headers from invocation metadata: a sequence of (key, value) pairs."""

    def get(self, carrier, key: str) -> list[str] | None:
        values = [v.decode() if isinstance(v, bytes) else v for k, v in carrier if k == key]
        return values or None

    def keys(self, carrier) -> list[str]:
        return [k for k, _ in carrier]


class _MetadataSetter(Setter):
    """Appends trace headers to a list of (key, value) pairs."""

    def set(self, carrier: list, key: str, value: str) -> None:
        carrier.append((key, value))


GETTER = _MetadataGetter()
SETTER = _MetadataSetter()


def inject_metadata(metadata: Iterable[tuple[str, str | bytes]] | None = None, *, ctx: Context | None = None):
    """``metadata`` plus the trace headers of ``ctx`` (default: the current context), as a list."""
    carrier = list(metadata or ())
    propagate.inject(carrier, context=ctx, setter=SETTER)
    return carrier


def extract_context(metadata: Iterable[tuple[str, str | bytes]] | None) -> Context:
    """The remote parent carried by ``metadata``, on an empty context (never the caller's)."""
    return propagate.extract(tuple(metadata or ()), context=Context(), getter=GETTER)


# ---- what is recorded per method ----------------------------------------------------------------


def _split_method(full_method: str | bytes) -> tuple[str, str]:
    """``/tributary.v1.Gateway/Produce`` -> (``tributary.v1.Gateway``, ``Produce``)."""
    if isinstance(full_method, bytes):
        full_method = full_method.decode()
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service, method


def _split_target(target: str) -> tuple[str, int | None]:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return target, None
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class _Method:
    name: str  # tributary.v1.Gateway/Produce: the span name and rpc.method
    service: str
    short: str
    span_attributes: dict


class RpcInstruments:
    """The call-duration histograms of one side (created once per meter, shared by observers)."""

    def __init__(self, meter, *, side: str, old_conventions: bool = False) -> None:
        self.duration = self.old_duration = None
        if meter is None:
            return
        self.duration = meter.create_histogram(
            names.RPC_SERVER_CALL_DURATION if side == "server" else names.RPC_CLIENT_CALL_DURATION,
            unit="s",
            description=f"Duration of {'incoming' if side == 'server' else 'outgoing'} gRPC calls.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        if old_conventions:
            self.old_duration = meter.create_histogram(
                names.OLD_RPC_SERVER_DURATION if side == "server" else names.OLD_RPC_CLIENT_DURATION,
                unit="ms",
                description="Deprecated: use rpc.*.call.duration (seconds).",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS_MS,
            )


class RpcObserver:
    """Spans from ``tracer`` and durations into ``instruments`` (either may be None).

    ``side`` is ``"server"`` or ``"client"``; ``target`` (host:port) names the peer of a client's
    channel. Attribute dictionaries are built once per method and status code, not per call.
    """

    def __init__(
        self,
        tracer,
        instruments: RpcInstruments | None,
        *,
        side: str,
        target: str = "",
        old_conventions: bool = False,
    ) -> None:
        self.tracer = tracer
        self.side = side
        self.kind = SpanKind.SERVER if side == "server" else SpanKind.CLIENT
        self.old = old_conventions
        self._peer: dict = {}
        if side == "client" and target:
            host, port = _split_target(target)
            self._peer = {
                names.SERVER_ADDRESS: host,
                **({names.SERVER_PORT: port} if port is not None else {}),
            }
        self._methods: dict[str | bytes, _Method] = {}
        self._metric_attributes: dict[tuple[str, grpc.StatusCode], tuple[dict, dict | None]] = {}
        self._duration = instruments.duration if instruments is not None else None
        self._old_duration = instruments.old_duration if instruments is not None else None

    @property
    def active(self) -> bool:
        return self.tracer is not None or self._duration is not None

    def method(self, full_method: str | bytes) -> _Method:
        info = self._methods.get(full_method)
        if info is None:
            service, short = _split_method(full_method)
            name = f"{service}/{short}"
            attributes = {names.RPC_SYSTEM_NAME: "grpc", names.RPC_METHOD: name, **self._peer}
            if self.old:
                attributes.update({names.OLD_RPC_SYSTEM: "grpc", names.OLD_RPC_SERVICE: service})
            info = self._methods[full_method] = _Method(name, service, short, attributes)
        return info

    def start(self, info: _Method, parent: Context | None = None):
        """(span or None, start time); the span is not made current here."""
        span = None
        if self.tracer is not None:
            span = self.tracer.start_span(
                info.name, context=parent, kind=self.kind, attributes=info.span_attributes
            )
        return span, time.perf_counter()

    def finish(
        self, span, started: float, info: _Method, code: grpc.StatusCode, exc: BaseException | None = None
    ) -> None:
        elapsed = time.perf_counter() - started
        if span is not None:
            span.set_attribute(names.RPC_RESPONSE_STATUS_CODE, code.name)
            if self.old:
                span.set_attribute(names.OLD_RPC_GRPC_STATUS_CODE, code.value[0])
            if code is not grpc.StatusCode.OK:
                span.set_attribute(names.ERROR_TYPE, code.name)
                if self.side == "client" or code in _SERVER_ERROR_CODES:
                    span.set_status(Status(StatusCode.ERROR, code.name))
                if exc is not None and not isinstance(
                    exc, (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit, grpc.aio.AioRpcError)
                ):
                    span.record_exception(exc)
            span.end()
        if self._duration is not None:
            attributes, old_attributes = self._metric_attributes_for(info, code)
            self._duration.record(elapsed, attributes)
            if self._old_duration is not None:
                self._old_duration.record(elapsed * 1000.0, old_attributes)

    def _metric_attributes_for(self, info: _Method, code: grpc.StatusCode) -> tuple[dict, dict | None]:
        key = (info.name, code)
        cached = self._metric_attributes.get(key)
        if cached is None:
            attributes = {
                names.RPC_SYSTEM_NAME: "grpc",
                names.RPC_METHOD: info.name,
                names.RPC_RESPONSE_STATUS_CODE: code.name,
                **self._peer,
            }
            if code is not grpc.StatusCode.OK:
                attributes[names.ERROR_TYPE] = code.name
            old = None
            if self.old:
                old = {
                    names.OLD_RPC_SYSTEM: "grpc",
                    names.OLD_RPC_SERVICE: info.service,
                    names.RPC_METHOD: info.short,
                    names.OLD_RPC_GRPC_STATUS_CODE: code.value[0],
                    **self._peer,
                }
            cached = self._metric_attributes[key] = (attributes, old)
        return cached


# ---- server ------------------------------------------------------------------------------------


def _server_code(context, exc: BaseException | None) -> grpc.StatusCode:
    """The status the call ends with: what the handler set or aborted with, else by outcome."""
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 -- an old grpc without code(): judge by the outcome
        code = None
    if isinstance(code, grpc.StatusCode):
        return code
    if exc is None:
        return grpc.StatusCode.OK
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


_HANDLER_FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _replaced(handler, **behavior):
    """``handler`` with one behaviour swapped (grpc's handlers are namedtuples; others rebuilt)."""
    if hasattr(handler, "_replace"):
        return handler._replace(**behavior)
    ((arity, function),) = behavior.items()
    return _HANDLER_FACTORIES[arity](
        function,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class TelemetryServerInterceptor(grpc.aio.ServerInterceptor):
    """A SERVER span (child of the caller's context, current while the handler runs) and a
    duration measurement for every call, except to :data:`UNOBSERVED_SERVICES`."""

    def __init__(self, observer: RpcObserver) -> None:
        self._observer = observer

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        info = self._observer.method(handler_call_details.method)
        if info.service in UNOBSERVED_SERVICES:
            return handler
        metadata = handler_call_details.invocation_metadata
        if handler.unary_unary is not None:
            return _replaced(handler, unary_unary=self._unary(handler.unary_unary, info, metadata))
        if handler.stream_unary is not None:
            return _replaced(handler, stream_unary=self._unary(handler.stream_unary, info, metadata))
        if handler.unary_stream is not None:
            return _replaced(handler, unary_stream=self._streaming(handler.unary_stream, info, metadata))
        if handler.stream_stream is not None:
            return _replaced(handler, stream_stream=self._streaming(handler.stream_stream, info, metadata))
        return handler

    def _begin(self, info: _Method, metadata):
        observer = self._observer
        parent = extract_context(metadata) if observer.tracer is not None else None
        span, started = observer.start(info, parent)
        ctx = trace.set_span_in_context(span, parent) if span is not None else None
        return span, started, ctx

    def _unary(self, behavior, info: _Method, metadata):
        observer = self._observer

        async def observed(request, context):
            span, started, ctx = self._begin(info, metadata)
            token = otel_context.attach(ctx) if ctx is not None else None
            try:
                response = behavior(request, context)
                if inspect.isawaitable(response):
                    response = await response
            except BaseException as exc:
                observer.finish(span, started, info, _server_code(context, exc), exc)
                raise
            finally:
                if token is not None:
                    otel_context.detach(token)
            observer.finish(span, started, info, _server_code(context, None))
            return response

        return observed

    def _streaming(self, behavior, info: _Method, metadata):
        observer = self._observer

        async def observed(request, context):
            span, started, ctx = self._begin(info, metadata)
            try:
                # The span's context is current only while the handler's code runs (each step
                # below), never across our own yields: the caller may resume or close this
                # generator from another context.
                token = otel_context.attach(ctx) if ctx is not None else None
                try:
                    produced = behavior(request, context)
                    if inspect.isawaitable(produced):  # a handler that writes with context.write
                        produced = await produced
                finally:
                    if token is not None:
                        otel_context.detach(token)
                if produced is not None:
                    async for item in _steps(produced, ctx):
                        yield item
            except BaseException as exc:
                observer.finish(span, started, info, _server_code(context, exc), exc)
                raise
            observer.finish(span, started, info, _server_code(context, None))

        return observed


async def _steps(produced, ctx: Context | None):
    """Iterate a handler's responses (async or plain iterator), each step under ``ctx``."""
    if not hasattr(produced, "__anext__"):
        if hasattr(produced, "__aiter__"):
            produced = produced.__aiter__()
        else:
            for item in produced:
                yield item
            return
    while True:
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            item = await produced.__anext__()
        except StopAsyncIteration:
            return
        finally:
            if token is not None:
                otel_context.detach(token)
        yield item


# ---- client ------------------------------------------------------------------------------------


class _ClientBase:
    def __init__(self, observer: RpcObserver) -> None:
        self._observer = observer

    def _begin(self, client_call_details):
        """(details with trace headers, method info, span, start time)."""
        observer = self._observer
        info = observer.method(client_call_details.method)
        span, started = observer.start(info)
        if span is not None:
            metadata = inject_metadata(client_call_details.metadata, ctx=trace.set_span_in_context(span))
            client_call_details = grpc.aio.ClientCallDetails(
                client_call_details.method,
                client_call_details.timeout,
                grpc.aio.Metadata(*metadata),
                client_call_details.credentials,
                client_call_details.wait_for_ready,
            )
        return client_call_details, info, span, started

    async def _observe_unary(self, continuation, client_call_details, request):
        details, info, span, started = self._begin(client_call_details)
        call = None
        try:
            call = await continuation(details, request)
            code = await call.code()
        except asyncio.CancelledError as exc:
            if call is not None:
                call.cancel()  # the caller gave up: do not leave the RPC running behind it
            self._observer.finish(span, started, info, grpc.StatusCode.CANCELLED, exc)
            raise
        except BaseException as exc:
            self._observer.finish(span, started, info, _client_code(exc), exc)
            raise
        self._observer.finish(span, started, info, code)
        return call

    async def _observe_streaming(self, continuation, client_call_details, request_or_iterator):
        details, info, span, started = self._begin(client_call_details)
        try:
            call = await continuation(details, request_or_iterator)
        except BaseException as exc:
            self._observer.finish(span, started, info, _client_code(exc), exc)
            raise
        call.add_done_callback(lambda done: self._finish_when_done(done, span, started, info))
        return call

    def _finish_when_done(self, call, span, started: float, info: _Method) -> None:
        async def finish() -> None:
            try:
                code = grpc.StatusCode.CANCELLED if call.cancelled() else await call.code()
            except Exception:  # noqa: BLE001 -- the status is gone with the channel
                code = grpc.StatusCode.UNKNOWN
            self._observer.finish(span, started, info, code)

        try:
            asyncio.get_running_loop().create_task(finish())
        except RuntimeError:  # the loop is closing: end the span without a status
            self._observer.finish(span, started, info, grpc.StatusCode.CANCELLED)


def _client_code(exc: BaseException) -> grpc.StatusCode:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


class _UnaryUnary(_ClientBase, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await self._observe_unary(continuation, client_call_details, request)


class _UnaryStream(_ClientBase, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await self._observe_streaming(continuation, client_call_details, request)


class _StreamUnary(_ClientBase, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        # Not awaited here: the caller may still have to write the requests (call.write).
        return await self._observe_streaming(continuation, client_call_details, request_iterator)


class _StreamStream(_ClientBase, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await self._observe_streaming(continuation, client_call_details, request_iterator)


def make_client_interceptors(observer: RpcObserver) -> list[grpc.aio.ClientInterceptor]:
    """One interceptor per call arity (grpc.aio files each interceptor under one arity only)."""
    if not observer.active:
        return []
    return [_UnaryUnary(observer), _UnaryStream(observer), _StreamUnary(observer), _StreamStream(observer)]


def make_server_interceptors(observer: RpcObserver) -> list[grpc.aio.ServerInterceptor]:
    return [TelemetryServerInterceptor(observer)] if observer.active else []
