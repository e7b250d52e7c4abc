"""The SDK's idempotent and transactional producers and read_committed consumers against a real
cluster: what each isolation level sees, offsets staged in a transaction, end offsets at the last
stable offset, and the misuse the producer refuses. Faults (kill -9, fencing under load,
timeouts) are in tests/integration/transactions/."""

from __future__ import annotations

import itertools
import time
import uuid

import grpc
import pytest

from gateway.client import (
    Admin,
    Consumer,
    IllegalStateError,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
    TransactionAbortedError,
)
from services import errors
from services.proto import gateway_grpc, pb
from services.records import RecordBatchBuilder, iter_batches


def read_all(servers: str, topic: str, partitions: int, level: str, expect: int, timeout: float = 10.0):
    """Values read from the beginning of every partition until ``expect`` arrived (or timeout)."""
    got: list[bytes] = []
    with Consumer(servers=servers, auto_offset_reset="earliest", isolation_level=level) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(r.value for r in records)
        # Nothing more arrives after what was expected (a short extra poll).
        for records in consumer.poll(timeout_ms=300).values():
            got.extend(r.value for r in records)
    return got


def transactional(servers: str, **settings) -> Producer:
    producer = Producer(servers=servers, transactional_id=f"tx-{uuid.uuid4().hex[:8]}", **settings)
    producer.init_transactions()
    return producer


def test_each_isolation_level_sees_what_kafka_promises(servers, make_topic):
    topic = make_topic(2)
    with transactional(servers) as producer:
        producer.begin_transaction()
        for i in range(30):
            producer.send(topic, b"c-%d" % i, partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, b"a-%d" % i, partition=i % 2)
        producer.flush()  # written, then aborted (unsent records would just be dropped)
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(6):
            producer.send(topic, b"o-%d" % i, partition=i % 2)
        producer.flush()

        committed = read_all(servers, topic, 2, "read_committed", expect=30)
        uncommitted = read_all(servers, topic, 2, "read_uncommitted", expect=46)
        tps = [TopicPartition(topic, p) for p in range(2)]
        with Consumer(servers=servers, isolation_level="read_committed") as c:
            stable = c.end_offsets(tps)
        with Consumer(servers=servers) as c:
            high = c.end_offsets(tps)
        with Admin(servers=servers) as admin:
            listed = admin.list_offsets(dict.fromkeys(tps, "latest"), isolation_level="read_committed")
        producer.commit_transaction()
        after = read_all(servers, topic, 2, "read_committed", expect=36)

    assert sorted(committed) == sorted(b"c-%d" % i for i in range(30))
    assert sorted(uncommitted) == sorted(
        [b"c-%d" % i for i in range(30)] + [b"a-%d" % i for i in range(10)] + [b"o-%d" % i for i in range(6)]
    )
    # Per partition: 15 committed + 1 marker + 5 aborted + 1 marker, then the open transaction.
    assert stable == {tp: 22 for tp in tps} and {tp: r.offset for tp, r in listed.items()} == stable
    assert high == {tp: 25 for tp in tps}
    assert sorted(after) == sorted([b"c-%d" % i for i in range(30)] + [b"o-%d" % i for i in range(6)])


def test_staged_offsets_become_the_groups_only_when_the_transaction_commits(servers, make_topic):
    source, sink = make_topic(1), make_topic(1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with Producer(servers=servers) as plain:
        for i in range(10):
            plain.send(source, b"in-%d" % i)
    tp = TopicPartition(source, 0)
    with (
        Consumer(
            servers=servers,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        ) as consumer,
        transactional(servers) as producer,
    ):
        consumer.subscribe([source])
        records: list = []
        deadline = time.monotonic() + 15
        while len(records) < 10 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=300).values():
                records.extend(batch)
        assert len(records) == 10
        metadata = consumer.group_metadata()
        assert metadata.group_id == group and metadata.generation_id >= 1 and metadata.member_id

        producer.begin_transaction()
        for record in records[:4]:
            producer.send(sink, record.value + b":out")
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(4, "first")}, metadata)
        producer.abort_transaction()
        assert consumer.committed(tp) is None

        producer.begin_transaction()
        for record in records:
            producer.send(sink, record.value + b":out")
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(10, "all")}, metadata)
        producer.commit_transaction()
        assert consumer.committed(tp) == OffsetAndMetadata(10, "all")
    out = read_all(servers, sink, 1, "read_committed", expect=10)
    assert out == [b"in-%d:out" % i for i in range(10)]


