"""Two real storage nodes, with the test acting as their controller: it sends UpdateLeaderAndIsr
itself, so the exact moment each node leads or follows is under its control. The follower copies
over the leader's fetch port; divergence, fencing and the high watermark are checked exactly."""

from __future__ import annotations

import grpc
import pytest

from services import errors
from services.proto import pb
from services.records import iter_batches
from tests.support.wait import wait_until

from .conftest import NodeHandle, make_batch, start_node

TOPIC = "roles"


def state(leader: int, epoch: int, isr, version: int, replicas=(1, 2)):
    return pb.LeaderAndIsr(
        topic=TOPIC,
        partition=0,
        replicas=list(replicas),
        leader=leader,
        leader_epoch=epoch,
        isr=list(isr),
        version=version,
    )


def tell(nodes: dict[int, NodeHandle], controller_epoch: int, leader_and_isr) -> None:
    leaders = [
        pb.ReplicaEndpoint(node_id=n, host="127.0.0.1", fetch_port=h.fetch_port)
        for n, h in nodes.items()
        if n == leader_and_isr.leader
    ]
    for handle in nodes.values():
        answer = handle.stub.UpdateLeaderAndIsr(
            pb.UpdateLeaderAndIsrRequest(
                controller_epoch=controller_epoch, partitions=[leader_and_isr], leaders=leaders
            ),
            timeout=5,
        )
        assert not answer.partitions[0].HasField("error"), answer


@pytest.fixture
def nodes(tmp_path):
    handles = {
        n: start_node(tmp_path, f"node{n}", "--node-id", str(n), "--replica-fetch-backoff-ms", "100")
        for n in (1, 2)
    }
    for handle in handles.values():
        handle.create(TOPIC)
    yield handles
    for handle in handles.values():
        handle.close()
        handle.process.stop()


def test_a_follower_copies_the_leaders_batches_and_the_high_watermark_waits_for_it(nodes, tmp_path):
    tell(nodes, 1, state(leader=1, epoch=1, isr=(1, 2), version=10))
    for i in range(5):
        assert not nodes[1].append(TOPIC, 0, make_batch([b"v%d" % i]), acks=pb.ACKS_LEADER).HasField("error")
    wait_until(
        lambda: nodes[2].describe(TOPIC).log_end_offset == 5,
        timeout=10.0,
        what="the follower copying five records",
    )
    wait_until(
        lambda: nodes[1].describe(TOPIC).high_watermark == 5, timeout=10.0, what="the leader's high watermark"
    )
    leader_batches = disk_batches(tmp_path, 1)
    assert len(leader_batches) == 5 and disk_batches(tmp_path, 2) == leader_batches
    assert {epoch for epoch, _ in leader_batches} == {1}
    assert nodes[2].describe(TOPIC).latest_log_epoch == 1
    # The follower serves no consumer: only the leader does.
    assert isinstance(nodes[2].fetch(TOPIC, 0, 0).header.error(), errors.NotLeaderOrFollowerError)
    answer = nodes[2].append(TOPIC, 0, make_batch([b"x"]))
    assert answer.error.reason == "NOT_LEADER_OR_FOLLOWER"


def disk_batches(tmp_path, node_id: int) -> list[tuple[int, bytes]]:
    """``(leader epoch, bytes)`` of each batch in a node's segment files, read from its disk."""
    directory = tmp_path / f"node{node_id}-data" / f"{TOPIC}-0"
    return [
        (batch.partition_leader_epoch, bytes(batch.buffer))
        for path in sorted(directory.glob("*.log"))
        for batch in iter_batches(path.read_bytes(), allow_partial_tail=True)
    ]


def test_consumers_read_only_below_the_high_watermark(nodes):
    tell(nodes, 1, state(leader=1, epoch=1, isr=(1, 2), version=10))
    nodes[1].append(TOPIC, 0, make_batch([b"a"]), acks=pb.ACKS_LEADER)
    wait_until(
        lambda: nodes[1].describe(TOPIC).high_watermark == 1, timeout=10.0, what="the first record committed"
    )
    nodes[2].process.signal(19)  # SIGSTOP: the follower stops fetching
    try:
        nodes[1].append(TOPIC, 0, make_batch([b"b"]), acks=pb.ACKS_LEADER)
        info = nodes[1].describe(TOPIC)
        assert (info.log_end_offset, info.high_watermark) == (2, 1)
        fetched = nodes[1].fetch(TOPIC, 0, 1, max_wait_ms=300)
        assert fetched.header.error() is None and fetched.records == b""
        assert fetched.header.high_watermark == 1
    finally:
        nodes[2].process.signal(18)  # SIGCONT
    wait_until(
        lambda: nodes[1].describe(TOPIC).high_watermark == 2, timeout=10.0, what="the follower catching up"
    )
    assert [r.value for b in iter_batches(nodes[1].fetch(TOPIC, 0, 1).records) for r in b.records()] == [b"b"]


def test_acks_all_waits_for_the_isr_and_min_insync_replicas_refuses_before_writing(nodes):
    for handle in nodes.values():
        handle.create(TOPIC, **{"min.insync.replicas": "2"})
    tell(nodes, 1, state(leader=1, epoch=1, isr=(1, 2), version=10))
    answer = nodes[1].append(TOPIC, 0, make_batch([b"both"]))
    assert not answer.HasField("error")
    assert nodes[2].describe(TOPIC).log_end_offset == 1  # acknowledged => on the follower
    tell(nodes, 1, state(leader=1, epoch=1, isr=(1,), version=11))  # the follower left the ISR
    refused = nodes[1].append(TOPIC, 0, make_batch([b"alone"]))
    assert refused.error.reason == "NOT_ENOUGH_REPLICAS"
    assert nodes[1].describe(TOPIC).log_end_offset == 1  # nothing written


