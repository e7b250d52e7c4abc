"""Produce through the SDK and consume back, against real processes: nothing lost or changed."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

import grpc
import pytest

from gateway.client import Consumer, Producer, TopicPartition
from services.partitioner import partition_for_key
from services.proto import gateway_grpc, pb
from services.records import Compression, iter_batches

BASE_TS = 1_700_000_000_000


def consume_all(servers: str, topic: str, partitions: int, expected: int, **settings) -> dict[int, list]:
    """Every record of ``topic`` by partition, in the order the consumer returned them."""
    got: dict[int, list] = defaultdict(list)
    with Consumer(servers=servers, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 60
        count = 0
        while count < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                got[tp.partition].extend(records)
                count += len(records)
    return got


def test_100k_keyed_records_with_headers_come_back_identical(servers, make_topic):
    topic = make_topic(partitions=8)
    total = 100_000
    expected: dict[int, list] = defaultdict(list)
    with Producer(servers=servers, linger_ms=5, batch_size=65536, compression="lz4") as producer:
        futures = []
        for i in range(total):
            key = b"user-%d" % (i % 997)
            value = b'{"seq":%d,"page":"/p/%d"}' % (i, i % 13)
            headers = (("seq", b"%d" % i), ("source", b"roundtrip"))
            futures.append(producer.send(topic, value, key=key, headers=headers, timestamp=BASE_TS + i))
            expected[partition_for_key(key, 8)].append((key, value, headers, BASE_TS + i))
        producer.flush(timeout=120)
    metadata = [f.get(0) for f in futures]
    assert all(m.partition == partition_for_key(b"user-%d" % (i % 997), 8) for i, m in enumerate(metadata))

    got = consume_all(servers, topic, 8, total)
    assert sum(len(r) for r in got.values()) == total
    for partition in range(8):
        records = got[partition]
        assert [r.offset for r in records] == list(range(len(records))), "dense offsets, in order"
        assert [(r.key, r.value, r.headers, r.timestamp) for r in records] == expected[partition]
        assert all(partition_for_key(r.key, 8) == partition for r in records)
    # What each future said is where the record really is.
    assert {(m.partition, m.offset) for m in metadata} == {(p, r.offset) for p, rs in got.items() for r in rs}


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_is_end_to_end(servers, make_topic, codec):
    """The consumer decodes what the producer encoded: the stored batches carry the codec."""
    topic = make_topic(partitions=1)
    values = [b"event %d " % i + b"x" * 100 for i in range(500)]
    with Producer(servers=servers, compression=codec, linger_ms=20) as producer:
        for value in values:
            producer.send(topic, value)
    got = consume_all(servers, topic, 1, len(values))
    assert [r.value for r in got[0]] == values
    with grpc.insecure_channel(servers) as channel:
        response = gateway_grpc.GatewayStub(channel).Fetch(
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=topic, partition=0, offset=0)], raw_batches=True
            ),
            timeout=30,
        )
    batches = list(iter_batches(response.partitions[0].record_batches))
    assert batches and all(b.compression == Compression.from_name(codec) for b in batches)
    assert sum(b.size_in_bytes for b in batches) < sum(len(v) for v in values) / 2


def test_null_keys_spread_over_partitions_in_sticky_batches(servers, make_topic):
    topic = make_topic(partitions=4)
    with Producer(servers=servers, batch_size=1024, linger_ms=0) as producer:
        futures = [producer.send(topic, b"v" * 100) for _ in range(400)]
        producer.flush()
    partitions = [f.get(0).partition for f in futures]
    assert len(set(partitions)) > 1, "a full batch moves the sticky partition on"
    switches = sum(1 for a, b in itertools.pairwise(partitions) if a != b)
    assert switches < 100, "but records stick to a partition for a whole batch"


def test_acks_zero_and_one(servers, make_topic):
    topic = make_topic(partitions=1)
    with Producer(servers=servers, acks=0) as producer:
        assert producer.send(topic, b"fire").get(10).offset == -1
    with Producer(servers=servers, acks=1) as producer:
        assert producer.send(topic, b"leader").get(10).offset >= 0
    got = consume_all(servers, topic, 1, 2)
    assert [r.value for r in got[0]] == [b"fire", b"leader"]


def test_acks_zero_loses_nothing_when_the_producer_closes(servers, make_topic):
    # acks=0 requests are done once written; close must still let the gateway read them all.
    topic = make_topic(partitions=1)
    # Enough 200-byte records that the gateway is still reading when the producer closes.
    values = [b"fire-%05d-" % i + b"x" * 190 for i in range(20_000)]
    with Producer(
        servers=servers, acks=0, batch_size=1, linger_ms=0, max_request_size=300, max_in_flight=16
    ) as producer:
        for value in values:
            producer.send(topic, value)
    got: list[bytes] = []
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 60
        while len(set(got)) < len(values) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(r.value for r in records)
    # Nothing lost, in order. A plain (non-idempotent) produce is at-least-once, as in Kafka: on a
    # loaded machine the gateway may retry an append whose first attempt was written after all
    # (seen twice in ~30 runs under a load of 5, both on the gRPC path: a run of records appended
    # again), so values may come twice; only an idempotent producer promises once.
    assert list(dict.fromkeys(got)) == values, (len(set(got)), len(values))


def test_explicit_partition_timestamps_and_callbacks(servers, make_topic):
    topic = make_topic(partitions=3)
    delivered, callbacks = [], []
    with Producer(servers=servers, value_serializer=str.encode, key_serializer=str.encode) as producer:
        producer.send(
            topic, "to-two", key="k", partition=2, on_delivery=lambda e, m: delivered.append((e, m))
        )
        future = producer.send(topic, "now")
        future.add_callback(callbacks.append)
        producer.flush()
        assert producer.partitions_for(topic) == {0, 1, 2}
    [(error, metadata)] = delivered
    assert error is None and metadata.partition == 2 and metadata.offset == 0
    [metadata] = callbacks
    assert abs(metadata.timestamp - time.time() * 1000) < 60_000, "default timestamp: create time now"
