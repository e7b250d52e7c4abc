"""The idempotent producer (the default) under faults: retries after a lost answer write nothing twice.

A default producer sends numbered records, paced, with small batches (one record each) so that a
request carries several batches of a partition, to an RF 3 topic (``min.insync.replicas=2``,
``LogAppendTime``):

* across the 3 partitions of a topic while the gateway is killed -9 and restarted (twice) and the
  leader of a partition is killed -9 and restarted (twice), at whatever moment the load is in;
* to one partition while the gateway is killed -9 at the moment a request of many batches is
  written by the leader and not yet answered -- made certain by freezing the followers in turn
  (see :func:`gateway_kill_mid_append`), the case idempotence exists for.

Afterwards, from what the producer was told and what the log holds:

* every record was acknowledged (the faults are far shorter than the delivery timeout);
* each partition's log is exactly the records sent to it, in the order sent: nothing twice,
  nothing missing, nothing that was never sent;
* each acknowledgement names the offset where the record is and the time the leader appended it
  (a retry answered from the log must say what the log says, as Kafka's broker does);
* (second test) the records written and unanswered when the gateway died were acknowledged
  afterwards, from the log: a retry answered with the first append's offsets.

The control, ``enable_idempotence=False``, only where it is deterministic: the targeted kill on
one partition makes the producer retry exactly the records the leader had written, so the log
then holds exactly those twice. (Under the untargeted kills, whether a non-idempotent producer
duplicates anything depends on timing: not asserted.)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.client import Admin, NewTopic, Producer, TopicPartition
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests.integration.transactions._eos import (
    ClusterFaults,
    ReplicaView,
    describe,
    full_isr,
    quote,
    read_topic,
    wait_until,
)

SEED = 20250215
REPLICAS = 3
TOPIC_CONFIGS = {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"}
#: About 100 bytes a record, and batches that hold one: a request carries as many batches of a
#: partition as records arrived during the previous request's round trip.
PAD = b"." * 90
PRODUCER_SETTINGS: dict[str, Any] = {
    "batch_size": 200,
    "linger_ms": 5,
    "request_timeout_ms": 5_000,
    "delivery_timeout_ms": 90_000,
    "retry_backoff_ms": 50,
    "retry_backoff_max_ms": 500,
}


#: A load: its topic, partitions, records, seconds they are spread over, and its faults, each when
#: this share of the records has been acknowledged: "gateway-kill" at whatever moment that is,
#: "gateway-kill-mid-append" once a request of many batches is written and unanswered (see
#: :func:`gateway_kill_mid_append`), "leader-kill" of a random partition.
@dataclass(frozen=True)
class Plan:
    topic: str
    partitions: int
    records: int
    send_s: float
    faults: tuple[tuple[float, str], ...]
    idempotent: bool = True


SPREAD = Plan(
    "idempotent",
    3,
    15_000,
    10.0,
    ((0.15, "gateway-kill"), (0.35, "leader-kill"), (0.55, "gateway-kill"), (0.75, "leader-kill")),
)
#: One partition: its followers can be frozen without freezing a leader the producer writes to.
TARGETED = Plan(
    "idempotent-one", 1, 6_000, 6.0, ((0.2, "gateway-kill-mid-append"), (0.6, "gateway-kill-mid-append"))
)
#: The same, without idempotence: what the faults do to a producer that retries blindly.
TARGETED_PLAIN = dataclasses.replace(TARGETED, topic="not-idempotent-one", idempotent=False)
#: Records sent behind a stalled request before it is let through (the next request carries them).
BACKLOG = 150
#: Attempts at stalling a request before a mid-append kill (see :func:`gateway_kill_mid_append`).
STALL_ATTEMPTS = 3
FAULT_TIMEOUT_S = 60
#: An acknowledgement this long after a gateway or leader was killed did not come from it (its
#: answers reach the producer within milliseconds; a replacement takes longer than this to serve).
GRACE_MS = 250


def value(seq: int) -> bytes:
    return b"%06d:" % seq + PAD


def seq_of(record_value: bytes) -> int:
    return int(record_value.split(b":", 1)[0])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(
        storage_nodes=3,
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--replica-lag-time-max-ms", "1500", "--replica-fetch-backoff-ms", "200"],
    )
    local = LocalCluster(tmp_path_factory.mktemp("idempotence") / "cluster", spec)
    try:
        local.start()
        yield local
    finally:
        local.stop()


@dataclass
class History:
    """What the producer was told, per record: acknowledged (partition, offset, timestamp, when,
    wall-clock ms) or failed."""

    acks: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    sent_at: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_delivery(self, seq: int, error, metadata) -> None:
        now_ms = int(time.time() * 1000)
        with self.lock:
            if error is not None:
                self.failures[seq] = f"{type(error).__name__}: {error}"
            else:
                self.acks[seq] = (metadata.partition, metadata.offset, metadata.timestamp, now_ms)

    def settled(self) -> int:
        with self.lock:
            return len(self.acks) + len(self.failures)

    def acked_at_least(self, count: int) -> bool:
        with self.lock:
            return len(self.acks) >= count

    def settled_below(self, count: int) -> bool:
        """Whether records 0 .. count - 1 are all acknowledged or failed."""
        with self.lock:
            return all(seq in self.acks or seq in self.failures for seq in range(count))


class Load(threading.Thread):
    """Sends the plan's records, paced over its ``send_s``; record ``seq`` goes to partition
    ``seq % partitions``."""

    def __init__(self, servers: str, plan: Plan, history: History) -> None:
        super().__init__(name="idempotent-load", daemon=True)
        self.servers = servers
        self.plan = plan
        self.history = history
        self.sent = 0
        self.metrics: dict[str, float] = {}
        self.error: BaseException | None = None
        self._abort = threading.Event()

    def run(self) -> None:
        try:
            settings = {**PRODUCER_SETTINGS, "enable_idempotence": self.plan.idempotent}
            with Producer(servers=self.servers, **settings) as producer:
                plan = self.plan
                start = time.monotonic()
                for seq in range(plan.records):
                    if self._abort.is_set():
                        return
                    if seq % 50 == 0:  # pacing in steps of 50 records
                        ahead = start + seq * plan.send_s / plan.records - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
                    self.history.sent_at[seq] = time.time() * 1000
                    producer.send(
                        plan.topic,
                        value(seq),
                        partition=seq % plan.partitions,
                        on_delivery=lambda error, metadata, seq=seq: self.history.on_delivery(
                            seq, error, metadata
                        ),
                    )
                    self.sent = seq + 1
                producer.flush(120)
                self.metrics = producer.metrics()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def abort(self) -> None:
        self._abort.set()


@dataclass
class Fault:
    kind: str
    partitions: tuple[int, ...]  # the partitions whose requests it could cut
    down_ms: int  # wall clock once it was killed
    took_ms: int  # until it was back (gateway restarted, node restarted)
    sent_before: int  # records handed to the producer before it
    #: gateway-kill-mid-append: the offsets the leader had written and not answered when it died.
    unanswered_offsets: range = range(0)

    @property
    def unanswered(self) -> int:
        return len(self.unanswered_offsets)


def gateway_kill(faults: ClusterFaults, load: Load) -> Fault:
    sent = load.sent
    done = faults.gateway_kill()
    return Fault(done.kind, tuple(range(load.plan.partitions)), done.down_ms, int(done.moved_s * 1000), sent)


def gateway_kill_mid_append(
    cluster: LocalCluster, faults: ClusterFaults, view: ReplicaView, load: Load, rng: random.Random
) -> Fault:
    """Kill -9 the gateway while a request of many batches is written by a leader and not yet
    answered -- the case idempotence exists for -- made certain rather than left to timing:

    1. freeze one follower of a partition: the request in flight to it is written by the leader
       and waits for that follower (acks=all), while the producer queues records behind it;
    2. once a backlog is queued and the other follower has copied the stalled request, freeze
       the other follower and resume the first: the stalled request is answered, and the next one
       -- the whole backlog, as many batches as fit a request -- is written and waits;
    3. kill -9 the gateway, resume the follower, restart the gateway. The producer retries the
       backlog's batches; the leader must answer them from the log.

    Both freezes are meant to be far shorter than the lease and replica.lag.time.max.ms (no ISR
    change). On a loaded machine a step can take longer, a frozen follower leaves the ISR, and the
    high watermark reaches the log end: nothing is left written and unanswered. The attempt then
    stops before the kill, both followers resume, and once the ISR is whole again it is made anew
    (at most :data:`STALL_ATTEMPTS` times)."""
    tp = TopicPartition(load.plan.topic, rng.randrange(load.plan.partitions))
    for _ in range(STALL_ATTEMPTS):
        stalled = _stall_a_request(cluster, faults, view, load, tp)
        if stalled is not None:
            break
        wait_until(lambda: full_isr(faults.admin, [tp.topic], REPLICAS), 30, f"{tp.topic} back to a full ISR")
    else:
        raise AssertionError(f"no request to {tp} stayed written and unanswered in {STALL_ATTEMPTS} attempts")
    done, sent_before, written = stalled
    took_ms = int(done.moved_s * 1000)
    return Fault(f"{done.kind}-mid-append", (tp.partition,), done.down_ms, took_ms, sent_before, written)


def _stall_a_request(
    cluster: LocalCluster, faults: ClusterFaults, view: ReplicaView, load: Load, tp: TopicPartition
):
    """Steps 1-3 of :func:`gateway_kill_mid_append` for ``tp``: ``(the kill, records sent before
    it, the offsets written and unanswered)``, or None (nothing killed, nobody frozen) when the
    ISR changed under the freezes."""
    state = describe(faults.admin, [tp.topic])[tp]
    leader = state.leader
    first, second = (r for r in state.replicas if r != leader)
    nodes = cluster.storage_nodes
    frozen: list[int] = []

    def freeze(node: int) -> None:
        os.kill(nodes[node].pid, signal.SIGSTOP)
        frozen.append(node)

    def thaw(node: int) -> None:
        os.kill(nodes[node].pid, signal.SIGCONT)
        frozen.remove(node)

    def isr_whole() -> bool:
        return len(describe(faults.admin, [tp.topic])[tp].isr) == REPLICAS

    try:
        freeze(first)
        stalled_end, _ = wait_until(
            lambda: (o := view.offsets(leader, tp))[0] > o[1] and o,
            5,
            f"a request to {tp} written and waiting",
        )
        sent = load.sent
        wait_until(lambda: load.sent >= sent + BACKLOG * load.plan.partitions, 10, "records queued behind it")
        wait_until(lambda: view.offsets(second, tp)[0] >= stalled_end, 5, f"node {second} copied it")
        freeze(second)
        thaw(first)
        try:
            end, high_watermark = wait_until(
                lambda: (o := view.offsets(leader, tp))[0] > stalled_end and stalled_end <= o[1] < o[0] and o,
                5,
                f"the next request to {tp} written and waiting",
            )
        except AssertionError:
            if isr_whole():
                raise
            return None  # a follower left the ISR: the high watermark reached the log end
        if not isr_whole():
            return None
        sent_before = load.sent
        done = faults.gateway_kill(while_down=lambda: thaw(second))
    finally:
        while frozen:  # a failed step leaves nobody frozen
            thaw(frozen[-1])
    return done, sent_before, range(high_watermark, end)


def leader_kill(faults: ClusterFaults, load: Load, rng: random.Random) -> Fault:
    partition = rng.randrange(load.plan.partitions)
    sent = load.sent
    done = faults.leader("leader-kill", lambda tps: next(tp for tp in tps if tp.partition == partition))
    led = tuple(tp.partition for tp in done.partitions)
    return Fault(done.kind, led, done.down_ms, int(done.moved_s * 1000), sent)


def check_logs(logs, plan: Plan) -> list[str]:
    """Each partition's log is the records sent to it, once each, in order."""
    violations = []
    for partition, records in logs.items():
        got = [seq_of(r.value) for r in records]
        expected = list(range(partition, plan.records, plan.partitions))
        if got == expected:
            continue
        counts = Counter(got)
        twice = sorted(s for s, n in counts.items() if n > 1)
        missing = sorted(set(expected) - set(got))
        foreign = sorted(s for s in set(got) if s % plan.partitions != partition or s >= plan.records)
        first = next(
            (i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected))
        )
        at = records[first].offset if first < len(records) else "the end"
        violations.append(
            f"p{partition}: {len(got)} records, {len(expected)} sent; first difference at offset {at}: "
            f"{got[first : first + 4]} where {expected[first : first + 4]} was sent; {len(twice)} "
            f"records twice (first {twice[:8]}), {len(missing)} missing {missing[:8]}, {len(foreign)} "
            f"never sent here {foreign[:8]}"
        )
    return violations


