"""The producer's accumulator: batching by size and linger, drain order, retries, buffer memory.

Time is passed in by hand (``now_ms``), so every rule is checked without sleeping.
"""

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.client.accumulator import (
    INITIAL_BATCH_RESERVATION,
    BufferPool,
    RecordAccumulator,
    estimate_record_size,
)
from gateway.client.errors import IllegalStateError, RecordTooLargeError, RequestTimedOutError
from gateway.client.structs import TopicPartition
from services.records import Compression, RecordBatchView
from services.records.format import RECORD_BATCH_OVERHEAD

T0 = 1_000_000
TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
OTHER = TopicPartition("u", 0)


def append(acc, tp=TP0, value=b"v" * 10, key=b"k", now=T0, headers=()):
    size = estimate_record_size(key, value, 0)
    return acc.append(tp.topic, tp.partition, now, key, value, headers, size, now)


def records_of(batch):
    return list(RecordBatchView(batch.close()).records())


def test_records_share_a_batch_until_batch_size():
    acc = RecordAccumulator(batch_size=200, linger_ms=10)
    flags = [append(acc)[1:] for _ in range(10)]
    assert flags[0] == (False, True)  # the first record opens a batch
    assert sum(new for _, new in flags) == 2, "~18-byte records: seven fit in 200 bytes with the header"
    plans = acc.drain([TP0], T0 + 10, max_request_size=10**6, max_requests=10)
    batches = plans[0][1][0]
    assert [b.record_count for b in batches] == [7, 3]
    assert all(len(b.close()) <= 200 for b in batches)
    assert [r.offset for r in records_of(batches[0])] == list(range(7))


def test_a_record_larger_than_batch_size_gets_a_batch_of_its_own():
    acc = RecordAccumulator(batch_size=100, linger_ms=10)
    _future, full, new = append(acc, value=b"x" * 500)
    assert new and full
    assert acc.ready(T0).ready == [TP0], "a full batch is sendable before linger"


def test_not_ready_before_linger_then_ready():
    acc = RecordAccumulator(batch_size=16384, linger_ms=10)
    append(acc)
    check = acc.ready(T0 + 3)
    assert check.ready == [] and check.next_check_ms == 7
    assert acc.ready(T0 + 10).ready == [TP0]


def test_full_batch_is_ready_at_once_and_the_next_one_lingers():
    acc = RecordAccumulator(batch_size=120, linger_ms=50)
    while not append(acc)[1]:
        pass
    append(acc)  # opens a second batch
    assert acc.ready(T0).ready == [TP0]
    plans = acc.drain([TP0], T0, max_request_size=10**6, max_requests=1)
    assert len(plans[0][1][0]) == 1, "the lingering second batch stays"
    assert acc.ready(T0).ready == []
    assert acc.ready(T0 + 50).ready == [TP0]


def test_muted_partition_is_never_ready():
    acc = RecordAccumulator(linger_ms=0)
    append(acc, TP0)
    append(acc, TP1)
    assert acc.ready(T0, muted={TP0}).ready == [TP1]


def test_drain_keeps_partition_order_and_groups_by_topic():
    acc = RecordAccumulator(batch_size=100, linger_ms=0)
    futures = [append(acc, TP0, value=bytes([i]) * 40)[0] for i in range(4)]
    append(acc, OTHER)
    plans = acc.drain(acc.ready(T0).ready, T0, max_request_size=10**6, max_requests=10)
    topics = sorted(topic for topic, _ in plans)
    assert topics == ["t", "u"]
    t_batches = next(parts for topic, parts in plans if topic == "t")[0]
    assert len(t_batches) == 4, "a 40-byte record and a second one exceed 100 bytes"
    assert [r.value[0] for b in t_batches for r in records_of(b)] == [0, 1, 2, 3]
    assert [b.result for b in t_batches] == [f._result for f in futures]


def test_each_drain_starts_after_the_last_partition_the_previous_one_took():
    acc = RecordAccumulator(batch_size=150, linger_ms=0)
    partitions = [TopicPartition("t", p) for p in range(10)]
    drained = []
    for _ in range(5):
        for tp in partitions:  # every partition has a record waiting, every time
            if not acc._queues.get(tp):
                append(acc, tp, value=b"x" * 80)
        plans = acc.drain(acc.ready(T0).ready, T0, max_request_size=3 * 160, max_requests=1)
        drained.append(sorted(plans[0][1]))
    # Round robin over all ten (Kafka's drainIndex), not the first few again and again.
    assert drained == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 9], [2, 3, 4]]


def test_drain_splits_requests_at_max_request_size_but_sends_at_least_one_batch():
    acc = RecordAccumulator(batch_size=150, linger_ms=0)
    for p in range(4):
        append(acc, TopicPartition("t", p), value=b"x" * 80)
    plans = acc.drain(acc.ready(T0).ready, T0, max_request_size=200, max_requests=10)
    assert len(plans) == 4, "each ~160-byte batch alone fills a 200-byte request"
    acc2 = RecordAccumulator(batch_size=10_000, linger_ms=0)
    append(acc2, value=b"x" * 5000)
    assert len(acc2.drain([TP0], T0, max_request_size=100, max_requests=10)) == 1


def test_drain_respects_max_requests():
    acc = RecordAccumulator(linger_ms=0)
    for topic in "abc":
        append(acc, TopicPartition(topic, 0))
    plans = acc.drain(acc.ready(T0).ready, T0, max_request_size=10**6, max_requests=2)
    assert len(plans) == 2
    assert len(acc.ready(T0).ready) == 1


