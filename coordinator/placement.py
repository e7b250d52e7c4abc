"""Partition placement: which storage nodes hold each partition's replicas. Pure, no I/O.

This is Kafka's ``AdminUtils.assignReplicasToBrokers`` (the algorithm *Kafka: The Definitive
Guide* describes under "partition allocation"), with the same goals:

* replicas spread evenly over the live nodes, and leaders (the first replica) too: the leader of
  partition ``p`` is node ``(start + p) mod n`` of the node list, so ``n * k`` partitions give
  every node exactly ``k`` leaders;
* each replica of a partition on a distinct node: followers are the leader shifted by
  ``1 + (shift + j) mod (n - 1)`` positions, never 0;
* when racks are known, the node list alternates racks (``0, 2, 1, 3`` for racks ``{0,1}`` and
  ``{2,3}``) and followers skip nodes whose rack already holds a replica while another rack holds
  none, so a partition spans ``min(rf, racks)`` racks.

The follower shift grows by one after every full round of ``n`` partitions, so that successive
rounds do not pair the same leader with the same followers.

Racks count as known only when every node has one; a mix of racked and unracked nodes is placed
rack-unaware (Kafka refuses it instead unless told to ignore racks).

Randomness (the start position and the first shift, as Kafka draws them) comes from the ``rng``
argument, so tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from services.errors import InvalidReplicationFactorError

Assignment = list[list[int]]


def racks_known(racks: Mapping[int, str]) -> bool:
    """True when every node reports a rack, so placement is rack-aware."""
    return bool(racks) and all(racks.values())


def rack_alternated_nodes(racks: Mapping[int, str]) -> list[int]:
    """Node ids ordered so that neighbours sit on different racks where possible.

    Racks are taken in sorted order and each contributes its next node (by id) in turn, as
    Kafka's ``getRackAlternatedBrokerList`` does.
    """
    by_rack: dict[str, list[int]] = {}
    for node_id in sorted(racks):
        by_rack.setdefault(racks[node_id], []).append(node_id)
    queues = [by_rack[rack] for rack in sorted(by_rack)]
    ordered: list[int] = []
    for depth in range(max(len(q) for q in queues)):
        ordered.extend(q[depth] for q in queues if depth < len(q))
    return ordered


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    """Position of the ``j``-th follower candidate: never the leader's own position."""
    return (first + 1 + (shift + j) % (n - 1)) % n


def _rack_unaware_replicas(nodes: Sequence[int], first: int, shift: int, rf: int) -> list[int]:
    n = len(nodes)
    return [nodes[first]] + [nodes[_follower_index(first, shift, j, n)] for j in range(rf - 1)]


def _rack_aware_replicas(
    nodes: Sequence[int], racks: Mapping[int, str], first: int, shift: int, rf: int
) -> list[int]:
    n, rack_count = len(nodes), len(set(racks.values()))
    replicas = [nodes[first]]
    used_racks = {racks[nodes[first]]}
    k = 0
    while len(replicas) < rf:
        candidate = nodes[_follower_index(first, shift * rack_count, k, n)]
        k += 1
        rack_ok = racks[candidate] not in used_racks or len(used_racks) == rack_count
        if rack_ok and candidate not in replicas:
            replicas.append(candidate)
            used_racks.add(racks[candidate])
    return replicas


def assign_replicas(
    racks: Mapping[int, str],
    partitions: int,
    replication_factor: int,
    *,
    start_index: int | None = None,
    replica_shift: int | None = None,
    first_partition: int = 0,
    rng: random.Random | None = None,
) -> Assignment:
    """Replica lists (leader first) for ``partitions`` new partitions over the nodes in ``racks``.

    ``racks`` maps each live node id to its rack ("" when unknown). ``start_index`` is the
    position (in the placement order) of the first partition's leader and ``replica_shift`` the
    initial follower shift; either is drawn from ``rng`` when None, as Kafka does.
    ``first_partition`` continues an existing topic's round robin (add partitions).
    """
    n = len(racks)
    if replication_factor < 1 or replication_factor > n:
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: {n}"
        )
    rack_aware = racks_known(racks)
    nodes = rack_alternated_nodes(racks) if rack_aware else sorted(racks)
    rng = rng or random.Random()
    start = rng.randrange(n) if start_index is None else start_index % n
    shift = rng.randrange(n) if replica_shift is None else replica_shift
    assignment: Assignment = []
    for partition in range(first_partition, first_partition + partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        if rack_aware:
            assignment.append(_rack_aware_replicas(nodes, racks, first, shift, replication_factor))
        else:
            assignment.append(_rack_unaware_replicas(nodes, first, shift, replication_factor))
    return assignment


def placement_order(racks: Mapping[int, str]) -> list[int]:
    """The node order :func:`assign_replicas` walks (rack-alternated when racks are known)."""
    return rack_alternated_nodes(racks) if racks_known(racks) else sorted(racks)


def least_loaded_start(
    racks: Mapping[int, str], leader_counts: Mapping[int, int], rng: random.Random | None = None
) -> int:
    """The start position whose node leads the fewest partitions today (ties broken at random).

    Kafka starts each topic at a random node; starting at the least-loaded one keeps leaders
    spread across topics too, which matters when many topics have fewer partitions than nodes.
    """
    order = placement_order(racks)
    fewest = min(leader_counts.get(node, 0) for node in order)
    candidates = [i for i, node in enumerate(order) if leader_counts.get(node, 0) == fewest]
    return (rng or random.Random()).choice(candidates)


def assign_added_partitions(
    racks: Mapping[int, str],
    existing: Sequence[Sequence[int]],
    new_total: int,
    *,
    rng: random.Random | None = None,
) -> Assignment:
    """Replica lists for partitions ``len(existing) .. new_total - 1`` of an existing topic.

    As Kafka's add-partitions: same replication factor; the round robin continues from where
    partition 0's leader sits in the node order, so old and new partitions together stay spread.
    """
    if not existing:
        raise ValueError("a topic always has at least one partition")
    order = placement_order(racks)
    anchor = existing[0][0]
    if anchor in order:
        start: int | None = order.index(anchor)
    else:  # partition 0's leader is gone: Kafka takes the next node id up, else a random start
        start = next((i for i, node in enumerate(order) if node >= anchor), None)
    return assign_replicas(
        racks,
        new_total - len(existing),
        len(existing[0]),
        start_index=start,
        replica_shift=start,
        first_partition=len(existing),
        rng=rng,
    )
