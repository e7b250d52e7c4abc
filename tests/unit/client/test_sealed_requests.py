"""One-record batches sealed in their request frames on the appending thread (``sealed.py``).

The C encoder must write what the Python reference writes, and both what the general frame
encoder (``dp.encode_produce_request``) and batch builder write; the accumulator seals only
batches nothing changes before they are sent; the sender writes a sealed frame with its own
correlation id, and anything else (a retry) goes the general way.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client import futures as futures_module
from gateway.client import sealed
from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.dataport import RawTransport
from gateway.client.futures import FutureRecordMetadata, ProduceResult
from gateway.client.producer import ProducerConfig, ProducerCore
from gateway.client.retry import RetryPolicy
from gateway.client.sealed import RecordRequestSealer, py_encode_record_request
from gateway.client.sender import Sender
from gateway.client.serialization import headers_size
from gateway.client.structs import TopicPartition
from services.clock import SYSTEM_CLOCK
from services.dataport import protocol as dp
from services.records import Compression, RecordBatchBuilder, iter_batches
from services.records import builder as builder_module

from ..services.records.records_backends import require_speedups
from .test_dataport import LogGateway, ScriptedGateway, _Fallback, _SenderClient, run_async

HEADERS = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=3)


def _reference(prefix, partition, timestamp, key, value, headers):
    """The Python reference with the builder's Python record encoder too."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(builder_module, "_append_record", None)
        return py_encode_record_request(prefix, partition, timestamp, key, value, headers)


@settings(max_examples=300, deadline=None)
@given(
    topic=st.text(min_size=1, max_size=40),
    acks=st.sampled_from([0, 1, -1]),
    timeout_ms=st.integers(0, 2**31 - 1),
    partition=st.integers(0, 2**31 - 1),
    timestamp=st.integers(-(2**63), 2**63 - 1),
    key=st.none() | st.binary(max_size=300),
    value=st.none() | st.binary(max_size=3000),
    headers=HEADERS,
)
def test_the_c_frame_is_the_references_and_the_general_encoders(
    topic, acks, timeout_ms, partition, timestamp, key, value, headers
):
    c = require_speedups()
    sealer = RecordRequestSealer(acks, timeout_ms)
    prefix = sealer.prefix(topic)
    frame = c.encode_record_request(prefix, partition, timestamp, key, value, headers)
    assert frame == _reference(prefix, partition, timestamp, key, value, headers)
    builder = RecordBatchBuilder()
    builder.append(value, timestamp=timestamp, key=key, headers=headers)
    batch = builder.build()
    general = dp.encode_produce_request(
        dp.ProduceRequest(0, acks, timeout_ms, topic, [(partition, batch)], "")
    )
    assert bytes(frame) == general
    start = len(prefix) + 8
    assert sealed.batch_in(frame, start) == batch
    decoded = dp.decode_produce_request(bytes(frame[4:]))
    assert (decoded.topic, decoded.acks, decoded.timeout_ms) == (topic, acks, timeout_ms)
    assert [(p, bytes(data)) for p, data in decoded.partitions] == [(partition, batch)]


class _Bytes(bytes):
    def __len__(self) -> int:  # the builder takes len() of a bytes subclass: C must not
        return 2


@pytest.mark.parametrize(
    "key, value, headers, timestamp",
    [
        (bytearray(b"k"), memoryview(b"value"), (), 5),
        (None, memoryview(b"abcdef")[::2], (), 5),
        (None, memoryview(b"\x01\x02\x03\x04").cast("I"), (), 5),
        (None, _Bytes(b"abcdef"), (), 5),
        (None, b"v", [("a", bytearray(b"1")), ("b", memoryview(b"2"))], 5),
        (None, b"v", (h for h in [("a", b"1")]), 5),
        (None, b"v", [("\udc80", b"1")], 5),
        (None, b"v", [(b"a", b"1")], 5),
        (None, b"v", (), 2**63),
        (None, b"v", (), 1.5),
        ("text", b"v", (), 5),
    ],
)
def test_odd_arguments_come_out_as_the_reference_says(key, value, headers, timestamp):
    """The C encoder declines what it does not take (None); the dispatcher then encodes it in
    Python, which gives the reference's bytes or raises the reference's error."""
    prefix = RecordRequestSealer(1, 1000).prefix("t")

    def outcome(fn):
        try:
            return bytes(fn(prefix, 3, timestamp, key, value, headers))
        except Exception as exc:  # noqa: BLE001 -- compared, not swallowed
            return type(exc).__name__

    if not isinstance(headers, list | tuple):  # a generator is used up by the first call
        headers = list(headers)
    assert outcome(sealed.encode_record_request) == outcome(_reference)


