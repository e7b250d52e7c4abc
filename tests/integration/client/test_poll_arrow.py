"""``Consumer.poll_arrow`` against real processes: the same records as ``poll``, as Arrow tables."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from gateway.client import Consumer, Producer, TopicPartition
from gateway.client.arrow import record_schema
from gateway.client.errors import IllegalStateError

BASE_TS = 1_700_000_000_000


def produce_mixed(servers: str, topic: str, count: int) -> None:
    """Null keys, tombstones, empty values and headers (some with null values), two codecs."""
    for compression in ("lz4", "zstd"):
        with Producer(servers=servers, linger_ms=5, compression=compression) as producer:
            for i in range(count // 2):
                key = None if i % 7 == 0 else b"k%d" % (i % 11)
                value = None if i % 13 == 0 else (b"" if i % 17 == 0 else b"value-%d" % i)
                headers = [("n", b"%d" % i), ("nil", None)] if i % 3 == 0 else []
                producer.send(topic, value, key=key, headers=headers, timestamp=BASE_TS + i)
            producer.flush(timeout=60)


def read_until(consumer: Consumer, count: int, poll) -> list:
    got: list = []
    deadline = time.monotonic() + 60
    while sum(len(x) for x in got) < count and time.monotonic() < deadline:
        got.append(poll(consumer))
    return got


def test_poll_arrow_gives_the_records_poll_gives(servers, make_topic):
    topic = make_topic(partitions=3)
    total = 3000
    produce_mixed(servers, topic, total)
    tps = [TopicPartition(topic, p) for p in range(3)]

    with Consumer(servers=servers, auto_offset_reset="earliest", max_poll_records=700) as consumer:
        consumer.assign(tps)
        polls = read_until(
            consumer, total, lambda c: [r for rs in c.poll(timeout_ms=500).values() for r in rs]
        )
        expected = sorted(
            (
                r.partition,
                r.offset,
                r.key,
                r.value,
                [{"key": k, "value": v} for k, v in r.headers],
                r.timestamp,
            )
            for rs in polls
            for r in rs
        )
    with Consumer(servers=servers, auto_offset_reset="earliest", max_poll_records=700) as consumer:
        consumer.assign(tps)
        tables = read_until(consumer, total, lambda c: c.poll_arrow(timeout_ms=500))
        assert all(t.num_rows <= 700 for t in tables), "max_poll_records bounds a poll"
        assert all(consumer.position(tp) == consumer.end_offsets([tp])[tp] for tp in tps)
    table = pa.concat_tables(tables)
    assert table.schema == record_schema(include_headers=True)
    assert table.num_rows == total == len(expected)
    millis = table.column("timestamp").cast(pa.int64()).to_pylist()
    got = sorted(
        (row["partition"], row["offset"], row["key"], row["value"], row["headers"], us // 1000)
        for row, us in zip(table.to_pylist(), millis, strict=True)
    )
    assert got == expected
    assert set(table.column("topic").to_pylist()) == {topic}
    assert set(table.column("timestampType").to_pylist()) == {0}


def test_poll_arrow_without_headers_and_with_nothing_to_read(servers, make_topic):
    topic = make_topic(partitions=1)
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        empty = consumer.poll_arrow(timeout_ms=50, include_headers=False)
        assert empty.num_rows == 0 and empty.schema == record_schema(include_headers=False)


def test_poll_arrow_refuses_a_consumer_with_deserializers(servers, make_topic):
    topic = make_topic(partitions=1)
    with Consumer(servers=servers, value_deserializer=bytes.decode) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(IllegalStateError, match="deserializer"):
            consumer.poll_arrow(timeout_ms=0)
