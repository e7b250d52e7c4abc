"""Replication with real processes: three storage nodes, a coordinator (two where a controller is
deposed), a gateway, the SDK. Each test breaks its own cluster (kill -9, SIGSTOP), so none is
shared; the chaos test (``test_chaos.py``) runs the long fault loop."""

from __future__ import annotations

import signal
import time
import urllib.request

import grpc
import pytest

from gateway.client import Admin, Consumer, Producer, TopicPartition
from services import errors
from services.proto import pb
from tests.support.ports import free_port
from tests.support.wait import wait_until

from ._replication import (
    TTL_S,
    new_topic,
    partition,
    replica_batches,
    replica_info,
    start_cluster,
    storage_stub,
    values_in,
)


def produce(
    servers: str, topic: str, values: list[bytes], *, acks="all", index: int = 0, timeout_ms: int = 20_000
):
    """Send ``values`` to one partition; the offsets acknowledged, or raise the first failure."""
    with Producer(
        servers=servers, acks=acks, delivery_timeout_ms=timeout_ms, request_timeout_ms=timeout_ms, linger_ms=0
    ) as producer:
        futures = [producer.send(topic, value, partition=index) for value in values]
        producer.flush()
        return [f.get(timeout_ms / 1000 + 5).offset for f in futures]


def read_values(
    servers: str, topic: str, index: int = 0, *, expect: int, timeout: float = 20.0
) -> list[bytes]:
    """What a consumer reads from the beginning, until ``expect`` values or the timeout."""
    got: list[bytes] = []
    with Consumer(servers=servers, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, index)])
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=300).values():
                got.extend(r.value for r in records)
    return got


def numbered(prefix: str, count: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(start, start + count)]


def in_sync(admin: Admin, topic: str, isr: set[int]) -> bool:
    p = partition(admin, topic)
    return p.state == "online" and set(p.isr) == isr


def assert_replicas_identical(cluster, topic: str, nodes, index: int = 0) -> list[tuple[int, int, bytes]]:
    """Every replica's log holds the same batches, byte for byte, below the leader's high watermark."""
    leader = partition(Admin(servers=cluster.gateway), topic, index).leader
    high_watermark = replica_info(cluster, leader, topic, index).high_watermark
    logs = {node: replica_batches(cluster, node, topic, index, below=high_watermark) for node in nodes}
    reference = logs[leader]
    assert reference, "the leader's log is empty"
    assert sum(len(values_in([b])) for b in reference) == high_watermark - reference[0][0]
    for node, batches in logs.items():
        assert batches == reference, f"replica on node {node} differs from the leader's ({leader})"
    return reference


@pytest.fixture
def cluster(tmp_path):
    with start_cluster(tmp_path) as local:
        yield local


@pytest.fixture
def admin(cluster):
    with Admin(servers=cluster.gateway) as client:
        yield client


def test_acks_all_records_are_on_every_replica_byte_for_byte_with_their_leader_epoch(cluster, admin):
    topic = new_topic(admin, partitions=2, min_insync_replicas=2)
    for index in (0, 1):
        offsets = produce(cluster.gateway, topic, numbered(f"p{index}", 300), index=index)
        assert offsets == list(range(300))
        p = partition(admin, topic, index)
        assert set(p.isr) == {0, 1, 2}
        # acks=all answered once the high watermark passed the records: every in-sync replica
        # already holds them (followers learn the high watermark on their next fetch).
        for node in (0, 1, 2):
            assert replica_info(cluster, node, topic, index).log_end_offset >= 300
        wait_until(
            lambda index=index: all(
                replica_info(cluster, n, topic, index).high_watermark == 300 for n in (0, 1, 2)
            ),
            timeout=20.0,
            what="followers learning the high watermark",
            interval=0.1,
            tolerate=(grpc.RpcError,),
        )
        batches = assert_replicas_identical(cluster, topic, (0, 1, 2), index)
        assert {epoch for _, epoch, _ in batches} == {p.leader_epoch}
        assert values_in(batches) == numbered(f"p{index}", 300)
        roles = {n: replica_info(cluster, n, topic, index) for n in (0, 1, 2)}
        assert {r.leader for r in roles.values()} == {p.leader}
        assert all(set(r.isr) == {0, 1, 2} and r.leader_epoch == p.leader_epoch for r in roles.values())


