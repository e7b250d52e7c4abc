"""The gateway against real processes: etcd, a coordinator, two storage nodes and two gateways.

One LocalCluster serves the whole module (the launch path users get). Tests call the public
Gateway API through the generated stubs on a plain synchronous channel and use their own topics;
the storage-node restart runs last because it disturbs the cluster.
"""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import errors
from services.partitioner import partition_for_key
from services.proto import gateway_grpc, pb
from services.records import Compression, RecordBatchBuilder, iter_batches
from tests.support.names import unique
from tests.support.wait import wait_until

CALL_TIMEOUT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=2, session_timeout_s=2)
    # Each LocalCluster has its own etcd, so no unique cluster name is needed.
    with LocalCluster(tmp_path_factory.mktemp("gateway-cluster"), spec) as local:
        yield local


@pytest.fixture(scope="module")
def channels(cluster):
    opened = [grpc.insecure_channel(address) for address in cluster.gateway_addresses()]
    yield opened
    for channel in opened:
        channel.close()


@pytest.fixture(scope="module")
def stubs(channels):
    return [gateway_grpc.GatewayStub(channel) for channel in channels]


@pytest.fixture(scope="module")
def stub(stubs):
    return stubs[0]


# ---- helpers ----------------------------------------------------------------------------------


def create_topic(stub, name: str, partitions: int, configs: dict[str, str] | None = None) -> str:
    stub.CreateTopic(
        pb.CreateTopicRequest(name=name, partitions=partitions, configs=configs or {}), timeout=CALL_TIMEOUT
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # produce would wait for this too; fetch reports it instead
        topic = stub.GetMetadata(pb.GetMetadataRequest(topics=[name]), timeout=CALL_TIMEOUT).topics[0]
        if all(p.state == pb.PARTITION_STATE_ONLINE for p in topic.partitions):
            return name
        time.sleep(0.05)
    raise AssertionError(f"{name} never came online")


def record(
    value: bytes, *, key: bytes | None = None, partition: int | None = None, headers=(), timestamp=None
):
    r = pb.ProduceRecord(value=value, headers=[pb.Header(key=k, value=v) for k, v in headers])
    if key is not None:
        r.key = key
    if partition is not None:
        r.partition = partition
    if timestamp is not None:
        r.timestamp = timestamp
    return r


def read_partition(stub, topic: str, partition: int, *, until: int, raw: bool = False, timeout: float = 20):
    """Fetch from offset 0 until ``until``; typed records, or raw batch bytes when ``raw``."""
    records, chunks, offset = [], [], 0
    deadline = time.monotonic() + timeout
    while offset < until:
        assert time.monotonic() < deadline, f"{topic}-{partition} stuck at {offset} < {until}"
        answer = stub.Fetch(
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=topic, partition=partition, offset=offset)],
                min_bytes=1,
                max_wait_ms=500,
                raw_batches=raw,
            ),
            timeout=CALL_TIMEOUT,
        ).partitions[0]
        if answer.HasField("error"):
            assert answer.error.retriable, answer.error
            time.sleep(0.1)
            continue
        records.extend(answer.records)
        chunks.append(answer.record_batches)
        offset = answer.next_offset
    return b"".join(chunks) if raw else records


def headers_of(consumed) -> list[tuple[str, bytes | None]]:
    return [(h.key, h.value if h.HasField("value") else None) for h in consumed.headers]


def rpc_error(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=CALL_TIMEOUT, **kwargs)
    return info.value.code(), errors.error_from_rpc(info.value).reason


def assert_serving(channel) -> None:
    # types-grpcio-health-checking's HealthStub declares no methods; the generated one has Check.
    health = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
        health_pb2.HealthCheckRequest(service="tributary.v1.Gateway")
    )
    assert health.status == health_pb2.HealthCheckResponse.SERVING


# ---- tests ------------------------------------------------------------------------------------


