"""_FetchSession._groups: partitions by leader, looked up once per run of one topic, and every
partition without a usable route (unknown topic, out of range, offline, leader not live) alone,
exactly as ``ClusterSnapshot.ensure_leader`` decides."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

from gateway.server.cluster_snapshot import ClusterSnapshot, PartitionRoute, TopicRoute
from gateway.server.fetch import FetchCommand, PartitionFetch, _FetchSession
from services import errors
from services.broker_address import BrokerAddress

NODE_1 = BrokerAddress(1, "127.0.0.1", 1, 11)
NODE_2 = BrokerAddress(2, "127.0.0.1", 2, 12)


def _snapshot() -> ClusterSnapshot:
    offline = errors.LeaderNotAvailableError("partition 2 has no live leader")
    a = TopicRoute(
        "a",
        (
            PartitionRoute(0, 1, 0),
            PartitionRoute(1, 2, 0),
            PartitionRoute(2, 1, 0, offline),  # offline: its last leader is named
            PartitionRoute(3, 9, 0),  # its leader is not a live node
            PartitionRoute(4, 1, 0),
        ),
    )
    b = TopicRoute("b", (PartitionRoute(0, 2, 0), PartitionRoute(1, 1, 0)))
    return ClusterSnapshot(1, MappingProxyType({1: NODE_1, 2: NODE_2}), MappingProxyType({"a": a, "b": b}))


def test_groups_follow_ensure_leader_for_every_route():
    snapshot = _snapshot()
    router = SimpleNamespace(
        snapshot=snapshot,
        clients=SimpleNamespace(fetcher=lambda node: SimpleNamespace(speaks_multi=True)),
    )
    # runs of one topic, a topic met again, out-of-range and unknown partitions among them
    asked = [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("a", 4),
        ("a", 7),
        ("b", 0),
        ("gone", 0),
        ("b", 1),
        ("b", 5),
    ]
    command = FetchCommand(partitions=tuple(PartitionFetch(t, p, 0) for t, p in asked), raw_batches=True)
    session = _FetchSession(router, command, deadline=0.0)
    groups, alone = session._groups(range(len(asked)))

    expected: dict[BrokerAddress, list[int]] = {}
    expected_alone = []
    for index, (topic, partition) in enumerate(asked):
        try:
            expected.setdefault(snapshot.ensure_leader(topic, partition), []).append(index)
        except errors.TributaryError:
            expected_alone.append(index)
    assert dict(groups) == expected
    assert alone == expected_alone
    assert expected_alone == [2, 3, 5, 7, 9]  # offline, dead leader, out of range, unknown x2
