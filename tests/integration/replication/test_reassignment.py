"""Partition reassignment under load (issue 18), with real processes: 3 storage nodes and a topic
at RF 2, ``min.insync.replicas=2``; an idempotent ``acks=all`` producer runs throughout. In turn:

* bad reassignments (unknown node, duplicates, fewer replicas than min.insync.replicas, an
  unknown topic) are refused with their reason and change nothing;
* a 4th node joins and ``tributary cluster rebalance --throttle`` spreads replicas and preferred
  leaders evenly; the new node copies its share at the throttle's rate (within 20%);
* a slow move is cancelled: the partition is back where it was, the partial copy deleted;
* the active controller is killed (-9) in the middle of a move: the standby finishes it;
* ``tributary cluster decommission 0`` moves every replica off node 0; stopping it then leaves
  every partition online with a full ISR;
* at the end, every acknowledged record is in the log where it was acknowledged, no send failed,
  and the replicas of each partition hold the same batches byte for byte.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.client import Admin, NewTopic, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import errors
from tests.integration.replication._chaos import (
    ProduceHistory,
    ProducerLoad,
    check_acknowledged,
    check_dense,
    check_replicas,
    describe,
    quote,
    read_logs,
    replica_batches,
)
from tests.support.wait import seconds_until, wait_until

TOPIC = "moves"
PARTITIONS = 6
RF = 2
CONFIGS = {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"}
#: Bytes preloaded per partition, so the copies take measurable time at the throttle.
PRELOAD = 1_500_000
THROTTLE = 1_000_000
PRODUCER_SETTINGS = {
    "acks": "all",
    "linger_ms": 5,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 120_000,
    "retry_backoff_ms": 50,
    "retry_backoff_max_ms": 500,
}


@pytest.fixture
def cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=3,
        coordinators=2,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--replica-lag-time-max-ms", "3000", "--replica-fetch-backoff-ms", "200"],
    )
    with LocalCluster(tmp_path / "cluster", spec) as local:
        yield local


def cli(cluster: LocalCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "cluster", *args, "--gateway", cluster.gateway],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def replicas_of(admin: Admin) -> dict[int, tuple[int, ...]]:
    return {p: tuple(s.replicas) for p, s in describe(admin, TOPIC).items()}


def settled(admin: Admin) -> bool:
    """No move running, every partition led with a full ISR."""
    states = describe(admin, TOPIC).values()
    return not admin.list_partition_reassignments() and all(
        s.leader >= 0 and set(s.isr) == set(s.replicas) for s in states
    )


def partition_dirs(cluster: LocalCluster, node: int) -> set[int]:
    root = cluster.data_dir / f"storage-{node}"
    return {p for p in range(PARTITIONS) if (root / f"{TOPIC}-{p}").is_dir()}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.log")) if path.exists() else 0


def preload(admin_servers: str) -> None:
    from gateway.client import Producer

    value = b"x" * 10_000
    with Producer(servers=admin_servers, acks="all", linger_ms=20) as producer:
        for p in range(PARTITIONS):
            for _ in range(PRELOAD // len(value)):
                producer.send(TOPIC, value, partition=p)
        producer.flush(60)


def refused(admin: Admin, moves: dict[TopicPartition, tuple[int, ...] | None]) -> dict[TopicPartition, str]:
    return {
        tp: error.reason if error is not None else ""
        for tp, error in admin.alter_partition_reassignments(moves).items()
    }


def test_reassign_rebalance_cancel_failover_and_decommission_under_load(cluster):
    admin = Admin(servers=cluster.gateway)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, RF, CONFIGS)])
    seconds_until(lambda: settled(admin), timeout=30, what="the topic online with full ISRs", interval=0.2)
    preload(cluster.gateway)

    # Bad input: a clear reason each, and nothing changes.
    before = replicas_of(admin)
    tp0 = TopicPartition(TOPIC, 0)
    assert refused(admin, {tp0: (0, 7)}) == {tp0: "INVALID_REPLICA_ASSIGNMENT"}
    assert refused(admin, {tp0: (1, 1)}) == {tp0: "INVALID_REPLICA_ASSIGNMENT"}
    assert refused(admin, {tp0: (1,)}) == {tp0: "INVALID_REPLICATION_FACTOR"}
    assert refused(admin, {tp0: None}) == {tp0: "NO_REASSIGNMENT_IN_PROGRESS"}
    unknown = TopicPartition("no-such-topic", 0)
    assert refused(admin, {unknown: (0, 1)}) == {unknown: "UNKNOWN_TOPIC_OR_PARTITION"}
    beyond = TopicPartition(TOPIC, PARTITIONS)
    assert refused(admin, {beyond: (0, 1)}) == {beyond: "UNKNOWN_TOPIC_OR_PARTITION"}
    with pytest.raises(errors.InvalidRequestError):
        admin.alter_partition_reassignments({tp0: (0, 1)}, throttle_bytes_per_second=-1)
    assert replicas_of(admin) == before and not admin.list_partition_reassignments()

    history = ProduceHistory()
    load = ProducerLoad(
        0,
        servers=cluster.gateway,
        topic=TOPIC,
        partitions=PARTITIONS,
        count=100_000,
        duration_s=500,  # 200 records/s until aborted
        history=history,
        settings=PRODUCER_SETTINGS,
        flush_timeout_s=120,
    )
    load.start()
    try:
        seconds_until(lambda: len(history.acks) >= 100, timeout=30, what="the producer is acknowledged")

        # A 4th node joins; rebalance spreads replicas and leaders, at the throttle.
        cluster.start_storage_node(3)
        seconds_until(
            lambda: len(admin.describe_cluster().brokers) == 4, timeout=30, what="node 3 registered"
        )
        new_node = cluster.data_dir / "storage-3"
        samples: list[tuple[float, int]] = []
        rebalance = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli.main",
                "cluster",
                "rebalance",
                "--throttle",
                f"{THROTTLE}",
                "--gateway",
                cluster.gateway,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while rebalance.poll() is None and time.monotonic() < deadline:
            samples.append((time.monotonic(), dir_bytes(new_node)))
            time.sleep(0.1)
        out, err = rebalance.communicate(timeout=10)
        assert rebalance.returncode == 0, f"rebalance failed:\n{out}\n{err}"
        assert "preferred leaders elected" in out, out
        replicas = replicas_of(admin)
        counts = Counter(r for listed in replicas.values() for r in listed)
        assert sorted(counts.values()) == [3, 3, 3, 3], f"replicas per node {dict(counts)}"
        firsts = Counter(listed[0] for listed in replicas.values())
        assert max(firsts.values()) - min(firsts.get(n, 0) for n in range(4)) <= 1, dict(firsts)
        states = describe(admin, TOPIC)
        assert all(s.leader == s.replicas[0] for s in states.values()), {
            p: (s.leader, s.replicas) for p, s in states.items()
        }
        # The copy rate while node 3 filled, from the first byte to the last sample's size.
        moving = [(t, b) for t, b in samples if b > 0]
        assert len(moving) > 10, f"too few samples of the copy: {samples[-5:]}"
        first_t = moving[0][0]
        total = moving[-1][1]
        full_t = next(t for t, b in moving if b >= total * 0.95)
        rate = total * 0.95 / max(full_t - first_t, 1e-3)
        print(f"\nrebalance: node 3 copied {total} bytes at {rate:,.0f} B/s (throttle {THROTTLE:,})")
        assert 0.8 * THROTTLE <= rate <= 1.2 * THROTTLE, f"copy rate {rate:,.0f} B/s, throttle {THROTTLE:,}"
        # Retired copies go: each node holds exactly the partitions it is a replica of.
        for node in range(4):
            wanted = {p for p, listed in replicas.items() if node in listed}
            wait_until(
                lambda n=node, w=wanted: partition_dirs(cluster, n) == w, timeout=30, what=f"node {node} dirs"
            )

        # A slow move, cancelled: back where it was, the partial copy deleted.
        moving_p, listed = next((p, r) for p, r in replicas.items() if 0 not in r)
        tp = TopicPartition(TOPIC, moving_p)
        started = admin.alter_partition_reassignments(
            {tp: (0, *listed[1:])}, throttle_bytes_per_second=50_000
        )
        assert started == {tp: None}
        wait_until(lambda: moving_p in partition_dirs(cluster, 0), timeout=30, what="the copy begins")
        (running,) = admin.list_partition_reassignments([TOPIC])
        assert (running.adding, running.removing) == ((0,), (listed[0],))
        assert running.throttle_bytes_per_second == 50_000
        listing = cli(cluster, "reassignments")
        assert listing.returncode == 0, listing.stderr
        (row,) = [
            line.split() for line in listing.stdout.splitlines() if line.startswith(f"{TOPIC}-{moving_p}")
        ]
        assert row[1:4] == [",".join(map(str, (0, *listed[1:]))), "0", str(listed[0])] and row[-1] == "50000"
        dry = cli(cluster, "rebalance", "--dry-run")
        assert dry.returncode == 0 and ("dry run" in dry.stdout or "nothing to move" in dry.stdout), (
            dry.stdout
        )
        cancel = cli(cluster, "reassign", TOPIC, str(moving_p), "--cancel")
        assert cancel.returncode == 0, cancel.stderr
        # Back on the same nodes (the order, as in Kafka, is the target's where they overlap).
        assert sorted(replicas_of(admin)[moving_p]) == sorted(listed)
        listed = replicas_of(admin)[moving_p]
        wait_until(
            lambda: moving_p not in partition_dirs(cluster, 0), timeout=30, what="the partial copy deleted"
        )

        # Kill -9 the active controller in the middle of a move: the standby finishes it.
        controller_id = admin.describe_cluster().controller_id
        active = int(controller_id.rsplit("-", 1)[1])  # coordinator-<index>
        target = (0, *listed[1:])
        assert admin.alter_partition_reassignments({tp: target}, throttle_bytes_per_second=300_000) == {
            tp: None
        }
        wait_until(lambda: moving_p in partition_dirs(cluster, 0), timeout=30, what="the copy begins")
        cluster.coordinators[active].kill()
        seconds_until(
            lambda: admin.describe_cluster().controller_id not in ("", controller_id),
            timeout=30,
            what="the standby takes over",
            tolerate=(errors.TributaryError,),
        )
        seconds_until(
            lambda: replicas_of(admin)[moving_p] == target and settled(admin),
            timeout=60,
            what="the standby finishes the move",
            interval=0.2,
            tolerate=(errors.TributaryError,),
        )
        wait_until(
            lambda: moving_p not in partition_dirs(cluster, listed[0]), timeout=30, what="old copy deleted"
        )

        # Decommission node 0 under load: afterwards it holds nothing; stopping it leaves every
        # partition online with a full ISR.
        decommission = cli(cluster, "decommission", "0")
        assert decommission.returncode == 0, decommission.stdout + decommission.stderr
        assert "node 0 holds no replica" in decommission.stdout
        assert all(0 not in listed for listed in replicas_of(admin).values())
        wait_until(lambda: not partition_dirs(cluster, 0), timeout=30, what="node 0's copies deleted")
        cluster.storage_nodes[0].stop(timeout=60)
        wait_until(
            lambda: 0 not in {b.node_id for b in admin.describe_cluster().brokers},
            timeout=30,
            what="node 0 gone",
        )
        states = describe(admin, TOPIC)
        assert all(s.leader >= 0 and len(s.isr) == RF for s in states.values()), {
            p: (s.leader, s.isr) for p, s in states.items()
        }
        seconds_until(lambda: len(history.acks) >= 2_000, timeout=60, what="load keeps being acknowledged")
    finally:
        load.abort()
        load.join(150)

    assert load.error is None, f"the producer failed: {load.error!r}"
    assert not history.failures, quote([f"{v!r}: {why}" for v, why in history.failures.items()])
    logs = read_logs(cluster.gateway, TOPIC, PARTITIONS, timeout_s=60)
    assert not check_dense(logs), quote(check_dense(logs))
    violations = check_acknowledged(history.acks, logs)
    assert not violations, quote(violations)
    ends = {p: len(records) for p, records in logs.items()}
    for p, listed in replicas_of(admin).items():
        copies = {n: replica_batches(cluster.data_dir / f"storage-{n}" / f"{TOPIC}-{p}") for n in listed}
        problems = check_replicas(p, copies, ends[p])
        assert not problems, quote(problems)
    admin.close()


def test_a_move_of_more_partitions_than_one_etcd_transaction_holds(cluster):
    """etcd allows 128 operations per transaction: a rebalance of a wide topic moves more."""
    wide = "wide"
    partitions = 150
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(wide, partitions, 1)])
        wait_until(
            lambda: all(p.leader >= 0 for p in admin.describe_topics([wide])[0].partitions),
            timeout=60,
            what="the wide topic online",
        )
        before = {p.partition: p.replicas[0] for p in admin.describe_topics([wide])[0].partitions}
        moves = {TopicPartition(wide, p): ((node + 1) % 3,) for p, node in before.items()}
        assert set(admin.alter_partition_reassignments(moves).values()) == {None}
        wait_until(lambda: not admin.list_partition_reassignments([wide]), timeout=90, what="every move done")
        after = {p.partition: tuple(p.replicas) for p in admin.describe_topics([wide])[0].partitions}
        assert after == {p: ((node + 1) % 3,) for p, node in before.items()}
