"""``tributary cluster reassign / reassignments / rebalance / decommission``: moving replicas
between storage nodes (Kafka's ``kafka-reassign-partitions``), through the SDK's Admin.

Each command starts partition reassignments and, unless ``--no-wait``, follows them until done,
printing progress; interrupted, the moves go on in the cluster (``tributary cluster
reassignments`` shows them, ``reassign --cancel`` stops one).
"""

from __future__ import annotations

import time

from gateway.cli.connect import CLI_REQUEST_TIMEOUT_MS, CliError, client_settings
from gateway.cli.output import table
from gateway.client import Admin, TopicPartition
from services.replica_moves import plan_decommission, plan_rebalance

POLL_S = 1.0

_UNITS = {"": 1, "b": 1, "k": 1_000, "kb": 1_000, "m": 1_000_000, "mb": 1_000_000, "g": 10**9, "gb": 10**9}


def parse_rate(text: str) -> int:
    """A rate in bytes/s: ``1048576``, ``500k``, ``10MB``, ``1g`` (decimal units)."""
    raw = text.strip().lower().removesuffix("/s")
    digits = raw.rstrip("bkmg")
    unit = raw[len(digits) :]
    if unit not in _UNITS or not digits:
        raise ValueError(f"{text!r} is not a rate (bytes/s, e.g. 10MB)")
    value = int(float(digits) * _UNITS[unit])
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


def _admin(args) -> Admin:
    return Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS)


def _node_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise CliError(f"--replicas {text!r}: node ids separated by commas, e.g. 1,2,3", 2) from None


def _throttle(args) -> int:
    if not args.throttle:
        return 0
    try:
        return parse_rate(args.throttle)
    except ValueError as exc:
        raise CliError(f"--throttle: {exc}", 2) from None


def _start(
    admin: Admin, moves: dict[TopicPartition, tuple[int, ...] | None], throttle: int
) -> list[TopicPartition]:
    """Ask for the moves; print refusals; the partitions started."""
    outcomes = admin.alter_partition_reassignments(moves, throttle_bytes_per_second=throttle)
    started = []
    for tp in sorted(outcomes):
        error = outcomes[tp]
        if error is None:
            started.append(tp)
        else:
            print(f"{tp.topic}-{tp.partition}\t{error.reason}: {error.message}")
    if len(started) < len(outcomes):
        raise CliError(f"{len(outcomes) - len(started)} of {len(outcomes)} moves refused", 1)
    return started


def _wait(admin: Admin, partitions: list[TopicPartition], timeout_s: float | None) -> None:
    """Follow the partitions' reassignments until none is left, printing progress."""
    wanted = set(partitions)
    start = time.monotonic()
    last = None
    while True:
        running = [r for r in admin.list_partition_reassignments() if (r.topic, r.partition) in wanted]
        copying = sum(1 for r in running if set(r.adding) - set(r.isr))
        line = (
            f"{len(wanted) - len(running)}/{len(wanted)} partitions moved, "
            f"{copying} copying, {time.monotonic() - start:.0f} s"
        )
        if line != last:
            print(line, flush=True)
            last = line
        if not running:
            return
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise CliError(
                f"{len(running)} reassignments still running after {timeout_s:.0f} s; they go on "
                "(tributary cluster reassignments)",
                1,
            )
        time.sleep(POLL_S)


def reassign(args) -> int:
    """Move one partition to new replicas, or cancel its move (``--cancel``)."""
    tp = TopicPartition(args.topic, args.partition)
    if args.cancel == bool(args.replicas):
        raise CliError("give either --replicas N,N,... or --cancel", 2)
    replicas = None if args.cancel else _node_list(args.replicas)
    with _admin(args) as admin:
        started = _start(admin, {tp: replicas}, _throttle(args))
        what = "cancelled" if args.cancel else f"moving to {list(replicas or ())}"
        print(f"{tp.topic}-{tp.partition}	{what}")
        if not args.cancel and not args.no_wait:
            _wait(admin, started, args.timeout)
    return 0