def test_idempotent_batches_carry_a_producer_id_and_consecutive_sequences(servers, make_topic, cluster):
    topic = make_topic(1)
    with Producer(servers=servers, linger_ms=0, batch_size=200) as producer:
        assert producer.config.idempotent
        for i in range(50):
            producer.send(topic, b"v-%03d" % i)
        producer.flush()
    with Producer(servers=servers, acks=1) as weak:
        assert not weak.config.idempotent
        weak.send(topic, b"plain").get(10)

    # Read the raw batches back (the fetch port of the partition's node serves them as stored).
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        seen = 0
        deadline = time.monotonic() + 10
        while seen < 51 and time.monotonic() < deadline:
            seen += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
    assert seen == 51
    batches = list(iter_batches(_raw_log(cluster, topic)))
    idempotent, plain = batches[:-1], batches[-1]
    assert len(idempotent) > 1 and len({b.producer_id for b in idempotent}) == 1
    assert idempotent[0].producer_id >= 0 and idempotent[0].base_sequence == 0
    for earlier, later in itertools.pairwise(idempotent):
        assert later.base_sequence == earlier.base_sequence + earlier.record_count
    assert plain.producer_id == -1


def _raw_log(cluster, topic: str) -> bytes:
    """The partition's segment bytes, from whichever storage node holds it."""
    found = [
        segment.read_bytes()
        for directory in cluster.data_dir.glob(f"storage-*/**/{topic}-0")
        for segment in sorted(directory.glob("*.log"))
    ]
    assert found, f"no log of {topic}-0 under {cluster.data_dir}"
    return b"".join(found)


def test_the_producer_refuses_what_the_transaction_state_does_not_allow(servers, make_topic):
    topic = make_topic(1)
    with Producer(servers=servers, transactional_id=f"tx-{uuid.uuid4().hex[:8]}") as producer:
        with pytest.raises(IllegalStateError, match="uninitialized"):
            producer.begin_transaction()
        producer.init_transactions()
        with pytest.raises(IllegalStateError, match="in transaction"):
            producer.send(topic, b"outside a transaction")
        with pytest.raises(IllegalStateError):
            producer.commit_transaction()
        producer.begin_transaction()
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()
        producer.send(topic, b"inside").get(10)
        producer.commit_transaction()
    # A record still queued (a long linger) when the transaction aborts is never sent.
    with transactional(servers, linger_ms=60_000) as lingering:
        lingering.begin_transaction()
        unsent = lingering.send(topic, b"never sent", partition=0)
        lingering.abort_transaction()
        with pytest.raises(TransactionAbortedError):
            unsent.get(10)
    assert read_all(servers, topic, 1, "read_uncommitted", expect=2, timeout=2) == [b"inside"]
    with Producer(servers=servers) as idempotent, pytest.raises(IllegalStateError, match="transactional_id"):
        idempotent.begin_transaction()
    with pytest.raises(ValueError, match="acks='all'"):
        Producer(servers=servers, transactional_id="x", acks=1)


# ---- what a client in another language can get wrong (raw gateway RPCs) --------------------------


@pytest.fixture
def gateway(servers):
    with grpc.insecure_channel(servers.split(",")[0]) as channel:
        yield gateway_grpc.GatewayStub(channel)