def check_acks(logs, history: History) -> list[str]:
    """Each acknowledgement names the offset and append time of its record in the log."""
    violations = []
    for seq, (partition, offset, timestamp, _) in sorted(history.acks.items()):
        records = logs[partition]
        found = records[offset] if 0 <= offset < len(records) else None
        if found is None or seq_of(found.value) != seq or found.timestamp != timestamp:
            there = f"{seq_of(found.value)} appended at {found.timestamp}" if found else "nothing"
            violations.append(
                f"record {seq} acknowledged at p{partition}@{offset} appended at {timestamp}; "
                f"the log has {there}"
            )
    return violations


def answered_from_first_append(logs, history: History, fault: Fault) -> int:
    """Records of ``fault``'s partitions that the log shows appended before the kill and that
    were acknowledged with that append's offset only well after it: the answer of their first
    append was lost, and a retry was answered from the log."""
    count = 0
    for partition in fault.partitions:
        for record in logs[partition]:
            ack = history.acks.get(seq_of(record.value))
            if (
                ack is not None
                and ack[1] == record.offset
                and record.timestamp < fault.down_ms
                and ack[3] > fault.down_ms + GRACE_MS
            ):
                count += 1
    return count


@dataclass
class Run:
    """A plan carried out: the final logs, what the producer was told, the faults, a summary."""

    plan: Plan
    logs: dict
    history: History
    faults: list[Fault]
    summary: dict


