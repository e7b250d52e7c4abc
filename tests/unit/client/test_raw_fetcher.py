"""The consumer's raw fetch path against a scripted gateway on loopback: a fetch written at once
(``RawFetcher.start``), abandoned, answered late; and the fetcher writing its next fetch in the
loop turn that buffers an answer, before ``poll`` decodes it."""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace

from gateway.client.dataport import READ_BUFFER_BYTES, RawFetcher
from gateway.client.errors import RequestTimedOutError
from gateway.client.fetcher import Fetcher, SendFetchHandler
from gateway.client.metadata import MetadataCache
from gateway.client.structs import TopicPartition
from gateway.client.subscription import SubscriptionState
from gateway.client.throttle import Throttles
from services.clock import ManualClock
from services.dataport import protocol as dp
from services.proto import pb
from services.records import RecordBatchBuilder

from .test_dataport import ScriptedGateway

TP = TopicPartition("t", 0)


def run_async(test):
    """Run an ``async def`` test on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run() -> None:
        asyncio.run(asyncio.wait_for(test(), 30))

    return run


def batch(base_offset: int, count: int) -> bytes:
    builder = RecordBatchBuilder(base_offset=base_offset)
    for i in range(count):
        builder.append(b"v%d" % (base_offset + i), timestamp=1_000)
    return builder.build()


class FetchGateway(ScriptedGateway):
    """Handshakes in the newest version, then answers each fetch with ``answer(request)``
    (a FetchResponse; None: no answer) and records the requests, decoded, in arrival order."""

    def __init__(self, answer) -> None:
        super().__init__()
        self.answer = answer
        self.requests: list[dp.FetchRequest] = []  # type: ignore[assignment]
        self.arrived = asyncio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _received(self, writer: asyncio.StreamWriter, body: bytes) -> None:
        request = dp.decode_fetch_request(body)
        self.requests.append(request)
        self.arrived.set()
        response = self.answer(request)
        if response is not None:
            writer.writelines(dp.encode_fetch_response_parts(response))

    async def wait_for_requests(self, count: int) -> None:
        while len(self.requests) < count:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)


def records_from_offset(request: dp.FetchRequest) -> dp.FetchResponse:
    """Three records from each named partition's fetch offset (a session answer when asked)."""
    return dp.FetchResponse(
        request.correlation_id,
        0,
        "",
        [
            dp.FetchPartitionResult(p.topic, p.partition, 0, 1_000, 0, records=batch(p.fetch_offset, 3))
            for p in request.partitions
        ],
        session_id=7 if request.session_epoch != dp.FINAL_EPOCH else dp.NO_SESSION_ID,
    )


class _Client:
    """What RawFetcher and Fetcher use of GatewayClient."""

    def __init__(self, data_address: str) -> None:
        self.client_id = "unit"
        self.tls = None
        self.token_source = None
        self.data_address = data_address
        self.pool = SimpleNamespace(current=lambda: SimpleNamespace(address="127.0.0.1:1"))
        self.fetch_throttles = Throttles("fetch")
        self.clock = ManualClock()
        self.metadata = MetadataCache()
        self.request_timeout_ms = 30_000

    async def call_with_retry(self, method, request, **_):
        assert method == "GetMetadata"
        return pb.GetMetadataResponse(data_address=self.data_address)


def request_from(offset: int) -> dp.FetchRequest:
    return dp.FetchRequest(0, [dp.FetchPartition(TP.topic, TP.partition, offset, 1 << 20)], max_wait_ms=0)


@run_async
async def test_start_writes_a_fetch_at_once_once_connected():
    async with FetchGateway(records_from_offset) as gateway:
        fetcher = RawFetcher(_Client(gateway.address))
        assert fetcher.start(request_from(0)) is None, "no connection yet: the caller awaits fetch()"
        first = await fetcher.fetch(request_from(0), 5.0)
        assert first is not None and first.partitions[0].records
        started = fetcher.start(request_from(3))
        assert started is not None
        connection = started.connection
        # Written to the socket now, not at the end of this loop turn.
        assert not connection._corked and connection.writer.transport.get_write_buffer_size() == 0
        assert started.correlation_id in connection.pending
        second = await fetcher.fetch(started.request, 5.0, started)
        await fetcher.close()
    assert second is not None and second.partitions[0].records
    assert [r.partitions[0].fetch_offset if r.partitions else None for r in gateway.requests] == [0, 3]
    assert fetcher.incremental_fetches == 1, "the started fetch ran in the connection's session"


