"""The transaction coordinator with real etcd, coordinator and storage-node processes: producer
ids across a failover, fencing, timeouts, a coordinator killed between PREPARE and COMPLETE,
offsets that count only when the transaction commits, read_committed following the outcome, and
bad requests that change nothing.

Tests named ``with-markers`` / ``..._with_markers`` write markers to partition leaders and read
them back from the segment files; the ``offsets-only`` variants (no partition in the transaction,
no marker) exercise the same coordinator paths without them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from coordinator.transactions import keys as txn_keys
from services import errors
from services.cluster_keys import cluster_prefix
from services.etcd import EtcdClient
from services.etcd.embedded import EmbeddedEtcd
from services.fetchport import multi
from services.fetchport.protocol import SIZE
from services.proto import pb
from services.records import RecordBatchBuilder, iter_batches
from services.records.control import parse_marker
from tests.support.names import unique
from tests.support.wait import CLUSTER_ERRORS, wait_until

from ._cluster import TTL_S, Cluster, call, rpc_code

#: Short waits so faults show quickly: EndTxn waits at most this for completion; timed-out
#: transactions are looked for this often.
TXN_ARGS = ("--admin-wait-s", "3", "--transaction-abort-check-interval-ms", "200")


# ---- helpers ---------------------------------------------------------------------------------------


def start_cluster(cluster: Cluster, storage: list[int]) -> Cluster:
    cluster.start(["c1", "c2"], storage, coordinator_args=TXN_ARGS)
    cluster.wait_active()
    return cluster


@pytest.fixture(scope="module")
def cluster(etcd: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two coordinators and one storage node for the tests that inject no faults."""
    shared = Cluster(etcd, tmp_path_factory.mktemp("txn-cluster"), f"txn-{uuid.uuid4().hex[:8]}")
    try:
        yield start_cluster(shared, [1])
    finally:
        shared.stop_all()


def create_topic(cluster: Cluster, partitions: int = 2) -> str:
    name = unique("txn")
    call(cluster.stub().CreateTopic, pb.CreateTopicRequest(name=name, partitions=partitions))
    cluster.wait_for(
        lambda md: any(
            t.name == name
            and t.partitions
            and all(p.state == pb.PARTITION_STATE_ONLINE for p in t.partitions)
            for t in md.topics
        ),
        what=f"{name} online",
    )
    return name


class Producer:
    """A transactional producer speaking the Coordinator RPCs (as the SDK will, through a gateway)."""

    def __init__(
        self, cluster: Cluster, transactional_id: str, *, timeout_ms: int = 60_000, via: str | None = None
    ):
        self.cluster, self.transactional_id, self.timeout_ms, self.via = (
            cluster,
            transactional_id,
            timeout_ms,
            via,
        )
        self.producer_id, self.epoch = -1, -1

    def stub(self):
        return self.cluster.stub(self.via)

    def init(self) -> Producer:
        answer = call(
            self.stub().InitProducerId,
            pb.InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            ),
        )
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        return self

    def _ids(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.epoch,
        }

    def add_partitions(self, *tps: tuple[str, int]) -> dict[tuple[str, int], str]:
        request = pb.AddPartitionsToTxnRequest(
            **self._ids(), partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in tps]
        )
        return {
            (r.topic, r.partition): r.error.reason
            for r in call(self.stub().AddPartitionsToTxn, request).results
        }

    def add_offsets(self, group: str) -> None:
        call(self.stub().AddOffsetsToTxn, pb.AddOffsetsToTxnRequest(**self._ids(), group_id=group))

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], str]:
        request = pb.TxnOffsetCommitRequest(
            **self._ids(),
            group_id=group,
            generation_id=-1,
            member_id="",
            offsets=[pb.TxnOffset(topic=t, partition=p, offset=o) for (t, p), o in offsets.items()],
        )
        return {
            (r.topic, r.partition): r.error.reason for r in call(self.stub().TxnOffsetCommit, request).results
        }

    def end(self, commit: bool) -> None:
        call(self.stub().EndTxn, pb.EndTxnRequest(**self._ids(), commit=commit), timeout=30)


