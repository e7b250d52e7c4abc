"""Idempotence and transaction markers on real storage nodes, with the test acting as the
controller and the transaction coordinator: retries are answered with their first offsets,
markers are written by the leader and replicated, read_committed stops at the last stable offset
and lists the aborted transactions."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.fetchport import multi
from services.fetchport.protocol import SIZE
from services.proto import pb
from services.records import RecordBatchBuilder, iter_batches
from tests.support.wait import wait_until

from .conftest import NodeHandle, start_node
from .test_replica_roles import TOPIC, disk_batches, state, tell

PID = 1000


def producer_batch(values, *, seq: int, epoch: int = 0, transactional: bool = False) -> bytes:
    builder = RecordBatchBuilder(
        producer_id=PID, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional
    )
    for value in values:
        builder.append(value, timestamp=int(time.time() * 1000))  # now: no roll or retention by age
    return builder.build()


def append(node: NodeHandle, data: bytes):
    return node.append(TOPIC, 0, data, acks=pb.ACKS_ALL)


def write_marker(node: NodeHandle, *, commit: bool, coordinator_epoch: int = 1):
    request = pb.WriteTxnMarkersRequest(
        markers=[
            pb.TxnMarker(
                producer_id=PID,
                producer_epoch=0,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                partitions=[pb.TopicPartition(topic=TOPIC, partition=0)],
            )
        ]
    )
    return node.stub.WriteTxnMarkers(request, timeout=10).markers[0].results[0]


def consumer_fetch(node: NodeHandle, offset: int, isolation: int) -> multi.PartitionData:
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", node.fetch_port)
        request = multi.MultiFetchRequest(
            7,
            multi.CONSUMER_REPLICA_ID,
            (multi.PartitionFetch(TOPIC, 0, offset, 1 << 20),),
            1 << 20,
            isolation_level=isolation,
        )
        writer.write(multi.encode_request(request))
        await writer.drain()
        (size,) = SIZE.unpack(await reader.readexactly(4))
        body = await reader.readexactly(size)
        writer.close()
        return multi.decode_response_body(body).partitions[0]

    return asyncio.run(go())


def values(data) -> list[bytes | None]:
    return [r.value for b in iter_batches(bytes(data)) if not b.is_control for r in b.records()]


def read_all(node: NodeHandle, isolation: int) -> tuple[list[bytes | None], multi.PartitionHeader]:
    """Every record value up to the end a consumer of ``isolation`` may read (a fetch returns the
    batches of one segment at a time), and the last answer's header."""
    got: list[bytes | None] = []
    offset = 0
    while True:
        answer = consumer_fetch(node, offset, isolation)
        batches = list(iter_batches(bytes(answer.records)))
        if not batches:
            return got, answer.header
        got += values(answer.records)
        offset = batches[-1].next_offset


@pytest.fixture
def nodes(tmp_path):
    handles = {n: start_node(tmp_path, f"node{n}", "--node-id", str(n)) for n in (1, 2)}
    for handle in handles.values():
        handle.create(TOPIC)
    tell(handles, 1, state(leader=1, epoch=1, isr=(1, 2), version=10))
    yield handles
    for handle in handles.values():
        handle.close()
        handle.process.stop()


def test_a_retried_idempotent_batch_gets_its_first_offsets_and_is_stored_once(nodes, tmp_path):
    first = append(nodes[1], producer_batch([b"a", b"b"], seq=0))
    assert not first.HasField("error") and (first.base_offset, first.last_offset) == (0, 1)
    retry = append(nodes[1], producer_batch([b"a", b"b"], seq=0))
    assert (retry.base_offset, retry.last_offset) == (0, 1)
    gap = append(nodes[1], producer_batch([b"c"], seq=5))
    assert gap.error.reason == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert append(nodes[1], producer_batch([b"c"], seq=2)).base_offset == 2
    wait_until(
        lambda: disk_batches(tmp_path, 2) == disk_batches(tmp_path, 1),
        timeout=10.0,
        what="the follower's copy",
    )
    assert len(disk_batches(tmp_path, 1)) == 2
    # The follower, made leader, knows the producer: the retry of what node 1 wrote is recognised.
    tell(nodes, 1, state(leader=2, epoch=2, isr=(1, 2), version=11))
    again = append(nodes[2], producer_batch([b"c"], seq=2))
    assert (again.base_offset, again.last_offset) == (2, 2)
    assert nodes[2].describe(TOPIC).log_end_offset == 3


def test_read_committed_stops_at_an_open_transaction_and_skips_aborted_ones(nodes, tmp_path):
    append(nodes[1], producer_batch([b"t1-a", b"t1-b"], seq=0, transactional=True))  # 0..1
    committed = consumer_fetch(nodes[1], 0, multi.READ_COMMITTED)
    assert committed.header.last_stable_offset == 0 and bytes(committed.records) == b""
    assert read_all(nodes[1], multi.READ_UNCOMMITTED)[0] == [b"t1-a", b"t1-b"]
    assert not write_marker(nodes[1], commit=True).HasField("error")  # offset 2
    append(nodes[1], producer_batch([b"t2-a"], seq=2, transactional=True))  # 3
    assert not write_marker(nodes[1], commit=False).HasField("error")  # offset 4
    view = consumer_fetch(nodes[1], 0, multi.READ_COMMITTED)
    assert view.header.last_stable_offset == 5
    assert view.header.aborted == ((PID, 3),)
    # The records are all there; the consumer drops the aborted producer's from offset 3 on.
    assert read_all(nodes[1], multi.READ_COMMITTED)[0] == [b"t1-a", b"t1-b", b"t2-a"]
    # Markers replicate like data.
    wait_until(
        lambda: disk_batches(tmp_path, 2) == disk_batches(tmp_path, 1),
        timeout=10.0,
        what="the follower's copy",
    )
    tell(nodes, 1, state(leader=2, epoch=2, isr=(1, 2), version=11))
    wait_until(
        lambda: nodes[2].describe(TOPIC).high_watermark == 5, timeout=10.0, what="node 2's high watermark"
    )
    assert consumer_fetch(nodes[2], 0, multi.READ_COMMITTED).header.aborted == ((PID, 3),)


def test_a_marker_from_an_older_coordinator_is_refused(nodes):
    append(nodes[1], producer_batch([b"x"], seq=0, transactional=True))
    assert not write_marker(nodes[1], commit=True, coordinator_epoch=5).HasField("error")
    stale = write_marker(nodes[1], commit=False, coordinator_epoch=4)
    assert stale.error.reason == "TRANSACTION_COORDINATOR_FENCED"
    assert write_marker(nodes[2], commit=True).error.reason == "NOT_LEADER_OR_FOLLOWER"