def test_typed_records_round_trip_on_murmur2_partitions(stub):
    topic = create_topic(stub, unique("typed"), 8)
    rng = random.Random(5)
    sent = []
    codecs = [
        pb.COMPRESSION_NONE,
        pb.COMPRESSION_GZIP,
        pb.COMPRESSION_SNAPPY,
        pb.COMPRESSION_LZ4,
        pb.COMPRESSION_ZSTD,
    ]
    for request_no, codec in enumerate(codecs * 2):
        batch = [
            record(
                rng.randbytes(rng.randrange(0, 300)),
                key=f"key-{rng.randrange(60)}".encode(),
                headers=[("req", str(request_no).encode()), ("null", None)],
                timestamp=1_600_000_000_000 + len(sent) + i,
            )
            for i in range(50)
        ]
        answer = stub.Produce(
            pb.ProduceRequest(topic=topic, records=batch, compression=codec), timeout=CALL_TIMEOUT
        )
        assert all(not p.HasField("error") for p in answer.partitions)
        assert [r.partition for r in answer.records] == [partition_for_key(r.key, 8) for r in batch]
        sent.extend(zip(batch, answer.records, strict=True))
    high = {p: 1 + max(res.offset for _, res in sent if res.partition == p) for p in range(8)}
    assert len(high) == 8 and sum(high.values()) == len(sent)
    for partition in range(8):
        consumed = read_partition(stub, topic, partition, until=high[partition])
        expected = [(r, res) for r, res in sent if res.partition == partition]
        assert (
            [c.offset for c in consumed]
            == [res.offset for _, res in expected]
            == list(range(high[partition]))
        )
        for c, (r, _) in zip(consumed, expected, strict=True):
            assert (c.key, c.value, c.timestamp) == (r.key, r.value, r.timestamp)
            assert headers_of(c) == [("req", r.headers[0].value), ("null", None)]
            assert c.timestamp_type == pb.TIMESTAMP_TYPE_CREATE_TIME


def test_raw_batches_round_trip(stub):
    topic = create_topic(stub, unique("raw"), 2)
    batches = []
    for codec, count in [(Compression.GZIP, 3), (Compression.NONE, 1), (Compression.ZSTD, 5)]:
        builder = RecordBatchBuilder(compression=codec)
        for i in range(count):
            builder.append(f"{codec.name}-{i}".encode(), timestamp=1000 + i, key=b"k")
        batches.append(builder.build())
    answer = stub.Produce(
        pb.ProduceRequest(
            topic=topic, batches=[pb.PartitionBatches(partition=1, record_batches=b"".join(batches))]
        ),
        timeout=CALL_TIMEOUT,
    )
    assert [(p.partition, p.base_offset, p.record_count, p.error.reason) for p in answer.partitions] == [
        (1, 0, 9, "")
    ]
    raw = read_partition(stub, topic, 1, until=9, raw=True)
    fetched = list(iter_batches(raw))
    assert [b.base_offset for b in fetched] == [0, 3, 4]
    # Byte for byte from the magic on (the node rewrites baseOffset and the leader epoch only).
    assert [bytes(b.buffer[16:]) for b in fetched] == [
        bytes(b.buffer[16:]) for b in iter_batches(b"".join(batches))
    ]
    typed = read_partition(stub, topic, 1, until=9)
    assert [c.value for c in typed] == [
        f"{c}-{i}".encode() for c, n in [("GZIP", 3), ("NONE", 1), ("ZSTD", 5)] for i in range(n)
    ]


def test_long_poll_answers_when_data_lands_or_after_max_wait(stub):
    topic = create_topic(stub, unique("poll"), 2)
    # ONLINE in the metadata can come before the gateway routes the new partitions: until then a
    # fetch answers at once with an error instead of waiting, so wait for an error-free answer.
    wait_until(
        lambda: (
            not any(
                p.HasField("error") and p.error.reason
                for p in stub.Fetch(
                    pb.FetchRequest(
                        partitions=[pb.FetchPartition(topic=topic, partition=p, offset=0) for p in range(2)],
                        max_wait_ms=0,
                    ),
                    timeout=CALL_TIMEOUT,
                ).partitions
            )
        ),
        timeout=15,
        what=f"the gateway fetching from {topic}",
    )
    request = pb.FetchRequest(
        partitions=[pb.FetchPartition(topic=topic, partition=p, offset=0) for p in range(2)],
        min_bytes=1,
        max_wait_ms=2000,
    )
    start = time.monotonic()
    empty = stub.Fetch(request, timeout=CALL_TIMEOUT)
    waited = time.monotonic() - start
    assert 1.8 <= waited < 3.0, waited
    assert [(len(p.records), p.error.reason, p.next_offset) for p in empty.partitions] == [
        (0, "", 0),
        (0, "", 0),
    ]

    def produce_later():
        time.sleep(0.3)
        stub.Produce(
            pb.ProduceRequest(topic=topic, records=[record(b"wake", partition=1)]), timeout=CALL_TIMEOUT
        )

    producer = threading.Thread(target=produce_later)
    start = time.monotonic()
    producer.start()
    answer = stub.Fetch(request, timeout=CALL_TIMEOUT)
    waited = time.monotonic() - start
    producer.join()
    assert 0.25 < waited < 1.3, waited
    assert [r.value for r in answer.partitions[1].records] == [b"wake"]
    assert answer.partitions[1].high_watermark == 1