def run_plan(cluster: LocalCluster, plan: Plan) -> Run:
    """Produce the plan's load through its faults, and read the logs back."""
    started = time.monotonic()
    rng = random.Random(f"{SEED}-{plan.topic}")
    admin = Admin(servers=cluster.gateway)
    admin.create_topics([NewTopic(plan.topic, plan.partitions, REPLICAS, dict(TOPIC_CONFIGS))])
    wait_until(lambda: full_isr(admin, [plan.topic], REPLICAS), 30, f"{plan.topic} online with full ISRs")
    history = History()
    load = Load(cluster.gateway, plan, history)
    faults = ClusterFaults(cluster, admin, [plan.topic], REPLICAS)
    view = ReplicaView(cluster)
    done: list[Fault] = []
    try:
        load.start()
        for share, kind in plan.faults:
            wait_until(
                functools.partial(history.acked_at_least, int(share * plan.records)),
                FAULT_TIMEOUT_S,
                f"{share:.0%} acknowledged",
            )
            if kind == "gateway-kill-mid-append":
                fault = gateway_kill_mid_append(cluster, faults, view, load, rng)
            elif kind == "gateway-kill":
                fault = gateway_kill(faults, load)
            else:
                fault = leader_kill(faults, load, rng)
            done.append(fault)
            # The records sent before the fault settle before the next one.
            wait_until(
                functools.partial(history.settled_below, fault.sent_before),
                FAULT_TIMEOUT_S,
                f"records sent before the {kind} settle",
            )
        load.join(FAULT_TIMEOUT_S + 60)
        assert not load.is_alive(), "the producer did not finish sending and flushing"
        assert load.error is None, f"the producer failed: {load.error!r}"
        logs = read_topic(
            cluster.gateway, plan.topic, plan.partitions, isolation_level="read_uncommitted", timeout_s=60
        )
    finally:
        load.abort()
        faults.resume_all()
        view.close()
        admin.close()
    assert len(done) == len(plan.faults)

    summary = {
        "seed": SEED,
        "topic": plan.topic,
        "idempotent": plan.idempotent,
        "records": plan.records,
        "acknowledged": len(history.acks),
        "failed": len(history.failures),
        "failures": sorted(Counter(reason.split(":")[0] for reason in history.failures.values()).items()),
        "log_records": sum(map(len, logs.values())),
        "faults": [
            f"{f.kind} partitions {list(f.partitions)} back after {f.took_ms} ms"
            + (f", {f.unanswered} records written and unanswered" if f.unanswered else "")
            for f in done
        ],
        "answered_from_first_append": {
            f"{f.kind}@{f.sent_before}": answered_from_first_append(logs, history, f) for f in done
        },
        "producer_metrics": load.metrics,
        "total_s": round(time.monotonic() - started, 1),
    }
    print(f"\nidempotence summary: {summary}")
    return Run(plan, logs, history, done, summary)


