"""Pattern subscriptions on real processes (regression for catastrophic backtracking).

Before RE2, a topic named ``"a"*29 + "-"`` and a member subscribed to ``(a+)+`` blocked the active
coordinator ~22 s per evaluation (Python's ``re`` backtracks, doubling per character), re-run on
every metadata change: it lost the controllership twice. Now patterns are RE2 (linear time),
bounded in length and compiled size, and matched off the event loop.
"""

from __future__ import annotations

import time

import pytest

from services import errors
from services.proto import pb
from tests.support.names import unique
from tests.support.wait import CLUSTER_ERRORS, wait_until

from ..coordinator._cluster import Responsiveness
from ._members import SimMember, call, converged
from .conftest import all_partitions

SESSION_MS = 2000
#: The reproduction's topic name: (a+)+ backtracks 2^29 ways before it fails on the "-".
CATASTROPHIC_TOPIC = "a" * 29 + "-"


@pytest.fixture
def members():
    started: list[SimMember] = []
    yield started
    for member in started:
        member.stop()


def _controller(cluster) -> tuple[str, int]:
    info = call(cluster.stub().GetControllerInfo, pb.GetControllerInfoRequest(), timeout=2)
    return info.active_id, info.controller_epoch


def _join(stub, group: str, pattern: str):
    request = pb.JoinGroupRequest(
        group_id=group,
        client_id="bad",
        subscription=pb.Subscription(pattern=pattern),
        session_timeout_ms=SESSION_MS,
    )
    return call(stub.JoinGroup, request, timeout=10)


def test_a_catastrophic_pattern_is_matched_in_linear_time_and_the_coordinator_keeps_serving(cluster, members):
    before = _controller(cluster)
    cluster.create_topic(CATASTROPHIC_TOPIC, 1)
    matching = cluster.create_topic("a" * 30, 2)
    active, standby = before[0], cluster.standby_id()
    # Another client's admin call on the active controller: groups and metadata share its event loop.
    other_client = cluster.stub(active)

    def probe(deadline: float) -> None:
        other_client.ListGroups(pb.ListGroupsRequest(), timeout=deadline)
        other_client.CreateTopic(
            pb.CreateTopicRequest(name=unique("probe"), partitions=1, validate_only=True), timeout=deadline
        )

    with Responsiveness(probe) as responsiveness:
        started = time.monotonic()
        member = SimMember(cluster.stub(standby), unique("g"), pattern="(a+)+", session_ms=SESSION_MS).start()
        members.append(member)
        print(f"\nJoinGroup with (a+)+ over {CATASTROPHIC_TOPIC!r}: {time.monotonic() - started:.3f}s")
        wait_until(
            lambda: converged([member], all_partitions(matching, 2)),
            timeout=10,
            what="(a+)+ assigned",
            tolerate=CLUSTER_ERRORS,
        )

        # Every metadata change re-runs the group's evaluation: new topics, more partitions.
        for _ in range(3):
            cluster.create_topic(unique("churn"), 1)
        call(cluster.stub().CreatePartitions, pb.CreatePartitionsRequest(topic=matching, total_count=3))
        wait_until(
            lambda: converged([member], all_partitions(matching, 3)),
            timeout=10,
            what="the new partition",
            tolerate=CLUSTER_ERRORS,
        )

        # Patterns that are not (RE2) patterns, or too big, are refused at once with the reason.
        for pattern, fragment in [
            ("a" * 1001, "at most 1000"),
            ("(?=a)(a+)+", "invalid perl operator"),
            ("[a-z]{1,1000}" * 41, "KiB a pattern may use"),
        ]:
            started = time.monotonic()
            with pytest.raises(errors.InvalidRequestError) as refused:
                _join(cluster.stub(standby), unique("bad"), pattern)
            assert fragment in refused.value.message and not refused.value.retriable
            assert time.monotonic() - started < 1.0
    responsiveness.assert_answered(at_least=5)  # all of it takes about a second now
    slowest = max(responsiveness.latencies)
    print(f"other client's admin calls: {len(responsiveness.latencies)}, slowest {slowest:.3f}s")

    assert _controller(cluster) == before, "the controller kept its seat (and epoch) throughout"
    assert all(tp[0] != CATASTROPHIC_TOPIC for tp in member.snapshot()[2])
    assert not member.errors
