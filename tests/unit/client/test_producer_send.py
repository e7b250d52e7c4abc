"""``Producer.send`` on its hot path, with no network: what each record's future resolves to,
how a batch's outcome reaches every record, buffer memory reserved per batch, and the sender
woken only when it would otherwise look too late.

The producer here never starts its I/O thread: the topic's metadata is cached up front and the
test plays the sender (drain the accumulator, resolve each batch), so every step is explicit.
"""

import asyncio
import threading
import time

import pytest

from gateway.client import AsyncProducer, Producer
from gateway.client.accumulator import (
    INITIAL_BATCH_RESERVATION,
    BufferExhausted,
    RecordAccumulator,
    estimate_record_size,
)
from gateway.client.errors import (
    IllegalStateError,
    NotLeaderOrFollowerError,
    RecordTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from gateway.client.producer import ProducerConfig, ProducerCore
from services.clock import ManualClock
from services.partitioner import partition_for_key
from services.records import RecordBatchView
from services.records.format import RECORD_BATCH_OVERHEAD

TOPIC = "events"
T0 = 1_700_000_000_000


def offline_producer(partitions=1, clock=None, **settings) -> Producer:
    """A Producer whose sender never runs; ``TOPIC`` is cached with ``partitions`` partitions."""
    config = ProducerConfig.from_kwargs({"servers": "127.0.0.1:1", **settings})
    producer = Producer.__new__(Producer)
    producer.config = config
    producer._core = ProducerCore(config, clock=clock or ManualClock(T0))
    producer._closed = True  # close() must not reach for the absent I/O thread
    metadata = producer._core.client.metadata
    metadata._partition_counts[TOPIC] = partitions
    metadata._fetched_ms[TOPIC] = T0
    return producer


def settle(producer, base_offsets=None, error=None):
    """Play the sender: drain every queued batch and resolve it (offsets per partition from
    ``base_offsets``, else 0), or fail it with ``error``. Returns the batches in drain order."""
    accumulator = producer._core.accumulator
    accumulator.begin_flush()
    try:
        ready = accumulator.ready(T0).ready
        plans = accumulator.drain(ready, T0, max_request_size=1 << 30, max_requests=1 << 30)
    finally:
        accumulator.end_flush()
    offsets = dict(base_offsets or {})
    batches = []
    for _topic, partitions in plans:
        for partition, queued in partitions.items():
            for batch in queued:
                batch.close()
                accumulator.complete(batch)
                if error is not None:
                    batch.result.complete(error=error)
                else:
                    batch.result.complete(offsets.get(partition, 0), -1, 0)
                    offsets[partition] = offsets.get(partition, 0) + batch.record_count
                batches.append(batch)
    return batches


def test_each_record_future_resolves_to_its_own_offset_partition_and_timestamp():
    producer = offline_producer(batch_size=400)  # ~12 records of 16 bytes per batch: several batches
    futures = [producer.send(TOPIC, b"value-%02d" % i, timestamp=T0 + i) for i in range(40)]
    assert not any(f.is_done for f in futures), "nothing resolves before its batch does"
    batches = settle(producer, {0: 1000})
    assert len(batches) > 1
    metadata = [f.get(0) for f in futures]
    assert [m.offset for m in metadata] == list(range(1000, 1040))
    assert [m.timestamp for m in metadata] == [T0 + i for i in range(40)]
    assert {(m.topic, m.partition) for m in metadata} == {(TOPIC, 0)}
    records = [r for b in batches for r in RecordBatchView(b.close()).records()]
    assert [r.value for r in records] == [b"value-%02d" % i for i in range(40)]


def test_a_record_without_a_timestamp_gets_the_clock_reading_of_its_send():
    clock = ManualClock(T0)
    producer = offline_producer(clock=clock)
    first = producer.send(TOPIC, b"a")
    clock.advance(7)
    second = producer.send(TOPIC, b"b")
    settle(producer)
    assert (first.get(0).timestamp, second.get(0).timestamp) == (T0, T0 + 7)


def test_a_failed_batch_fails_every_record_of_it_and_only_those():
    producer = offline_producer(partitions=2)
    failed = [producer.send(TOPIC, b"x", partition=0) for _ in range(3)]
    error = NotLeaderOrFollowerError("leader moved")
    settle(producer, error=error)
    kept = [producer.send(TOPIC, b"y", partition=1) for _ in range(2)]
    settle(producer)
    for future in failed:
        assert future.failed() and future.exception is error
        with pytest.raises(NotLeaderOrFollowerError):
            future.get(0)
    assert [f.get(0).offset for f in kept] == [0, 1]


def test_callbacks_run_in_record_order_with_each_records_metadata():
    producer = offline_producer()
    seen = []
    for i in range(5):
        future = producer.send(
            TOPIC, b"v", on_delivery=lambda err, md, i=i: seen.append(("delivery", i, err, md.offset))
        )
        future.add_callback(lambda md, i=i: seen.append(("callback", i, md.offset)))
    settle(producer, {0: 10})
    assert seen == [
        entry for i in range(5) for entry in (("delivery", i, None, 10 + i), ("callback", i, 10 + i))
    ]


def test_errbacks_and_delivery_callbacks_hear_the_batch_error():
    producer = offline_producer()
    seen = []
    futures = [
        producer.send(TOPIC, b"v", on_delivery=lambda err, md: seen.append((type(err), md))) for _ in range(3)
    ]
    for future in futures:
        future.add_errback(lambda exc: seen.append(type(exc)))
    settle(producer, error=NotLeaderOrFollowerError("gone"))
    # In the order they were registered: the three delivery callbacks (at send), then the errbacks.
    assert seen == [(NotLeaderOrFollowerError, None)] * 3 + [NotLeaderOrFollowerError] * 3


def test_keys_partition_by_murmur2_and_serializers_headers_apply():
    producer = offline_producer(
        partitions=8, key_serializer=lambda k: k.encode(), value_serializer=lambda v: v.upper().encode()
    )
    futures = {
        key: producer.send(TOPIC, "value", key=key, headers={"h": "1"}) for key in ("a", "b", "c", "d")
    }
    batches = settle(producer)
    for key, future in futures.items():
        assert future.get(0).partition == partition_for_key(key.encode(), 8)
    records = [r for b in batches for r in RecordBatchView(b.close()).records()]
    assert sorted(r.key for r in records) == [b"a", b"b", b"c", b"d"]
    assert {r.value for r in records} == {b"VALUE"}
    assert {r.headers for r in records} == {(("h", b"1"),)}


def test_bad_input_is_refused_before_anything_is_queued_or_reserved():
    producer = offline_producer(partitions=2, max_request_size=1000)
    pool = producer._core.pool
    with pytest.raises(TypeError):
        producer.send(TOPIC, 12345)
    with pytest.raises(TypeError):
        producer.send(TOPIC, b"v", headers=[(1, b"x")])
    with pytest.raises(RecordTooLargeError):
        producer.send(TOPIC, b"x" * 2000)
    with pytest.raises(ValueError, match="non-negative"):
        producer.send(TOPIC, b"v", partition=-1)
    with pytest.raises(TypeError):
        producer.send(TOPIC, b"v", timestamp="yesterday")
    assert pool.available == pool.total_bytes
    assert not producer._core.accumulator.has_queued(), "a refused record leaves no (empty) batch"
    # A partition past the cached count asks the cluster; a closed producer refuses instead.
    producer._core.accumulator.close()
    with pytest.raises(IllegalStateError):
        producer.send(TOPIC, b"v", partition=5)
    with pytest.raises(IllegalStateError):
        producer.send(TOPIC, b"v")


def test_an_explicit_partition_past_the_count_is_unknown():
    core = offline_producer(partitions=2)._core
    prepared = core.prepare(b"v", None, None, None)
    with pytest.raises(UnknownTopicOrPartitionError):
        core.append(TOPIC, 2, 2, prepared)


def test_buffer_memory_is_reserved_per_batch_and_released_when_it_completes():
    producer = offline_producer(batch_size=1000, buffer_memory=10_000)
    pool = producer._core.pool
    producer.send(TOPIC, b"x" * 100)
    assert pool.available == 9000, "the record that opens a batch reserves a first step (batch_size here)"
    for _ in range(5):
        producer.send(TOPIC, b"x" * 100)
    assert pool.available == 9000, "records joining the open batch within its step reserve nothing"
    producer.send(TOPIC, b"y" * 3000)  # larger than batch_size: a batch of its own, its own size
    assert pool.available == 9000 - (RECORD_BATCH_OVERHEAD + 3000 + 16)
    settle(producer)
    assert pool.available == 10_000


def test_a_batch_reserves_in_steps_as_it_grows_up_to_batch_size():
    producer = offline_producer(batch_size=16384, buffer_memory=100_000)
    pool = producer._core.pool
    producer.send(TOPIC, b"x" * 100)
    assert pool.available == 100_000 - INITIAL_BATCH_RESERVATION, "a batch of one record holds one step"
    steps = [INITIAL_BATCH_RESERVATION]
    for _ in range(140):  # ~16 KiB of records: the batch fills up
        producer.send(TOPIC, b"x" * 100)
        if 100_000 - pool.available != steps[-1]:
            steps.append(100_000 - pool.available)
    assert steps == [1024, 2048, 4096, 8192, 16384], "doubling, up to batch_size"
    settle(producer)
    assert pool.available == 100_000


def test_a_batch_the_pool_cannot_grow_is_sent_and_the_record_waits_for_a_new_one():
    producer = offline_producer(batch_size=16384, buffer_memory=3000, max_block_ms=50)
    pool = producer._core.pool
    first = producer.send(TOPIC, b"x" * 100)
    for _ in range(8):  # the batch outgrows 1 KiB: its second step (2 KiB) still fits
        producer.send(TOPIC, b"x" * 100)
    assert pool.available == 3000 - 2048
    for _ in range(9):  # past 2 KiB it cannot grow to 4 KiB: full, and a new batch needs 1 KiB
        producer.send(TOPIC, b"x" * 100)
    with pytest.raises(RequestTimedOutError, match="buffer_memory"):
        for _ in range(20):
            producer.send(TOPIC, b"x" * 100)
    settle(producer)  # the full batch completes, its memory comes back
    assert first.get(0).offset == 0
    assert producer.send(TOPIC, b"x" * 100) is not None


def test_send_blocks_for_buffer_memory_up_to_max_block_ms():
    producer = offline_producer(batch_size=1000, buffer_memory=1000, max_block_ms=50, partitions=2)
    first = producer.send(TOPIC, b"x", partition=0)
    started = time.monotonic()
    with pytest.raises(RequestTimedOutError, match="buffer_memory"):
        producer.send(TOPIC, b"x", partition=1)  # needs a batch, the pool is taken by partition 0's
    assert time.monotonic() - started >= 0.05
    # Once partition 0's batch completes, a blocked send gets the memory and goes through.
    producer.config.max_block_ms = 10_000
    result = {}
    sender = threading.Thread(
        target=lambda: result.setdefault("future", producer.send(TOPIC, b"z", partition=1))
    )
    sender.start()
    deadline = time.monotonic() + 10
    while not producer._core.pool._cond._waiters and time.monotonic() < deadline:  # the send is waiting
        time.sleep(0.001)
    settle(producer)
    sender.join(10)
    assert first.get(0).offset == 0
    settle(producer)
    assert result["future"].get(0).partition == 1


def test_the_accumulator_asks_for_memory_it_has_not_got_and_takes_what_it_was_given():
    acc = RecordAccumulator(batch_size=1000, linger_ms=5)
    acc.pool.try_allocate(acc.pool.total_bytes - 500)
    size = estimate_record_size(None, b"v", 0)
    with pytest.raises(BufferExhausted) as exhausted:
        acc.append(TOPIC, 0, T0, None, b"v", (), size, T0)
    assert exhausted.value.needed == 1000
    assert not acc.has_queued()
    acc.pool.deallocate(acc.pool.total_bytes - 500)
    acc.pool.allocate(1000, 1)
    future, _full, new = acc.append(TOPIC, 0, T0, None, b"v", (), size, T0, False, 1000)
    assert new and future is not None
    assert acc.pool.available == acc.pool.total_bytes - 1000
    # Memory waited for while another thread opened the batch is given back.
    acc.pool.allocate(1000, 1)
    _future, _full, new = acc.append(TOPIC, 0, T0, None, b"v", (), size, T0, False, 1000)
    assert not new and acc.pool.available == acc.pool.total_bytes - 1000


def test_the_sender_is_woken_only_when_it_would_look_too_late():
    acc = RecordAccumulator(batch_size=1000, linger_ms=5)
    assert not acc.sender_looks_by(T0 + 10**9), "before its first look the sender must be woken"
    size = estimate_record_size(None, b"v", 0)
    acc.append(TOPIC, 0, T0, None, b"v", (), size, T0)
    acc.ready(T0)  # the sender looks: the batch lingers until T0 + 5, it will look again then
    assert acc.sender_looks_by(T0 + 5) and not acc.sender_looks_by(T0 + 4)
    acc.ready(T0 + 5)  # ready now: it sends and looks again at once (or when the request completes)
    assert acc.sender_looks_by(T0 + 5)
    acc.drain([acc.ready(T0 + 5).ready[0]], T0 + 5, max_request_size=1 << 20, max_requests=1)
    acc.ready(T0 + 6)  # nothing queued: it sleeps until woken
    assert not acc.sender_looks_by(T0 + 10**9)


def test_expire_walks_the_queues_only_once_a_batch_may_be_due():
    acc = RecordAccumulator(linger_ms=10_000)
    size = estimate_record_size(None, b"v", 0)
    acc.append(TOPIC, 0, T0, None, b"v", (), size, T0)
    assert acc.expire(T0 + 999, delivery_timeout_ms=1000) == []
    expired = acc.expire(T0 + 1000, delivery_timeout_ms=1000)
    assert [b.record_count for b in expired] == [1]
    # A retried batch keeps its creation time: put back, it is due at once.
    acc.append(TOPIC, 1, T0 + 2000, None, b"v", (), size, T0 + 2000)
    (batch,) = acc.drain(
        [acc.ready(T0 + 12_000).ready[0]], T0 + 12_000, max_request_size=1 << 20, max_requests=1
    )[0][1][1]
    acc.append(TOPIC, 0, T0 + 2500, None, b"v", (), size, T0 + 2500)
    assert acc.expire(T0 + 2900, delivery_timeout_ms=1000) == []
    acc.reenqueue([batch], retry_at_ms=T0 + 3000)
    assert acc.expire(T0 + 3000, delivery_timeout_ms=1000) == [batch]
    assert [b.created_ms for b in acc.expire(T0 + 3500, delivery_timeout_ms=1000)] == [T0 + 2500]


def offline_async_producer(partitions=1, **settings) -> AsyncProducer:
    """``offline_producer`` for asyncio: the core is never started (no sender routine)."""
    config = ProducerConfig.from_kwargs({"servers": "127.0.0.1:1", **settings})
    producer = AsyncProducer.__new__(AsyncProducer)
    producer.config = config
    producer._core = core = ProducerCore(config, clock=ManualClock(T0))

    async def never_started() -> None:
        return None

    core.start = never_started  # type: ignore[method-assign]
    core.client.metadata._partition_counts[TOPIC] = partitions
    core.client.metadata._fetched_ms[TOPIC] = T0
    return producer


def test_async_send_waits_for_buffer_memory_on_the_loop_and_times_out_at_max_block_ms():
    async def scenario():
        producer = offline_async_producer(partitions=2, batch_size=1000, buffer_memory=1000, max_block_ms=50)
        first = await producer.send(TOPIC, b"x", partition=0)
        with pytest.raises(RequestTimedOutError, match="buffer_memory"):
            await producer.send(TOPIC, b"x", partition=1)
        producer.config.max_block_ms = 10_000
        waiting = asyncio.ensure_future(producer.send(TOPIC, b"z", partition=1))
        await asyncio.sleep(0)  # let it find the pool full and wait
        assert not waiting.done()
        settle(producer)  # partition 0's batch completes: its memory comes back
        second = await asyncio.wait_for(waiting, 10)
        settle(producer)
        return (await first).offset, (await second).partition

    assert asyncio.run(scenario()) == (0, 1)


def test_reserved_memory_passed_to_append_is_given_back_unless_a_new_batch_keeps_it():
    acc = RecordAccumulator(batch_size=100, linger_ms=5)
    total = acc.pool.total_bytes
    size = estimate_record_size(None, b"v" * 60, 0)
    first = acc.batch_reservation(size)
    acc.append(TOPIC, 0, T0, None, b"v" * 60, (), size, T0)  # opens partition 0's batch
    assert acc.pool.available == total - first

    def reserve():
        acc.pool.allocate(first, 1)
        return first

    # A sticky abort (the open batch is full for this record) gives the reservation back.
    future, _full, _new = acc.append(TOPIC, 0, T0, None, b"v" * 60, (), size, T0, True, reserve())
    assert future is None and acc.pool.available == total - first
    # So does a record the builder refuses while joining an open batch ...
    small = estimate_record_size(None, b"v", 0)
    with pytest.raises(TypeError):
        acc.append(TOPIC, 0, "not a timestamp", None, b"v", (), small, T0, False, reserve())
    assert acc.pool.available == total - first
    # ... and one refused by a closed accumulator.
    acc.close()
    with pytest.raises(IllegalStateError):
        acc.append(TOPIC, 1, T0, None, b"v", (), small, T0, False, reserve())
    assert acc.pool.available == total - first


def test_a_sticky_record_that_moves_on_waits_for_its_new_batch_memory_again():
    # Partition 0's batch is full for the next record, and the pool has no room for another.
    producer = offline_producer(partitions=2, batch_size=100, buffer_memory=100, max_block_ms=50)
    producer._core.sticky._current[TOPIC] = 0
    producer.send(TOPIC, b"v" * 60)
    with pytest.raises(RequestTimedOutError, match="buffer_memory"):
        producer.send(TOPIC, b"v" * 60)
    assert producer._core.pool.available == 0, "nothing leaked, nothing double-counted"
    settle(producer)
    assert producer._core.pool.available == 100
