"""Idempotent producers with up to 5 requests in flight under a bounded nemesis: nothing twice,
nothing reordered, nothing acknowledged lost.

Three idempotent producers (acks=all, ``max_in_flight=5``, ``linger_ms=0``, batches of a few
records, so a partition's records queue up as many batches and requests) send numbered records
round robin to a topic of 3 partitions with replication factor 3 (``min.insync.replicas=2``,
``LogAppendTime``), while a nemesis, one fault after another: kills the gateway (-9) and restarts
it on its port, kills (-9) the leader of a partition, SIGSTOPs a leader until the controller has
replaced it and then SIGCONTs it (a zombie), kills the gateway again and another leader. Each
fault waits for the cluster to take over, so the whole plan is bounded (~15 s here; the test
about 25 s with the cluster's start).

Then, from what each producer was told and what the cluster holds:

* every record is acknowledged (the faults are far shorter than the delivery timeout), on the
  partition it was sent to, and is in the final log at the offset and append time it was
  acknowledged with;
* the final logs are dense and hold each record exactly once, and only records sent;
* per producer and partition, the log holds the records in strictly increasing send order (and
  the acknowledgements came in that order): a retry never overtook a later batch, and no batch
  was written again behind later ones;
* the three replicas of each partition hold the same batches, byte for byte, up to the high
  watermark (read from their segment files once the cluster has settled).

With one request in flight per partition (main until the pipelining lands) this holds as well;
with 5 it is what KIP-360's in-order retries and the leaders' producer state must keep.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import pytest

from gateway.client import Admin, NewTopic, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests.integration.replication import _chaos as chaos
from tests.integration.replication._chaos import (
    ProduceHistory,
    ProducerLoad,
    Seen,
    check_acknowledged,
    check_dense,
    check_known,
    check_order,
    check_replicas,
    check_sent_partitions,
    duplicates,
    read_logs,
)
from tests.integration.transactions._eos import ClusterFaults, full_isr, quote, wait_until

TOPIC = "pipelined"
PARTITIONS = 3
REPLICAS = 3
NODES = (0, 1, 2)
PRODUCERS = 3
RECORDS_PER_PRODUCER = 4_000
PRODUCE_S = 14.0
TOPIC_CONFIGS = {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"}
PRODUCER_SETTINGS = {
    "acks": "all",
    "enable_idempotence": True,
    "max_in_flight": 5,
    "linger_ms": 0,
    # A few records a batch: a partition's records wait as many batches, in several requests.
    "batch_size": 100,
    # A request stuck on a killed or paused leader is given up soon and retried on its successor;
    # the delivery timeout outlasts every outage here many times over.
    "request_timeout_ms": 4_000,
    "delivery_timeout_ms": 60_000,
    "retry_backoff_ms": 50,
    "retry_backoff_max_ms": 500,
}
#: The nemesis's plan, one fault after the other with :data:`FAULT_GAP_S` between them.
FAULT_PLAN = ("gateway-kill", "leader-kill", "leader-pause", "gateway-kill", "leader-kill", "leader-pause")
FAULT_GAP_S = 0.7
SEED = 20261125


@pytest.fixture
def cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=len(NODES),
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--replica-lag-time-max-ms", "1500"],
    )
    local = LocalCluster(tmp_path / "cluster", spec)
    try:
        local.start()
        yield local
    finally:
        for node in local.storage_nodes.values():
            node.signal(signal.SIGCONT)  # a node left paused would only stop after the SIGKILL timeout
        local.stop()


class PlanNemesis(threading.Thread):
    """Carries out :data:`FAULT_PLAN` with ``ClusterFaults`` (each fault bounded by its waits:
    the cluster takes over, the node or gateway is back); stops early when told, after the fault
    under way (every process is always brought back)."""

    def __init__(self, faults: ClusterFaults, plan: Sequence[str], seed: int) -> None:
        super().__init__(name="pipelined-nemesis", daemon=True)
        self.faults = faults
        self.plan = tuple(plan)
        self.seed = seed
        self.done: Counter[str] = Counter()
        self.log: list[str] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self, timeout_s: float) -> None:
        self._halt.set()
        self.join(timeout_s)

    def run(self) -> None:
        try:
            for kind in self.plan:
                if self._halt.wait(FAULT_GAP_S):
                    return
                if kind == "gateway-kill":
                    fault = self.faults.gateway_kill()
                else:
                    # The leader of a different partition each time (round robin from the seed).
                    partition = (
                        self.seed + self.done["leader-kill"] + self.done["leader-pause"]
                    ) % PARTITIONS
                    fault = self.faults.leader(kind, functools.partial(_partition, partition))
                self.done[kind] += 1
                self.log.append(f"{fault.kind} {fault.target}: taken over in {fault.moved_s:.1f} s")
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc


def _partition(partition: int, tps: list[TopicPartition]) -> TopicPartition:
    return next(tp for tp in tps if tp.partition == partition)


#: This module's topic in the shared checks.
high_watermarks = functools.partial(chaos.high_watermarks, topic=TOPIC, partitions=PARTITIONS)
disk_replicas = functools.partial(chaos.disk_replicas, topic=TOPIC, nodes=NODES)


def converged(cluster: LocalCluster, admin: Admin) -> bool:
    """Every ISR full, and every replica's log ends exactly at its leader's high watermark."""
    if not full_isr(admin, [TOPIC], REPLICAS):
        return False
    return chaos.logs_end_at_high_watermarks(cluster, admin, TOPIC, PARTITIONS, NODES)


def check_log_order(logs: Mapping[int, list[Seen]]) -> list[str]:
    """Per producer and partition, the log holds the records in strictly increasing send order
    (a retry that overtook a later batch, or a batch written again behind later ones, breaks it)."""
    violations = []
    for partition, records in logs.items():
        last: dict[int, tuple[int, int]] = {}  # producer -> (seq, offset) of its last record here
        for record in records:
            producer, seq = (int(part) for part in record.value.split(b":"))
            before = last.get(producer)
            if before is not None and seq <= before[0]:
                violations.append(
                    f"p{partition}@{record.offset}: producer {producer} seq {seq} after seq "
                    f"{before[0]} at offset {before[1]}"
                )
            last[producer] = (seq, record.offset)
    return violations


def test_pipelined_idempotent_producers_write_each_record_once_in_order_under_faults(cluster):
    started = time.monotonic()
    admin = Admin(servers=cluster.gateway)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, REPLICAS, dict(TOPIC_CONFIGS))])
    wait_until(lambda: full_isr(admin, [TOPIC], REPLICAS), 30, f"{TOPIC} online with full ISRs")

    history = ProduceHistory()
    producers = [
        ProducerLoad(
            producer_id,
            servers=cluster.gateway,
            topic=TOPIC,
            partitions=PARTITIONS,
            count=RECORDS_PER_PRODUCER,
            duration_s=PRODUCE_S,
            history=history,
            settings=PRODUCER_SETTINGS,
            flush_timeout_s=60,
        )
        for producer_id in range(PRODUCERS)
    ]
    faults = ClusterFaults(cluster, admin, [TOPIC], REPLICAS)
    nemesis = PlanNemesis(faults, FAULT_PLAN, SEED)
    try:
        for producer in producers:
            producer.start()
        nemesis.start()
        for producer in producers:
            producer.join(PRODUCE_S + 90)
        produced_s = time.monotonic() - started
        nemesis.join(120)
        assert not nemesis.is_alive(), "the nemesis did not finish its plan"
        assert nemesis.error is None, f"the nemesis failed: {nemesis.error!r}"
        for producer in producers:
            assert not producer.is_alive(), f"{producer.name} did not finish sending and flushing"
            assert producer.error is None, f"{producer.name} failed: {producer.error!r}"
        wait_until(lambda: converged(cluster, admin), 60, "the cluster settles", interval_s=0.3)
        hws = high_watermarks(admin)
        logs = read_logs(cluster.gateway, TOPIC, PARTITIONS, timeout_s=60)
    finally:
        nemesis.stop(60)
        for producer in producers:
            producer.abort()
        faults.resume_all()
    replica_violations = []
    for partition, hw in hws.items():
        replica_violations += check_replicas(partition, disk_replicas(cluster, partition), hw)
    admin.close()

    records = PRODUCERS * RECORDS_PER_PRODUCER
    metrics: dict[str, float] = defaultdict(float)
    for producer in producers:
        for name in ("requests", "batches-retried", "batches-acknowledged"):
            metrics[name] += producer.metrics.get(name, 0)
    summary = {
        "records": records,
        "acknowledged": len(history.acks),
        "failed": len(history.failures),
        "failure_kinds": sorted({reason.split(":")[0] for reason in history.failures.values()}),
        "duplicates": duplicates(logs),
        "log_records": sum(map(len, logs.values())),
        "high_watermarks": hws,
        "faults": nemesis.log,
        "producer_metrics": dict(metrics),
        "produce_s": round(produced_s, 1),
        "total_s": round(time.monotonic() - started, 1),
    }
    print(f"\npipelined idempotence summary: {summary}")

    checks = {
        "every record acknowledged": [f"{v!r}: {why}" for v, why in sorted(history.failures.items())],
        "acknowledged on the partition it was sent to": check_sent_partitions(history.acks, history.sent),
        "acknowledged records in the final log at their offsets": check_acknowledged(history.acks, logs),
        "nothing twice": [f"{duplicates(logs)} extra copies"] if duplicates(logs) else [],
        "final logs dense from offset 0": check_dense(logs),
        "final log holds only records sent": check_known(logs, history.sent),
        "log order per producer and partition": check_log_order(logs),
        "acknowledgement order per producer and partition": check_order(history.acks),
        "replicas identical up to the high watermark": replica_violations,
    }
    broken = {name: violations for name, violations in checks.items() if violations}
    assert not broken, (
        "\n".join(f"{name}: {quote(v)}" for name, v in broken.items()) + f"\nsummary: {summary}"
    )
    assert nemesis.done == Counter(FAULT_PLAN), f"the nemesis did not carry out its plan: {summary}"
    assert len(history.acks) == records == summary["log_records"], summary