def test_two_of_three_down_refuses_acks_all_before_writing_and_recovers_when_they_return(cluster, admin):
    topic = new_topic(admin, min_insync_replicas=2)
    produce(cluster.gateway, topic, numbered("before", 50))
    leader = partition(admin, topic).leader
    followers = [n for n in (0, 1, 2) if n != leader]
    for node in followers:
        cluster.storage_nodes[node].kill()
    wait_until(
        lambda: in_sync(admin, topic, {leader}),
        timeout=TTL_S + 10,
        what="the ISR to shrink to the leader",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    end_before = replica_info(cluster, leader, topic).log_end_offset

    with pytest.raises(errors.TributaryError) as refused:
        produce(cluster.gateway, topic, numbered("refused", 5), timeout_ms=2_000)
    chain = [refused.value, refused.value.__cause__]
    assert any(getattr(e, "reason", "") == "NOT_ENOUGH_REPLICAS" for e in chain), chain
    # NOT_ENOUGH_REPLICAS is answered before the append: nothing of it reached the log.
    assert replica_info(cluster, leader, topic).log_end_offset == end_before

    assert produce(cluster.gateway, topic, numbered("acks1", 20), acks=1) == list(
        range(end_before, end_before + 20)
    )

    for node in followers:
        cluster.start_storage_node(node)
    wait_until(
        lambda: in_sync(admin, topic, {0, 1, 2}),
        timeout=30,
        what="the returning replicas to rejoin the ISR",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    produce(cluster.gateway, topic, numbered("after", 30))
    expected = numbered("before", 50) + numbered("acks1", 20) + numbered("after", 30)
    assert read_values(cluster.gateway, topic, expect=len(expected)) == expected
    assert_replicas_identical(cluster, topic, (0, 1, 2))


def _leader_and_followers(admin: Admin, topic: str) -> tuple[int, list[int]]:
    p = partition(admin, topic)
    return p.leader, [n for n in p.replicas if n != p.leader]


def test_without_unclean_election_the_partition_waits_offline_for_an_in_sync_replica(cluster, admin):
    topic = new_topic(admin, min_insync_replicas=1)
    produce(cluster.gateway, topic, numbered("committed", 40))
    leader, followers = _leader_and_followers(admin, topic)
    for node in followers:
        cluster.storage_nodes[node].kill()
    wait_until(
        lambda: in_sync(admin, topic, {leader}),
        timeout=TTL_S + 10,
        what="the ISR to shrink to the leader",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    produce(cluster.gateway, topic, numbered("leader-only", 10))
    epoch = partition(admin, topic).leader_epoch
    cluster.storage_nodes[leader].kill()
    wait_until(
        lambda: partition(admin, topic).state == "offline",
        timeout=TTL_S + 10,
        what="the partition to go offline",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    for node in followers:
        cluster.start_storage_node(node)
    # The out-of-sync replicas are live, but may not lead: they never had "leader-only".
    time.sleep(TTL_S + 1)
    p = partition(admin, topic)
    assert (p.state, p.leader, tuple(p.isr)) == ("offline", -1, (leader,))
    cluster.start_storage_node(leader)
    wait_until(
        lambda: partition(admin, topic).leader == leader,
        timeout=20,
        what="the in-sync replica to lead again",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    assert partition(admin, topic).leader_epoch > epoch
    expected = numbered("committed", 40) + numbered("leader-only", 10)
    assert read_values(cluster.gateway, topic, expect=len(expected)) == expected
    wait_until(
        lambda: in_sync(admin, topic, {0, 1, 2}),
        timeout=30,
        what="every replica back in sync",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    assert_replicas_identical(cluster, topic, (0, 1, 2))


def _unclean_elections(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("tributary_coordinator_unclean_elections") and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_unclean_election_lets_an_out_of_sync_replica_lead_and_counts_it(tmp_path):
    metrics_port = free_port()
    with start_cluster(
        tmp_path, coordinator_args=["--metrics-address", f"127.0.0.1:{metrics_port}"]
    ) as cluster:
        admin = Admin(servers=cluster.gateway)
        topic = new_topic(admin, min_insync_replicas=1, unclean_leader_election_enable="true")
        produce(cluster.gateway, topic, numbered("committed", 40))
        leader, followers = _leader_and_followers(admin, topic)
        for node in followers:
            cluster.storage_nodes[node].kill()
        wait_until(
            lambda: in_sync(admin, topic, {leader}),
            timeout=TTL_S + 10,
            what="the ISR to shrink to the leader",
            interval=0.1,
            tolerate=(grpc.RpcError,),
        )
        produce(cluster.gateway, topic, numbered("lost", 10))
        cluster.storage_nodes[leader].kill()
        wait_until(
            lambda: partition(admin, topic).state == "offline",
            timeout=TTL_S + 10,
            what="the partition to go offline",
            interval=0.1,
            tolerate=(grpc.RpcError,),
        )
        assert _unclean_elections(metrics_port) == 0
        for node in followers:
            cluster.start_storage_node(node)
        p = wait_until(
            lambda: (lambda q: q if q.state == "online" else None)(partition(admin, topic)),
            timeout=20,
            what="an unclean leader",
            interval=0.1,
            tolerate=(grpc.RpcError,),
        )
        # An out-of-sync replica leads (the other may already have copied it and rejoined).
        assert p.leader in followers and leader not in p.isr
        wait_until(
            lambda: _unclean_elections(metrics_port) == 1,
            timeout=10,
            what="the unclean election metric",
            interval=0.1,
            tolerate=(grpc.RpcError,),
        )
        produce(cluster.gateway, topic, numbered("new", 5))
        # The old leader returns: its tail ("lost") is not the new leader's history; it truncates.
        cluster.start_storage_node(leader)
        wait_until(
            lambda: in_sync(admin, topic, {0, 1, 2}),
            timeout=30,
            what="every replica back in sync",
            interval=0.1,
            tolerate=(grpc.RpcError,),
        )
        expected = numbered("committed", 40) + numbered("new", 5)
        assert read_values(cluster.gateway, topic, expect=len(expected), timeout=5) == expected
        assert_replicas_identical(cluster, topic, (0, 1, 2))
        admin.close()


def test_consumers_see_nothing_past_the_high_watermark(cluster, admin):
    topic = new_topic(admin, min_insync_replicas=1)
    produce(cluster.gateway, topic, numbered("visible", 10))
    leader, followers = _leader_and_followers(admin, topic)
    wait_until(
        lambda: replica_info(cluster, leader, topic).high_watermark == 10,
        timeout=20.0,
        what="the high watermark at 10",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    with Consumer(servers=cluster.gateway, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        first = []
        deadline = time.monotonic() + 10
        while len(first) < 10 and time.monotonic() < deadline:
            first += [r.value for recs in consumer.poll(timeout_ms=200).values() for r in recs]
        assert first == numbered("visible", 10)
        for node in followers:
            cluster.storage_nodes[node].signal(signal.SIGSTOP)
        try:
            produce(cluster.gateway, topic, numbered("pending", 5), acks=1)
            # On the leader's disk, not yet in every in-sync replica: invisible.
            assert replica_info(cluster, leader, topic).log_end_offset == 15
            assert replica_info(cluster, leader, topic).high_watermark == 10
            seen = [r.value for recs in consumer.poll(timeout_ms=500).values() for r in recs]
            assert seen == []
            assert consumer.end_offsets([tp])[tp] == 10
        finally:
            for node in followers:
                cluster.storage_nodes[node].signal(signal.SIGCONT)
        later = []
        deadline = time.monotonic() + 15
        while len(later) < 5 and time.monotonic() < deadline:
            later += [r.value for recs in consumer.poll(timeout_ms=200).values() for r in recs]
        assert later == numbered("pending", 5)


def test_a_follower_stopped_past_the_lag_time_leaves_the_isr_and_the_high_watermark_moves_on(cluster, admin):
    topic = new_topic(admin, min_insync_replicas=1)
    produce(cluster.gateway, topic, numbered("a", 5))
    _, followers = _leader_and_followers(admin, topic)
    laggard = followers[0]
    cluster.storage_nodes[laggard].kill()  # gone: the lease and the lag both take it out
    produce(cluster.gateway, topic, numbered("b", 5))  # acks=all: waits for the ISR to shrink
    assert laggard not in partition(admin, topic).isr
    assert read_values(cluster.gateway, topic, expect=10) == numbered("a", 5) + numbered("b", 5)


def test_a_deposed_controller_changes_nothing_on_any_storage_node(tmp_path):
    with start_cluster(tmp_path, coordinators=2) as cluster:
        admin = Admin(servers=cluster.gateway)
        topic = new_topic(admin, partitions=3, min_insync_replicas=1)
        produce(cluster.gateway, topic, numbered("x", 10))
        info = admin.describe_cluster() if hasattr(admin, "describe_cluster") else None
        del info
        coordinators = cluster.coordinators
        active = _active_coordinator(cluster)
        old = coordinators[active]
        old.signal(signal.SIGSTOP)
        try:
            wait_until(
                lambda: _active_coordinator(cluster, exclude=active) is not None,
                timeout=TTL_S + 15,
                what="a new active controller",
                interval=0.1,
                tolerate=(grpc.RpcError,),
            )
            # Make the new controller change something: a leader dies, its partitions move.
            victim = partition(admin, topic, 0).leader
            cluster.storage_nodes[victim].kill()
            wait_until(
                lambda: partition(admin, topic, 0).leader not in (victim, -1),
                timeout=TTL_S + 10,
                what="partition 0 to fail over",
                interval=0.1,
                tolerate=(grpc.RpcError,),
            )
        finally:
            old.signal(signal.SIGCONT)
        time.sleep(3)  # the deposed controller runs again, with its old view, until it learns
        live = [n for n in (0, 1, 2) if n != victim]
        for index in range(3):
            p = partition(admin, topic, index)
            for node in live:
                role = replica_info(cluster, node, topic, index)
                assert (role.leader, role.leader_epoch, set(role.isr)) == (
                    p.leader,
                    p.leader_epoch,
                    set(p.isr),
                ), f"node {node} holds a role for {topic}-{index} that is not the committed one"
        # A call with the old controller epoch, as the deposed one would send, changes nothing.
        stale = _controller_epoch(cluster) - 1
        stub = storage_stub(cluster, live[0])
        with pytest.raises(grpc.RpcError) as refused:
            stub.DeletePartition(
                pb.DeletePartitionRequest(topic=topic, partition=0, controller_epoch=stale), timeout=5
            )
        assert errors.error_from_rpc(refused.value).reason == "STALE_CONTROLLER_EPOCH"
        assert replica_info(cluster, live[0], topic).log_end_offset == 10
        admin.close()


def _active_coordinator(cluster, exclude: int | None = None) -> int | None:
    for index, process in enumerate(cluster.coordinators):
        if index == exclude or not process.is_running:
            continue
        info = process.info
        channel = grpc.insecure_channel(f"{info['host']}:{info['grpc_port']}")
        try:
            from services.proto import coordinator_grpc

            answer = coordinator_grpc.CoordinatorStub(channel).GetControllerInfo(
                pb.GetControllerInfoRequest(), timeout=2
            )
        except grpc.RpcError:
            continue
        finally:
            channel.close()
        if answer.is_active:
            return index
    return None


def _controller_epoch(cluster) -> int:
    for process in cluster.coordinators:
        info = process.info
        channel = grpc.insecure_channel(f"{info['host']}:{info['grpc_port']}")
        try:
            from services.proto import coordinator_grpc

            return (
                coordinator_grpc.CoordinatorStub(channel)
                .GetControllerInfo(pb.GetControllerInfoRequest(), timeout=2)
                .controller_epoch
            )
        except grpc.RpcError:
            continue
        finally:
            channel.close()
    raise AssertionError("no coordinator answers")


def test_a_storage_node_refuses_to_delete_a_replica_it_serves(cluster, admin):
    """DeletePartition behind the controller's back (the internal API is open until the
    security issue lands): refused while the replica is active, nothing lost."""
    topic = new_topic(admin, min_insync_replicas=1)
    produce(cluster.gateway, topic, numbered("keep", 8))
    leader = partition(admin, topic).leader
    stub = storage_stub(cluster, leader)
    with pytest.raises(grpc.RpcError) as refused:
        stub.DeletePartition(
            pb.DeletePartitionRequest(topic=topic, partition=0, controller_epoch=_controller_epoch(cluster)),
            timeout=5,
        )
    assert errors.error_from_rpc(refused.value).reason == "POLICY_VIOLATION"
    assert read_values(cluster.gateway, topic, expect=8) == numbered("keep", 8)
    assert partition(admin, topic).state == "online"


def test_a_replica_that_lost_its_log_copies_it_again_and_a_sole_one_never_leads_empty(cluster, admin):
    replicated = new_topic(admin, min_insync_replicas=1)
    single = new_topic(admin, replication_factor=1)
    produce(cluster.gateway, replicated, numbered("r", 25))
    produce(cluster.gateway, single, numbered("s", 15))
    _, followers = _leader_and_followers(admin, replicated)
    wiped = followers[0]
    sole = partition(admin, single).leader
    for node in {wiped, sole}:
        cluster.storage_nodes[node].kill()
    import shutil

    shutil.rmtree(cluster.data_dir / f"storage-{wiped}" / f"{replicated}-0")
    shutil.rmtree(cluster.data_dir / f"storage-{sole}" / f"{single}-0")
    for node in {wiped, sole}:
        cluster.start_storage_node(node)
    # The follower without its log leaves the ISR, copies the log again and rejoins.
    wait_until(
        lambda: (
            in_sync(admin, replicated, {0, 1, 2})
            and replica_info(cluster, wiped, replicated).log_end_offset == 25
        ),
        timeout=30,
        what="the wiped follower caught up and in sync",
        interval=0.1,
        tolerate=(grpc.RpcError,),
    )
    assert_replicas_identical(cluster, replicated, (0, 1, 2))
    # The only replica lost the log: the partition stays offline instead of restarting at offset 0.
    time.sleep(TTL_S + 1)
    p = partition(admin, single)
    assert p.state == "offline" and p.leader == -1
    with pytest.raises(grpc.RpcError):
        replica_info(cluster, sole, single)  # no empty log was created there either
