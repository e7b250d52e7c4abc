"""Bad input gets a typed error with the right reason, and the cluster keeps serving afterwards."""

from __future__ import annotations

import pytest

from gateway.client import Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import (
    CorruptRecordError,
    IllegalStateError,
    InvalidPartitionsError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
    TributaryError,
    UnknownTopicOrPartitionError,
)
from services.records import RecordBatchBuilder


def assert_serving(servers: str, topic: str) -> None:
    """A record still goes in and comes back out."""
    with Producer(servers=servers) as producer:
        metadata = producer.send(topic, b"still serving", partition=0).get(30)
    with Consumer(servers=servers) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, metadata.offset)
        records = consumer.poll(timeout_ms=10_000)[tp]
    assert records[0].value == b"still serving"


def poll_error(consumer: Consumer, timeout_s: float = 15.0) -> BaseException:
    """Poll until the consumer raises (it must, within ``timeout_s``)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            consumer.poll(timeout_ms=500)
        except TributaryError as exc:
            return exc
    raise AssertionError("poll never raised")


def test_unknown_topic(servers, admin, make_topic):
    with (
        Producer(servers=servers, max_block_ms=1500) as producer,
        pytest.raises(UnknownTopicOrPartitionError) as produced,
    ):
        producer.send("no-such-topic", b"x")
    assert produced.value.reason == "UNKNOWN_TOPIC_OR_PARTITION" and produced.value.retriable
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("no-such-topic", 0)])
        error = poll_error(consumer)
    assert isinstance(error, UnknownTopicOrPartitionError)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topics(["no-such-topic"])
    assert_serving(servers, make_topic())


def test_bad_partition(servers, make_topic):
    topic = make_topic(partitions=2)
    with Producer(servers=servers) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="partition 7"):
            producer.send(topic, b"x", partition=7)
        with pytest.raises(ValueError):
            producer.send(topic, b"x", partition=-1)
    with Consumer(servers=servers) as consumer:
        consumer.assign([TopicPartition(topic, 7)])
        consumer.seek(TopicPartition(topic, 7), 0)
        assert isinstance(poll_error(consumer), UnknownTopicOrPartitionError)
        with pytest.raises(IllegalStateError):
            consumer.position(TopicPartition(topic, 0))
    assert_serving(servers, topic)


def test_out_of_range_offset_with_reset_none(servers, make_topic):
    topic = make_topic()
    tp = TopicPartition(topic, 0)
    with Producer(servers=servers) as producer:
        producer.send(topic, b"only", partition=0).get(30)
    with Consumer(servers=servers, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        with pytest.raises(OffsetOutOfRangeError, match="auto_offset_reset is 'none'"):
            consumer.position(tp)  # no position and no reset policy
        consumer.seek(tp, 1_000)
        error = poll_error(consumer)
        assert isinstance(error, OffsetOutOfRangeError) and error.reason == "OFFSET_OUT_OF_RANGE"
        consumer.seek(tp, 0)  # the application recovers by seeking
        assert [r.value for r in consumer.poll(timeout_ms=10_000)[tp]] == [b"only"]
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1_000)
        assert [r.value for r in consumer.poll(timeout_ms=10_000)[tp]] == [b"only"], "earliest: reset quietly"


def test_oversized_record(servers, make_topic):
    topic = make_topic(max_message_bytes=1000)
    with Producer(servers=servers, max_request_size=10_000) as producer:
        with pytest.raises(RecordTooLargeError, match="max_request_size"):
            producer.send(topic, b"x" * 20_000)  # refused client-side, before it is queued
        future = producer.send(topic, b"x" * 5_000)  # within the client's limit, above the topic's
        with pytest.raises(RecordTooLargeError) as refused:
            future.get(30)
        assert refused.value.reason == "RECORD_TOO_LARGE" and not refused.value.retriable
        assert producer.send(topic, b"small").get(30).offset == 0, "nothing of the big one was written"
    assert_serving(servers, topic)


def test_malformed_raw_batch(servers, make_topic):
    topic = make_topic()
    builder = RecordBatchBuilder()
    builder.append(b"payload", timestamp=1_700_000_000_000)
    corrupt = bytearray(builder.build())
    corrupt[-3] ^= 0xFF  # a payload byte: the CRC no longer matches
    with Producer(servers=servers) as producer:
        assert producer.send_batch(topic, 0, builder.build()).get(30).offset == 0, "a valid batch goes in"
        for bad in (bytes(corrupt), b"\x00" * 70, b"not a batch at all"):
            with pytest.raises(CorruptRecordError) as refused:
                producer.send_batch(topic, 0, bad).get(30)
            assert refused.value.reason == "CORRUPT_MESSAGE"
    assert_serving(servers, topic)


def test_admin_errors(admin, make_topic):
    topic = make_topic(partitions=2)
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic(topic, 1)])
    with pytest.raises(InvalidPartitionsError):
        admin.create_partitions({topic: 1})
    with pytest.raises(TributaryError) as bad_config:
        admin.create_topics([NewTopic(topic + "-x", 1, 1, {"retention.ms": "soon"})])
    assert bad_config.value.reason == "INVALID_CONFIG"


def test_closed_clients_refuse_work(servers, make_topic):
    producer = Producer(servers=servers)
    producer.close()
    with pytest.raises(IllegalStateError):
        producer.send(make_topic(), b"late")
    consumer = Consumer(servers=servers)
    with pytest.raises(IllegalStateError, match="assign"):
        consumer.poll()
    consumer.close()
