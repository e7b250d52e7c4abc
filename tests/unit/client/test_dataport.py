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

from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.dataport import READ_BUFFER_BYTES, DataConnection, RawTransport, parse_data_path
from gateway.client.errors import NetworkError, UnsupportedVersionError
from gateway.client.metadata import MetadataCache
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.throttle import Throttles
from services import errors
from services.clock import SYSTEM_CLOCK
from services.dataport import protocol as dp
from services.proto import pb
from services.records import iter_batches


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
                self._received(writer, await reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    def _received(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        self.requests.append(body)
        if self.on_request is not None:
            self.on_request(writer, body)


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


# ---- the sender writing its requests itself (``Sender._write_direct``) ------------------------


class LogGateway:
    """A gateway that keeps a log per partition: an answered request's records are appended
    (acks=0 ones at once, unanswered); answers wait ``delay`` s. Counts requests that name a
    partition with an earlier request still unanswered (``overlaps``). ``drop_at``: the
    connection is cut when that request (1-based) arrives, before it is appended."""

    def __init__(self, *, delay: float = 0.0, drop_at: int | None = None) -> None:
        self.delay = delay
        self.drop_at = drop_at
        self.logs: dict[int, list[bytes | None]] = {}
        self.outstanding: set[int] = set()
        self.overlaps = 0
        self.count = 0

    def __call__(self, writer, body) -> None:
        request = dp.decode_produce_request(body)
        self.count += 1
        if self.count == self.drop_at:
            writer.transport.abort()
            return
        partitions = {p for p, _ in request.partitions}
        if partitions & self.outstanding:
            self.overlaps += 1
        results = []
        for p, data in request.partitions:
            values = [r.value for batch in iter_batches(bytes(data)) for r in batch.records()]
            log = self.logs.setdefault(p, [])
            results.append(dp.PartitionProduceResult(p, 0, len(log), -1, 0, len(values)))
            log.extend(values)
        if request.acks == 0:
            return
        self.outstanding |= partitions
        answer = dp.encode_produce_response(dp.ProduceResponse(request.correlation_id, 0, "", results))

        def send() -> None:
            self.outstanding -= partitions
            if not writer.transport.is_closing():
                writer.write(answer)

        if self.delay:
            asyncio.get_running_loop().call_later(self.delay, send)
        else:
            send()


class _SenderClient(_Client):
    """What the Sender uses of GatewayClient too: the clock and the metadata cache."""

    def __init__(self, data_address: str) -> None:
        super().__init__(data_address)
        self.clock = SYSTEM_CLOCK
        self.metadata = MetadataCache()


async def _produce_over_raw(gateway, values, *, acks=1, partitions=1, batch_size=100, max_in_flight=5):
    """Run a Sender over a RawTransport to ``gateway``; returns the futures, the requests that
    went through ``RawTransport.send`` (the task path) rather than directly, and the sender's
    counters."""
    client = _SenderClient(f"127.0.0.1:{gateway.port}")
    transport = RawTransport(client, _Fallback())
    through_send: list = []
    send = transport.send

    async def counted(request, timeout_s):
        through_send.append(request)
        return await send(request, timeout_s)

    transport.send = counted
    accumulator = RecordAccumulator(batch_size=batch_size, linger_ms=0)
    sender = Sender(
        client=client,
        accumulator=accumulator,
        transport=transport,
        policy=RetryPolicy(retries=0 if acks == 0 else 10, retry_backoff_ms=1, retry_backoff_max_ms=5),
        max_in_flight=max_in_flight,
        acks=acks,
    )
    task = asyncio.create_task(sender.run())
    futures = []
    for i, value in enumerate(values):
        now_ms = SYSTEM_CLOCK.time_ms()
        size = estimate_record_size(None, value, 0)
        future, _, _ = accumulator.append("t", i % partitions, now_ms, None, value, (), size, now_ms)
        futures.append(future)
        sender.wakeup()
        if i == 0:  # the first request opens the connection (through send()); the rest follow it
            while not future.is_done:
                await asyncio.sleep(0.001)
        elif i % 3 == 0:
            await asyncio.sleep(0.001)
    accumulator.close()
    sender.stop()
    await asyncio.wait_for(task, 10)
    await transport.close(1.0)
    return futures, through_send, sender.metrics


@run_async
async def test_the_sender_writes_requests_itself_once_connected_in_order_one_per_partition():
    values = [b"v%03d" % i for i in range(60)]
    gateway_log = LogGateway(delay=0.002)
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        futures, through_send, metrics = await _produce_over_raw(gateway, values, partitions=2, batch_size=40)
    assert gateway_log.logs == {0: values[0::2], 1: values[1::2]}
    offsets = [f.get(0) for f in futures]
    assert [m.offset for m in offsets] == [i // 2 for i in range(60)]
    assert gateway_log.overlaps == 0, "a partition never has two requests in flight at acks=1"
    assert len(through_send) == 1, "only the first request (it opens the connection) goes through send()"
    assert gateway_log.count > 10
    assert metrics["requests"] == gateway_log.count
    assert metrics["requests-written-directly"] == gateway_log.count - 1


@run_async
async def test_acks_zero_direct_requests_are_done_once_written_and_arrive_in_order():
    values = [b"r%03d" % i for i in range(50)]
    gateway_log = LogGateway()
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        futures, through_send, metrics = await _produce_over_raw(
            gateway, values, acks=0, batch_size=1, max_in_flight=16
        )
        while gateway_log.logs.get(0, []) != values:  # written before close returned
            await asyncio.sleep(0.001)
    assert all(f.succeeded() and f.get(0).offset == -1 for f in futures)
    assert len(through_send) == 1 and gateway_log.count > 1
    assert metrics["requests-written-directly"] == gateway_log.count - 1


@run_async
async def test_direct_requests_cut_off_by_a_broken_connection_are_retried_in_order():
    values = [b"x%03d" % i for i in range(40)]
    gateway_log = LogGateway(delay=0.001, drop_at=6)
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        futures, through_send, metrics = await _produce_over_raw(gateway, values, partitions=2, batch_size=30)
    assert gateway_log.logs == {0: values[0::2], 1: values[1::2]}, "nothing lost, doubled or reordered"
    assert [f.get(0).offset for f in futures] == [i // 2 for i in range(40)]
    assert len(through_send) >= 2, "the retry reconnects through send()"
    assert metrics["batches-retried"] > 0


@run_async
async def test_one_direct_request_in_flight_does_not_stall_the_sender():
    values = [b"s%02d" % i for i in range(30)]
    gateway_log = LogGateway(delay=0.001)
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        futures, through_send, metrics = await _produce_over_raw(
            gateway, values, batch_size=1, max_in_flight=1
        )
    assert gateway_log.logs == {0: values}
    assert [f.get(0).offset for f in futures] == list(range(30))
    assert len(through_send) == 1
    assert (
        metrics["requests"] == gateway_log.count
        and metrics["requests-written-directly"] == gateway_log.count - 1
    )


@run_async
async def test_a_wakeup_for_a_sendable_record_writes_its_request_in_the_same_turn():
    """``Sender.wakeup_to_send`` (a record sendable now, woken from the application's thread)
    drains and writes while the routine sleeps, instead of in the routine's next turn; the
    answer still settles the record."""
    gateway_log = LogGateway()
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        client = _SenderClient(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
        sender = Sender(
            client=client, accumulator=accumulator, transport=transport, policy=RetryPolicy(), acks=1
        )
        task = asyncio.create_task(sender.run())

        def append(value: bytes):
            now_ms = SYSTEM_CLOCK.time_ms()
            size = estimate_record_size(None, value, 0)
            return accumulator.append("t", 0, now_ms, None, value, (), size, now_ms)[0]

        first = append(b"first")  # opens the connection through send()
        sender.wakeup()
        assert (await first).offset == 0
        await asyncio.sleep(0.01)  # the routine is asleep, waiting for a wakeup
        second = append(b"second")
        sender.wakeup_to_send()
        assert not accumulator.has_queued(), "drained and written in this turn"
        assert (await second).offset == 1
        accumulator.close()
        sender.stop()
        await asyncio.wait_for(task, 5)
        await transport.close(1.0)
    assert gateway_log.logs == {0: [b"first", b"second"]}


@run_async
async def test_the_produce_connection_reads_at_most_64_kib_a_recv():
    """asyncio's default read (256 KiB) costs a 256 KiB allocation per recv, ~12 us for a
    60-byte produce answer; the producer's connection reads at most 64 KiB."""
    async with ScriptedGateway(on_request=_answer_ok) as gateway:
        transport = RawTransport(_Client(f"127.0.0.1:{gateway.port}"), _Fallback())
        await transport.send(_request(), 5.0)
        connection = transport._link._connection
        assert connection is not None
        assert len(connection.reader.get_buffer(-1)) == READ_BUFFER_BYTES == 64 * 1024
        await transport.close(1.0)


@run_async
async def test_a_request_that_cannot_be_encoded_fails_its_records_and_the_sender_goes_on():
    """A frame the encoder refuses (here a topic name past the format's 249 bytes) fails that
    request's records, as in a task; the sender routine neither dies nor loses the others."""
    gateway_log = LogGateway()
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        client = _SenderClient(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
        sender = Sender(
            client=client,
            accumulator=accumulator,
            transport=transport,
            policy=RetryPolicy(retries=0),
            acks=1,
        )
        task = asyncio.create_task(sender.run())

        def append(topic: str, value: bytes):
            now_ms = SYSTEM_CLOCK.time_ms()
            size = estimate_record_size(None, value, 0)
            future = accumulator.append(topic, 0, now_ms, None, value, (), size, now_ms)[0]
            sender.wakeup()
            return future

        assert (await append("t", b"first")).offset == 0  # the connection is open
        refused = append("x" * 300, b"refused")
        after = append("t", b"after")
        with pytest.raises(errors.TributaryError, match="ValueError"):
            await refused
        assert (await after).offset == 1
        accumulator.close()
        sender.stop()
        await asyncio.wait_for(task, 5)
        await transport.close(1.0)
    assert sender.metrics["requests-written-directly"] >= 2


def test_direct_requests_left_unanswered_fail_at_their_own_deadlines_from_one_timer(monkeypatch):
    # The requests the sender writes itself share one timer for their deadlines (request
    # timeout + grace): an unanswered one breaks its connection at its deadline -- failing
    # with REQUEST_TIMED_OUT -- while those answered in time are not touched by it.
    import gateway.client.sender as sender_module

    monkeypatch.setattr(sender_module, "ANSWER_GRACE_S", 0.1)
    futures, settled_at = asyncio.run(asyncio.wait_for(_unanswered_direct_request(), 30))
    assert [f.get(0).offset for f in futures[:3]] == [0, 0, 0]  # (the scripted answers' offsets)
    assert all(settled_at[i] < 0.3 for i in range(3)), settled_at  # answered: not held to a deadline
    with pytest.raises(errors.RequestTimedOutError, match="no produce answer"):
        futures[3].get(0)
    assert 0.3 - 0.05 <= settled_at[3] < 5, settled_at[3]


async def _unanswered_direct_request():
    """Four one-record requests one after another; the gateway answers the first three only."""
    answered = 0

    def first_three_only(writer, body) -> None:
        nonlocal answered
        if answered < 3:
            answered += 1
            _answer_ok(writer, body)

    async with ScriptedGateway(on_request=first_three_only) as gateway:
        client = _SenderClient(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
        sender = Sender(
            client=client,
            accumulator=accumulator,
            transport=transport,
            policy=RetryPolicy(retries=0, retry_backoff_ms=1, retry_backoff_max_ms=5),
            max_in_flight=1,
            acks=1,
            request_timeout_ms=200,
        )
        task = asyncio.create_task(sender.run())
        loop = asyncio.get_running_loop()
        futures, settled_at = [], {}
        for i in range(4):
            now_ms = SYSTEM_CLOCK.time_ms()
            value = b"late-%d" % i
            future, _, _ = accumulator.append(
                "t", 0, now_ms, None, value, (), estimate_record_size(None, value, 0), now_ms
            )
            futures.append(future)
            sender.wakeup()
            written_at = loop.time()
            while not future.is_done:
                await asyncio.sleep(0.005)
            settled_at[i] = loop.time() - written_at
        accumulator.close()
        sender.stop()
        await asyncio.wait_for(task, 10)
        await transport.close(1.0)
    return futures, settled_at


@run_async
async def test_held_writes_leave_together_at_flush_and_schedule_no_write_of_their_own():
    # The sender's pass holds a connection's writes while it queues its requests and flushes
    # once at its end: nothing leaves before the flush (not even at the next loop turn), and
    # all of it leaves then; without a hold a queued frame still leaves at the end of the turn.
    arrived: list[int] = []
    async with ScriptedGateway(
        on_request=lambda writer, body: arrived.append(dp.decode_header(body)[1])
    ) as gateway:
        connection = await DataConnection.open("127.0.0.1", gateway.port, client_id="unit", timeout_s=5.0)
        frames = [
            dp.encode_produce_request(dp.ProduceRequest(i, 0, 1000, "t", [(0, b"held-%d" % i)]))
            for i in range(3)
        ]
        connection.hold_writes()
        for frame in frames[:2]:
            connection.send_nowait(frame, None)
        for _ in range(5):
            await asyncio.sleep(0)  # turns of the loop: a scheduled write would have gone
        await asyncio.sleep(0.05)
        assert arrived == [], "held frames leave only at flush"
        connection.flush()
        connection.send_nowait(frames[2], None)  # not held: leaves at the end of the turn
        deadline = asyncio.get_running_loop().time() + 5
        while len(arrived) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        await connection.close(1.0)
    assert arrived == [0, 1, 2]
