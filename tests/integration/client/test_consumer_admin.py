"""Consumer positioning and the admin client against real processes; the asyncio clients too."""

from __future__ import annotations

import asyncio
import time

from gateway.client import AsyncAdmin, AsyncConsumer, AsyncProducer, Consumer, Producer, TopicPartition
from gateway.client.structs import OffsetAndTimestamp

BASE_TS = 1_700_000_000_000


def fill(servers: str, topic: str, count: int, partition: int = 0) -> None:
    with Producer(servers=servers, linger_ms=0) as producer:
        for i in range(count):
            producer.send(
                topic, b"v%d" % i, key=b"k%d" % i, partition=partition, timestamp=BASE_TS + 1000 * i
            )


def poll_values(consumer: Consumer, tp: TopicPartition, count: int, timeout_s: float = 20) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(values) < count and time.monotonic() < deadline:
        values.extend(r.value for r in consumer.poll(timeout_ms=500).get(tp, []))
    return values


def test_seek_position_and_offset_lookups(servers, make_topic):
    topic = make_topic()
    tp = TopicPartition(topic, 0)
    fill(servers, topic, 10)
    with Consumer(servers=servers, auto_offset_reset="latest") as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 10, "latest: after the last record"
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: BASE_TS + 3500})
        assert found == {tp: OffsetAndTimestamp(4, BASE_TS + 4000)}
        assert consumer.offsets_for_times({tp: BASE_TS + 10**9}) == {tp: None}
        consumer.seek(tp, found[tp].offset)
        assert poll_values(consumer, tp, 6) == [b"v%d" % i for i in range(4, 10)]
        assert consumer.position(tp) == 10
        assert consumer.highwater(tp) == 10
        consumer.seek_to_beginning(tp)
        assert consumer.position(tp) == 0
        assert poll_values(consumer, tp, 2)[:2] == [b"v0", b"v1"]
        consumer.seek_to_end()
        assert consumer.poll(timeout_ms=300) == {}


def test_max_records_and_iteration(servers, make_topic):
    topic = make_topic()
    tp = TopicPartition(topic, 0)
    fill(servers, topic, 25)
    with Consumer(
        servers=servers, auto_offset_reset="earliest", consumer_timeout_ms=1500, max_partition_fetch_bytes=200
    ) as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 20
        first = {}
        while not first and time.monotonic() < deadline:
            first = consumer.poll(timeout_ms=500, max_records=7)
        assert len(first[tp]) <= 7
        rest = [record.offset for record in consumer]  # stops after 1.5 s without records
    assert [r.offset for r in first[tp]] + rest == list(range(25))


def test_pause_and_resume(servers, make_topic):
    topic = make_topic(partitions=2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    fill(servers, topic, 5, partition=0)
    fill(servers, topic, 5, partition=1)
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp0, tp1])
        consumer.pause(tp1)
        assert consumer.paused() == {tp1}
        seen: dict = {}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                seen.setdefault(tp, []).extend(records)
        assert set(seen) == {tp0} and len(seen[tp0]) == 5
        consumer.resume(tp1)
        assert poll_values(consumer, tp1, 5) == [b"v%d" % i for i in range(5)]


def test_reassignment(servers, make_topic):
    a, b = make_topic(), make_topic()
    fill(servers, a, 3)
    fill(servers, b, 4)
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(a, 0)])
        assert len(poll_values(consumer, TopicPartition(a, 0), 3)) == 3
        consumer.assign([TopicPartition(b, 0)])
        assert consumer.assignment() == {TopicPartition(b, 0)}
        assert len(poll_values(consumer, TopicPartition(b, 0), 4)) == 4


def test_admin_topic_lifecycle(admin, make_topic):
    topic = make_topic(partitions=2)
    assert topic in admin.list_topics()
    [description] = admin.describe_topics([topic])
    assert len(description.partitions) == 2 and all(p.leader >= 0 for p in description.partitions)
    [grown] = admin.create_partitions({topic: 4})
    assert len(grown.partitions) == 4
    altered = admin.alter_topic_configs(topic, {"retention.ms": 3_600_000})
    assert altered.configs.get("retention.ms") == "3600000"
    reset = admin.alter_topic_configs(topic, delete=["retention.ms"])
    assert "retention.ms" not in reset.configs or reset.configs["retention.ms"] != "3600000"
    cluster = admin.describe_cluster()
    assert len(cluster.brokers) == 2 and cluster.controller_id
    offsets = admin.list_offsets({TopicPartition(topic, p): "latest" for p in range(4)})
    assert {r.offset for r in offsets.values()} == {0}
    admin.delete_topics([topic])
    assert topic not in admin.list_topics()


def test_async_round_trip(servers, make_topic):
    topic = make_topic(partitions=3)

    async def scenario():
        async with AsyncAdmin(servers=servers) as admin:
            assert topic in await admin.list_topics()
        async with AsyncProducer(
            servers=servers, value_serializer=str.encode, compression="zstd"
        ) as producer:
            futures = [await producer.send(topic, f"event-{i}", key=b"k%d" % (i % 5)) for i in range(300)]
            first = await futures[0]
            last = await producer.send_and_wait(topic, "last", partition=0)
            await producer.flush()
        assert first.offset >= 0 and last.partition == 0
        async with AsyncConsumer(
            servers=servers,
            auto_offset_reset="earliest",
            value_deserializer=bytes.decode,
            consumer_timeout_ms=2000,
        ) as consumer:
            consumer.assign([TopicPartition(topic, p) for p in range(3)])
            assert await consumer.position(TopicPartition(topic, 0)) == 0
            only_zero = await consumer.getmany(TopicPartition(topic, 0), timeout_ms=10_000, max_records=5)
            assert (
                set(only_zero) == {TopicPartition(topic, 0)} and len(only_zero[TopicPartition(topic, 0)]) <= 5
            )
            consumer.seek(TopicPartition(topic, 0), 0)
            values = [record.value async for record in consumer]
        return values

    values = asyncio.run(scenario())
    assert sorted(values) == sorted([f"event-{i}" for i in range(300)] + ["last"])
