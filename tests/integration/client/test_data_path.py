"""The SDK takes the raw data path when the gateway offers it, gRPC when it does not or when told.

The rest of the package runs every test over both paths (see ``conftest.py``); this module checks
that each run really took the path it is named after.
"""

from __future__ import annotations

from gateway.client import Consumer, Producer, TopicPartition
from gateway.client.dataport import RawTransport
from gateway.client.transport import StreamTransport


def _consume_one(servers: str, topic: str, **settings):
    with Consumer(servers=servers, auto_offset_reset="earliest", **settings) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records: list = []
        for _ in range(30):
            records.extend(r for rs in consumer.poll(timeout_ms=1000).values() for r in rs)
            if records:
                break
        return records, consumer._core._fetcher._raw


def test_the_sdk_takes_the_data_path_the_gateway_offers(servers, make_topic, data_path):
    topic = make_topic(partitions=1)
    with Producer(servers=servers, acks=1) as producer:
        metadata = producer.send(topic, b"over the default path").get(30)
        transport = producer._core.sender.transport
        assert isinstance(transport, RawTransport)
        assert transport.using_raw == (data_path == "raw")
    assert metadata.offset == 0
    records, raw = _consume_one(servers, topic)
    assert [r.value for r in records] == [b"over the default path"]
    assert raw is not None and (not raw._link.unavailable) == (data_path == "raw")


def test_data_path_grpc_never_opens_a_data_connection(servers, make_topic):
    topic = make_topic(partitions=1)
    with Producer(servers=servers, acks=1, data_path="grpc") as producer:
        assert producer.send(topic, b"over gRPC").get(30).offset == 0
        assert isinstance(producer._core.sender.transport, StreamTransport)
    records, raw = _consume_one(servers, topic, data_path="grpc")
    assert [r.value for r in records] == [b"over gRPC"]
    assert raw is None