def test_reenqueue_puts_batches_back_in_front_in_order_and_backs_off():
    acc = RecordAccumulator(batch_size=100, linger_ms=0)
    for i in range(3):
        append(acc, value=bytes([i]) * 40)
    first = acc.drain([TP0], T0, max_request_size=100, max_requests=1)[0][1][0]
    assert len(first) == 1
    append(acc, value=bytes([9]) * 40)
    acc.reenqueue(first, retry_at_ms=T0 + 100)
    check = acc.ready(T0 + 1)
    assert check.ready == [] and check.next_check_ms == 99, "the head batch is backing off"
    plans = acc.drain(acc.ready(T0 + 100).ready, T0 + 100, max_request_size=10**6, max_requests=1)
    values = [r.value[0] for b in plans[0][1][0] for r in records_of(b)]
    assert values == [0, 1, 2, 9]


def test_flush_makes_lingering_batches_ready():
    acc = RecordAccumulator(linger_ms=10_000)
    append(acc)
    assert acc.ready(T0).ready == []
    results = acc.begin_flush()
    assert len(results) == 1
    assert acc.ready(T0).ready == [TP0]
    acc.end_flush()
    assert acc.ready(T0).ready == []


def test_expire_removes_old_queued_batches():
    acc = RecordAccumulator(linger_ms=10_000)
    append(acc, now=T0)
    append(acc, TP1, now=T0 + 500)
    expired = acc.expire(T0 + 1000, delivery_timeout_ms=1000)
    assert [b.topic_partition for b in expired] == [TP0]


def test_complete_releases_buffer_memory():
    pool = BufferPool(1000)
    acc = RecordAccumulator(linger_ms=0, pool=pool)
    append(acc, value=b"x" * 100)
    assert pool.available < 1000
    batch = acc.drain([TP0], T0, max_request_size=10**6, max_requests=1)[0][1][0][0]
    acc.complete(batch)
    assert pool.available == 1000
    assert not acc.has_incomplete()


def test_closed_accumulator_refuses_appends_and_everything_is_ready():
    acc = RecordAccumulator(linger_ms=10_000)
    append(acc)
    acc.close()
    assert acc.ready(T0).ready == [TP0]
    with pytest.raises(IllegalStateError):
        append(acc)


def test_sealed_batches_keep_their_bytes():
    from services.records import RecordBatchBuilder

    builder = RecordBatchBuilder(compression=Compression.GZIP)
    for i in range(3):
        builder.append(b"v%d" % i, timestamp=T0)
    data = builder.build()
    acc = RecordAccumulator(linger_ms=10_000)
    acc.append_batch(TP0, data, T0)
    batch = acc.drain(acc.ready(T0).ready, T0, max_request_size=10**6, max_requests=1)[0][1][0][0]
    assert batch.close() == data and batch.record_count == 3


def test_compression_is_applied_client_side():
    acc = RecordAccumulator(linger_ms=0, compression=Compression.ZSTD)
    for _ in range(50):
        append(acc, value=b"same" * 20)
    batch = acc.drain([TP0], T0, max_request_size=10**6, max_requests=1)[0][1][0][0]
    view = RecordBatchView(batch.close())
    assert view.compression == Compression.ZSTD
    assert view.size_in_bytes < 50 * 80
    assert len(list(view.records())) == 50


# ---- buffer memory back-pressure ----------------------------------------------------------------


def test_allocate_blocks_until_memory_is_released():
    pool = BufferPool(100)
    pool.allocate(80, timeout_s=1)
    released = threading.Timer(0.1, pool.deallocate, args=(80,))
    released.start()
    start = time.monotonic()
    pool.allocate(50, timeout_s=5)
    assert 0.05 < time.monotonic() - start < 2
    assert pool.available == 50


def test_allocate_times_out_when_the_buffer_stays_full():
    pool = BufferPool(100)
    pool.allocate(100, timeout_s=1)
    start = time.monotonic()
    with pytest.raises(RequestTimedOutError, match="max_block_ms"):
        pool.allocate(1, timeout_s=0.1)
    assert time.monotonic() - start >= 0.09


def test_a_record_larger_than_the_whole_buffer_fails_at_once():
    with pytest.raises(RecordTooLargeError):
        BufferPool(100).allocate(101, timeout_s=10)


def test_async_allocate_waits_without_blocking_the_loop():
    async def scenario():
        pool = BufferPool(100)
        await pool.allocate_async(100, 1)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                if ticks == 5:  # only a loop that kept running while the allocation waited gets here
                    pool.deallocate(60)
                await asyncio.sleep(0.01)

        # The room comes from the loop's fifth tick, not from a timer: counting ticks against a
        # 100 ms timer failed under load, when a descheduled loop missed ticks.
        task = asyncio.create_task(ticker())
        await pool.allocate_async(60, 10)
        task.cancel()
        assert ticks >= 5, "the loop kept running while the allocation waited"
        with pytest.raises(RequestTimedOutError):
            await pool.allocate_async(50, 0.05)

    asyncio.run(scenario())


@given(
    size=st.integers(min_value=0, max_value=1 << 21),
    batch_size=st.integers(min_value=1, max_value=1 << 20),
    pool_bytes=st.integers(min_value=1, max_value=1 << 22),
)
@settings(max_examples=300, deadline=None)
def test_batch_reservation_is_the_documented_step(size, batch_size, pool_bytes):
    # What the batch header and the record need, at least the first step (1 KiB, at most
    # batch_size), at most the whole pool -- but never less than the record itself.
    acc = RecordAccumulator(batch_size=batch_size, pool=BufferPool(pool_bytes))
    first = max(RECORD_BATCH_OVERHEAD + size, min(INITIAL_BATCH_RESERVATION, batch_size))
    assert acc.batch_reservation(size) == max(size, min(first, pool_bytes))