def committed(cluster: Cluster, group: str, *tps: tuple[str, int], via: str | None = None) -> dict:
    request = pb.FetchCommittedOffsetsRequest(
        group_id=group, partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in tps]
    )
    return {
        (o.topic, o.partition): o.offset
        for o in call(cluster.stub(via).FetchCommittedOffsets, request).offsets
    }


def etcd_get(cluster: Cluster, key: str):
    async def read():
        async with EtcdClient(cluster.etcd.endpoint, prefix=cluster_prefix(cluster.name)) as client:
            return await client.get(key)

    return asyncio.run(read())


def etcd_put(cluster: Cluster, key: str, value: bytes) -> None:
    async def write():
        async with EtcdClient(cluster.etcd.endpoint, prefix=cluster_prefix(cluster.name)) as client:
            await client.put(key, value)

    asyncio.run(write())


def stored_txn(cluster: Cluster, transactional_id: str) -> dict | None:
    kv = etcd_get(cluster, txn_keys.transaction_key(transactional_id))
    return json.loads(kv.value) if kv is not None else None


def wait_for_state(cluster: Cluster, transactional_id: str, state: str, timeout: float = 20.0) -> dict:
    def in_state() -> dict | None:
        txn = stored_txn(cluster, transactional_id)
        return txn if txn is not None and txn["state"] == state else None

    found = wait_until(in_state, timeout=timeout, what=f"{transactional_id} {state}", tolerate=CLUSTER_ERRORS)
    assert found is not None  # wait_until returns a truthy result
    return found


def markers_on_disk(cluster: Cluster, topic: str, partition: int, node_id: int = 1) -> list[tuple]:
    """``(producer id, producer epoch, commit, coordinator epoch)`` of every control batch in the
    partition's segment files on ``node_id`` (the one storage node of these clusters)."""
    directory = cluster.run_dir / f"data-{node_id}" / f"{topic}-{partition}"
    found = []
    for path in sorted(directory.glob("*.log")):
        for batch in iter_batches(path.read_bytes(), allow_partial_tail=True):
            for record in batch.records() if batch.is_control else ():
                marker = parse_marker(record.key, record.value)
                found.append(
                    (batch.producer_id, batch.producer_epoch, marker.commit, marker.coordinator_epoch)
                )
    return found


def controller_epoch(cluster: Cluster) -> int:
    return call(cluster.stub().GetControllerInfo, pb.GetControllerInfoRequest()).controller_epoch


# ---- producer ids -------------------------------------------------------------------------------------


def test_producer_ids_are_unique_across_a_coordinator_failover(make_cluster):
    cluster = start_cluster(make_cluster(), [])
    active = cluster.wait_active()
    standby = next(c for c in cluster.coordinators if c != active)

    def fresh_ids(via: str, count: int) -> list[int]:
        request = pb.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
        answers = [call(cluster.stub(via).InitProducerId, request) for _ in range(count)]
        assert {a.producer_epoch for a in answers} == {0}
        return [a.producer_id for a in answers]

    before = fresh_ids(active, 30) + fresh_ids(standby, 30)  # the standby forwards to the active
    transactional = Producer(cluster, unique("tid")).init()
    cluster.coordinators[active].kill()
    successor = cluster.wait_active(exclude=active, timeout=TTL_S + 10)
    after = wait_until(
        lambda: fresh_ids(successor, 30),
        timeout=20.0,
        what="InitProducerId on the new active controller",
        tolerate=CLUSTER_ERRORS,
    )
    ids = before + after
    assert len(set(ids)) == len(ids), "a producer id was handed out twice"
    assert min(after) > max(before), "the new term takes a block after every id of the old one"
    counter = int(etcd_get(cluster, txn_keys.PRODUCER_IDS).value)
    assert counter > max(ids)
    # The transactional id survived the failover: same producer id, next epoch.
    again = Producer(cluster, transactional.transactional_id).init()
    assert (again.producer_id, again.epoch) == (transactional.producer_id, transactional.epoch + 1)


