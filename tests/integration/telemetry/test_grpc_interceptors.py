"""The grpc.aio interceptors against a real loopback server: every arity, status codes, errors,
cancellation, context while the handler runs, skipped health checks, the old conventions.

The server hosts a small bytes-in/bytes-out ``test.Echo`` service through ``create_server`` (so
health and reflection are registered exactly as in the services).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.grpc_server import ServiceRegistration, create_server
from services.telemetry import Telemetry, names, telemetry_settings


class Echo:
    """Handlers of ``test.Echo``; ``inner`` spans prove the server span is current in them."""

    def __init__(self, tracer) -> None:
        self.tracer = tracer
        self.started = asyncio.Event()

    async def say(self, request: bytes, context) -> bytes:
        with self.tracer.start_as_current_span("inner-say"):
            pass
        if request == b"missing":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        if request == b"boom":
            raise RuntimeError("handler bug")
        if request == b"slow":
            self.started.set()
            await asyncio.sleep(30)
        return b"echo:" + request

    async def repeat(self, request: bytes, context):
        for i in range(3):
            with self.tracer.start_as_current_span(f"inner-repeat-{i}"):
                pass
            yield request + b"%d" % i

    async def chat(self, request_iterator, context):
        async for request in request_iterator:
            with self.tracer.start_as_current_span("inner-chat"):
                pass
            yield request.upper()


def _add(echo: Echo):
    def add(servicer, server) -> None:
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Echo",
                    {
                        "Say": grpc.unary_unary_rpc_method_handler(echo.say),
                        "Repeat": grpc.unary_stream_rpc_method_handler(echo.repeat),
                        "Chat": grpc.stream_stream_rpc_method_handler(echo.chat),
                    },
                ),
            )
        )

    return add


def _telemetry(service: str, spans: InMemorySpanExporter, env=None):
    reader = InMemoryMetricReader()
    telemetry = Telemetry.create(
        telemetry_settings(service, env=env or {}),
        span_processors=[SimpleSpanProcessor(spans)],
        metric_readers=[reader],
    )
    return telemetry, reader


def run(scenario, env=None):
    """``await scenario(ctx)`` with a server and a client channel, both instrumented."""
    spans = InMemorySpanExporter()
    server_telemetry, server_reader = _telemetry("server", spans, env)
    client_telemetry, client_reader = _telemetry("client", spans, env)

    class Ctx:
        pass

    async def main():
        ctx = Ctx()
        ctx.spans, ctx.server_reader, ctx.client_reader = spans, server_reader, client_reader
        ctx.client_tracer = client_telemetry.tracer
        ctx.echo = Echo(server_telemetry.tracer)
        hosted = await create_server(
            "127.0.0.1:0",
            [ServiceRegistration(_add(ctx.echo), None, "test.Echo")],
            interceptors=server_telemetry.server_interceptors(),
        )
        target = f"127.0.0.1:{hosted.port}"
        ctx.port = hosted.port
        async with grpc.aio.insecure_channel(
            target, interceptors=client_telemetry.client_interceptors(target)
        ) as ch:
            ctx.channel = ch
            try:
                await asyncio.wait_for(scenario(ctx), 20)
            finally:
                await hosted.stop(0)

    asyncio.run(main())
    server_telemetry.shutdown()
    client_telemetry.shutdown()


def by_name(spans, name, kind=None):
    return [s for s in spans.get_finished_spans() if s.name == name and (kind is None or s.kind == kind)]


def durations(reader, name):
    data = reader.get_metrics_data()
    if data is None:  # nothing recorded at all
        return {}
    return {
        tuple(sorted(p.attributes.items())): p.count
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
    }


async def settle(spans, count: int, name: str) -> None:
    """Streaming client spans end in a done callback: wait until ``count`` ``name`` spans ended."""
    for _ in range(100):
        if len(by_name(spans, name)) >= count:
            return
        await asyncio.sleep(0.01)


def test_unary_call_ok_error_and_handler_bug():
    async def scenario(ctx):
        say = ctx.channel.unary_unary("/test.Echo/Say")
        with ctx.client_tracer.start_as_current_span("application") as app:
            assert await say(b"hi") == b"echo:hi"
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await say(b"missing")
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as boom:
            await say(b"boom")
        assert boom.value.code() is grpc.StatusCode.UNKNOWN

        clients = sorted(by_name(ctx.spans, "test.Echo/Say", SpanKind.CLIENT), key=lambda s: s.start_time)
        servers = {s.parent.span_id: s for s in by_name(ctx.spans, "test.Echo/Say", SpanKind.SERVER)}
        assert len(clients) == 3 and len(servers) == 3
        # The first call ran under the application's span: the whole call joins its trace.
        assert clients[0].parent.span_id == app.get_span_context().span_id
        assert clients[0].context.trace_id == app.get_span_context().trace_id
        expected = [
            ("OK", StatusCode.UNSET, StatusCode.UNSET),
            ("NOT_FOUND", StatusCode.ERROR, StatusCode.UNSET),
            ("UNKNOWN", StatusCode.ERROR, StatusCode.ERROR),
        ]
        for client, (code, client_status, server_status) in zip(clients, expected, strict=True):
            server = servers[client.context.span_id]
            assert server.context.trace_id == client.context.trace_id
            for span in (client, server):
                assert span.attributes[names.RPC_RESPONSE_STATUS_CODE] == code
                assert span.attributes[names.RPC_METHOD] == "test.Echo/Say"
                assert (names.ERROR_TYPE in span.attributes) == (code != "OK")
            assert client.status.status_code is client_status
            assert server.status.status_code is server_status  # NOT_FOUND is the caller's problem
            (inner,) = [
                s for s in by_name(ctx.spans, "inner-say") if s.parent.span_id == server.context.span_id
            ]
            assert inner.context.trace_id == client.context.trace_id
        assert client.attributes[names.SERVER_ADDRESS] == "127.0.0.1"
        assert client.attributes[names.SERVER_PORT] == ctx.port
        assert [e.name for e in servers[clients[2].context.span_id].events] == ["exception"]

        server_counts = {
            dict(k)[names.RPC_RESPONSE_STATUS_CODE]: v
            for k, v in durations(ctx.server_reader, names.RPC_SERVER_CALL_DURATION).items()
        }
        assert server_counts == {"OK": 1, "NOT_FOUND": 1, "UNKNOWN": 1}
        client_counts = {
            dict(k)[names.RPC_RESPONSE_STATUS_CODE]: v
            for k, v in durations(ctx.client_reader, names.RPC_CLIENT_CALL_DURATION).items()
        }
        assert client_counts == {"OK": 1, "NOT_FOUND": 1, "UNKNOWN": 1}

    run(scenario)


def test_streaming_calls_end_their_spans_when_done_and_keep_the_context_in_handlers():
    async def scenario(ctx):
        repeat = ctx.channel.unary_stream("/test.Echo/Repeat")
        assert [m async for m in repeat(b"r")] == [b"r0", b"r1", b"r2"]
        chat = ctx.channel.stream_stream("/test.Echo/Chat")

        async def requests():
            for word in (b"a", b"b"):
                yield word

        assert [m async for m in chat(requests())] == [b"A", b"B"]
        await settle(ctx.spans, 2, "test.Echo/Repeat")
        await settle(ctx.spans, 2, "test.Echo/Chat")

        for method, inner_names in (
            ("Repeat", {"inner-repeat-0", "inner-repeat-1", "inner-repeat-2"}),
            ("Chat", {"inner-chat"}),
        ):
            (client,) = by_name(ctx.spans, f"test.Echo/{method}", SpanKind.CLIENT)
            (server,) = by_name(ctx.spans, f"test.Echo/{method}", SpanKind.SERVER)
            assert server.parent.span_id == client.context.span_id
            assert client.attributes[names.RPC_RESPONSE_STATUS_CODE] == "OK"
            assert server.attributes[names.RPC_RESPONSE_STATUS_CODE] == "OK"
            inner = [s for s in ctx.spans.get_finished_spans() if s.name in inner_names]
            assert inner and all(s.parent.span_id == server.context.span_id for s in inner)
            assert all(server.start_time <= s.start_time and s.end_time <= server.end_time for s in inner)

    run(scenario)


def test_a_cancelled_call_ends_both_spans_cancelled():
    async def scenario(ctx):
        call = asyncio.ensure_future(ctx.channel.unary_unary("/test.Echo/Say")(b"slow"))
        await ctx.echo.started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await settle(ctx.spans, 1, "test.Echo/Say")
        (client,) = by_name(ctx.spans, "test.Echo/Say", SpanKind.CLIENT)
        assert client.attributes[names.RPC_RESPONSE_STATUS_CODE] == "CANCELLED"
        for _ in range(200):  # the server notices the cancellation asynchronously
            if by_name(ctx.spans, "test.Echo/Say", SpanKind.SERVER):
                break
            await asyncio.sleep(0.01)
        (server,) = by_name(ctx.spans, "test.Echo/Say", SpanKind.SERVER)
        assert server.attributes[names.RPC_RESPONSE_STATUS_CODE] == "CANCELLED"

    run(scenario)


def test_health_checks_are_not_traced_on_the_server():
    async def scenario(ctx):
        answer = await health_pb2_grpc.HealthStub(ctx.channel).Check(
            health_pb2.HealthCheckRequest(service="")
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert by_name(ctx.spans, "grpc.health.v1.Health/Check", SpanKind.SERVER) == []
        assert len(by_name(ctx.spans, "grpc.health.v1.Health/Check", SpanKind.CLIENT)) == 1
        assert durations(ctx.server_reader, names.RPC_SERVER_CALL_DURATION) == {}

    run(scenario)


def test_rpc_dup_also_emits_the_old_conventions():
    async def scenario(ctx):
        assert await ctx.channel.unary_unary("/test.Echo/Say")(b"x") == b"echo:x"
        (server,) = by_name(ctx.spans, "test.Echo/Say", SpanKind.SERVER)
        assert server.attributes[names.RPC_SYSTEM_NAME] == "grpc"
        assert server.attributes[names.OLD_RPC_SYSTEM] == "grpc"
        assert server.attributes[names.OLD_RPC_SERVICE] == "test.Echo"
        assert server.attributes[names.OLD_RPC_GRPC_STATUS_CODE] == 0
        old = durations(ctx.server_reader, names.OLD_RPC_SERVER_DURATION)
        assert old == {
            tuple(
                sorted(
                    {
                        names.OLD_RPC_SYSTEM: "grpc",
                        names.OLD_RPC_SERVICE: "test.Echo",
                        names.RPC_METHOD: "Say",
                        names.OLD_RPC_GRPC_STATUS_CODE: 0,
                    }.items()
                )
            ): 1
        }
        assert len(durations(ctx.server_reader, names.RPC_SERVER_CALL_DURATION)) == 1
        assert len(durations(ctx.client_reader, names.OLD_RPC_CLIENT_DURATION)) == 1

    run(scenario, env={"OTEL_SEMCONV_STABILITY_OPT_IN": "http, rpc/dup"})


def test_without_telemetry_there_are_no_interceptors_and_no_trace_headers():
    seen = []

    async def main():
        def add(servicer, server) -> None:
            async def say(request, context):
                seen.extend(key for key, _ in context.invocation_metadata())
                return request

            server.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(
                        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
                    ),
                )
            )

        off = Telemetry.disabled()
        hosted = await create_server(
            "127.0.0.1:0",
            [ServiceRegistration(add, None, "test.Echo")],
            interceptors=off.server_interceptors(),
        )
        target = f"127.0.0.1:{hosted.port}"
        async with grpc.aio.insecure_channel(
            target, interceptors=off.client_interceptors(target) or None
        ) as ch:
            tracer = trace.get_tracer("test")  # the API's no-op tracer: nothing configured
            with tracer.start_as_current_span("app"):
                assert await ch.unary_unary("/test.Echo/Say")(b"x") == b"x"
        await hosted.stop(0)

    asyncio.run(main())
    assert "traceparent" not in seen
