"""Group RPCs end to end through a gateway (raw Gateway stubs), and a group carrying on after the
active coordinator is killed with SIGKILL."""

from __future__ import annotations

import time

import pytest

from services import errors
from services.proto import pb
from tests.support.names import unique
from tests.support.wait import CLUSTER_ERRORS, wait_until

from ._members import SimMember, call, converged
from .conftest import all_partitions, start_cluster


def test_group_rpcs_through_a_gateway(cluster):
    topic = cluster.create_topic(unique("gw"), 3)
    group = unique("g")
    gateway = cluster.gateway_stub()
    member = SimMember(gateway, group, topics=[topic], session_ms=3000, name="gw-member").start()
    try:
        wait_until(
            lambda: converged([member], all_partitions(topic, 3)),
            timeout=10,
            what="assigned via gateway",
            tolerate=CLUSTER_ERRORS,
        )
        member.commit({(topic, p): 10 + p for p in range(3)})
        fetched = call(gateway.FetchCommittedOffsets, pb.FetchCommittedOffsetsRequest(group_id=group)).offsets
        assert [(o.partition, o.offset) for o in fetched] == [(0, 10), (1, 11), (2, 12)]
        listed = call(gateway.ListGroups, pb.ListGroupsRequest()).groups
        assert any(g.group_id == group and g.member_count == 1 for g in listed)
        described = call(gateway.DescribeGroup, pb.DescribeGroupRequest(group_id=group))
        assert [m.member_id for m in described.members] == [member.member_id]
        with pytest.raises(errors.NonEmptyGroupError):
            call(gateway.DeleteGroup, pb.DeleteGroupRequest(group_id=group))
        member.leave()
        reset = call(
            gateway.ResetGroupOffsets,
            pb.ResetGroupOffsetsRequest(
                group_id=group, topics=[topic], spec=pb.OffsetSpec(earliest=True), dry_run=True
            ),
        ).offsets
        assert [o.offset for o in reset] == [0, 0, 0]
        call(gateway.DeleteGroup, pb.DeleteGroupRequest(group_id=group))
        with pytest.raises(errors.UnknownMemberIdError):
            member.heartbeat()
    finally:
        member.stop()


def kill_active(cluster) -> str:
    active = cluster.wait_active()
    cluster.coordinators[active].kill()
    return active


def test_group_carries_on_after_the_active_coordinator_is_killed(etcd, tmp_path_factory):
    cluster = start_cluster(etcd, tmp_path_factory)
    members: list[SimMember] = []
    try:
        topic = cluster.create_topic(unique("failover"), 6)
        gateway = cluster.gateway_stub()

        # Sessions longer than a failover: the members keep their ids and generation.
        group = unique("long")
        members += [
            SimMember(gateway, group, topics=[topic], session_ms=8000, heartbeat_s=0.3, name=f"l{i}").start()
            for i in range(3)
        ]
        wait_until(
            lambda: converged(members, all_partitions(topic, 6)),
            timeout=10,
            what="converged",
            tolerate=CLUSTER_ERRORS,
        )
        members[0].commit({tp: 100 + tp[1] for tp in members[0].owned})
        before = [m.snapshot() for m in members]
        dead = kill_active(cluster)  # SIGKILL: nothing is handed over
        new_active = cluster.wait_active(exclude=dead, timeout=20)
        time.sleep(2.0)  # several heartbeats against the new controller
        assert [m.snapshot()[:3] for m in members] == [b[:3] for b in before]
        assert all(m.joins == 1 for m in members), "nobody had to join again"
        described = call(cluster.stub(new_active).DescribeGroup, pb.DescribeGroupRequest(group_id=group))
        assert sorted(m.member_id for m in described.members) == sorted(b[0] for b in before)
        assert described.state == "Stable" and described.generation_id == before[0][1]
        committed = {p.partition: p.committed_offset for p in described.partitions if p.committed_offset >= 0}
        assert committed == {tp[1]: 100 + tp[1] for tp in before[0][2]}

        # The killed coordinator comes back as a standby; kill the new active too. This time the
        # sessions are shorter than the failover: the members rejoin cleanly.
        restarted = cluster.coordinators[dead]
        restarted.args += ["--port", str(restarted.info["grpc_port"])]  # where the gateway looks for it
        restarted.start(timeout=30)
        short = unique("short")
        quick = [
            SimMember(gateway, short, topics=[topic], session_ms=1000, heartbeat_s=0.2, name=f"s{i}").start()
            for i in range(2)
        ]
        members += quick
        wait_until(
            lambda: converged(quick, all_partitions(topic, 6)),
            timeout=10,
            what="short group converged",
            tolerate=CLUSTER_ERRORS,
        )
        kill_active(cluster)
        cluster.wait_active(exclude=new_active, timeout=20)
        wait_until(
            lambda: all(m.joins >= 2 for m in quick) and converged(quick, all_partitions(topic, 6)),
            timeout=20,
            what="short-session members rejoined and own everything",
            tolerate=CLUSTER_ERRORS,
        )
        wait_until(
            lambda: converged(members[:3], all_partitions(topic, 6)),
            timeout=20,
            what="the long-session group carried on through the second failover too",
            tolerate=CLUSTER_ERRORS,
        )
    finally:
        for member in members:
            member.stop()
        cluster.stop_all()