@run_async
async def test_an_abandoned_fetch_drops_its_answer_and_restarts_the_session():
    async with FetchGateway(records_from_offset) as gateway:
        fetcher = RawFetcher(_Client(gateway.address))
        await fetcher.fetch(request_from(0), 5.0)
        started = fetcher.start(request_from(3))
        assert started is not None
        fetcher.abandon(started)
        assert started.answer.cancelled() and started.correlation_id not in started.connection.pending
        await gateway.wait_for_requests(2)
        # The gateway's picture of the session is unknown: the next fetch is a full one.
        again = await fetcher.fetch(request_from(10), 5.0)
        await fetcher.close()
    assert again is not None and again.partitions[0].records
    assert gateway.requests[-1].session_epoch == dp.INITIAL_EPOCH
    assert fetcher.full_fetches == 2


@run_async
async def test_a_fetch_not_answered_in_time_fails_retriably_and_the_next_reconnects():
    silent = True

    def answer(request):
        return None if silent else records_from_offset(request)

    async with FetchGateway(answer) as gateway:
        fetcher = RawFetcher(_Client(gateway.address))
        try:
            await fetcher.fetch(request_from(0), 0.2)
        except RequestTimedOutError as exc:
            assert exc.retriable
        else:
            raise AssertionError("an unanswered fetch must time out")
        silent = False
        answered = await fetcher.fetch(request_from(0), 5.0)
        await fetcher.close()
    assert answered is not None and answered.partitions[0].records
    assert fetcher._link.opened == 2 and len(gateway.writers) == 2


@run_async
async def test_an_answer_larger_than_the_read_buffer_arrives_whole_in_a_buffer_of_its_own_size():
    """A fetch answer of hundreds of KB is received straight into a buffer of its size (no
    copies through a stream buffer): its records come out intact and are views onto it."""

    def big_answer(request: dp.FetchRequest) -> dp.FetchResponse:
        records = b"".join(batch(i * 100, 100) for i in range(120))
        assert len(records) > 2 * READ_BUFFER_BYTES
        return dp.FetchResponse(
            request.correlation_id,
            0,
            "",
            [dp.FetchPartitionResult(TP.topic, TP.partition, 0, 12_000, 0, records=records)],
            session_id=7,
        )

    async with FetchGateway(big_answer) as gateway:
        fetcher = RawFetcher(_Client(gateway.address))
        answer = await fetcher.fetch(request_from(0), 5.0)
        await fetcher.close()
    assert answer is not None
    records = answer.partitions[0].records
    assert isinstance(records, memoryview) and len(records) > 2 * READ_BUFFER_BYTES
    # A view onto the answer's own buffer (a stream reader's answer was a bytes copy).
    assert isinstance(records.obj, bytearray) and len(records.obj) < len(records) + 200
    assert bytes(records) == b"".join(batch(i * 100, 100) for i in range(120))


@run_async
async def test_the_fetcher_writes_its_next_fetch_in_the_turn_that_buffers_an_answer():
    async with FetchGateway(records_from_offset) as gateway:
        client = _Client(gateway.address)
        subscription = SubscriptionState("earliest")
        subscription.assign_from_user([TP])
        subscription.seek(TP, 0)
        fetcher = Fetcher(client, subscription, fetch_max_wait_ms=0)
        written: list[int] = []
        start = fetcher._raw.start

        def recording_start(request):
            # The chunk it follows is buffered, undecoded: poll has not run yet.
            written.append(len(fetcher._buffers[TP]))
            return start(request)

        fetcher._raw.start = recording_start
        # The first answer sends the next fetch at once, awaited in the same task; the second
        # fills the prefetch depth (two chunks), so nothing follows it.
        await fetcher._do_fetch(SendFetchHandler(fetcher, {TP: 0}))
        assert written == [1], "the next fetch left as the answer was buffered"
        assert len(fetcher._buffers[TP]) == 2 and fetcher._next is None
        assert [r.partitions[0].fetch_offset for r in gateway.requests] == [0, 3]
        # Room again (a chunk consumed): the next fetch is written at once, from offset 6.
        assert len(fetcher.drain(3)[TP]) == 3
        fetcher._send_next()
        assert fetcher._next is not None
        handler, started = fetcher._next
        assert handler.offsets == {TP: 6} and started.correlation_id in started.connection.pending
        await gateway.wait_for_requests(3)
        # A seek (or close) abandons it: its answer is never buffered, and the session restarts.
        fetcher.wakeup(restart_fetch=True)
        assert fetcher._next is None and started.correlation_id not in started.connection.pending
        assert fetcher._raw._session.full
        assert len(fetcher._buffers[TP]) == 1
        await fetcher.close()


def _three_records_each(request: pb.FetchRequest) -> pb.FetchResponse:
    """A gRPC fetch answer: three records from each asked partition's offset."""
    return pb.FetchResponse(
        partitions=[
            pb.FetchPartitionResult(
                topic=p.topic,
                partition=p.partition,
                record_batches=batch(p.offset, 3),
                high_watermark=1_000,
                log_start_offset=0,
            )
            for p in request.partitions
        ]
    )