def test_errors_are_reported_and_the_gateway_keeps_serving(stub, channels):
    topic = create_topic(stub, unique("errs"), 2, {"max.message.bytes": "1024"})
    assert rpc_error(stub.Produce, pb.ProduceRequest(topic=unique("missing"), records=[record(b"x")])) == (
        grpc.StatusCode.NOT_FOUND,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert rpc_error(stub.Produce, pb.ProduceRequest(topic=topic, records=[record(b"x")], acks=7)) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUIRED_ACKS",
    )
    assert rpc_error(stub.Produce, pb.ProduceRequest(topic=topic, records=[record(b"x", partition=-1)])) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_REQUEST",
    )

    answer = stub.Produce(
        pb.ProduceRequest(
            topic=topic,
            records=[
                record(b"fine", partition=0),
                record(b"nowhere", partition=9),
                record(bytes(5000), partition=1),
            ],
        ),
        timeout=CALL_TIMEOUT,
    )
    assert {p.partition: p.error.reason for p in answer.partitions} == {
        0: "",
        9: "UNKNOWN_TOPIC_OR_PARTITION",
        1: "RECORD_TOO_LARGE",
    }
    assert [(r.partition, r.offset) for r in answer.records] == [(0, 0), (9, -1), (1, -1)]

    good = RecordBatchBuilder()
    good.append(b"ok", timestamp=1)
    corrupt = bytearray(good.build())
    corrupt[-1] ^= 0xFF
    answer = stub.Produce(
        pb.ProduceRequest(
            topic=topic,
            batches=[
                pb.PartitionBatches(partition=0, record_batches=bytes(corrupt)),
                pb.PartitionBatches(partition=1, record_batches=b"definitely not a record batch"),
            ],
        ),
        timeout=CALL_TIMEOUT,
    )
    assert [(p.partition, p.error.reason) for p in answer.partitions] == [
        (0, "CORRUPT_MESSAGE"),
        (1, "CORRUPT_MESSAGE"),
    ]

    fetched = stub.Fetch(
        pb.FetchRequest(
            partitions=[
                pb.FetchPartition(topic=topic, partition=0, offset=1000),
                pb.FetchPartition(topic=topic, partition=0 + 7, offset=0),
                pb.FetchPartition(topic=unique("missing"), partition=0, offset=0),
                pb.FetchPartition(topic=topic, partition=1, offset=0),
            ]
        ),
        timeout=CALL_TIMEOUT,
    )
    assert [p.error.reason for p in fetched.partitions] == [
        "OFFSET_OUT_OF_RANGE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "",
    ]

    # Nothing bad was stored, and the gateway still serves.
    assert [r.value for r in read_partition(stub, topic, 0, until=1)] == [b"fine"]
    answer = stub.Produce(
        pb.ProduceRequest(topic=topic, records=[record(b"after", partition=0)]), timeout=CALL_TIMEOUT
    )
    assert answer.records[0].offset == 1
    assert_serving(channels[0])


