"""Group membership against real processes: assignment, cooperative and eager rebalances, session
timeouts, static members, pattern subscriptions. Members are raw gRPC stubs (``_members.py``)
talking to the standby coordinator, so every call also exercises forwarding to the active one."""

from __future__ import annotations

import time

import pytest

from services import errors
from services.proto import pb
from tests.support.names import unique
from tests.support.wait import CLUSTER_ERRORS, wait_until

from ._members import SimMember, call, converged, settled
from .conftest import all_partitions

SESSION_MS = 2000


@pytest.fixture
def members():
    started: list[SimMember] = []
    yield started
    for member in started:
        member.stop()


def start(members: list, cluster, group: str, count: int, **kwargs) -> list[SimMember]:
    stub = kwargs.pop("stub", None) or cluster.stub(cluster.standby_id())
    new = [
        SimMember(stub, group, session_ms=SESSION_MS, name=f"m{len(members) + i}", **kwargs).start()
        for i in range(count)
    ]
    members.extend(new)
    return new


def owners(members: list[SimMember]) -> dict[tuple[str, int], str]:
    return {tp: m.member_id for m in members for tp in m.snapshot()[2]}


def test_three_members_on_six_partitions_get_two_each(cluster, members):
    topic = cluster.create_topic(unique("three"), 6)
    group = unique("g")
    ms = start(members, cluster, group, 3, topics=[topic])
    wait_until(
        lambda: converged(ms, all_partitions(topic, 6)),
        timeout=10,
        what="three members converged",
        tolerate=CLUSTER_ERRORS,
    )
    assert sorted(len(m.owned) for m in ms) == [2, 2, 2]
    described = call(cluster.stub().DescribeGroup, pb.DescribeGroupRequest(group_id=group))
    assert described.state == "Stable" and len(described.members) == 3
    assert {m.member_id for m in described.members} == {m.member_id for m in ms}


def test_fourth_member_cooperative_revokes_only_moved_partitions(cluster, members):
    topic = cluster.create_topic(unique("coop"), 6)
    group = unique("g")
    ms = start(members, cluster, group, 3, topics=[topic])
    wait_until(
        lambda: settled(ms, all_partitions(topic, 6)),
        timeout=10,
        what="three members converged, every member on the new generation",
        tolerate=CLUSTER_ERRORS,
    )
    before = owners(ms)
    for m in ms:
        m.revoked.clear()
    generation = call(cluster.stub().DescribeGroup, pb.DescribeGroupRequest(group_id=group)).generation_id
    ms += start(members, cluster, group, 1, topics=[topic])
    wait_until(
        lambda: settled(ms, all_partitions(topic, 6)),
        timeout=10,
        what="four members settled",
        tolerate=CLUSTER_ERRORS,
    )
    after = owners(ms)
    moved = {tp for tp in before if after[tp] != before[tp]}
    revoked = [tp for m in ms for tp in m.revoked]
    assert sorted(revoked) == sorted(moved) and len(moved) == 1, (revoked, moved)
    assert set(ms[3].owned) == moved
    assert sorted(len(m.owned) for m in ms) == [1, 1, 2, 2]
    assert all(m.generation == generation + 1 for m in ms), [m.generation for m in ms]


def test_eager_rebalance_revokes_everything_first(cluster, members):
    topic = cluster.create_topic(unique("eager"), 6)
    group = unique("g")
    ms = start(members, cluster, group, 2, topics=[topic], assignor=pb.ASSIGNOR_RANGE)
    wait_until(
        lambda: settled(ms, all_partitions(topic, 6)),
        timeout=10,
        what="two members converged, every member on the new generation",
        tolerate=CLUSTER_ERRORS,
    )
    for m in ms:
        m.revoked.clear()
    ms += start(members, cluster, group, 1, topics=[topic], assignor=pb.ASSIGNOR_RANGE)
    wait_until(
        lambda: converged(ms, all_partitions(topic, 6)),
        timeout=10,
        what="three members converged",
        tolerate=CLUSTER_ERRORS,
    )
    assert (
        sorted(ms[0].revoked) == sorted(all_partitions(topic, 6) - {(topic, p) for p in range(3, 6)})
        or len(ms[0].revoked) == 3
    )  # everything it held, not only what moved
    assert len(ms[1].revoked) == 3
    assert sorted(sorted(p for _, p in m.owned) for m in ms) == [[0, 1], [2, 3], [4, 5]]