@run_async
async def test_without_a_raw_data_path_the_fetcher_fetches_over_grpc():
    client = _Client("")  # the gateway offers no data listener
    calls = []

    async def call(method, request, **_):
        calls.append(method)
        return _three_records_each(request)

    client.call = call
    subscription = SubscriptionState("earliest")
    subscription.assign_from_user([TP])
    subscription.seek(TP, 0)
    fetcher = Fetcher(client, subscription, fetch_max_wait_ms=0)
    await fetcher._do_fetch(SendFetchHandler(fetcher, {TP: 0}))
    assert calls == ["Fetch"]
    assert [r.offset for r in fetcher.drain(10)[TP]] == [0, 1, 2]
    await fetcher.close()


@run_async
async def test_a_pending_offset_reset_holds_back_no_fetch_of_the_positioned_partitions():
    # assign() then seek() of each partition: the lookup assign started (moot once the seeks
    # came) must not keep the partitions with a position waiting, as it did when the routine
    # awaited it before every fetch.
    tp1 = TopicPartition("t", 1)
    client = _Client("")
    lookup_released = asyncio.Event()
    fetched: list[dict[TopicPartition, int]] = []
    fetched_once = asyncio.Event()

    async def call_with_retry(method, request, **_):
        if method == "GetMetadata":
            return pb.GetMetadataResponse(data_address="")
        assert method == "ListOffsets"
        await lookup_released.wait()
        return pb.ListOffsetsResponse(
            partitions=[
                pb.ListOffsetsPartitionResult(topic=p.topic, partition=p.partition, offset=5)
                for p in request.partitions
            ]
        )

    async def call(method, request, **_):
        assert method == "Fetch"
        fetched.append({TopicPartition(p.topic, p.partition): p.offset for p in request.partitions})
        fetched_once.set()
        return _three_records_each(request)

    client.call_with_retry = call_with_retry
    client.call = call
    subscription = SubscriptionState("earliest")
    subscription.assign_from_user([TP, tp1])
    subscription.seek(TP, 0)  # tp1 awaits its reset
    fetcher = Fetcher(client, subscription, fetch_max_wait_ms=0, data_path="grpc")
    routine = asyncio.ensure_future(fetcher.run())
    try:
        await asyncio.wait_for(fetched_once.wait(), 5)
        assert fetched[0] == {TP: 0}, "the positioned partition is fetched while the lookup runs"
        assert subscription.position(tp1) is None
        lookup_released.set()
        while not any(tp1 in f for f in fetched):
            await asyncio.sleep(0.01)
        assert subscription.position(tp1) == 5
        assert next(f for f in fetched if tp1 in f)[tp1] == 5, "fetched from the looked-up offset"
    finally:
        await fetcher.close()
        routine.cancel()
        await asyncio.gather(routine, return_exceptions=True)


@run_async
async def test_a_consumers_fetcher_opens_its_connection_but_fetches_nothing_before_the_first_poll():
    # assign() then a seek() per partition, before the first poll: each seek restarts the fetch
    # in flight, so a fetcher already fetching made a request (or a lookup) per seek.
    async with FetchGateway(records_from_offset) as gateway:
        client = _Client(gateway.address)
        lookups: list[str] = []
        call_with_retry = client.call_with_retry

        async def recording(method, request, **kwargs):
            lookups.append(method)
            return await call_with_retry(method, request, **kwargs)

        client.call_with_retry = recording
        subscription = SubscriptionState("earliest")
        subscription.assign_from_user([TP, TopicPartition("t", 1)])  # both await a reset
        fetcher = Fetcher(client, subscription, fetch_max_wait_ms=0, fetch_before_poll=False)
        routine = asyncio.ensure_future(fetcher.run())
        try:
            while fetcher._warm_up is None or not fetcher._warm_up.done():
                await asyncio.sleep(0.01)
            assert fetcher._raw._link.opened == 1, "the data connection is opened ahead"
            subscription.seek(TP, 0)
            fetcher.wakeup(restart_fetch=True)
            subscription.seek(TopicPartition("t", 1), 4)
            fetcher.wakeup(restart_fetch=True)
            for _ in range(50):
                await asyncio.sleep(0)
            assert gateway.requests == [] and lookups == ["GetMetadata"], "no fetch, no ListOffsets"
            fetcher.allow_fetching()
            await gateway.wait_for_requests(1)
            first = gateway.requests[0]
            assert {(p.partition, p.fetch_offset) for p in first.partitions} == {(0, 0), (1, 4)}
            assert lookups == ["GetMetadata"]
        finally:
            await fetcher.close()
            routine.cancel()
            await asyncio.gather(routine, return_exceptions=True)