# ---- fencing and timeouts -------------------------------------------------------------------------------


@pytest.mark.parametrize("with_partition", [False, True], ids=["offsets-only", "with-markers"])
def test_a_second_instance_fences_the_first(cluster, with_partition):
    topic = create_topic(cluster)
    group = unique("g")
    tid = unique("tid")
    first = Producer(cluster, tid).init()
    if with_partition:
        assert first.add_partitions((topic, 0)) == {(topic, 0): ""}
    first.add_offsets(group)
    assert first.commit_offsets(group, {(topic, 0): 5}) == {(topic, 0): ""}

    second = Producer(cluster, tid).init()  # aborts the first one's open transaction
    assert second.producer_id == first.producer_id and second.epoch == first.epoch + 2
    stored = stored_txn(cluster, tid)
    assert stored["state"] == "EMPTY" and stored["producer_epoch"] == second.epoch
    with pytest.raises(errors.ProducerFencedError) as fenced:
        first.end(commit=True)
    assert rpc_code(fenced.value) == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(errors.ProducerFencedError):
        first.add_offsets(group)
    assert committed(cluster, group, (topic, 0)) == {(topic, 0): -1}, "the aborted offsets were committed"
    if with_partition:  # the ABORT marker carries the fencing epoch: the first one's writes are refused
        expected = (first.producer_id, first.epoch + 1, False, controller_epoch(cluster))
        assert markers_on_disk(cluster, topic, 0) == [expected]


@pytest.mark.parametrize("with_partition", [False, True], ids=["offsets-only", "with-markers"])
def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(cluster, with_partition):
    topic = create_topic(cluster)
    group = unique("g")
    producer = Producer(cluster, unique("tid"), timeout_ms=1_000).init()
    if with_partition:
        producer.add_partitions((topic, 1))
    producer.add_offsets(group)
    producer.commit_offsets(group, {(topic, 1): 7})
    started = time.monotonic()
    aborted = wait_for_state(cluster, producer.transactional_id, "COMPLETE_ABORT", timeout=15)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.8, f"aborted after {elapsed:.2f}s, before its 1 s timeout"
    assert aborted["producer_epoch"] == producer.epoch + 1
    with pytest.raises(errors.ProducerFencedError):
        producer.end(commit=True)
    assert committed(cluster, group, (topic, 1)) == {(topic, 1): -1}
    if with_partition:
        expected = (producer.producer_id, producer.epoch + 1, False, controller_epoch(cluster))
        assert markers_on_disk(cluster, topic, 1) == [expected]
    # The producer recovers by initialising again (a new epoch), as Kafka's does.
    again = Producer(cluster, producer.transactional_id).init()
    assert again.epoch == producer.epoch + 2


# ---- commit and abort -------------------------------------------------------------------------------