def test_killed_member_partitions_reassigned_within_session_timeout(cluster, members):
    topic = cluster.create_topic(unique("kill"), 6)
    group = unique("g")
    ms = start(members, cluster, group, 3, topics=[topic])
    wait_until(
        lambda: settled(ms, all_partitions(topic, 6)),
        timeout=10,
        what="three members converged, every member on the new generation",
        tolerate=CLUSTER_ERRORS,
    )
    for m in ms:
        m.revoked.clear()
    victim = ms.pop(1)
    lost = set(victim.owned)
    killed_at = time.monotonic()
    victim.kill()
    wait_until(
        lambda: converged(ms, all_partitions(topic, 6)),
        timeout=SESSION_MS / 1000 + 5,
        what="the survivors own everything",
        tolerate=CLUSTER_ERRORS,
    )
    elapsed = time.monotonic() - killed_at
    # etcd expires the lease within TTL + 0.5 s; then one heartbeat interval to hand out.
    assert elapsed < SESSION_MS / 1000 + 2.0, elapsed
    assert lost <= set(owners(ms)) and not any(tp in m.revoked for m in ms for tp in lost)
    with pytest.raises(errors.UnknownMemberIdError):
        victim.heartbeat()


def test_static_member_restart_within_session_keeps_assignment(cluster, members):
    topic = cluster.create_topic(unique("static"), 4)
    group = unique("g")
    ms = [
        *start(members, cluster, group, 1, topics=[topic], instance_id="host-a"),
        *start(members, cluster, group, 1, topics=[topic], instance_id="host-b"),
    ]
    wait_until(
        lambda: settled(ms, all_partitions(topic, 4)),
        timeout=10,
        what="two static members settled",
        tolerate=CLUSTER_ERRORS,
    )
    old = ms[1]
    old_id, generation, owned, _ = old.snapshot()
    old.kill()
    time.sleep(0.5)  # the process restarts, well within the session timeout
    restarted = start(members, cluster, group, 1, topics=[topic], instance_id="host-b")[0]
    assert restarted.member_id != old_id
    assert restarted.generation == generation and set(restarted.owned) == set(owned)
    time.sleep(SESSION_MS / 1000 + 1)  # past the old session: still no rebalance
    assert ms[0].generation == generation and restarted.generation == generation
    assert set(restarted.owned) == set(owned)
    with pytest.raises(errors.FencedInstanceIdError):
        old.heartbeat()


def test_stale_generation_commit_is_rejected(cluster, members):
    topic = cluster.create_topic(unique("stale"), 2)
    group = unique("g")
    first = start(members, cluster, group, 1, topics=[topic])[0]
    wait_until(
        lambda: converged([first], all_partitions(topic, 2)),
        timeout=10,
        what="one member owns all",
        tolerate=CLUSTER_ERRORS,
    )
    stale = first.generation
    start(members, cluster, group, 1, topics=[topic])
    wait_until(lambda: first.generation > stale, timeout=10, what="a new generation", tolerate=CLUSTER_ERRORS)
    with pytest.raises(errors.IllegalGenerationError):
        first.commit({(topic, 0): 5}, generation=stale)
    _, generation, owned, _ = first.snapshot()
    response = first.commit({tp: 7 for tp in owned}, generation=generation)
    assert all(not r.HasField("error") for r in response.results)


def test_pattern_subscription_picks_up_a_new_topic(cluster, members):
    prefix = unique("pat")
    first = cluster.create_topic(f"{prefix}.one", 2)
    group = unique("g")
    ms = start(members, cluster, group, 2, pattern=rf"{prefix}\..*")
    wait_until(
        lambda: settled(ms, all_partitions(first, 2)),
        timeout=10,
        what="the first topic assigned, every member on the new generation",
        tolerate=CLUSTER_ERRORS,
    )
    for m in ms:
        m.revoked.clear()
    second = cluster.create_topic(f"{prefix}.two", 2)
    wait_until(
        lambda: converged(ms, all_partitions(first, 2) | all_partitions(second, 2)),
        timeout=10,
        what="the new matching topic assigned",
        tolerate=CLUSTER_ERRORS,
    )
    assert not any(m.revoked for m in ms), "cooperative: nobody gave anything up"


def test_member_that_stops_polling_is_removed(cluster, members):
    topic = cluster.create_topic(unique("poll"), 4)
    group = unique("g")
    stuck = start(members, cluster, group, 1, topics=[topic], max_poll_interval_ms=1000)[0]
    healthy = start(members, cluster, group, 1, topics=[topic])[0]
    wait_until(
        lambda: converged([stuck, healthy], all_partitions(topic, 4)),
        timeout=10,
        what="converged",
        tolerate=CLUSTER_ERRORS,
    )
    stuck.stop()
    stuck.polled = False  # its heartbeat thread runs, the application does not poll
    deadline = time.monotonic() + 5
    with pytest.raises(errors.UnknownMemberIdError, match=r"max\.poll\.interval\.ms"):
        while time.monotonic() < deadline:  # heartbeats keep the session alive, but say "not polled"
            stuck.heartbeat()
            time.sleep(0.3)
    wait_until(
        lambda: converged([healthy], all_partitions(topic, 4)),
        timeout=5,
        what="the other member owns all",
        tolerate=CLUSTER_ERRORS,
    )
