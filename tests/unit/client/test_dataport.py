"""The SDK's raw data connection and transport against a scripted gateway on loopback.

The scripted gateway speaks the frame format (``services/dataport``) and answers what each test
tells it to, so the client's bookkeeping -- correlation ids, broken connections, error frames,
refused handshakes, the gRPC fallback -- is checked without a cluster.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from types import SimpleNamespace

import pytest

from gateway.client.dataport import DataConnection, RawTransport, parse_data_path
from gateway.client.errors import NetworkError, UnsupportedVersionError
from gateway.client.throttle import Throttles
from services import errors
from services.dataport import protocol as dp
from services.proto import pb


def run_async(test):
    """Run an ``async def`` test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(asyncio.wait_for(test(), 30))

    return run


class ScriptedGateway:
    """Handshakes (or refuses) in ``version``, then hands each request body to ``on_request``."""

    def __init__(self, *, refuse: bool = False, on_request=None, version: int = dp.MAX_VERSION) -> None:
        self.refuse = refuse
        self.version = version
        self.on_request = on_request
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> ScriptedGateway:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer) -> None:
        self.writers.append(writer)
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        dp.decode_handshake(await reader.readexactly(size))
        if self.refuse:
            writer.write(dp.encode_handshake_answer(dp.HandshakeAnswer(35, -1, 7, 9, 0, "only 7..9")))
            writer.close()
            return
        writer.write(
            dp.encode_handshake_answer(
                dp.HandshakeAnswer(0, self.version, dp.MIN_VERSION, dp.MAX_VERSION, dp.MAX_REQUEST_FRAME)
            )
        )
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                body = await reader.readexactly(size)
                self.requests.append(body)
                if self.on_request is not None:
                    self.on_request(writer, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


def _answer_ok(writer, body) -> None:
    request = dp.decode_produce_request(body)
    writer.write(
        dp.encode_produce_response(
            dp.ProduceResponse(
                request.correlation_id,
                0,
                "",
                [dp.PartitionProduceResult(p, 0, 10 * p, -1, 0, 1) for p, _ in request.partitions],
            )
        )
    )


def _request(acks=pb.ACKS_LEADER):
    request = pb.ProduceRequest(topic="t", acks=acks, timeout_ms=1000)
    request.batches.add(partition=0, record_batches=b"batch-0")
    request.batches.add(partition=2, record_batches=b"batch-2")
    return request


class _Client:
    """What RawTransport uses of GatewayClient: GetMetadata (the data address) and an endpoint."""

    def __init__(self, data_address: str) -> None:
        self.client_id = "unit"
        self.tls = None  # plaintext
        self.token_source = None
        self.data_address = data_address
        self.metadata_calls = 0
        self.pool = SimpleNamespace(current=lambda: SimpleNamespace(address="127.0.0.1:1"))
        self.produce_throttles = Throttles("produce")
        self.fetch_throttles = Throttles("fetch")

    async def call_with_retry(self, method, request, **_):
        assert method == "GetMetadata"
        self.metadata_calls += 1
        return pb.GetMetadataResponse(data_address=self.data_address)


class _Fallback:
    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, request, timeout_s):
        self.sent.append(request)
        return pb.ProduceResponse(topic=request.topic)

    async def close(self, timeout_s=30.0):
        pass


def test_data_path_setting_is_checked():
    assert parse_data_path("auto") == "auto" and parse_data_path("grpc") == "grpc"
    with pytest.raises(ValueError, match="data_path"):
        parse_data_path("raw")


@run_async
async def test_answers_are_matched_by_correlation_id_and_converted():
    async with ScriptedGateway(on_request=_answer_ok) as gateway:
        transport = RawTransport(_Client(f"0.0.0.0:{gateway.port}"), _Fallback())
        responses = await asyncio.gather(*(transport.send(_request(), 5.0) for _ in range(3)))
        await transport.close(1.0)
    assert [r.correlation_id for r in responses] == [1, 2, 3]
    assert [(p.partition, p.base_offset, p.HasField("error")) for p in responses[0].partitions] == [
        (0, 0, False),
        (2, 20, False),
    ]
    sent = dp.decode_produce_request(gateway.requests[0])
    assert (sent.acks, sent.topic) == (1, "t")
    assert [(p, bytes(d)) for p, d in sent.partitions] == [(0, b"batch-0"), (2, b"batch-2")]


@run_async
async def test_acks_zero_is_done_once_written():
    async with ScriptedGateway() as gateway:
        transport = RawTransport(_Client(f"127.0.0.1:{gateway.port}"), _Fallback())
        response = await transport.send(_request(pb.ACKS_NONE), 5.0)
        assert [p.base_offset for p in response.partitions] == [-1, -1]
        await transport.close(1.0)
    assert dp.decode_produce_request(gateway.requests[0]).acks == 0