@pytest.mark.parametrize("with_partition", [False, True], ids=["offsets-only", "with-markers"])
def test_offsets_become_the_groups_only_when_the_transaction_commits(cluster, with_partition):
    topic = create_topic(cluster)
    group = unique("g")
    standby = next(c for c in cluster.coordinators if c != cluster.wait_active())
    producer = Producer(cluster, unique("tid"), via=standby).init()  # every call forwarded

    def transaction(offset: int, commit: bool) -> None:
        if with_partition:
            assert producer.add_partitions((topic, 0), (topic, 1)) == {(topic, 0): "", (topic, 1): ""}
        producer.add_offsets(group)
        assert producer.commit_offsets(group, {(topic, 0): offset, (topic, 1): offset + 1}) == {
            (topic, 0): "",
            (topic, 1): "",
        }
        assert committed(cluster, group, (topic, 0)) != {(topic, 0): offset}, (
            "staged offsets visible before the end"
        )
        producer.end(commit=commit)

    transaction(10, commit=False)
    assert stored_txn(cluster, producer.transactional_id)["state"] == "COMPLETE_ABORT"
    assert committed(cluster, group, (topic, 0), (topic, 1)) == {(topic, 0): -1, (topic, 1): -1}
    transaction(20, commit=True)
    stored = stored_txn(cluster, producer.transactional_id)
    assert stored["state"] == "COMPLETE_COMMIT" and stored["offsets"] == {} and stored["partitions"] == {}
    assert committed(cluster, group, (topic, 0), (topic, 1)) == {(topic, 0): 20, (topic, 1): 21}
    assert committed(cluster, group, (topic, 0), via=standby) == {(topic, 0): 20}
    producer.end(commit=True)  # a retry of the commit just completed: success, nothing changes
    epoch = controller_epoch(cluster)
    expected = [(producer.producer_id, producer.epoch, commit, epoch) for commit in (False, True)]
    for partition in (0, 1):  # one ABORT, one COMMIT, in order; none without partitions
        assert markers_on_disk(cluster, topic, partition) == (expected if with_partition else [])


def transactional_batch(producer: Producer, values: list[bytes], *, seq: int) -> bytes:
    builder = RecordBatchBuilder(
        producer_id=producer.producer_id,
        producer_epoch=producer.epoch,
        base_sequence=seq,
        is_transactional=True,
    )
    for value in values:
        builder.append(value, timestamp=int(time.time() * 1000))
    return builder.build()


def append(cluster: Cluster, topic: str, data: bytes, node_id: int = 1):
    request = pb.AppendRequest(
        partitions=[pb.PartitionAppend(topic=topic, partition=0, record_batches=data)], acks=pb.ACKS_ALL
    )
    return cluster.storage_stub(node_id).Append(request, timeout=10).partitions[0]


def read_committed(cluster: Cluster, topic: str, node_id: int = 1) -> multi.PartitionHeader:
    """The header of a read_committed consumer fetch from offset 0 (last stable offset, aborted)."""

    async def fetch():
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", cluster.storage[node_id].info["fetch_port"]
        )
        request = multi.MultiFetchRequest(
            1,
            multi.CONSUMER_REPLICA_ID,
            (multi.PartitionFetch(topic, 0, 0, 1 << 20),),
            1 << 20,
            isolation_level=multi.READ_COMMITTED,
        )
        writer.write(multi.encode_request(request))
        await writer.drain()
        (size,) = SIZE.unpack(await reader.readexactly(4))
        body = await reader.readexactly(size)
        writer.close()
        return multi.decode_response_body(body).partitions[0].header

    return asyncio.run(fetch())


def test_records_become_readable_on_commit_and_a_fenced_producer_cannot_write_with_markers(cluster):
    """The coordinator and the storage nodes together: read_committed stops at an open
    transaction, moves past it when it commits, lists it when a new instance aborts it, and the
    fenced instance's next batch is refused by the partition leader."""
    topic = create_topic(cluster, partitions=1)
    producer = Producer(cluster, unique("tid")).init()
    producer.add_partitions((topic, 0))
    assert append(cluster, topic, transactional_batch(producer, [b"a", b"b"], seq=0)).base_offset == 0
    assert read_committed(cluster, topic).last_stable_offset == 0  # open: nothing readable yet
    producer.end(commit=True)  # COMMIT marker at offset 2
    header = read_committed(cluster, topic)
    assert (header.last_stable_offset, header.aborted) == (3, ())

    producer.add_partitions((topic, 0))
    assert append(cluster, topic, transactional_batch(producer, [b"c"], seq=2)).base_offset == 3
    Producer(cluster, producer.transactional_id).init()  # aborts it: ABORT marker at offset 4
    refused = append(cluster, topic, transactional_batch(producer, [b"d"], seq=3))
    assert refused.error.reason == "INVALID_PRODUCER_EPOCH"
    header = read_committed(cluster, topic)
    assert (header.last_stable_offset, header.aborted) == (5, ((producer.producer_id, 3),))


