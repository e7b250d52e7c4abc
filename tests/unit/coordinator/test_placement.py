"""Placement: hand-worked cases from Kafka's algorithm and the Definitive Guide, plus properties."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.placement import (
    assign_added_partitions,
    assign_replicas,
    least_loaded_start,
    placement_order,
    rack_alternated_nodes,
)
from services.errors import InvalidReplicationFactorError


def no_racks(*ids):
    return {i: "" for i in ids}


def test_guide_example_rack_unaware_start_4():
    # The Guide: 6 brokers, start at broker 4: leaders 4, 5, 0, ...; followers follow the leader.
    nodes = no_racks(0, 1, 2, 3, 4, 5)
    assignment = assign_replicas(nodes, 10, 3, start_index=4, replica_shift=0)
    assert assignment[0] == [4, 5, 0]
    assert assignment[1] == [5, 0, 1]
    assert assignment[2] == [0, 1, 2]
    assert [r[0] for r in assignment] == [4, 5, 0, 1, 2, 3, 4, 5, 0, 1]
    # 30 replicas on 6 brokers: 5 on average. Kafka's algorithm is exact per full round of 6
    # partitions (3 each); the 4 partitions of the partial round add 0-3 more per broker.
    per_broker = Counter(n for r in assignment for n in r)
    assert sum(per_broker.values()) == 30 and set(per_broker.values()) <= {4, 5, 6}
    assert set(Counter(n for r in assignment[:6] for n in r).values()) == {3}


def test_kafka_rack_unaware_second_round_shifts_followers():
    # Kafka's AdminUtils comment: 5 brokers, 10 partitions, rf 3, start 0, shift 0.
    assignment = assign_replicas(no_racks(0, 1, 2, 3, 4), 10, 3, start_index=0, replica_shift=0)
    assert assignment == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 4],
        [3, 4, 0],
        [4, 0, 1],
        [0, 2, 3],
        [1, 3, 4],
        [2, 4, 0],
        [3, 0, 1],
        [4, 1, 2],
    ]


def test_twelve_partitions_on_three_nodes_give_four_leaders_each():
    for seed in range(20):
        assignment = assign_replicas(no_racks(1, 2, 3), 12, 1, rng=random.Random(seed))
        assert Counter(r[0] for r in assignment) == {1: 4, 2: 4, 3: 4}


def test_rack_alternated_order_matches_the_guide():
    # Brokers 0,1 on one rack and 2,3 on another are walked 0, 2, 1, 3.
    assert rack_alternated_nodes({0: "r1", 1: "r1", 2: "r2", 3: "r2"}) == [0, 2, 1, 3]
    # Uneven racks: each round takes the next node of every rack that still has one.
    assert rack_alternated_nodes({1: "a", 2: "a", 3: "a", 4: "b", 5: "c"}) == [1, 4, 5, 2, 3]


def test_guide_rack_example_leader_2_follower_on_other_rack():
    racks = {0: "r1", 1: "r1", 2: "r2", 3: "r2"}
    assignment = assign_replicas(racks, 4, 2, start_index=1, replica_shift=0)
    assert assignment[0] == [2, 1]  # leader on broker 2, first follower on broker 1 (other rack)
    for replicas in assignment:
        assert len({racks[n] for n in replicas}) == 2


def test_partial_racks_fall_back_to_rack_unaware():
    nodes = {1: "a", 2: "", 3: "b"}
    assert placement_order(nodes) == [1, 2, 3]


def test_replication_factor_above_nodes_is_rejected():
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas(no_racks(1, 2), 3, 3)
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas(no_racks(1, 2), 3, 0)


def test_added_partitions_continue_the_round_robin():
    nodes = no_racks(1, 2, 3)
    existing = assign_replicas(nodes, 4, 2, start_index=0, replica_shift=0)
    added = assign_added_partitions(nodes, existing, 12)
    everything = existing + added
    assert len(everything) == 12
    assert Counter(r[0] for r in everything) == {1: 4, 2: 4, 3: 4}
    assert all(len(set(r)) == 2 for r in added)


def test_added_partitions_when_partition_zero_leader_is_gone():
    existing = [[5, 1], [1, 2]]
    added = assign_added_partitions(no_racks(1, 2, 3), existing, 5, rng=random.Random(3))
    assert len(added) == 3 and all(len(set(r)) == 2 and set(r) <= {1, 2, 3} for r in added)


def test_least_loaded_start_picks_the_node_with_fewest_leaders():
    nodes = no_racks(1, 2, 3)
    start = least_loaded_start(nodes, {1: 5, 2: 1, 3: 4}, random.Random(0))
    assert placement_order(nodes)[start] == 2


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

cluster = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.sampled_from("abcd"), min_size=n, max_size=n),
        st.booleans(),
    )
)


@settings(max_examples=300, deadline=None)
@given(cluster, st.integers(1, 60), st.integers(1, 12), st.integers(0, 2**16))
def test_properties_distinct_nodes_distinct_racks_balanced_leaders(cluster_spec, partitions, rf, seed):
    n, rack_letters, with_racks = cluster_spec
    rf = min(rf, n)
    racks = {node_id: (rack_letters[node_id] if with_racks else "") for node_id in range(n)}
    assignment = assign_replicas(racks, partitions, rf, rng=random.Random(seed))

    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == rf
        assert len(set(replicas)) == rf, "each replica on a distinct node"
        if with_racks:
            wanted = min(rf, len(set(rack_letters)))
            assert len({racks[r] for r in replicas}) == wanted, "replicas spread over racks"

    leaders = Counter(r[0] for r in assignment)
    counts = [leaders.get(node, 0) for node in range(n)]
    assert max(counts) - min(counts) <= 1, "leaders spread evenly"
    if not with_racks:
        replicas_per_node = Counter(node for r in assignment for node in r)
        per_node = [replicas_per_node.get(node, 0) for node in range(n)]
        assert max(per_node) - min(per_node) <= rf, "replicas spread evenly"
        if partitions % n == 0:
            assert len(set(per_node)) == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 20), st.integers(1, 30), st.integers(1, 8), st.integers(0, 999))
def test_properties_added_partitions(n, initial, extra, rf, seed):
    rf = min(rf, n)
    nodes = no_racks(*range(n))
    rng = random.Random(seed)
    existing = assign_replicas(nodes, initial, rf, rng=rng)
    added = assign_added_partitions(nodes, existing, initial + extra, rng=rng)
    assert len(added) == extra
    assert all(len(r) == rf and len(set(r)) == rf for r in added)
    leaders = Counter(r[0] for r in existing + added)
    counts = [leaders.get(node, 0) for node in range(n)]
    assert max(counts) - min(counts) <= 1
