"""The data listener's in-place serving (``_Connection.serve_now``) against fakes, as pure logic:
what a queued produce keeps alive is what the queues count.

A produce served in place keeps its records as views into the bytes of the read it came in, and
the append queues count the records' bytes only (``AppendQueues.max_queued_bytes``, the listener's
``max_in_flight_bytes``). A small frame must not keep a large read alive -- the rest of the read
being a frame that was refused (an unknown topic at acks=0: answered by nobody, queued nowhere),
or a frame's start copied to the connection's buffer -- else a client makes the gateway hold
hundreds of times its byte budgets (a 100-byte record keeping a 256 KiB read)."""

import asyncio
from types import SimpleNamespace

from gateway.server.data_listener import _Connection
from services import errors
from services.dataport import protocol as dp
from services.records import RecordBatchBuilder


class FakeProduce:
    """Plans a known topic's request (what it appends is kept in ``queued``), refuses others."""

    def __init__(self):
        self.queued = []

    def plan_now(self, command):
        if command.topic != "known":
            raise errors.UnknownTopicOrPartitionError(f"no topic {command.topic}")
        return command

    def deadline_for(self, command, _timeout, *, now):
        return now + 30

    def submit_then(self, plan, *, deadline, queues, done):
        self.queued.extend(data for _partition, data in plan.batches)


def _connection(produce):
    connection = _Connection.__new__(_Connection)
    connection.listener = SimpleNamespace(
        telemetry=None,
        quotas=None,
        max_frame=1 << 20,
        produce=produce,
        gatekeeper=None,
        max_in_flight_bytes=64 << 20,
        max_in_flight_requests=1000,
    )
    connection.queues = SimpleNamespace(has_room=True, hold_rounds=lambda: None, release_rounds=lambda: None)
    connection.expires_at = None
    connection.throttle = SimpleNamespace(muted_until=0)
    connection.writer = SimpleNamespace(transport=SimpleNamespace(get_write_buffer_size=lambda: 0))
    connection.in_flight_bytes = 0
    connection.in_flight_requests = 0
    connection._served_at = 0.0
    connection.peer = "127.0.0.1:1"
    connection._loop = asyncio.new_event_loop()
    connection._quota = lambda: None
    return connection


def _frame(topic, value, correlation_id):
    builder = RecordBatchBuilder()
    builder.append(value, timestamp=1)
    return dp.encode_produce_request(
        dp.ProduceRequest(correlation_id, 0, 1000, topic, [(0, builder.build())])
    )


def _kept_alive(data):
    return len(data.obj) if isinstance(data, memoryview) else len(data)


def test_a_small_produce_served_in_place_keeps_no_large_read_alive():
    produce = FakeProduce()
    connection = _connection(produce)
    small = _frame("known", b"x" * 10, 1)
    refused = _frame("unknown", b"y" * 200_000, 2)  # acks=0 to an unknown topic: queued nowhere
    read = small + refused
    try:
        assert connection.serve_now(read) == len(read)
    finally:
        connection._loop.close()
    (queued,) = produce.queued
    counted = len(queued)
    assert _kept_alive(queued) <= 2 * max(counted, len(small)), (
        f"a {counted}-byte record queued keeps {_kept_alive(queued)} bytes alive"
    )


def test_a_produce_that_fills_its_read_is_still_served_without_a_copy():
    produce = FakeProduce()
    connection = _connection(produce)
    frame = _frame("known", b"z" * 50_000, 1)
    try:
        assert connection.serve_now(frame) == len(frame)
    finally:
        connection._loop.close()
    (queued,) = produce.queued
    assert isinstance(queued, memoryview) and queued.obj is frame, "a view into the read, not a copy"