# ---- failover between PREPARE and COMPLETE ----------------------------------------------------------------


def test_a_new_controller_completes_a_commit_an_earlier_one_prepared(make_cluster):
    """The decision (PREPARE_COMMIT, with staged offsets) is in etcd when the active controller
    dies; the next one finishes it. The state is written by the test while the active controller
    runs (it loads transactions only when its term starts), then the active one is killed."""
    cluster = start_cluster(make_cluster(), [1])
    topic = create_topic(cluster, partitions=1)
    group, tid = unique("g"), unique("tid")
    producer = Producer(cluster, tid).init()
    prepared = {
        "producer_id": producer.producer_id,
        "producer_epoch": producer.epoch,
        "last_producer_id": -1,
        "last_producer_epoch": -1,
        "state": "PREPARE_COMMIT",
        "timeout_ms": 60_000,
        "partitions": {},
        "groups": [group],
        "offsets": {
            group: [
                {
                    "topic": topic,
                    "partition": 0,
                    "offset": 33,
                    "metadata": "m",
                    "commit_timestamp": 1,
                    "generation": -1,
                }
            ]
        },
        "start_ms": 1,
        "last_update_ms": 2,
    }
    etcd_put(cluster, txn_keys.transaction_key(tid), json.dumps(prepared).encode())
    active = cluster.wait_active()
    assert committed(cluster, group, (topic, 0)) == {(topic, 0): -1}
    cluster.coordinators[active].kill()
    successor = cluster.wait_active(exclude=active, timeout=TTL_S + 10)
    wait_for_state(cluster, tid, "COMPLETE_COMMIT")
    # COMPLETE_COMMIT and the offsets are one etcd transaction; the group's memory follows it a
    # moment later (``TransactionalOffsets.apply``), so an OffsetFetch right after may read -1.
    wait_until(
        lambda: committed(cluster, group, (topic, 0), via=successor) == {(topic, 0): 33},
        timeout=10,
        what="the successor to serve the committed offset",
    )
    with pytest.raises(errors.InvalidTxnStateError):
        producer.end(commit=False)  # the other outcome of a completed commit


def test_coordinator_killed_between_prepare_and_complete_with_markers(make_cluster):
    """A commit whose partition's leader is down stays PREPARE_COMMIT; the active controller is
    killed; the leader comes back; the new active controller writes the marker and completes."""
    cluster = start_cluster(make_cluster(), [1])
    topic = create_topic(cluster, partitions=1)
    group, tid = unique("g"), unique("tid")
    producer = Producer(cluster, tid).init()
    assert producer.add_partitions((topic, 0)) == {(topic, 0): ""}
    producer.add_offsets(group)
    producer.commit_offsets(group, {(topic, 0): 12})
    first_epoch = controller_epoch(cluster)

    cluster.storage[1].kill()  # the only replica: the partition goes offline
    cluster.wait_for(lambda md: not md.brokers, what="storage node 1 gone")
    producer.end(commit=True)  # decided; answers after admin_wait_s with the marker still owed
    assert stored_txn(cluster, tid)["state"] == "PREPARE_COMMIT"
    assert committed(cluster, group, (topic, 0)) == {(topic, 0): -1}

    active = cluster.wait_active()
    cluster.coordinators[active].kill()
    successor = cluster.wait_active(exclude=active, timeout=TTL_S + 10)
    assert stored_txn(cluster, tid)["state"] == "PREPARE_COMMIT"  # nothing to write the marker to yet
    cluster.storage[1].start(timeout=30)
    wait_for_state(cluster, tid, "COMPLETE_COMMIT", timeout=30)
    # COMPLETE_COMMIT and the offsets are one etcd transaction; the group's memory follows it a
    # moment later (``TransactionalOffsets.apply``), so an OffsetFetch right after may read -1.
    wait_until(
        lambda: committed(cluster, group, (topic, 0), via=successor) == {(topic, 0): 12},
        timeout=10,
        what="the successor to serve the committed offset",
    )
    # Written by the new controller (its epoch is on the marker), once.
    assert markers_on_disk(cluster, topic, 0) == [
        (producer.producer_id, producer.epoch, True, first_epoch + 1)
    ]


