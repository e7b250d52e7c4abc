"""A Fetch of many partitions asks each leader node for all of its partitions in one fetch-port
request (real storage nodes, gateway and gRPC).

* every partition's records come back, at their offsets, from two nodes;
* a long poll over 160 empty partitions wakes when a record reaches the last of them: with one
  request per partition, the gateway's 64 connections per node were taken by the first
  partitions' polls and the last partition's record waited for the poll's deadline;
* a long poll whose first data comes from one partition of a node goes on watching the node's
  other partitions until min_bytes are there;
* read_committed over many partitions stops at each one's last stable offset;
* a partition whose leader is gone is reported on its own while the others are answered.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.proto import gateway_grpc, pb
from services.records import iter_batches
from tests.support.names import unique
from tests.support.wait import wait_until

CALL_TIMEOUT = 30
PARTITIONS = 64
#: More partitions per node than the gateway keeps fetch-port connections to a node (64).
LONG_POLL_PARTITIONS = 160


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=1, session_timeout_s=2)
    with LocalCluster(tmp_path_factory.mktemp("fetch-many"), spec) as local:
        yield local


@pytest.fixture(scope="module")
def stub(cluster):
    channel = grpc.insecure_channel(cluster.gateway, options=[("grpc.max_receive_message_length", 1 << 27)])
    yield gateway_grpc.GatewayStub(channel)
    channel.close()


def _topic(stub, partitions: int = PARTITIONS) -> str:
    name = unique("many")
    stub.CreateTopic(pb.CreateTopicRequest(name=name, partitions=partitions), timeout=CALL_TIMEOUT)

    def online() -> bool:
        answer = stub.Produce(
            pb.ProduceRequest(
                topic=name,
                records=[pb.ProduceRecord(value=b"warm", partition=p) for p in range(partitions)],
                acks=pb.ACKS_LEADER,
            ),
            timeout=CALL_TIMEOUT,
        )
        return not any(r.HasField("error") for r in answer.partitions)

    wait_until(online, timeout=20, what=f"{name} online")
    return name


def _produce(stub, topic: str, partition: int, value: bytes) -> int:
    answer = stub.Produce(
        pb.ProduceRequest(
            topic=topic, records=[pb.ProduceRecord(value=value, partition=partition)], acks=pb.ACKS_LEADER
        ),
        timeout=CALL_TIMEOUT,
    )
    (result,) = answer.partitions
    assert not result.HasField("error"), result
    return result.base_offset


def _fetch(stub, topic: str, offsets: dict[int, int], **request) -> pb.FetchResponse:
    return stub.Fetch(
        pb.FetchRequest(
            partitions=[pb.FetchPartition(topic=topic, partition=p, offset=o) for p, o in offsets.items()],
            raw_batches=True,
            max_bytes=64 << 20,
            **request,
        ),
        timeout=CALL_TIMEOUT,
    )


def _values(result) -> list[bytes | None]:
    return [r.value for batch in iter_batches(result.record_batches) for r in batch.records()]


def test_every_partition_of_two_nodes_comes_back_at_its_offsets(cluster, stub):
    topic = _topic(stub)
    offsets = {p: _produce(stub, topic, p, f"p{p}".encode()) for p in range(PARTITIONS)}
    answer = _fetch(stub, topic, offsets)
    assert [(r.topic, r.partition) for r in answer.partitions] == [(topic, p) for p in range(PARTITIONS)]
    for result in answer.partitions:
        assert not result.HasField("error"), result
        assert _values(result) == [f"p{result.partition}".encode()]
        assert result.high_watermark == offsets[result.partition] + 1


def test_a_long_poll_over_many_partitions_wakes_for_the_last_one(cluster, stub):
    topic = _topic(stub, LONG_POLL_PARTITIONS)
    ends = {p: 1 for p in range(LONG_POLL_PARTITIONS)}  # after the warm-up record
    last = LONG_POLL_PARTITIONS - 1
    answers: list[tuple[float, pb.FetchResponse]] = []

    def long_poll() -> None:
        started = time.monotonic()
        answer = _fetch(stub, topic, ends, min_bytes=1, max_wait_ms=15_000)
        answers.append((time.monotonic() - started, answer))

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)  # let the poll reach the nodes; a record before it would answer at once anyway
    _produce(stub, topic, last, b"wake")
    poller.join(CALL_TIMEOUT)
    ((took, answer),) = answers
    assert took < 10, f"the poll waited {took:.1f}s for a record that came after 0.5s"
    woken = [r for r in answer.partitions if r.record_batches]
    assert [(r.partition, _values(r)) for r in woken] == [(last, [b"wake"])]


def test_a_long_poll_keeps_watching_a_nodes_other_partitions_after_one_brings_data(cluster, stub):
    topic = _topic(stub, 8)
    metadata = stub.GetMetadata(pb.GetMetadataRequest(topics=[topic]), timeout=CALL_TIMEOUT)
    by_leader: dict[int, list[int]] = {}
    for p in metadata.topics[0].partitions:
        by_leader.setdefault(p.leader, []).append(p.partition)
    first, second = next(parts for parts in by_leader.values() if len(parts) >= 2)[:2]
    # Each partition holds its warm-up record (same size as the ones below): one batch's bytes.
    batch_bytes = len(_fetch(stub, topic, {first: 0}).partitions[0].record_batches)
    answers: list[tuple[float, pb.FetchResponse]] = []

    def long_poll() -> None:
        started = time.monotonic()
        answer = _fetch(stub, topic, {first: 1, second: 1}, min_bytes=batch_bytes + 1, max_wait_ms=15_000)
        answers.append((time.monotonic() - started, answer))

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)
    _produce(stub, topic, first, b"late")
    time.sleep(0.5)  # the node has answered the group with the first partition's record by now
    _produce(stub, topic, second, b"late")
    poller.join(CALL_TIMEOUT)
    ((took, answer),) = answers
    assert took < 10, f"the poll waited {took:.1f}s: the second partition was no longer watched"
    assert {r.partition: _values(r) for r in answer.partitions} == {first: [b"late"], second: [b"late"]}


def test_read_committed_over_many_partitions_answers_every_one(cluster, stub):
    topic = _topic(stub, 16)
    offsets = {p: _produce(stub, topic, p, f"c{p}".encode()) for p in range(16)}
    answer = _fetch(stub, topic, offsets, isolation_level=pb.ISOLATION_LEVEL_READ_COMMITTED)
    for result in answer.partitions:
        assert not result.HasField("error"), result
        assert _values(result) == [f"c{result.partition}".encode()]
        assert result.last_stable_offset == offsets[result.partition] + 1


def test_a_partition_whose_leader_is_gone_fails_alone(tmp_path):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=1, session_timeout_s=2)
    with LocalCluster(tmp_path, spec) as local:
        channel = grpc.insecure_channel(local.gateway)
        stub = gateway_grpc.GatewayStub(channel)
        try:
            topic = _topic(stub, 8)
            offsets = {p: _produce(stub, topic, p, f"v{p}".encode()) for p in range(8)}
            metadata = stub.GetMetadata(pb.GetMetadataRequest(topics=[topic]), timeout=CALL_TIMEOUT)
            leaders = {p.partition: p.leader for p in metadata.topics[0].partitions}
            local.storage_nodes[0].kill()
            answer = _fetch(stub, topic, offsets)
            for result in answer.partitions:
                if leaders[result.partition] == 0:
                    assert result.HasField("error"), result
                else:
                    assert not result.HasField("error"), result
                    assert _values(result) == [f"v{result.partition}".encode()]
            assert any(r.HasField("error") for r in answer.partitions)
            assert any(not r.HasField("error") for r in answer.partitions)
        finally:
            channel.close()
