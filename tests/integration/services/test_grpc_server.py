"""The shared server factory and error edge, on a real grpc.aio server bound to loopback port 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services import errors
from services.grpc_server import ServiceRegistration, create_server, translate_errors
from services.proto import GATEWAY_SERVICE, gateway_grpc, pb


class _Servicer(gateway_grpc.GatewayServicer):
    @translate_errors
    async def Produce(self, request, context):
        if request.topic == "moved":
            raise errors.NotLeaderOrFollowerError("partition moved to node 2")
        if request.topic == "boom":
            raise ZeroDivisionError("division by zero")
        return pb.ProduceResponse(topic=request.topic, correlation_id=request.correlation_id)

    @translate_errors
    async def ProduceStream(self, request_iterator, context):
        async for request in request_iterator:
            if request.topic == "bad":
                raise errors.InvalidTopicError("topic name 'bad' is reserved")
            yield pb.ProduceResponse(topic=request.topic, correlation_id=request.correlation_id)


async def _with_server(body):
    server = await create_server(
        "127.0.0.1:0",
        [ServiceRegistration(gateway_grpc.add_GatewayServicer_to_server, _Servicer(), GATEWAY_SERVICE)],
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            return await body(channel)
    finally:
        await server.stop(0)


def test_binds_port_zero_health_and_reflection():
    async def body(channel):
        health = health_pb2_grpc.HealthStub(channel)
        overall = await health.Check(health_pb2.HealthCheckRequest(service=""))
        gateway = await health.Check(health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE))
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        names = []
        async for response in stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        ):
            names = [s.name for s in response.list_services_response.service]
        return overall.status, gateway.status, names

    overall, gateway, names = asyncio.run(_with_server(body))
    assert overall == gateway == health_pb2.HealthCheckResponse.SERVING
    assert GATEWAY_SERVICE in names and "grpc.health.v1.Health" in names


def _reflect_v1(channel, request):
    """One grpc.reflection.v1 exchange, over the wire (v1 and v1alpha messages are the same bytes)."""
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return call(iter([request]))


def test_reflection_v1_lists_and_describes_the_services():
    async def body(channel):
        listed = [
            r async for r in _reflect_v1(channel, reflection_pb2.ServerReflectionRequest(list_services=""))
        ]
        gateway_files = [
            r
            async for r in _reflect_v1(
                channel, reflection_pb2.ServerReflectionRequest(file_containing_symbol=GATEWAY_SERVICE)
            )
        ]
        v1_files = [
            r
            async for r in _reflect_v1(
                channel,
                reflection_pb2.ServerReflectionRequest(
                    file_containing_symbol="grpc.reflection.v1.ServerReflection"
                ),
            )
        ]
        return listed, gateway_files, v1_files

    listed, gateway_files, v1_files = asyncio.run(_with_server(body))
    names = {s.name for s in listed[0].list_services_response.service}
    assert {GATEWAY_SERVICE, "grpc.health.v1.Health"} <= names
    assert {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"} <= names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in gateway_files[0].file_descriptor_response.file_descriptor_proto
    ]
    assert any(f.name == "tributary/v1/gateway.proto" and f.service[0].name == "Gateway" for f in files)
    (v1,) = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in v1_files[0].file_descriptor_response.file_descriptor_proto
    ]
    assert v1.name == "grpc/reflection/v1/reflection.proto" and v1.package == "grpc.reflection.v1"
    method = v1.service[0].method[0]
    assert (method.input_type, method.output_type) == (
        ".grpc.reflection.v1.ServerReflectionRequest",
        ".grpc.reflection.v1.ServerReflectionResponse",
    )
    assert not any("v1alpha" in f.type_name for m in v1.message_type for f in m.field)


def test_domain_error_becomes_status_with_reason():
    async def body(channel):
        stub = gateway_grpc.GatewayStub(channel)
        ok = await stub.Produce(pb.ProduceRequest(topic="fine", correlation_id=5))
        try:
            await stub.Produce(pb.ProduceRequest(topic="moved"))
        except grpc.aio.AioRpcError as exc:
            return ok, exc

    ok, exc = asyncio.run(_with_server(body))
    assert ok.correlation_id == 5
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    typed = errors.error_from_rpc(exc)
    assert isinstance(typed, errors.NotLeaderOrFollowerError)
    assert typed.message == "partition moved to node 2" and typed.retriable


def test_unexpected_exception_is_unknown_server_error_not_a_crash():
    async def body(channel):
        stub = gateway_grpc.GatewayStub(channel)
        try:
            await stub.Produce(pb.ProduceRequest(topic="boom"))
        except grpc.aio.AioRpcError as exc:
            after = await stub.Produce(pb.ProduceRequest(topic="fine", correlation_id=1))
            return exc, after

    exc, after = asyncio.run(_with_server(body))
    assert exc.code() == grpc.StatusCode.INTERNAL
    typed = errors.error_from_rpc(exc)
    assert typed.reason == "UNKNOWN_SERVER_ERROR" and "ZeroDivisionError" in typed.message
    assert after.correlation_id == 1  # the server kept serving


def test_streaming_error_after_some_answers():
    async def body(channel):
        stub = gateway_grpc.GatewayStub(channel)
        requests = [
            pb.ProduceRequest(topic="a", correlation_id=1),
            pb.ProduceRequest(topic="bad", correlation_id=2),
        ]
        call = stub.ProduceStream(iter(requests))
        got = []
        try:
            async for response in call:
                got.append(response.correlation_id)
        except grpc.aio.AioRpcError as exc:
            return got, exc

    got, exc = asyncio.run(_with_server(body))
    assert got == [1]
    assert isinstance(errors.error_from_rpc(exc), errors.InvalidTopicError)


def test_an_undecodable_message_mid_stream_is_invalid_request_after_the_earlier_answers():
    async def body(channel):
        raw = channel.stream_stream("/tributary.v1.Gateway/ProduceStream")
        messages = [pb.ProduceRequest(topic="a", correlation_id=1).SerializeToString(), b"\x0f\xff"]
        got = []
        try:
            async for response in raw(iter(messages)):
                got.append(pb.ProduceResponse.FromString(response).correlation_id)
        except grpc.aio.AioRpcError as exc:
            after = await gateway_grpc.GatewayStub(channel).Produce(pb.ProduceRequest(topic="fine"))
            return got, exc, after

    got, exc, after = asyncio.run(_with_server(body))
    assert got == [1]
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    typed = errors.error_from_rpc(exc)
    assert isinstance(typed, errors.InvalidRequestError)
    assert "not a valid tributary.v1.ProduceRequest" in typed.message
    assert after.topic == "fine"


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from services.grpc_server import ServiceRegistration, create_server, run_until_signalled
    from services.proto import GATEWAY_SERVICE, gateway_grpc

    async def main():
        server = await create_server("127.0.0.1:0", [ServiceRegistration(
            gateway_grpc.add_GatewayServicer_to_server, gateway_grpc.GatewayServicer(), GATEWAY_SERVICE)])
        async def cleanup():
            print("cleanup ran", flush=True)
        print(server.port, flush=True)
        await run_until_signalled(server, cleanup, grace=1)

    asyncio.run(main())
    """
)


def test_sigterm_shuts_down_gracefully_and_runs_cleanup():
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )  # the repo
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=root
    )
    port = int(proc.stdout.readline())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert "cleanup ran" in out
