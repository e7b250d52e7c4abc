"""The parts of the replication chaos test (``test_chaos.py``), Jepsen style: clients that record
what they were told, a nemesis that breaks the cluster, and checks over the recorded history.

* :class:`ProducerLoad` -- a paced producer thread; every record carries a unique number, and
  :class:`ProduceHistory` keeps what its producer was told: acknowledged at (partition, offset),
  in the order the acknowledgements arrived, or failed (and why).
* :class:`ConsumerLog` -- a consumer thread reading every partition from the beginning
  throughout, keeping every (partition, offset, value, append time) it was handed.
* :class:`LeaderWatch` -- samples the partitions' leaders and measures how long each partition
  went without a live one.
* :class:`Nemesis` -- the fault loop: ``kill -9`` the leader of a partition, wait until the
  controller has moved its partitions, restart it -- plain, or after isolating it, or after
  freezing its preferred follower out of the ISR, or twice in a row; once, ``SIGSTOP`` a leader
  past its lease and ``SIGCONT`` it after the controller has replaced it (a zombie leader). See
  :data:`FAULT_KINDS`.
* The checks: pure functions over the history and the final logs, each returning every violation
  it finds (a failure names the broken records, not just the first).
* :func:`replica_batches` -- one replica's batches, read straight from its segment files.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

from gateway.client import Admin, Consumer, ConsumerRecord, PartitionMetadata, Producer, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster
from services.records import iter_batches
from tests.support.wait import seconds_until

#: Violations quoted in an assertion message (the count is always given).
QUOTED = 20


def record_value(producer: int, seq: int) -> bytes:
    """The value of record ``seq`` of ``producer``: its unique number."""
    return b"%d:%d" % (producer, seq)


def describe(admin: Admin, topic: str) -> dict[int, PartitionMetadata]:
    """Partition -> its leader (-1: offline), replicas and ISR, as the controller has them."""
    return {p.partition: p for p in admin.describe_topics([topic])[0].partitions}


def quote(violations: Sequence[str]) -> str:
    shown = "\n  ".join(violations[:QUOTED])
    more = f"\n  ... and {len(violations) - QUOTED} more" if len(violations) > QUOTED else ""
    return f"{len(violations)} violation(s):\n  {shown}{more}"


# ---- producers ------------------------------------------------------------------------------------


class Ack(NamedTuple):
    """An acknowledgement: where the record was appended, and when (the leader's LogAppendTime)."""

    producer: int
    seq: int
    partition: int
    offset: int
    timestamp: int


class ProduceHistory:
    """What every send was told. Delivery callbacks run on each producer's I/O thread, one at a
    time per producer and in the order the acknowledgements arrived, so ``acks`` keeps each
    producer's acknowledgement order."""

    def __init__(self) -> None:
        self.acks: list[Ack] = []
        self.failures: dict[bytes, str] = {}
        self.sent: dict[bytes, int] = {}  # value -> the partition it was sent to
        self._lock = threading.Lock()

    def on_send(self, value: bytes, partition: int) -> None:
        with self._lock:
            self.sent[value] = partition

    def on_delivery(self, producer: int, seq: int, error, metadata) -> None:
        with self._lock:
            if error is not None:
                self.failures[record_value(producer, seq)] = f"{type(error).__name__}: {error}"
            else:
                # The SDK names the partition it was acknowledged on; a different one is a bug too.
                self.acks.append(Ack(producer, seq, metadata.partition, metadata.offset, metadata.timestamp))

    @property
    def settled(self) -> int:
        with self._lock:
            return len(self.acks) + len(self.failures)


class ProducerLoad(threading.Thread):
    """Sends ``count`` records, spread evenly over ``duration_s``, round robin over the partitions
    (record ``seq`` goes to partition ``seq % partitions``), then flushes."""

    def __init__(
        self,
        producer_id: int,
        *,
        servers: str,
        topic: str,
        partitions: int,
        count: int,
        duration_s: float,
        history: ProduceHistory,
        settings: Mapping[str, Any],
        flush_timeout_s: float,
    ) -> None:
        super().__init__(name=f"chaos-producer-{producer_id}", daemon=True)
        self.producer_id = producer_id
        self.servers = servers
        self.topic = topic
        self.partitions = partitions
        self.count = count
        self.duration_s = duration_s
        self.history = history
        self.settings = dict(settings)
        self.flush_timeout_s = flush_timeout_s
        #: time.monotonic() when the last record was handed to the producer.
        self.all_sent_at = 0.0
        self.error: BaseException | None = None
        self.metrics: dict[str, float] = {}
        self._abort = threading.Event()

    def abort(self) -> None:
        """Stop sending (a test that failed early must not leave load running)."""
        self._abort.set()

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def _produce(self) -> None:
        producer = Producer(servers=self.servers, **self.settings)
        try:
            start = time.monotonic()
            pace = self.duration_s / self.count
            for seq in range(self.count):
                if self._abort.is_set():
                    return
                if (
                    seq % 50 == 0
                ):  # pace in steps of 50 records: a sleep per record costs more than it spreads
                    ahead = start + seq * pace - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                partition = seq % self.partitions
                value = record_value(self.producer_id, seq)
                self.history.on_send(value, partition)
                producer.send(
                    self.topic,
                    value,
                    partition=partition,
                    on_delivery=functools.partial(self.history.on_delivery, self.producer_id, seq),
                )
            self.all_sent_at = time.monotonic()
            producer.flush(self.flush_timeout_s)
            self.metrics = producer.metrics()
        finally:
            producer.close(5)


# ---- the consumer -------------------------------------------------------------------------------


class Seen(NamedTuple):
    """A record as a consumer got it. On a LogAppendTime topic the timestamp tells appends apart:
    a record re-appended by a retry has the same value, and a later timestamp."""

    partition: int
    offset: int
    value: bytes
    timestamp: int

    @classmethod
    def of(cls, record: ConsumerRecord) -> Seen:
        return cls(record.partition, record.offset, cast(bytes, record.value), record.timestamp)


class ConsumerLog(threading.Thread):
    """Reads every partition from the beginning until stopped, keeping everything it was given."""

    def __init__(self, *, servers: str, topic: str, partitions: int) -> None:
        super().__init__(name="chaos-consumer", daemon=True)
        self.servers = servers
        self.topic = topic
        self.partitions = partitions
        self.seen: list[Seen] = []
        self.poll_errors: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._next: dict[int, int] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            consumer = Consumer(
                servers=self.servers,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                fetch_max_wait_ms=200,
            )
            try:
                consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
                while not self._halt.is_set():
                    self._poll(consumer)
            finally:
                consumer.close()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def _poll(self, consumer: Consumer) -> None:
        try:
            batches = consumer.poll(timeout_ms=200)
        except TributaryError as exc:  # a leader going away surfaces here now and then: keep reading
            self.poll_errors[type(exc).__name__] += 1
            return
        with self._lock:
            for tp, records in batches.items():
                self.seen.extend(map(Seen.of, records))
                if records:
                    self._next[tp.partition] = max(self._next.get(tp.partition, 0), records[-1].offset + 1)

    def reached(self, end_offsets: Mapping[int, int]) -> bool:
        """Whether it has been handed every partition's records up to ``end_offsets``."""
        with self._lock:
            return all(self._next.get(p, 0) >= end for p, end in end_offsets.items())

    def stop(self, timeout_s: float) -> None:
        self._halt.set()
        self.join(timeout_s)


def read_logs(servers: str, topic: str, partitions: int, timeout_s: float) -> dict[int, list[Seen]]:
    """Every partition's records from the beginning to its end offset (the high watermark), in
    offset order, read through the gateway."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    logs: dict[int, list[Seen]] = {p: [] for p in range(partitions)}
    with Consumer(servers=servers, auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        end = {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                positions = {tp.partition: consumer.position(tp) for tp in tps}
                raise AssertionError(f"final read not done in {timeout_s:.0f} s: at {positions}, ends {end}")
            for tp, records in consumer.poll(timeout_ms=500).items():
                logs[tp.partition].extend(map(Seen.of, records))
    return {p: [r for r in seen if r.offset < end[p]] for p, seen in logs.items()}


# ---- leaders ------------------------------------------------------------------------------------


@dataclass
class LeaderWatch:
    """Samples the leaders every ``interval_s`` from its own thread. A partition is *without a
    leader* while the controller names none (-1) or names a node the nemesis has taken down;
    ``longest_s`` is the longest such stretch seen, per partition."""

    admin: Admin
    topic: str
    down: set[int]
    interval_s: float = 0.2
    longest_s: dict[int, float] = field(default_factory=dict)
    sample_errors: int = 0
    _since: dict[int, float] = field(default_factory=dict)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-leader-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                states = describe(self.admin, self.topic)
            except TributaryError:
                self.sample_errors += 1
                continue
            now = time.monotonic()
            down = set(self.down)
            for partition, state in states.items():
                if state.leader < 0 or state.leader in down:
                    self._since.setdefault(partition, now)
                elif partition in self._since:
                    stretch = now - self._since.pop(partition)
                    self.longest_s[partition] = max(self.longest_s.get(partition, 0.0), stretch)

    @property
    def max_without_leader_s(self) -> float:
        now = time.monotonic()
        still = [now - since for since in self._since.values()]
        return max([*self.longest_s.values(), *still], default=0.0)


# ---- the nemesis ------------------------------------------------------------------------------------


#: The nemesis's faults, each done to the leader of a randomly picked partition:
#: ``kill`` -- kill -9, restarted once the controller has moved its partitions away;
#: ``isolate`` -- first freeze (SIGSTOP) the other live nodes for ``isolate_s``, well inside their
#: leases, so the leader appends records nobody copies (an uncommitted tail: what reads above the
#: high watermark would show, and what the leader must truncate when it comes back), then kill -9
#: it, resume the others, and restart it as for ``kill``;
#: ``lag`` -- first freeze the follower an election would try first (the first in assignment
#: order) until it has left the ISR -- its leader asks the controller to drop it (AlterPartition)
#: after replica.lag.time.max.ms, or the controller drops it when its lease expires -- then resume
#: it and at once kill -9 the leader, while the follower still misses records committed without
#: it: a clean election must pass it over. Restarted as for ``kill``;
#: ``double`` -- ``kill``, and once the partition has a new leader, ``isolate`` that one too before
#: either is back: the last replica leads alone, and the two returning replicas hold tails of two
#: different leader epochs to truncate (KIP-279);
#: ``pause`` -- SIGSTOP until the controller has replaced it (its lease expired), ``pause_hold_s``
#: longer, then SIGCONT: a zombie that still believes it leads.
FAULT_KINDS = ("kill", "isolate", "lag", "double", "pause")


@dataclass
class Fault:
    """One node taken down by the nemesis."""

    kind: str  # how (one of FAULT_KINDS but "double", which takes down two: "kill", then "isolate")
    node: int
    partition: int  # the partition whose leader was picked
    led: tuple[int, ...]  # every partition the node led then
    moved_s: float  # node down -> the controller has moved all of ``led`` off it
    at: float  # time.monotonic() when it went down


class Nemesis(threading.Thread):
    """One fault every ``interval_s`` (plus the time the fault takes), of the kinds in ``plan``
    (see :data:`FAULT_KINDS`), each to the leader of a random partition. Stops at the end of the
    plan or when told to, after finishing the fault under way: every node is always brought back."""

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        topic: str,
        plan: Sequence[str],
        interval_s: float,
        isolate_s: float,
        pause_hold_s: float,
        move_timeout_s: float,
        seed: int,
    ) -> None:
        super().__init__(name="chaos-nemesis", daemon=True)
        unknown = set(plan) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.cluster = cluster
        self.topic = topic
        self.plan = tuple(plan)
        self.interval_s = interval_s
        self.isolate_s = isolate_s
        self.pause_hold_s = pause_hold_s
        self.move_timeout_s = move_timeout_s
        self.rng = random.Random(seed)
        #: Nodes killed, paused or frozen right now (read by LeaderWatch).
        self.down: set[int] = set()
        self.faults: list[Fault] = []
        #: The kinds of faults done, "double" counted once.
        self.done: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self, timeout_s: float) -> None:
        self._halt.set()
        self.join(timeout_s)

    def run(self) -> None:
        try:
            with Admin(servers=self.cluster.gateway) as admin:
                for kind in self.plan:
                    if self._halt.wait(self.interval_s):
                        return
                    self._fault(admin, kind)
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def _fault(self, admin: Admin, kind: str) -> None:
        states = describe(admin, self.topic)
        leading = sorted(p for p, state in states.items() if state.leader >= 0)
        if not leading:
            return  # every partition offline: nothing to take down this round
        partition = self.rng.choice(leading)
        taken: list[tuple[int, str]] = []  # (node, how), to bring back
        try:
            node = states[partition].leader
            taken.append((node, "kill" if kind == "double" else kind))
            self._take_down(admin, states, partition, *taken[-1])
            if kind == "double":
                states = describe(admin, self.topic)
                second = states[partition].leader
                if second >= 0 and second != node:
                    taken.append((second, "isolate"))
                    self._take_down(admin, states, partition, *taken[-1])
            elif kind == "pause":
                time.sleep(self.pause_hold_s)  # the fault's length: the zombie stays stopped a while
        finally:
            for node, how in taken:
                if how == "pause":
                    self._signal(node, signal.SIGCONT)
                else:
                    self.cluster.start_storage_node(node)
                self.down.discard(node)
        self.done[kind] += 1

    def _take_down(
        self, admin: Admin, states: Mapping[int, PartitionMetadata], partition: int, node: int, how: str
    ) -> None:
        """Take ``node`` down (``how``: kill, isolate, lag or pause) and wait until the controller
        has moved every partition it led."""
        led = tuple(p for p, state in states.items() if state.leader == node)
        process = self.cluster.storage_nodes[node]
        live_others = [n for n in self.cluster.storage_nodes if n != node and n not in self.down]
        self.down.add(node)
        if how == "isolate":
            self._freeze(
                live_others, lambda: time.sleep(self.isolate_s), then=process.kill
            )  # before they wake
        elif how == "lag":
            preferred = next(r for r in states[partition].replicas if r in live_others)
            self._freeze(
                [preferred],
                lambda: seconds_until(
                    lambda: preferred not in describe(admin, self.topic)[partition].isr,
                    timeout=self.move_timeout_s,
                    what=f"frozen node {preferred} leaves the ISR of partition {partition}",
                    interval=0.2,
                ),
            )
            process.kill()
        elif how == "pause":
            self._signal(node, signal.SIGSTOP)
        else:
            process.kill()
        at = time.monotonic()
        moved_s = seconds_until(
            lambda: all(describe(admin, self.topic)[p].leader != node for p in led),
            timeout=self.move_timeout_s,
            what=f"the controller moves partitions {led} off node {node} ({how})",
            interval=0.2,
        )
        self.faults.append(Fault(how, node, partition, led, moved_s, at))

    def _signal(self, node: int, sig: int) -> None:
        process = self.cluster.storage_nodes[node]
        if process.is_running():
            os.kill(process.pid, sig)

    def _freeze(
        self, nodes: Sequence[int], hold: Callable[[], object], then: Callable[[], None] = lambda: None
    ) -> None:
        """SIGSTOP ``nodes``, ``hold`` (the fault's length), call ``then``, SIGCONT them."""
        self.down.update(nodes)
        try:
            for node in nodes:
                self._signal(node, signal.SIGSTOP)
            hold()
            then()
        finally:
            for node in nodes:
                self._signal(node, signal.SIGCONT)
            self.down.difference_update(nodes)


# ---- replicas on disk ----------------------------------------------------------------------------


class DiskBatch(NamedTuple):
    base_offset: int
    next_offset: int
    crc: int
    data: bytes


def high_watermarks(admin: Admin, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark (ListOffsets "latest")."""
    tps = {TopicPartition(topic, p): "latest" for p in range(partitions)}
    return {tp.partition: result.offset for tp, result in admin.list_offsets(tps).items()}


def disk_replicas(cluster: LocalCluster, partition: int, topic: str, nodes: Iterable[int]) -> dict:
    """Each node's batches of ``topic``-``partition``, read from its segment files."""
    return {
        node: replica_batches(cluster.data_dir / f"storage-{node}" / f"{topic}-{partition}") for node in nodes
    }


def logs_end_at_high_watermarks(
    cluster: LocalCluster, admin: Admin, topic: str, partitions: int, nodes: Iterable[int]
) -> bool:
    """Whether every replica's log ends exactly at its partition's high watermark."""
    for partition, hw in high_watermarks(admin, topic, partitions).items():
        for batches in disk_replicas(cluster, partition, topic, nodes).values():
            if (batches[-1].next_offset if batches else 0) != hw:
                return False
    return True


def replica_batches(partition_dir: Path) -> list[DiskBatch]:
    """Every whole batch of one replica's segment files, in offset order."""
    batches = []
    for segment in sorted(partition_dir.glob("*.log")):  # named by base offset, zero-padded
        for batch in iter_batches(segment.read_bytes(), allow_partial_tail=True):
            batches.append(DiskBatch(batch.base_offset, batch.next_offset, batch.crc, bytes(batch.buffer)))
    return batches


def check_replicas(partition: int, replicas: Mapping[int, list[DiskBatch]], high_watermark: int) -> list[str]:
    """The replicas hold the same batches, byte for byte, below the high watermark, and those
    batches cover every offset from 0 to the high watermark."""
    violations = []
    below = {
        node: [b for b in batches if b.base_offset < high_watermark] for node, batches in replicas.items()
    }
    for node, batches in below.items():
        expected = 0
        for batch in batches:
            if batch.base_offset != expected:
                violations.append(
                    f"p{partition} node {node}: batch at {batch.base_offset}, expected one at {expected}"
                )
                break
            expected = batch.next_offset
        if expected != high_watermark:
            violations.append(
                f"p{partition} node {node}: batches below the HW end at {expected}, HW {high_watermark}"
            )
    nodes = sorted(below)
    reference = below[nodes[0]]
    for node in nodes[1:]:
        for ours, theirs in zip(reference, below[node]):
            if ours != theirs:
                violations.append(
                    f"p{partition}: node {nodes[0]} and node {node} differ at batch {ours.base_offset}/"
                    f"{theirs.base_offset} (next {ours.next_offset}/{theirs.next_offset}, "
                    f"crc {ours.crc:#x}/{theirs.crc:#x})"
                )
                break
        if len(reference) != len(below[node]):
            violations.append(
                f"p{partition}: below the HW node {nodes[0]} has {len(reference)} batches, "
                f"node {node} {len(below[node])}"
            )
    return violations


# ---- checks over the history ---------------------------------------------------------------------


def check_dense(logs: Mapping[int, list[Seen]]) -> list[str]:
    """The final log of each partition holds each offset from 0 once, in order."""
    violations = []
    for partition, records in logs.items():
        for expected, record in enumerate(records):
            if record.offset != expected:
                violations.append(f"p{partition}: offset {record.offset} where {expected} was expected")
                break
    return violations


def check_acknowledged(acks: Iterable[Ack], logs: Mapping[int, list[Seen]]) -> list[str]:
    """Every acknowledged record is in the final log at the partition and offset it was
    acknowledged with, appended when it was acknowledged to be (a committed offset never changes
    hands, and its record is never replaced, not even by a copy of itself)."""
    where = _positions(logs)
    violations = []
    for ack in acks:
        value = record_value(ack.producer, ack.seq)
        found = _record_at(logs, ack.partition, ack.offset)
        if found is None or (found.value, found.timestamp) != (value, ack.timestamp):
            violations.append(
                f"{value!r} acknowledged at p{ack.partition}@{ack.offset} (appended at {ack.timestamp}): "
                f"{_describe_slot(found, logs, ack.partition)}; {_copies(where, value)}"
            )
    return violations


def _record_at(logs: Mapping[int, list[Seen]], partition: int, offset: int) -> Seen | None:
    records = logs.get(partition, [])
    return records[offset] if 0 <= offset < len(records) else None


def _describe_slot(found: Seen | None, logs: Mapping[int, list[Seen]], partition: int) -> str:
    if found is None:
        return f"the final log ends at {len(logs.get(partition, []))}"
    return f"the final log has {found.value!r} appended at {found.timestamp} there"


def _positions(logs: Mapping[int, list[Seen]]) -> dict[bytes, list[str]]:
    where: dict[bytes, list[str]] = defaultdict(list)
    for records in logs.values():
        for r in records:
            where[r.value].append(f"p{r.partition}@{r.offset}")
    return where


def _copies(where: Mapping[bytes, list[str]], value: bytes) -> str:
    places = where.get(value)
    return f"copies at {', '.join(places)}" if places else "no copy anywhere in the final log"


def check_sent_partitions(acks: Iterable[Ack], sent: Mapping[bytes, int]) -> list[str]:
    """Every acknowledgement names the partition the record was sent to."""
    violations = []
    for ack in acks:
        value = record_value(ack.producer, ack.seq)
        if sent[value] != ack.partition:
            violations.append(f"{value!r} sent to p{sent[value]}, acknowledged on p{ack.partition}")
    return violations


def check_order(acks: Iterable[Ack]) -> list[str]:
    """One producer's acknowledged records to one partition have increasing offsets, in the order
    they were sent and in the order they were acknowledged (``acks`` is in acknowledgement order)."""
    violations = []
    last: dict[tuple[int, int], Ack] = {}
    for ack in acks:
        key = (ack.producer, ack.partition)
        before = last.get(key)
        if before is not None and not (ack.seq > before.seq and ack.offset > before.offset):
            violations.append(
                f"producer {ack.producer} p{ack.partition}: seq {ack.seq} at offset {ack.offset} "
                f"acknowledged after seq {before.seq} at offset {before.offset}"
            )
        last[key] = ack
    return violations


def check_known(logs: Mapping[int, list[Seen]], sent: Mapping[bytes, int]) -> list[str]:
    """The final log holds only records that were sent, each in the partition it was sent to."""
    violations = []
    for partition, records in logs.items():
        for record in records:
            target = sent.get(record.value)
            if target != partition:
                what = "never sent" if target is None else f"sent to p{target}"
                violations.append(f"p{partition}@{record.offset}: {record.value!r} ({what})")
    return violations


def duplicates(logs: Mapping[int, list[Seen]]) -> int:
    """Extra copies of records in the final log (at-least-once until idempotence lands)."""
    counts = Counter(r.value for records in logs.values() for r in records)
    return sum(n - 1 for n in counts.values() if n > 1)


def check_consumer(seen: Iterable[Seen], logs: Mapping[int, list[Seen]]) -> list[str]:
    """Everything the consumer was handed is in the final log: the same record, appended at the
    same time, at the same offset (a read above the high watermark, of a record truncated later,
    would be handed a record that is not -- even if a retry appended it again)."""
    violations = []
    for record in seen:
        found = _record_at(logs, record.partition, record.offset)
        if found != record:
            violations.append(
                f"consumer got {record.value!r} appended at {record.timestamp} at "
                f"p{record.partition}@{record.offset}: {_describe_slot(found, logs, record.partition)}"
            )
    return violations


def check_consumer_saw_everything(seen: Iterable[Seen], logs: Mapping[int, list[Seen]]) -> list[str]:
    """The consumer running throughout was handed every offset of the final log."""
    offsets: dict[int, set[int]] = defaultdict(set)
    for record in seen:
        offsets[record.partition].add(record.offset)
    violations = []
    for partition, records in logs.items():
        missing = len(records) - len(offsets[partition] & set(range(len(records))))
        if missing:
            violations.append(f"p{partition}: the consumer never got {missing} of the {len(records)} offsets")
    return violations