@run_async
async def test_a_broken_connection_fails_unanswered_requests_retriably_and_reconnects():
    async with ScriptedGateway() as gateway:
        client = _Client(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        pending = asyncio.ensure_future(transport.send(_request(), 5.0))
        while not gateway.requests:
            await asyncio.sleep(0.01)
        gateway.writers[0].transport.abort()  # the gateway goes away without answering
        with pytest.raises(NetworkError) as caught:
            await pending
        assert caught.value.retriable
        gateway.on_request = _answer_ok
        response = await transport.send(_request(), 5.0)  # a new connection, looked up again
        await transport.close(1.0)
    assert response.partitions[0].base_offset == 0
    assert client.metadata_calls == 2 and transport.connections_opened == 2


@run_async
async def test_an_error_frame_fails_the_named_request_with_its_error_and_the_rest_retriably():
    def refuse_second(writer, body):
        request = dp.decode_produce_request(body)
        if request.correlation_id == 2:
            writer.write(dp.encode_error(2, errors.InvalidRequestError("bad frame")))

    async with ScriptedGateway(on_request=refuse_second) as gateway:
        transport = RawTransport(_Client(f"127.0.0.1:{gateway.port}"), _Fallback())
        outcomes = await asyncio.gather(
            *(transport.send(_request(), 5.0) for _ in range(3)), return_exceptions=True
        )
        await transport.close(1.0)
    assert isinstance(outcomes[1], errors.InvalidRequestError)
    assert isinstance(outcomes[0], NetworkError) and isinstance(outcomes[2], NetworkError)


@run_async
async def test_a_refused_handshake_falls_back_to_grpc_for_good():
    async with ScriptedGateway(refuse=True) as gateway:
        with pytest.raises(UnsupportedVersionError):
            await DataConnection.open("127.0.0.1", gateway.port, client_id="unit", timeout_s=5.0)
        fallback = _Fallback()
        transport = RawTransport(_Client(f"127.0.0.1:{gateway.port}"), fallback)
        await transport.send(_request(), 5.0)
        await transport.send(_request(), 5.0)
        await transport.close(1.0)
    assert len(fallback.sent) == 2 and not transport.using_raw


@run_async
async def test_no_data_address_means_grpc():
    fallback = _Fallback()
    client = _Client("")
    transport = RawTransport(client, fallback)
    await transport.send(_request(), 5.0)
    await transport.send(_request(), 5.0)
    assert len(fallback.sent) == 2 and client.metadata_calls == 1


def _answer_throttled(throttle_ms: int, version: int):
    def answer(writer, body) -> None:
        request = dp.decode_produce_request(body)
        writer.write(
            dp.encode_produce_response(
                dp.ProduceResponse(
                    request.correlation_id,
                    0,
                    "",
                    [dp.PartitionProduceResult(p, 0, 0, -1, 0, 1) for p, _ in request.partitions],
                    throttle_ms,
                ),
                version,
            )
        )

    return answer


@run_async
async def test_a_throttled_answer_holds_the_next_request_that_long():
    """KIP-219 on the client: the answer's throttle_time_ms holds the next request to that
    gateway; requests waiting for it go out in order; the producer's metrics count it."""
    async with ScriptedGateway(on_request=_answer_throttled(300, 2)) as gateway:
        client = _Client(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        first = await transport.send(_request(), 5.0)
        assert first.throttle_time_ms == 300
        loop = asyncio.get_running_loop()
        started = loop.time()
        later = await asyncio.gather(*(transport.send(_request(), 5.0) for _ in range(3)))
        waited = loop.time() - started
        await transport.close(1.0)
    assert waited >= 0.29
    assert [r.correlation_id for r in later] == [2, 3, 4]  # written in the order sent
    metrics = client.produce_throttles.metrics()
    assert metrics["produce-throttled-requests"] == 4
    assert metrics["produce-throttle-time-max"] == 300
    assert metrics["produce-throttle-time-avg"] == 300


@run_async
async def test_a_version_1_gateway_answers_without_throttle_times():
    async with ScriptedGateway(on_request=_answer_throttled(300, 1), version=1) as gateway:
        client = _Client(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        responses = await asyncio.gather(*(transport.send(_request(), 5.0) for _ in range(2)))
        await transport.close(1.0)
    assert [r.throttle_time_ms for r in responses] == [0, 0]
    assert [r.partitions[0].base_offset for r in responses] == [0, 0]
    assert client.produce_throttles.metrics()["produce-throttled-requests"] == 0
