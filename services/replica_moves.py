"""Plans of replica moves for ``tributary cluster rebalance`` and ``decommission``. Pure.

Input: every partition's replica list (first: the preferred leader) and the live storage nodes
with their racks. Output: the partitions whose replica list changes, with the new list -- what
a partition reassignment is then asked to do. The plans move as few replicas as they can:

* **decommission**: each replica on the retiring node goes to the live node holding the fewest
  replicas that does not hold the partition yet (and, when racks are known, whose rack the
  partition's other replicas do not use, where such a node exists); it keeps its place in the
  list, so a preferred leader is replaced by a preferred leader.
* **rebalance**: replicas on nodes that are gone move first; then, while the most loaded node
  holds more than one replica over the least loaded, one replica moves from it to the least
  loaded node that may take it; then preferred leaders are spread the same way by reordering
  replica lists (no data moves for that), so a preferred-leader election balances leadership.

Racks are respected as placement respects them: a move never puts two replicas of a partition
in one rack when the replica it replaces was not sharing one.
"""

from __future__ import annotations

from collections.abc import Mapping

Key = tuple[str, int]
Assignment = dict[Key, tuple[int, ...]]


def _rack_allows(racks: Mapping[int, str], replicas: tuple[int, ...], leaving: int, joining: int) -> bool:
    """Whether ``joining`` may replace ``leaving`` in ``replicas`` without crowding a rack."""
    rack = racks.get(joining) or ""
    if not rack or not all(racks.get(r) for r in replicas if r in racks):
        return True  # racks unknown: any node
    if rack == racks.get(leaving):
        return True
    return rack not in {racks.get(r) for r in replicas if r != leaving}


def _replica_counts(assignment: Assignment, nodes: Mapping[int, str]) -> dict[int, int]:
    counts = dict.fromkeys(nodes, 0)
    for replicas in assignment.values():
        for r in replicas:
            if r in counts:
                counts[r] += 1
    return counts


def _replace(
    assignment: Assignment, key: Key, leaving: int, racks: Mapping[int, str], counts: dict[int, int]
) -> bool:
    """Move the replica of ``key`` on ``leaving`` to the least loaded node that may take it."""
    replicas = assignment[key]
    candidates = sorted((counts[n], n) for n in racks if n not in replicas and n != leaving)
    allowed = [n for _, n in candidates if _rack_allows(racks, replicas, leaving, n)]
    chosen = allowed[0] if allowed else (candidates[0][1] if candidates else None)
    if chosen is None:
        return False
    assignment[key] = tuple(chosen if r == leaving else r for r in replicas)
    counts[chosen] += 1
    if leaving in counts:
        counts[leaving] -= 1
    return True


def plan_decommission(
    assignments: Mapping[Key, tuple[int, ...]], racks: Mapping[int, str], node: int
) -> Assignment:
    """Move every replica off ``node`` (``racks``: the live nodes, ``node`` may be one). Raises
    ValueError when a partition has nowhere to go (too few other nodes)."""
    others = {n: rack for n, rack in racks.items() if n != node}
    assignment = dict(assignments)
    counts = _replica_counts(assignment, others)
    for key in sorted(k for k, replicas in assignments.items() if node in replicas):
        if not _replace(assignment, key, node, others, counts):
            raise ValueError(
                f"{key[0]}-{key[1]} has {len(assignments[key])} replicas and only "
                f"{len(others)} other live nodes: it cannot leave node {node}"
            )
    return {k: v for k, v in assignment.items() if v != assignments[k]}


def plan_rebalance(assignments: Mapping[Key, tuple[int, ...]], racks: Mapping[int, str]) -> Assignment:
    """Spread replicas, then preferred leaders, evenly over the live nodes in ``racks``."""
    assignment = dict(assignments)
    counts = _replica_counts(assignment, racks)
    for key in sorted(assignment):
        for gone in [r for r in assignment[key] if r not in racks]:
            _replace(assignment, key, gone, racks, counts)
    _spread_replicas(assignment, racks, counts)
    _spread_leaders(assignment, racks)
    return {k: v for k, v in assignment.items() if v != assignments[k]}


def _spread_replicas(assignment: Assignment, racks: Mapping[int, str], counts: dict[int, int]) -> None:
    stuck: set[tuple[int, int]] = set()
    for _ in range(sum(counts.values()) + 1):  # each move narrows the spread: bounded
        order = sorted(counts, key=lambda n: (counts[n], n))
        pairs = [(high, low) for high in reversed(order) for low in order if counts[high] - counts[low] > 1]
        pairs = [p for p in pairs if p not in stuck]
        if not pairs:
            return
        high, low = pairs[0]
        key = next(
            (
                k
                for k in sorted(assignment)
                if high in assignment[k]
                and low not in assignment[k]
                and _rack_allows(racks, assignment[k], high, low)
            ),
            None,
        )
        if key is None:
            stuck.add((high, low))
            continue
        assignment[key] = tuple(low if r == high else r for r in assignment[key])
        counts[high] -= 1
        counts[low] += 1


def _spread_leaders(assignment: Assignment, racks: Mapping[int, str]) -> None:
    leaders = dict.fromkeys(racks, 0)
    for replicas in assignment.values():
        if replicas and replicas[0] in leaders:
            leaders[replicas[0]] += 1
    for _ in range(len(assignment) + 1):
        moved = False
        for key in sorted(assignment):
            replicas = assignment[key]
            first = replicas[0]
            if first not in leaders:
                continue
            better = min(
                (r for r in replicas[1:] if r in leaders), key=lambda n: (leaders[n], n), default=None
            )
            if better is not None and leaders[first] - leaders[better] > 1:
                assignment[key] = (better, *(r for r in replicas if r != better))
                leaders[first] -= 1
                leaders[better] += 1
                moved = True
        if not moved:
            return
