"""Replication under chaos, Jepsen style: leaders killed (kill -9) and restarted every few seconds,
once a leader paused past its lease and resumed, while producers send 100,000 numbered records
with acks=all and a consumer reads throughout. Some kills are set up to hurt: the leader first
isolated (an uncommitted tail to truncate), the preferred follower first dropped from the ISR (an
election that must pass it over), two leaders in a row (tails of two epochs); see
``_chaos.FAULT_KINDS``. Then, from what the clients were told and what the cluster holds:

* every acknowledged record is in the final log, at the offset it was acknowledged with
  (duplicates are allowed until idempotence lands: counted);
* one producer's acknowledged records to one partition keep their order;
* the replicas hold the same batches, byte for byte, up to the high watermark (read from their
  segment files);
* the consumer never got a record that is not in the final log (a read above the high watermark
  of a record later truncated would be one).

Real processes: a LocalCluster of 3 storage nodes, a coordinator and a gateway, a topic of 6
partitions with replication factor 3 and ``min.insync.replicas=2``. The replicas are compared
while the cluster runs, after it settled (every ISR full again, every replica's log ending at
its leader's high watermark): stopping the nodes first would compare what a clean shutdown left,
not what the replicas served, and the page cache shows a running node's writes to this reader.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time
from collections import Counter

import pytest

from gateway.client import Admin, NewTopic
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests.integration.replication import _chaos as chaos
from tests.integration.replication._chaos import (
    ConsumerLog,
    LeaderWatch,
    Nemesis,
    ProduceHistory,
    ProducerLoad,
    check_acknowledged,
    check_consumer,
    check_consumer_saw_everything,
    check_dense,
    check_known,
    check_order,
    check_replicas,
    check_sent_partitions,
    describe,
    duplicates,
    quote,
    read_logs,
)
from tests.support.wait import seconds_until

#: The controller's line for an AlterPartition it applied (coordinator/controller.py).
ISR_CHANGE = re.compile(r"ISR \[([\d, ]+)\] -> \[([\d, ]+)\] \(asked by leader")

TOPIC = "chaos"
PARTITIONS = 6
REPLICAS = 3
NODES = (0, 1, 2)
SESSION_TIMEOUT_S = 2
#: Below the lease, so a frozen follower leaves the ISR by its leader's AlterPartition before the
#: controller would drop it for a lost lease.
REPLICA_LAG_MS = 1000
#: The issue's 100,000 records, from two producers, spread over the fault window.
RECORDS = 100_000
PRODUCERS = 2
#: Faults (see _chaos.FAULT_KINDS), one every few seconds: this gap, plus the failover and the
#: restart (4-8 s here, so the plan about fills the produce window). Every kind once, then a
#: second kill and double fault, in the suite; TRIBUTARY_CHAOS_ROUNDS=N repeats the whole plan
#: N times (and stretches the produce window with it) for a longer soak.
ROUNDS = int(os.environ.get("TRIBUTARY_CHAOS_ROUNDS", "1"))
FAULT_PLAN = ("kill", "isolate", "lag", "pause", "double", "kill") * ROUNDS
PRODUCE_S = 36.0 * ROUNDS
FAULT_INTERVAL_S = 1.5
#: Bound on the whole plan (a fault takes 4-10 s here; each of its waits is bounded on its own).
NEMESIS_TIMEOUT_S = 180 * ROUNDS
#: How long the other nodes stay frozen before an isolated leader is killed (leases last 2 s).
ISOLATE_S = 0.8
#: The zombie stays stopped this much longer after the controller replaced it.
PAUSE_HOLD_S = 1.5
SEED = int(os.environ.get("TRIBUTARY_CHAOS_SEED", "20240611"))

TOPIC_CONFIGS = {
    "min.insync.replicas": "2",
    # The leader stamps each append with its own clock, so a record tells which append it came
    # from: a retry that re-appends it after a failover (same value, maybe even the same offset)
    # is a different record, and a consumer that read the first append above the high watermark
    # -- truncated since -- holds a record the final log does not.
    "message.timestamp.type": "LogAppendTime",
}

PRODUCER_SETTINGS = {
    "acks": "all",
    "linger_ms": 5,
    # Order: the SDK never has two requests of one partition in flight (a partition is muted
    # while its request is out, see gateway/client/sender.py), and a batch to retry goes back to
    # the front of its partition's queue, so a retry can never overtake the records behind it.
    # max_in_flight only spreads requests over *different* partitions; one producer's records
    # reach a partition in the order they were sent, retries included -- which is what makes the
    # order check below meaningful (it would be with max_in_flight=1 too, just slower).
    "max_in_flight": PARTITIONS,
    # Short enough that a request stuck on a dead or paused leader is retried elsewhere soon;
    # the delivery timeout outlasts any outage the nemesis causes (about 5 s), so a record fails
    # only if the cluster stays unavailable far longer than it should.
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 45_000,
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 500,
}


@pytest.fixture
def chaos_cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=len(NODES),
        coordinators=1,
        gateways=1,
        session_timeout_s=SESSION_TIMEOUT_S,
        storage_args=["--replica-lag-time-max-ms", str(REPLICA_LAG_MS)],
    )
    local = LocalCluster(tmp_path / "cluster", spec)
    try:
        local.start()
        yield local
    finally:
        for node in local.storage_nodes.values():
            node.signal(signal.SIGCONT)  # a node left paused would only stop after the SIGKILL timeout
        local.stop()


#: This module's topic in the shared checks.
high_watermarks = functools.partial(chaos.high_watermarks, topic=TOPIC, partitions=PARTITIONS)
disk_replicas = functools.partial(chaos.disk_replicas, topic=TOPIC, nodes=NODES)


def converged(cluster: LocalCluster, admin: Admin) -> bool:
    """Every ISR full, and every replica's log ends exactly at its leader's high watermark."""
    states = describe(admin, TOPIC)
    if any(s.leader < 0 or len(s.isr) != REPLICAS for s in states.values()):
        return False
    return chaos.logs_end_at_high_watermarks(cluster, admin, TOPIC, PARTITIONS, NODES)


def log_counts(cluster: LocalCluster) -> dict[str, int]:
    """What the services' logs say happened: ISR changes leaders asked for (AlterPartition), and
    follower truncations -- evidence that the faults reached those paths."""
    shrinks = expansions = truncations = 0
    for path in cluster.run_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            change = ISR_CHANGE.search(line)
            if change is not None:
                before, after = (len(group.split(",")) for group in change.groups())
                shrinks += after < before
                expansions += after > before
            truncations += "Truncated" in line or "Emptied" in line
    return {"isr_shrinks": shrinks, "isr_expansions": expansions, "truncations": truncations}


def test_acknowledged_records_survive_killed_and_paused_leaders(chaos_cluster):
    cluster = chaos_cluster
    started = time.monotonic()
    admin = Admin(servers=cluster.gateway)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, REPLICAS, TOPIC_CONFIGS)])
    seconds_until(
        lambda: all(len(s.isr) == REPLICAS for s in describe(admin, TOPIC).values()),
        timeout=30,
        what="every partition online with a full ISR",
        interval=0.2,
    )

    history = ProduceHistory()
    producers = [
        ProducerLoad(
            producer_id,
            servers=cluster.gateway,
            topic=TOPIC,
            partitions=PARTITIONS,
            count=RECORDS // PRODUCERS,
            duration_s=PRODUCE_S,
            history=history,
            settings=PRODUCER_SETTINGS,
            flush_timeout_s=90,
        )
        for producer_id in range(PRODUCERS)
    ]
    consumer = ConsumerLog(servers=cluster.gateway, topic=TOPIC, partitions=PARTITIONS)
    nemesis = Nemesis(
        cluster,
        topic=TOPIC,
        plan=FAULT_PLAN,
        interval_s=FAULT_INTERVAL_S,
        isolate_s=ISOLATE_S,
        pause_hold_s=PAUSE_HOLD_S,
        move_timeout_s=30,
        seed=SEED,
    )
    watch = LeaderWatch(Admin(servers=cluster.gateway), TOPIC, nemesis.down)
    try:
        consumer.start()
        watch.start()
        for producer in producers:
            producer.start()
        nemesis.start()

        # The plan is sized to fit the produce window here; on a slower machine its last faults
        # come after the producers are done, rather than the test doing fewer of them.
        for producer in producers:
            producer.join(PRODUCE_S + 120)
        sent_at = max(p.all_sent_at for p in producers)
        nemesis.join(NEMESIS_TIMEOUT_S)
        produced_s = time.monotonic() - started
        assert not nemesis.is_alive(), "the nemesis did not finish its last round"
        assert nemesis.error is None, f"the nemesis failed: {nemesis.error!r}"
        for producer in producers:
            assert not producer.is_alive(), f"{producer.name} did not finish sending and flushing"
            assert producer.error is None, f"{producer.name} failed: {producer.error!r}"
        assert history.settled == RECORDS, f"{RECORDS - history.settled} sends never settled"

        settle_s = seconds_until(
            lambda: converged(cluster, admin), timeout=60, what="the cluster settles", interval=0.5
        )
        hws = high_watermarks(admin)
        logs = read_logs(cluster.gateway, TOPIC, PARTITIONS, timeout_s=60)
        seconds_until(
            lambda: consumer.reached(hws),
            timeout=60,
            what="the consumer reads up to the high watermarks",
            interval=0.2,
        )
    finally:
        nemesis.stop(60)
        for producer in producers:
            producer.abort()
        consumer.stop(30)
        watch.stop()
        watch.admin.close()
    assert consumer.error is None, f"the consumer failed: {consumer.error!r}"

    replica_violations = []
    for partition, hw in hws.items():
        replica_violations += check_replicas(partition, disk_replicas(cluster, partition), hw)
    admin.close()

    acked_values = {(a.producer, a.seq) for a in history.acks}
    failed_in_log = sum(1 for records in logs.values() for r in records if r.value in history.failures)
    done = nemesis.done
    summary = {
        "records": RECORDS,
        "acknowledged": len(history.acks),
        "failed": len(history.failures),
        "failed_but_in_log": failed_in_log,
        "duplicates": duplicates(logs),
        "log_records": sum(map(len, logs.values())),
        "high_watermarks": hws,
        "consumer_records": len(consumer.seen),
        "consumer_poll_errors": dict(consumer.poll_errors),
        "faults": dict(done),
        "faults_while_producing": sum(1 for f in nemesis.faults if f.at < sent_at),
        "fault_log": [
            f"{f.kind} node {f.node} (led {list(f.led)}) moved in {f.moved_s:.1f} s" for f in nemesis.faults
        ],
        **log_counts(cluster),
        "partitions_moved": sum(len(f.led) for f in nemesis.faults),
        "max_move_s": round(max((f.moved_s for f in nemesis.faults), default=0.0), 2),
        "max_without_leader_s": round(watch.max_without_leader_s, 2),
        "produce_and_faults_s": round(produced_s, 1),
        "settle_s": round(settle_s, 1),
        "total_s": round(time.monotonic() - started, 1),
        "failure_kinds": sorted({reason.split(":")[0] for reason in history.failures.values()}),
    }
    print(f"\nchaos summary: {summary}")

    checks = {
        "acknowledged once": []
        if len(acked_values) == len(history.acks)
        else ["a record was acknowledged twice"],
        "acknowledged on the partition it was sent to": check_sent_partitions(history.acks, history.sent),
        "final logs dense from offset 0": check_dense(logs),
        "acknowledged records in the final log at their offsets": check_acknowledged(history.acks, logs),
        "acknowledged order per producer and partition": check_order(history.acks),
        "final log holds only records sent": check_known(logs, history.sent),
        "replicas identical up to the high watermark": replica_violations,
        "consumer never got a record not in the final log": check_consumer(consumer.seen, logs),
        "consumer got every record of the final log": check_consumer_saw_everything(consumer.seen, logs),
    }
    broken = {name: violations for name, violations in checks.items() if violations}
    assert not broken, (
        "\n".join(f"{name}: {quote(v)}" for name, v in broken.items()) + f"\nsummary: {summary}"
    )

    # The run must have been chaotic enough to mean something, and the cluster useful throughout.
    assert done == Counter(FAULT_PLAN), f"the nemesis did not carry out its plan: {summary}"
    assert len(history.acks) >= 0.95 * RECORDS, f"too few records acknowledged: {summary}"
