"""Rebalance and decommission plans: balanced, minimal, rack-aware, never a duplicate replica."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.replica_moves import plan_decommission, plan_rebalance


def placed(partitions: int, nodes: int, rf: int) -> dict[tuple[str, int], tuple[int, ...]]:
    return {("t", p): tuple((p + i) % nodes for i in range(rf)) for p in range(partitions)}


def apply(assignments, plan):
    return {**assignments, **plan}


def test_a_new_node_gets_its_share_and_leaders_spread():
    before = placed(6, 3, 2)
    racks = {n: "" for n in range(4)}
    after = apply(before, plan_rebalance(before, racks))
    assert sorted(Counter(r for rs in after.values() for r in rs).values()) == [3, 3, 3, 3]
    leaders = Counter(rs[0] for rs in after.values())
    assert max(leaders.values()) - min(leaders.get(n, 0) for n in racks) <= 1
    assert all(len(set(rs)) == 2 for rs in after.values())


def test_a_balanced_cluster_moves_nothing():
    before = placed(6, 3, 3)
    assert plan_rebalance(before, {0: "", 1: "", 2: ""}) == {}


def test_replicas_on_gone_nodes_move_first():
    before = {("t", 0): (0, 9), ("t", 1): (1, 0)}
    after = apply(before, plan_rebalance(before, {0: "", 1: "", 2: ""}))
    assert all(9 not in rs for rs in after.values())


def test_decommission_moves_every_replica_off_the_node_keeping_its_place():
    before = placed(6, 4, 2)
    plan = plan_decommission(before, {n: "" for n in range(4)}, 0)
    after = apply(before, plan)
    assert all(0 not in rs for rs in after.values())
    assert set(plan) == {k for k, rs in before.items() if 0 in rs}
    for key, replicas in plan.items():
        position = before[key].index(0)
        assert replicas[position] != 0 and [r for i, r in enumerate(replicas) if i != position] == [
            r for i, r in enumerate(before[key]) if i != position
        ]


def test_decommission_without_room_is_refused():
    with pytest.raises(ValueError, match="cannot leave node 0"):
        plan_decommission(placed(3, 3, 3), {0: "", 1: "", 2: ""}, 0)


def test_decommission_keeps_replicas_in_distinct_racks():
    racks = {0: "a", 1: "b", 2: "a", 3: "b", 4: "c"}
    before = {("t", 0): (0, 1), ("t", 1): (1, 0)}
    after = apply(before, plan_decommission(before, racks, 0))
    for replicas in after.values():
        assert len({racks[r] for r in replicas}) == 2, replicas


@settings(max_examples=60, deadline=None)
@given(
    partitions=st.integers(1, 40),
    nodes=st.integers(2, 6),
    extra=st.integers(0, 3),
    rf=st.integers(1, 3),
    racked=st.booleans(),
)
def test_rebalance_is_always_valid_and_evens_replica_counts(partitions, nodes, extra, rf, racked):
    rf = min(rf, nodes)
    before = placed(partitions, nodes, rf)
    racks = {n: (f"r{n % 3}" if racked else "") for n in range(nodes + extra)}
    after = apply(before, plan_rebalance(before, racks))
    for key, replicas in after.items():
        assert len(replicas) == rf and len(set(replicas)) == rf, (key, replicas)
        assert set(replicas) <= set(racks)
        if racked:
            assert len({racks[r] for r in replicas}) >= len({racks[r] for r in before[key]}) or len(
                {racks[r] for r in replicas}
            ) == min(rf, 3)
    if not racked:
        counts = Counter(r for rs in after.values() for r in rs)
        assert max(counts.get(n, 0) for n in racks) - min(counts.get(n, 0) for n in racks) <= 1
