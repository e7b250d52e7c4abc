"""Partition moves under faults, Jepsen style (issue 18): 4 storage nodes, 2 coordinators, a topic
at RF 3 with ``min.insync.replicas=2`` and an idempotent ``acks=all`` producer throughout. A
nemesis loop, bounded in time, keeps reassigning random partitions to random sets of 3 nodes
(some throttled, some cancelled half way) and, between moves, kill -9s a storage node taking part
in the move (restarted once the controller has noticed), or the active controller (restarted as
the new standby).

Afterwards, with every move finished: no send failed, every acknowledged record is in the log
where it was acknowledged, offsets are dense, the replicas of each partition hold the same batches
byte for byte, and no node keeps a copy of a partition it is no longer a replica of.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from gateway.client import Admin, NewTopic, Producer, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
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
from tests.support.wait import wait_until

TOPIC = "moving"
PARTITIONS = 4
NODES = 4
RF = 3
NEMESIS_S = 12.0
#: The fault sequence; TRIBUTARY_CHAOS_SEED explores others.
SEED = int(os.environ.get("TRIBUTARY_CHAOS_SEED", "1824"))


@pytest.fixture
def cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=NODES,
        coordinators=2,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--replica-lag-time-max-ms", "3000", "--replica-fetch-backoff-ms", "200"],
    )
    with LocalCluster(tmp_path / "cluster", spec) as local:
        yield local


def moves_done(admin: Admin) -> bool:
    return not admin.list_partition_reassignments([TOPIC])


def healthy(admin: Admin) -> bool:
    states = describe(admin, TOPIC).values()
    return moves_done(admin) and all(s.leader >= 0 and set(s.isr) == set(s.replicas) for s in states)


def call(action, *args, **kwargs):
    """An admin call during faults: a retriable refusal (no controller yet, ...) is None."""
    try:
        return action(*args, **kwargs)
    except TributaryError:
        return None


class MoveNemesis:
    def __init__(self, cluster: LocalCluster, admin: Admin) -> None:
        self.cluster, self.admin = cluster, admin
        self.rng = random.Random(SEED)
        self.log: list[str] = []

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.round()

    def round(self) -> None:
        states = call(describe, self.admin, TOPIC)
        if not states:
            return
        partition = self.rng.randrange(PARTITIONS)
        current = tuple(states[partition].replicas)
        target = tuple(self.rng.sample(range(NODES), RF))
        throttle = self.rng.choice([0, 0, 200_000])
        tp = TopicPartition(TOPIC, partition)
        outcome = call(
            self.admin.alter_partition_reassignments, {tp: target}, throttle_bytes_per_second=throttle
        )
        self.log.append(f"move p{partition} {current} -> {target} (throttle {throttle}): {outcome}")
        fault = self.rng.choice(["none", "kill-node", "kill-controller", "cancel"])
        time.sleep(self.rng.uniform(0.1, 1.0))
        if fault == "kill-node":
            node = self.rng.choice(sorted(set(current) | set(target)))
            self.log.append(f"kill -9 node {node}")
            self.cluster.storage_nodes[node].kill()
            wait_until(
                lambda: node not in {b.node_id for b in self.admin.describe_cluster().brokers},
                timeout=20,
                what=f"node {node}'s lease expiring",
                tolerate=(TributaryError,),
            )
            self.cluster.start_storage_node(node)
        elif fault == "kill-controller":
            controller = call(self.admin.describe_cluster)
            if controller is not None and controller.controller_id:
                index = int(controller.controller_id.rsplit("-", 1)[1])
                self.log.append(f"kill -9 controller {controller.controller_id}")
                self.cluster.coordinators[index].kill()
                wait_until(
                    lambda: self.admin.describe_cluster().controller_id not in ("", controller.controller_id),
                    timeout=30,
                    what="a new controller",
                    tolerate=(TributaryError,),
                )
                self.cluster.start_coordinator(index)
        elif fault == "cancel":
            self.log.append(
                f"cancel p{partition}: {call(self.admin.alter_partition_reassignments, {tp: None})}"
            )
        # The next round starts once this partition's move is over (done, cancelled or refused).
        wait_until(
            lambda: not self.admin.list_partition_reassignments([TOPIC]),
            timeout=60,
            what="the move finishing",
            interval=0.2,
            tolerate=(TributaryError,),
        )


def test_moves_under_node_and_controller_kills_lose_nothing(cluster):
    admin = Admin(servers=cluster.gateway)
    admin.create_topics(
        [
            NewTopic(
                TOPIC, PARTITIONS, RF, {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"}
            )
        ]
    )
    wait_until(lambda: healthy(admin), timeout=30, what="the topic online")
    # Some bulk first, so throttled moves take seconds and faults land mid-copy.
    with Producer(servers=cluster.gateway, acks="all", linger_ms=20) as bulk:
        for i in range(PARTITIONS * 40):
            bulk.send(TOPIC, b"b" * 10_000, partition=i % PARTITIONS)
        bulk.flush(60)
    history = ProduceHistory()
    load = ProducerLoad(
        0,
        servers=cluster.gateway,
        topic=TOPIC,
        partitions=PARTITIONS,
        count=200 * int(NEMESIS_S + 60),
        duration_s=NEMESIS_S + 60,
        history=history,
        settings={
            "acks": "all",
            "linger_ms": 5,
            "request_timeout_ms": 10_000,
            "delivery_timeout_ms": 120_000,
            "retry_backoff_ms": 50,
            "retry_backoff_max_ms": 500,
        },
        flush_timeout_s=150,
    )
    nemesis = MoveNemesis(cluster, admin)
    load.start()
    try:
        wait_until(lambda: len(history.acks) >= 100, timeout=30, what="the producer is acknowledged")
        nemesis.run(NEMESIS_S)
        wait_until(
            lambda: healthy(admin), timeout=90, what="every move done and every ISR full", interval=0.3
        )
    finally:
        load.abort()
        load.join(180)
    print("\nnemesis:\n  " + "\n  ".join(nemesis.log))
    assert load.error is None, f"the producer failed: {load.error!r}"
    assert not history.failures, quote([f"{v!r}: {why}" for v, why in history.failures.items()])
    assert len(history.acks) > 1_000, f"only {len(history.acks)} acknowledged"
    logs = read_logs(cluster.gateway, TOPIC, PARTITIONS, timeout_s=60)
    assert not check_dense(logs), quote(check_dense(logs))
    violations = check_acknowledged(history.acks, logs)
    assert not violations, quote(violations)
    replicas = {p: tuple(s.replicas) for p, s in describe(admin, TOPIC).items()}
    # Every move ended (done or cancelled), none was dropped half way: RF replicas each.
    assert all(len(listed) == RF for listed in replicas.values()), replicas
    for p, listed in replicas.items():
        copies = {n: replica_batches(cluster.data_dir / f"storage-{n}" / f"{TOPIC}-{p}") for n in listed}
        problems = check_replicas(p, copies, len(logs[p]))
        assert not problems, quote(problems)

    def strays() -> list[str]:
        return [
            f"node {n} p{p}"
            for p, listed in replicas.items()
            for n in range(NODES)
            if n not in listed and (cluster.data_dir / f"storage-{n}" / f"{TOPIC}-{p}").is_dir()
        ]

    wait_until(lambda: not strays(), timeout=30, what="no copy left off the replicas")
    admin.close()