# ---- bad requests ---------------------------------------------------------------------------------------


def test_bad_requests_get_typed_errors_and_change_nothing_in_etcd(cluster):
    topic = create_topic(cluster)
    tid = unique("tid")
    producer = Producer(cluster, tid).init()
    key = txn_keys.transaction_key(tid)
    before = etcd_get(cluster, key)
    counter = etcd_get(cluster, txn_keys.PRODUCER_IDS)

    def expect(error_type, action, code: grpc.StatusCode) -> None:
        with pytest.raises(error_type) as info:
            action()
        assert rpc_code(info.value) == code

    FAILED = grpc.StatusCode.FAILED_PRECONDITION
    expect(errors.InvalidTxnStateError, lambda: producer.end(commit=True), FAILED)  # nothing begun
    expect(errors.InvalidTxnStateError, lambda: producer.end(commit=False), FAILED)
    wrong_id = Producer(cluster, tid)
    wrong_id.producer_id, wrong_id.epoch = producer.producer_id + 1_000_000, producer.epoch
    expect(errors.InvalidProducerIdMappingError, lambda: wrong_id.end(commit=True), FAILED)
    expect(errors.InvalidProducerIdMappingError, lambda: wrong_id.add_partitions((topic, 0)), FAILED)
    future = Producer(cluster, tid)
    future.producer_id, future.epoch = producer.producer_id, producer.epoch + 5
    expect(errors.InvalidProducerEpochError, lambda: future.add_offsets("g"), FAILED)
    expect(errors.InvalidTxnStateError, lambda: producer.commit_offsets("g", {(topic, 0): 1}), FAILED)
    unknown = Producer(cluster, unique("never"))
    unknown.producer_id, unknown.epoch = producer.producer_id, 0
    expect(errors.InvalidProducerIdMappingError, lambda: unknown.end(commit=True), FAILED)
    assert producer.add_partitions((topic, 0), (topic, 99), ("no-such-topic", 0)) == {
        (topic, 0): "OPERATION_NOT_ATTEMPTED",
        (topic, 99): "UNKNOWN_TOPIC_OR_PARTITION",
        ("no-such-topic", 0): "UNKNOWN_TOPIC_OR_PARTITION",
    }
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    expect(
        errors.InvalidTransactionTimeoutError, lambda: Producer(cluster, tid, timeout_ms=0).init(), invalid
    )
    expect(
        errors.InvalidTransactionTimeoutError,
        lambda: Producer(cluster, tid, timeout_ms=900_001).init(),
        invalid,
    )
    expect(errors.InvalidRequestError, lambda: Producer(cluster, "a/b").init(), invalid)
    bad_ids = pb.InitProducerIdRequest(producer_id=5, producer_epoch=-1)  # only one of the two
    expect(errors.InvalidRequestError, lambda: call(cluster.stub().InitProducerId, bad_ids), invalid)
    never_handed_out = pb.InitProducerIdRequest(producer_id=0, producer_epoch=0)  # proto3's defaults
    expect(
        errors.InvalidProducerIdMappingError,
        lambda: call(cluster.stub().InitProducerId, never_handed_out),
        FAILED,
    )
    after = etcd_get(cluster, key)
    assert (after.value, after.mod_revision) == (before.value, before.mod_revision)
    assert etcd_get(cluster, txn_keys.PRODUCER_IDS).mod_revision == counter.mod_revision
    assert etcd_get(cluster, txn_keys.transaction_key(unknown.transactional_id)) is None
    # A stale epoch, after the id was initialised again.
    newer = Producer(cluster, tid).init()
    expect(errors.ProducerFencedError, lambda: producer.add_offsets("g"), FAILED)
    assert stored_txn(cluster, tid)["producer_epoch"] == newer.epoch