def reassignments(args) -> int:
    """Reassignments in progress: replicas, those being added and removed, ISR, throttle."""
    with _admin(args) as admin:
        running = admin.list_partition_reassignments()
    if not running:
        print("no reassignments in progress")
        return 0
    rows = [
        [
            f"{r.topic}-{r.partition}",
            ",".join(map(str, r.target)),
            ",".join(map(str, r.adding)) or "-",
            ",".join(map(str, r.removing)) or "-",
            ",".join(map(str, r.isr)),
            r.leader,
            r.throttle_bytes_per_second or "-",
        ]
        for r in running
    ]
    print(table(("PARTITION", "TARGET", "ADDING", "REMOVING", "ISR", "LEADER", "THROTTLE B/S"), rows))
    return 0


def _current(admin: Admin) -> tuple[dict[tuple[str, int], tuple[int, ...]], dict[int, str]]:
    cluster, topics = admin.metadata()
    assignments = {(p.topic, p.partition): tuple(p.replicas) for topic in topics for p in topic.partitions}
    for move in admin.list_partition_reassignments():  # planned from where they are going
        assignments[(move.topic, move.partition)] = move.target
    racks = {b.node_id: b.rack or "" for b in cluster.brokers}
    return assignments, racks


def _run_plan(
    args, admin: Admin, plan: dict[tuple[str, int], tuple[int, ...]], what: str
) -> list[TopicPartition]:
    running = {(r.topic, r.partition) for r in admin.list_partition_reassignments()}
    held = sorted(key for key in plan if key in running)
    if held:
        print(f"left for later ({len(held)}, being moved already): " + ", ".join(f"{t}-{p}" for t, p in held))
        plan = {key: replicas for key, replicas in plan.items() if key not in running}
    if not plan:
        print(f"nothing to move: {what}")
        return []
    print(
        table(
            ("PARTITION", "NEW REPLICAS"),
            [[f"{t}-{p}", ",".join(map(str, r))] for (t, p), r in sorted(plan.items())],
        )
    )
    if args.dry_run:
        print(f"dry run: {len(plan)} partitions would move")
        return []
    started = _start(admin, {TopicPartition(t, p): r for (t, p), r in plan.items()}, _throttle(args))
    print(f"{len(started)} reassignments started")
    if not args.no_wait:
        _wait(admin, started, args.timeout)
    return started


def rebalance(args) -> int:
    """Spread replicas and preferred leaders evenly over the live nodes, then (after the moves)
    elect the preferred leaders so leadership follows."""
    with _admin(args) as admin:
        assignments, racks = _current(admin)
        started = _run_plan(
            args, admin, plan_rebalance(assignments, racks), "replicas and leaders are balanced"
        )
        if started and not args.no_wait:
            outcomes = admin.elect_leaders(partitions=started)
            moved = sum(1 for error in outcomes.values() if error is None)
            print(f"preferred leaders elected: {moved} partitions changed leader")
    return 0


def decommission(args) -> int:
    """Move every replica off a node, so it can be stopped with no partition under-replicated."""
    with _admin(args) as admin:
        assignments, racks = _current(admin)
        if args.node not in racks and not any(args.node in r for r in assignments.values()):
            raise CliError(f"node {args.node} is neither live nor holding a replica", 2)
        try:
            plan = plan_decommission(assignments, racks, args.node)
        except ValueError as exc:
            raise CliError(str(exc), 1) from None
        _run_plan(args, admin, plan, f"node {args.node} holds no replica")
        if not args.dry_run and not args.no_wait:
            left = [k for k, r in _current(admin)[0].items() if args.node in r]
            if left:
                raise CliError(f"node {args.node} still holds {len(left)} replicas", 1)
            print(f"node {args.node} holds no replica: it can be stopped")
    return 0