def test_the_c_encoder_refuses_a_bad_prefix_and_declines_a_bad_partition():
    c = require_speedups()
    with pytest.raises(TypeError):
        c.encode_record_request(bytearray(b"\x00" * 8), 0, 0, None, b"v", ())
    with pytest.raises(TypeError):
        c.encode_record_request(b"\x00" * 8, 0, 0, None, b"v")
    assert c.encode_record_request(b"\x00" * 8, -1, 0, None, b"v", ()) is None
    assert c.encode_record_request(b"\x00" * 8, 2**31, 0, None, b"v", ()) is None


# ---- the accumulator ---------------------------------------------------------------------------


def _append(accumulator, value, *, key=None, headers=(), partition=0):
    now_ms = SYSTEM_CLOCK.time_ms()
    size = estimate_record_size(key, value, headers_size(headers) if headers else 0)
    future, full, new = accumulator.append("t", partition, now_ms, key, value, headers, size, now_ms)
    return future, full, new, now_ms


def _only_batch(accumulator):
    (queue,) = accumulator._queues.values()
    (batch,) = queue
    return batch


def test_a_record_that_fills_its_batch_is_sealed_in_its_frame():
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, sealer=RecordRequestSealer(0, 1000))
    headers = [("h", b"1")]
    _, full, new, now_ms = _append(accumulator, b"value", key=b"key", headers=headers, partition=7)
    assert full and new
    batch = _only_batch(accumulator)
    builder = RecordBatchBuilder()
    builder.append(b"value", timestamp=now_ms, key=b"key", headers=headers)
    expected = builder.build()
    assert batch.request_frame is not None and batch.is_full and not batch.prebuilt
    assert batch.estimated_size == len(expected)
    assert bytes(batch.close()) == expected
    frame = dp.decode_produce_request(bytes(batch.request_frame[4:]))
    assert [(p, bytes(d)) for p, d in frame.partitions] == [(7, expected)]


@pytest.mark.parametrize(
    "settings, value",
    [
        ({"batch_size": 16384}, b"small"),  # more records can join the batch
        ({"batch_size": 1, "compression": Compression.GZIP}, b"v"),  # compressed when built
        ({"batch_size": 1, "sealer": None}, b"v"),  # no sealer (idempotent, or gRPC only)
        ({"batch_size": 300}, b"x" * 180),  # might not fill it: the estimate is an upper bound
    ],
)
def test_batches_that_may_still_change_are_not_sealed(settings, value):
    settings = {"linger_ms": 0, "sealer": RecordRequestSealer(1, 1000), **settings}
    accumulator = RecordAccumulator(**settings)
    _append(accumulator, value)
    batch = _only_batch(accumulator)
    assert batch.request_frame is None
    assert [b.record_count for b in iter_batches(bytes(batch.close()))] == [1]


def test_a_record_surely_filling_a_bigger_batch_is_sealed():
    accumulator = RecordAccumulator(batch_size=300, linger_ms=0, sealer=RecordRequestSealer(1, 1000))
    _append(accumulator, b"x" * 250)
    assert _only_batch(accumulator).request_frame is not None


def test_a_record_the_encoder_refuses_leaves_nothing_queued_or_reserved():
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, sealer=RecordRequestSealer(1, 1000))
    available = accumulator.pool.available
    now_ms = SYSTEM_CLOCK.time_ms()
    with pytest.raises(TypeError):
        accumulator.append("t", 0, now_ms, None, 12345, (), 40, now_ms)
    assert accumulator.pool.available == available
    assert not accumulator.has_incomplete() and not accumulator.has_queued()


def test_the_producer_seals_only_without_idempotence_on_the_raw_path():
    def sealer(**settings):
        config = ProducerConfig.from_kwargs({"servers": "127.0.0.1:1", **settings})
        return ProducerCore(config).accumulator._sealer

    assert sealer(acks=0, batch_size=1) is not None
    assert sealer(acks=1) is not None
    assert sealer() is None, "idempotent by default: batches are numbered when sent"
    assert sealer(acks=1, data_path="grpc") is None
    assert sealer(acks=1, compression="zstd") is None


# ---- the sender ------------------------------------------------------------------------------


