"""``RecordAccumulator.reenqueue`` as pure logic: failed batches go back to the front of their
partition's queue merged by the order they were made with the retries queued there already,
before the batches never sent -- whatever order, and however many, they come back in."""

from types import SimpleNamespace

from gateway.client.accumulator import RecordAccumulator
from gateway.client.structs import TopicPartition

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def _batch(order, tp=TP, attempts=1):
    return SimpleNamespace(order=order, topic_partition=tp, attempts=attempts, created_ms=0, retry_at_ms=0)


def test_retries_merge_with_queued_retries_in_made_order_before_unsent_batches():
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
    queue = accumulator._queue(TP)
    queue.extend([_batch(2), _batch(5), _batch(9, attempts=0), _batch(10, attempts=0)])
    accumulator.reenqueue([_batch(6), _batch(1), _batch(4, OTHER), _batch(3)], retry_at_ms=7)
    assert [b.order for b in accumulator._queue(TP)] == [1, 2, 3, 5, 6, 9, 10]
    assert [b.order for b in accumulator._queue(OTHER)] == [4]
    assert [b.retry_at_ms for b in accumulator._queue(TP)] == [7, 0, 7, 0, 7, 0, 0]


def test_the_batches_of_a_large_failed_request_go_back_in_order():
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
    accumulator._queue(TP).extend([_batch(100_000 + i, attempts=0) for i in range(3)])
    accumulator.reenqueue([_batch(i) for i in range(20_000)], retry_at_ms=1)
    orders = [b.order for b in accumulator._queue(TP)]
    assert orders == [*range(20_000), 100_000, 100_001, 100_002]