def test_a_follower_whose_tail_diverged_truncates_to_the_new_leader(nodes, tmp_path):
    tell(nodes, 1, state(leader=1, epoch=1, isr=(1, 2), version=10))
    nodes[1].append(TOPIC, 0, make_batch([b"c0", b"c1", b"c2"]), acks=pb.ACKS_LEADER)
    wait_until(
        lambda: nodes[2].describe(TOPIC).log_end_offset == 3, timeout=10.0, what="the follower caught up"
    )
    # Node 2 stops following (no leader for it), node 1 takes records nobody copies...
    nodes[2].stub.UpdateLeaderAndIsr(
        pb.UpdateLeaderAndIsrRequest(
            controller_epoch=1, partitions=[state(leader=-1, epoch=2, isr=(1, 2), version=11)]
        ),
        timeout=5,
    )
    nodes[1].append(TOPIC, 0, make_batch([b"orphan0", b"orphan1"]), acks=pb.ACKS_LEADER)
    nodes[1].append(TOPIC, 0, make_batch([b"orphan2"]), acks=pb.ACKS_LEADER)
    assert nodes[1].describe(TOPIC).log_end_offset == 6
    # ...then node 2 leads epoch 3 and writes its own records at the same offsets.
    tell(nodes, 1, state(leader=2, epoch=3, isr=(2,), version=12))
    nodes[2].append(TOPIC, 0, make_batch([b"n0", b"n1", b"n2", b"n3"]), acks=pb.ACKS_LEADER)
    # Node 1, now a follower, finds its epoch-1 tail past where epoch 1 ended on the leader.
    wait_until(
        lambda: (
            nodes[1].describe(TOPIC).log_end_offset == 7 and nodes[1].describe(TOPIC).latest_log_epoch == 3
        ),
        timeout=10.0,
        what="the old leader truncating and copying",
    )
    wait_until(
        lambda: disk_batches(tmp_path, 1) == disk_batches(tmp_path, 2), timeout=10.0, what="identical logs"
    )
    values = [
        r.value for _, data in disk_batches(tmp_path, 1) for b in iter_batches(data) for r in b.records()
    ]
    assert values == [b"c0", b"c1", b"c2", b"n0", b"n1", b"n2", b"n3"]
    assert [epoch for epoch, _ in disk_batches(tmp_path, 1)] == [1, 3]


def test_stale_controllers_and_stale_leader_epochs_are_refused_and_change_nothing(nodes):
    tell(nodes, 5, state(leader=1, epoch=3, isr=(1, 2), version=10))
    nodes[1].append(TOPIC, 0, make_batch([b"kept"]), acks=pb.ACKS_LEADER)
    with pytest.raises(grpc.RpcError) as stale:
        nodes[1].stub.UpdateLeaderAndIsr(
            pb.UpdateLeaderAndIsrRequest(
                controller_epoch=4, partitions=[state(leader=2, epoch=9, isr=(2,), version=20)]
            ),
            timeout=5,
        )
    assert errors.error_from_rpc(stale.value).reason == "STALE_CONTROLLER_EPOCH"
    with pytest.raises(grpc.RpcError) as stale_delete:
        nodes[1].stub.DeletePartition(
            pb.DeletePartitionRequest(topic=TOPIC, partition=0, controller_epoch=4), timeout=5
        )
    assert errors.error_from_rpc(stale_delete.value).reason == "STALE_CONTROLLER_EPOCH"
    info = nodes[1].describe(TOPIC)
    assert (info.leader, info.leader_epoch, info.log_end_offset) == (1, 3, 1)
    # An older leader epoch from the current controller is ignored (FENCED per partition).
    answer = nodes[1].stub.UpdateLeaderAndIsr(
        pb.UpdateLeaderAndIsrRequest(
            controller_epoch=5, partitions=[state(leader=2, epoch=2, isr=(2,), version=30)]
        ),
        timeout=5,
    )
    assert answer.partitions[0].error.reason == "FENCED_LEADER_EPOCH"
    # Producers routed by stale or future metadata are told so.
    for epoch, reason in ((2, "FENCED_LEADER_EPOCH"), (4, "UNKNOWN_LEADER_EPOCH")):
        response = nodes[1].stub.Append(
            pb.AppendRequest(
                partitions=[
                    pb.PartitionAppend(
                        topic=TOPIC, partition=0, record_batches=make_batch([b"x"]), leader_epoch=epoch
                    )
                ],
                acks=pb.ACKS_LEADER,
            )
        )
        assert response.partitions[0].error.reason == reason
    assert nodes[1].describe(TOPIC).log_end_offset == 1
    # An active replica is not deleted behind the controller's back.
    with pytest.raises(grpc.RpcError) as active:
        nodes[1].stub.DeletePartition(
            pb.DeletePartitionRequest(topic=TOPIC, partition=0, controller_epoch=5), timeout=5
        )
    assert errors.error_from_rpc(active.value).reason == "POLICY_VIOLATION"
    assert nodes[1].describe(TOPIC).log_end_offset == 1