async def _produce_sealed(gateway, values, *, acks, max_in_flight=16, partitions=1):
    """A Sender over a RawTransport to ``gateway``, its accumulator sealing one-record batches,
    requests of one batch each. Returns the futures, the requests that went through
    ``RawTransport.send`` and the counters, with ``general-writes``: requests the routine wrote
    itself through ``RawTransport.write_request`` (encoded then, not sealed)."""
    client = _SenderClient(f"127.0.0.1:{gateway.port}")
    transport = RawTransport(client, _Fallback())
    through_send: list = []
    send = transport.send

    async def counted(request, timeout_s):
        through_send.append(request)
        return await send(request, timeout_s)

    transport.send = counted
    general_writes = 0

    def write_request(*args, **kwargs):
        nonlocal general_writes
        general_writes += 1
        RawTransport.write_request(*args, **kwargs)

    transport.write_request = write_request
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, sealer=RecordRequestSealer(acks, 30_000))
    sender = Sender(
        client=client,
        accumulator=accumulator,
        transport=transport,
        policy=RetryPolicy(retries=0 if acks == 0 else 10, retry_backoff_ms=1, retry_backoff_max_ms=5),
        max_in_flight=max_in_flight,
        max_request_size=100,  # one batch a request
        acks=acks,
        request_timeout_ms=30_000,
    )
    task = asyncio.create_task(sender.run())
    futures = []
    for i, value in enumerate(values):
        future, _, _, _ = _append(accumulator, value, partition=i % partitions)
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
    return futures, through_send, {**sender.metrics, "general-writes": general_writes}