def check_exactly_once(run: Run) -> None:
    checks = {
        "every record acknowledged": [f"{seq}: {why}" for seq, why in sorted(run.history.failures.items())],
        "each log = the records sent to it, once each, in order": check_logs(run.logs, run.plan),
        "acknowledgements name the record's offset and append time": check_acks(run.logs, run.history),
    }
    broken = {name: v for name, v in checks.items() if v}
    assert not broken, (
        "\n".join(f"{name}: {quote(v)}" for name, v in broken.items()) + f"\nsummary: {run.summary}"
    )


def test_idempotent_producer_writes_each_record_once_across_gateway_and_leader_kills(cluster: LocalCluster):
    check_exactly_once(run_plan(cluster, SPREAD))


def test_a_written_request_of_many_batches_is_answered_from_the_log_after_the_gateway_dies(
    cluster: LocalCluster,
):
    run = run_plan(cluster, TARGETED)
    check_exactly_once(run)
    # The kills did cut written requests, and their records were answered from the log.
    for fault in run.faults:
        answered = run.summary["answered_from_first_append"][f"{fault.kind}@{fault.sent_before}"]
        assert fault.unanswered > 0 and answered >= fault.unanswered, (
            f"{fault.kind}: {fault.unanswered} records written and unanswered, {answered} "
            f"acknowledged from the log afterwards: {run.summary}"
        )


def test_without_idempotence_the_same_kills_write_exactly_the_unanswered_records_twice(cluster: LocalCluster):
    # The control: the fault above is real -- a producer that retries blindly duplicates what
    # the leader had written when the gateway died, and only that (every record acknowledged).
    run = run_plan(cluster, TARGETED_PLAIN)
    assert not run.history.failures, f"records failed: {run.summary}"
    [log] = run.logs.values()
    unanswered = {seq_of(log[offset].value) for fault in run.faults for offset in fault.unanswered_offsets}
    counts = Counter(seq_of(record.value) for record in log)
    twice = {seq for seq, n in counts.items() if n > 1}
    assert unanswered and twice == unanswered and max(counts.values()) == 2, (
        f"written twice: {sorted(twice)[:20]}; written and unanswered at the kills: "
        f"{sorted(unanswered)[:20]}; summary: {run.summary}"
    )
    assert set(counts) == set(range(run.plan.records)), "every record is in the log"