def raw_batch(producer_id: int, epoch: int, sequence: int, *, transactional: bool, count: int = 2) -> bytes:
    builder = RecordBatchBuilder(
        producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, is_transactional=transactional
    )
    for i in range(count):
        builder.append(b"raw-%d" % (sequence + i), timestamp=int(time.time() * 1000))
    return builder.build()


def produce_raw(gateway, topic: str, data: bytes):
    answer = gateway.Produce(
        pb.ProduceRequest(
            topic=topic, acks=pb.ACKS_ALL, batches=[pb.PartitionBatches(partition=0, record_batches=data)]
        ),
        timeout=20,
    )
    return answer.partitions[0]


def log_end(gateway, topic: str) -> int:
    answer = gateway.ListOffsets(
        pb.ListOffsetsRequest(
            partitions=[pb.ListOffsetsPartition(topic=topic, partition=0, spec=pb.OffsetSpec(latest=True))]
        ),
        timeout=20,
    )
    return answer.partitions[0].offset


def test_raw_misuse_gets_a_typed_error_and_stores_nothing(gateway, make_topic):
    topic = make_topic(1)
    tid = f"raw-{uuid.uuid4().hex[:8]}"
    init = gateway.InitProducerId(
        pb.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
        ),
        timeout=20,
    )
    pid, epoch = init.producer_id, init.producer_epoch
    common = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch}

    # A transactional batch before AddPartitionsToTxn would open a transaction no one ends.
    refused = produce_raw(gateway, topic, raw_batch(pid, epoch, 0, transactional=True))
    assert refused.error.reason == "INVALID_TXN_STATE", refused
    assert "AddPartitionsToTxn" in refused.error.message and log_end(gateway, topic) == 0
    # Committing with nothing begun.
    with pytest.raises(grpc.RpcError) as info:
        gateway.EndTxn(pb.EndTxnRequest(commit=True, **common), timeout=20)
    assert errors.error_from_rpc(info.value).reason == "INVALID_TXN_STATE"

    added = gateway.AddPartitionsToTxn(
        pb.AddPartitionsToTxnRequest(partitions=[pb.TopicPartition(topic=topic, partition=0)], **common),
        timeout=20,
    )
    assert not any(r.HasField("error") for r in added.results)
    accepted = produce_raw(gateway, topic, raw_batch(pid, epoch, 0, transactional=True))
    assert not accepted.HasField("error") and accepted.base_offset == 0
    # A sequence gap, then an epoch the coordinator never handed out: typed, nothing written.
    gap = produce_raw(gateway, topic, raw_batch(pid, epoch, 5, transactional=True))
    assert gap.error.reason == "OUT_OF_ORDER_SEQUENCE_NUMBER", gap
    assert log_end(gateway, topic) == 2
    # A retry of the accepted batch is answered with its first offsets, not written again.
    again = produce_raw(gateway, topic, raw_batch(pid, epoch, 0, transactional=True))
    assert not again.HasField("error") and again.base_offset == 0 and log_end(gateway, topic) == 2

    gateway.EndTxn(pb.EndTxnRequest(commit=False, **common), timeout=20)
    bumped = gateway.InitProducerId(
        pb.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60_000, producer_id=pid, producer_epoch=epoch
        ),
        timeout=20,
    )
    assert bumped.producer_epoch > epoch
    end = log_end(gateway, topic)
    stale = produce_raw(gateway, topic, raw_batch(pid, epoch, 2, transactional=True))
    assert stale.error.reason == "INVALID_PRODUCER_EPOCH", stale
    # An idempotent producer id claimed as transactional: no transactional id has it.
    idempotent = gateway.InitProducerId(
        pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=20
    )
    orphan = produce_raw(gateway, topic, raw_batch(idempotent.producer_id, 0, 0, transactional=True))
    assert orphan.error.reason == "INVALID_PRODUCER_ID_MAPPING", orphan
    assert log_end(gateway, topic) == end