@run_async
async def test_sealed_frames_are_written_with_their_correlation_ids_in_order_at_acks_1():
    values = [b"s%03d" % i for i in range(40)]
    gateway_log = LogGateway(delay=0.001)
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        futures, through_send, metrics = await _produce_sealed(gateway, values, acks=1, partitions=2)
    assert gateway_log.logs == {0: values[0::2], 1: values[1::2]}
    assert [f.get(0).offset for f in futures] == [i // 2 for i in range(40)]
    assert gateway_log.overlaps == 0
    assert len(through_send) == 1
    assert metrics["requests-written-directly"] == gateway_log.count - 1 == 39
    assert metrics["general-writes"] == 0, "every request after the first was a sealed frame"


@run_async
async def test_sealed_frames_at_acks_0_are_done_once_written_and_arrive_in_order():
    values = [b"z%03d" % i for i in range(50)]
    gateway_log = LogGateway()
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        futures, _, metrics = await _produce_sealed(gateway, values, acks=0)
        while gateway_log.logs.get(0, []) != values:
            await asyncio.sleep(0.001)
    assert all(f.succeeded() and f.get(0).offset == -1 for f in futures)
    assert metrics["requests-written-directly"] == gateway_log.count - 1 == 49
    assert metrics["general-writes"] == 0


@run_async
async def test_sealed_batches_cut_off_by_a_broken_connection_are_retried_in_order():
    values = [b"r%03d" % i for i in range(30)]
    gateway_log = LogGateway(delay=0.001, drop_at=6)
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        # (One partition: one request in flight, so the one cut off was never appended.)
        futures, through_send, metrics = await _produce_sealed(gateway, values, acks=1)
    assert gateway_log.logs == {0: values}, "nothing lost, doubled or reordered"
    assert [f.get(0).offset for f in futures] == list(range(30))
    assert metrics["batches-retried"] > 0
    assert len(through_send) >= 2, "the retry reconnects through send()"


class _FrameConnection:
    """What ``Sender._write_direct`` uses of a DataConnection; keeps the frames queued."""

    broken = False

    def __init__(self) -> None:
        self.frames: list[tuple[bytes, int | None]] = []
        self._correlation = 40

    def backlogged(self) -> bool:
        return False

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def send_nowait(self, frame, correlation_id, answer=None):
        self.frames.append((bytes(frame), correlation_id))


@pytest.mark.parametrize("attempts", [0, 1])
@pytest.mark.parametrize("trace_context", ["", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"])
def test_only_a_first_untraced_attempt_is_written_as_sealed(attempts, trace_context):
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, sealer=RecordRequestSealer(0, 30_000))
    _append(accumulator, b"value", partition=3)
    batch = _only_batch(accumulator)
    batch.attempts = attempts
    sealed_frame = bytes(batch.request_frame)
    transport = RawTransport(_SenderClient("127.0.0.1:1"), _Fallback())
    encoded: list = []

    def write_request(*args, **kwargs):
        encoded.append(args)
        RawTransport.write_request(*args, **kwargs)

    transport.write_request = write_request
    sender = Sender(
        client=_SenderClient("127.0.0.1:1"),
        accumulator=accumulator,
        transport=transport,
        policy=RetryPolicy(retries=0),
        acks=0,
        request_timeout_ms=30_000,
    )
    connection = _FrameConnection()
    unacked: list = []
    assert sender._write_direct(connection, "t", {3: [batch]}, trace_context, unacked)
    ((frame, correlation_id),) = connection.frames
    assert correlation_id is None  # acks=0: no answer awaited
    request = dp.decode_produce_request(frame[4:])
    assert request.correlation_id == 41 and request.trace_context == trace_context
    assert [(p, bytes(d)) for p, d in request.partitions] == [(3, bytes(batch.close()))]
    if attempts == 0 and not trace_context:
        assert not encoded, "the sealed frame went as it was"
        assert frame == sealed_frame[:5] + b"\x00\x00\x00\x29" + sealed_frame[9:]
    else:
        assert len(encoded) == 1, "encoded the general way"
    assert batch.attempts == attempts + 1 and unacked == [([batch], -1, -1, -1)]


# ---- futures -----------------------------------------------------------------------------------


def test_listeners_run_once_in_the_order_added_and_a_failing_one_stops_none(caplog):
    result = ProduceResult(TopicPartition("t", 0))
    future = FutureRecordMetadata(result, 2, 77)
    calls = []
    future.add_callback(lambda *a, **k: calls.append(("first", a, k)), "x", flag=1)
    future.add_errback(lambda error: calls.append(("errback", error)))
    result.add_listener(lambda r: 1 / 0)
    future.add_both(lambda outcome: calls.append(("both", outcome.offset)))
    with caplog.at_level(logging.ERROR):
        result.complete(10, -1, 0)
        result.complete(99, -1, 0)  # only the first completion counts
    assert calls == [("first", ("x", future.get(0)), {"flag": 1}), ("both", 12)]
    assert "error in a produce callback" in caplog.text
    future.add_callback(lambda metadata: calls.append(("late", metadata.offset)))
    assert calls[-1] == ("late", 12)


def test_errbacks_get_the_error():
    result = ProduceResult(TopicPartition("t", 0))
    future = FutureRecordMetadata(result, 0, 5)
    seen = []
    future.add_callback(seen.append)
    future.add_errback(lambda tag, error: seen.append((tag, error)), "tag")
    error = RuntimeError("boom")
    result.complete(error=error)
    assert seen == [("tag", error)]
    future.add_errback(seen.append)
    assert seen[-1] is error


@pytest.mark.parametrize("backend", ["c", "python"])
def test_settled_results_and_their_futures_leave_the_collectors_walks_failed_ones_stay(backend, monkeypatch):
    untrack = require_speedups().untrack if backend == "c" else None
    monkeypatch.setattr(futures_module, "_untrack", untrack)
    ok = ProduceResult(TopicPartition("t", 0))
    ok_future = FutureRecordMetadata(ok, 0, 5)
    ok_future.add_callback(lambda metadata: None)
    failed = ProduceResult(TopicPartition("t", 0))
    failed_future = FutureRecordMetadata(failed, 0, 5)
    failed_future.add_callback(lambda metadata: None)
    assert gc.is_tracked(ok) and gc.is_tracked(ok_future)
    ok.complete(3, -1, 0)
    failed.complete(error=RuntimeError("boom"))
    # Without the C module nothing is untracked (it only saves the collector work).
    assert gc.is_tracked(ok) == gc.is_tracked(ok_future) == (untrack is None)
    assert ok_future.get(0).offset == 3
    # An error's traceback can lead back to the future (a frame that raised it holds it).
    assert gc.is_tracked(failed) and gc.is_tracked(failed_future)


def test_every_blocked_waiter_wakes_when_the_result_settles_and_timeouts_say_so():
    result = ProduceResult(TopicPartition("t", 0))
    assert result.wait(0) is False and result.wait(0.01) is False and result.wait(-1) is False
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(result.wait(30))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    deadline = time.monotonic() + 10
    while result._gate is None and time.monotonic() < deadline:  # a waiter made the gate
        time.sleep(0.001)
    result.complete(1, -1, 0)
    for waiter in waiters:
        waiter.join(10)
    assert woken == [True, True, True]
    assert result.wait(0) and result.wait(None) and FutureRecordMetadata(result, 1, 0).get(0).offset == 2