def test_list_offsets(stub):
    topic = create_topic(stub, unique("offsets"), 2)
    stub.Produce(
        pb.ProduceRequest(
            topic=topic, records=[record(b"x", partition=1, timestamp=5000 + i) for i in range(4)]
        ),
        timeout=CALL_TIMEOUT,
    )
    answer = stub.ListOffsets(
        pb.ListOffsetsRequest(
            partitions=[
                pb.ListOffsetsPartition(topic=topic, partition=1, spec=pb.OffsetSpec(earliest=True)),
                pb.ListOffsetsPartition(topic=topic, partition=0, spec=pb.OffsetSpec(latest=True)),
                pb.ListOffsetsPartition(topic=topic, partition=5, spec=pb.OffsetSpec(latest=True)),
            ]
        ),
        timeout=CALL_TIMEOUT,
    )
    assert [(p.offset, p.error.reason) for p in answer.partitions] == [
        (0, ""),
        (0, ""),
        (-1, "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    latest = stub.ListOffsets(
        pb.ListOffsetsRequest(
            partitions=[
                pb.ListOffsetsPartition(topic=topic, partition=1, spec=pb.OffsetSpec(latest=True)),
                pb.ListOffsetsPartition(topic=topic, partition=0, spec=pb.OffsetSpec(timestamp=0)),
            ]
        ),
        timeout=CALL_TIMEOUT,
    )
    assert [p.offset for p in latest.partitions] == [4, -1]


def test_produce_stream_pipelines_100_requests_in_order(stub):
    topic = create_topic(stub, unique("stream"), 4)
    pulled: list[float] = []

    def requests():
        for i in range(100):
            pulled.append(time.monotonic())
            yield pb.ProduceRequest(
                topic=topic,
                correlation_id=i,
                records=[record(f"{i}-{j}".encode(), partition=i % 4) for j in range(5)],
            )

    received: list[float] = []
    answers = []
    for answer in stub.ProduceStream(requests(), timeout=CALL_TIMEOUT):
        received.append(time.monotonic())
        answers.append(answer)
    assert [a.correlation_id for a in answers] == list(range(100))
    assert all(not p.HasField("error") for a in answers for p in a.partitions)
    # Each partition's offsets follow request order, with no gaps.
    for partition in range(4):
        offsets = [r.offset for a in answers for r in a.records if r.partition == partition]
        assert offsets == list(range(125))
    # Pipelined: requests went out ahead of their answers. In lockstep (one answer before the
    # next request is read) at most one request would be unanswered when an answer came; here
    # the stream reads on while answers are pending, so at some answer many were. (Not counted
    # at a fixed answer, e.g. "20 sent before the 10th answer": under load the client's thread
    # that pulls requests may run late at the start while the gateway answers at once; and not
    # "all 100 before the 50th answer": appends answered in rounds return half the answers
    # within the same milliseconds as the last requests.)
    most_unanswered = max(sum(1 for t in pulled if t < at) - k for k, at in enumerate(received))
    assert most_unanswered >= 5, f"at most {most_unanswered} requests were unanswered when an answer came"
    values = [c.value for c in read_partition(stub, topic, 2, until=125)]
    assert values == [f"{i}-{j}".encode() for i in range(2, 100, 4) for j in range(5)]


def test_acks_none_and_acks_leader(stub):
    topic = create_topic(stub, unique("acks"), 1)
    answer = stub.Produce(
        pb.ProduceRequest(topic=topic, acks=pb.ACKS_NONE, records=[record(b"a"), record(b"b")]),
        timeout=CALL_TIMEOUT,
    )
    assert [r.offset for r in answer.records] == [-1, -1]
    answer = stub.Produce(
        pb.ProduceRequest(topic=topic, acks=pb.ACKS_LEADER, records=[record(b"c")]), timeout=CALL_TIMEOUT
    )
    assert answer.records[0].offset in (0, 2)  # acks=none may still be landing
    assert sorted(c.value for c in read_partition(stub, topic, 0, until=3)) == [b"a", b"b", b"c"]


def test_two_gateways_serve_the_same_data(stubs):
    assert len(stubs) == 2
    topic = create_topic(stubs[0], unique("two"), 3)
    stubs[0].Produce(
        pb.ProduceRequest(topic=topic, records=[record(b"via-0", partition=p) for p in range(3)]),
        timeout=CALL_TIMEOUT,
    )
    stubs[1].Produce(
        pb.ProduceRequest(topic=topic, records=[record(b"via-1", partition=p) for p in range(3)]),
        timeout=CALL_TIMEOUT,
    )
    for partition in range(3):
        seen = [[c.value for c in read_partition(s, topic, partition, until=2)] for s in stubs]
        assert seen == [[b"via-0", b"via-1"]] * 2
    names = [set(s.ListTopics(pb.ListTopicsRequest(), timeout=CALL_TIMEOUT).names) for s in stubs]
    assert topic in names[0] and names[0] == names[1]


def test_storage_node_restart_gateway_refreshes_and_keeps_going(cluster, stub):
    topic = create_topic(stub, unique("restart"), 4)
    metadata = stub.GetMetadata(pb.GetMetadataRequest(topics=[topic]), timeout=CALL_TIMEOUT)
    leaders = {p.partition: p.leader for p in metadata.topics[0].partitions}
    victim = leaders[0]
    stub.Produce(
        pb.ProduceRequest(topic=topic, records=[record(b"before", partition=p) for p in range(4)]),
        timeout=CALL_TIMEOUT,
    )
    old_port = cluster.storage_nodes[victim].info["grpc_port"]

    cluster.storage_nodes[victim].kill()
    answers = []
    # Sent while the node is down: the gateway retries (refreshing metadata) until it is back.
    producer = threading.Thread(
        target=lambda: answers.append(
            stub.Produce(
                pb.ProduceRequest(topic=topic, records=[record(b"after", partition=p) for p in range(4)]),
                timeout=CALL_TIMEOUT,
            )
        )
    )
    producer.start()
    try:
        # A node restarts once its old registration lease has expired (it refuses a live node id).
        wait_until_offline(stub, topic, [p for p, leader in leaders.items() if leader == victim])
        assert producer.is_alive()
        cluster.storage_nodes[victim].start(timeout=30)
    finally:
        producer.join()
    assert cluster.storage_nodes[victim].info["grpc_port"] != old_port  # really a new address
    answer = answers[0]
    assert [(p.partition, p.error.reason) for p in answer.partitions] == [(p, "") for p in range(4)]
    assert [r.offset for r in answer.records] == [1, 1, 1, 1]
    for partition in range(4):
        assert [c.value for c in read_partition(stub, topic, partition, until=2)] == [b"before", b"after"]


def wait_until_offline(stub, topic: str, partitions: list[int], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metadata = stub.GetMetadata(pb.GetMetadataRequest(topics=[topic]), timeout=CALL_TIMEOUT)
        if all(metadata.topics[0].partitions[p].leader == -1 for p in partitions):
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic} {partitions} never went offline")
