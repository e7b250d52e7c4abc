"""Exactly-once consume-transform-produce under chaos, Jepsen style.

A real application process (``_eos_app.py``) reads a 3-partition input topic of 20,000 numbered
records in a consumer group (read_committed, static membership), writes ``value + b":out"`` of
each to the same partition of an output topic, and commits the consumed offsets in the same
transaction. The test kill -9s it 20 times at seeded points -- while it has records of an open
transaction sent, while it commits, right after a commit, right after it starts -- restarting it
each time with the same transactional id. In the same loop, six times, at the moment the
application starts to commit (or has records of a transaction sent) the cluster is hit: the leader
of an output partition killed -9 (twice) or frozen with SIGSTOP past its lease, the gateway killed
-9, the active coordinator killed -9 or frozen past its lease (a deposed controller that wakes up)
-- and the application is killed a little later, while the cluster fails over. A read_committed
reader follows the output topic throughout. Then:

* read_committed, each output partition holds exactly the transformed input partition, in order:
  no record lost, none twice;
* the group's committed offsets are the input's end offsets;
* no transaction is left open on the output (last stable offset = high watermark);
* the reader that ran throughout was only ever handed a prefix of that final output (never a
  record of an aborted transaction, never a record out of place);
* the kills did land inside open transactions: the application was killed with records of an
  open transaction sent several times, the output holds ABORT markers of several transactions,
  and a read_uncommitted reader sees their records (duplicates of committed ones, and nothing
  else).

Real processes: a LocalCluster of etcd, 2 coordinators, 3 storage nodes and a gateway; both
topics RF 3 with ``min.insync.replicas=2``.
"""

from __future__ import annotations

import os
import random
import threading
import time
import traceback
from collections import Counter

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests.integration.transactions._eos import (
    AppProcess,
    ClusterFaults,
    Line,
    Read,
    end_offsets,
    full_isr,
    in_open_transaction,
    markers_on_disk,
    quote,
    read_topic,
    wait_until,
)

#: The run's randomness (kill points, jitter, which leader); another run: EOS_CHAOS_SEED=<n>.
SEED = int(os.environ.get("EOS_CHAOS_SEED", "20250214"))
INPUT, OUTPUT, GROUP, TRANSACTIONAL_ID = "eos-in", "eos-out", "eos-app", "eos-app-0"
PARTITIONS = 3
REPLICAS = 3
RECORDS = 20_000
SESSION_TIMEOUT_S = 2
TOPIC_CONFIGS = {"min.insync.replicas": "2"}

APP_KILLS = 20
#: Cluster faults: during app run N (0-based), when the app says the given line (its first one of
#: that kind), the fault starts in the background; the app is then killed at its own trigger,
#: counted from there -- so it dies while the cluster is failing over, and its successor starts
#: then. "committing": EndTxn under way (markers to write to a leader that is going away, a
#: decision the next controller must finish). One cluster fault at a time.
CLUSTER_FAULTS = {
    2: ("leader-kill", "committing"),
    5: ("gateway-kill", "committing"),
    8: ("coordinator-kill", "committing"),
    11: ("leader-pause", "sent"),
    14: ("coordinator-pause", "committing"),
    17: ("leader-kill", "sent"),
}
#: Where an app run is killed: on the k-th line of this kind it says (k drawn from the range).
TRIGGERS = (
    ("sent", (1, 7), 0.55),  # records of an open transaction handed to send()
    ("committing", (1, 3), 0.25),  # commit_transaction() under way
    ("committed", (1, 3), 0.1),  # just after a commit
    ("ready", (1, 1), 0.1),  # before its first transaction
)
#: The application's pace while it is being killed (a transaction: 3 polls of 40 records, 40 ms
#: apart) and once the faults are over (as fast as it goes).
FAULT_PACE = ["--polls-per-txn", "3", "--max-records", "40", "--pause-ms", "40"]
FINAL_PACE = ["--polls-per-txn", "2", "--max-records", "500", "--pause-ms", "0"]
#: Bounds: one app run reaching its kill point (a coordinator failover stalls it a few seconds),
#: the cluster faults, the final run to the end of the input, the final reads.
TRIGGER_TIMEOUT_S = 45
FAULTS_TIMEOUT_S = 90
FINISH_TIMEOUT_S = 90
READ_TIMEOUT_S = 60


@pytest.fixture
def cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=3,
        coordinators=2,
        gateways=1,
        session_timeout_s=SESSION_TIMEOUT_S,
        storage_args=["--replica-lag-time-max-ms", "1500", "--replica-fetch-backoff-ms", "200"],
    )
    local = LocalCluster(tmp_path / "cluster", spec)
    try:
        local.start()
        yield local
    finally:
        local.stop()


def expected_output(partition: int) -> list[bytes]:
    return [b"%d:out" % i for i in range(partition, RECORDS, PARTITIONS)]


class CommittedReader(threading.Thread):
    """Reads the output topic read_committed from the beginning until stopped, keeping what it
    was handed, while the faults go on."""

    def __init__(self, servers: str) -> None:
        super().__init__(name="eos-committed-reader", daemon=True)
        self.servers = servers
        self.seen: dict[int, list[Read]] = {p: [] for p in range(PARTITIONS)}
        self.poll_errors: Counter[str] = Counter()
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            with Consumer(
                servers=self.servers,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                isolation_level="read_committed",
                fetch_max_wait_ms=200,
            ) as consumer:
                consumer.assign([TopicPartition(OUTPUT, p) for p in range(PARTITIONS)])
                while not self._halt.is_set():
                    try:
                        polled = consumer.poll(timeout_ms=200)
                    except TributaryError as exc:  # a leader going away: keep reading
                        self.poll_errors[type(exc).__name__] += 1
                        continue
                    with self._lock:
                        for tp, records in polled.items():
                            self.seen[tp.partition].extend(map(Read.of, records))
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def count(self, partition: int) -> int:
        with self._lock:
            return len(self.seen[partition])

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class FaultRunner:
    """Runs one cluster fault at a time in the background (the app kills go on meanwhile)."""

    def __init__(self, faults: ClusterFaults, rng: random.Random) -> None:
        self.faults = faults
        self.rng = rng
        self.errors: list[BaseException] = []
        self._thread: threading.Thread | None = None

    def start(self, kind: str) -> None:
        self.join(FAULTS_TIMEOUT_S)
        self._thread = threading.Thread(target=self._run, args=(kind,), name=f"eos-{kind}", daemon=True)
        self._thread.start()

    def _run(self, kind: str) -> None:
        try:
            if kind == "coordinator-kill":
                self.faults.coordinator_kill()
            elif kind == "coordinator-pause":
                self.faults.coordinator_pause()
            elif kind == "gateway-kill":
                self.faults.gateway_kill()
            else:  # the leader of an output partition: the one markers and new records go to
                self.faults.leader(
                    kind, lambda tps: self.rng.choice([tp for tp in tps if tp.topic == OUTPUT])
                )
        except BaseException as exc:  # noqa: BLE001 -- reported by the test (with its traceback)
            self.errors.append(exc)

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
            assert not self._thread.is_alive(), f"{self._thread.name} did not finish in {timeout_s:.0f} s"


def pre_produce(servers: str) -> None:
    with Producer(servers=servers, linger_ms=20) as producer:
        for i in range(RECORDS):
            producer.send(INPUT, b"%d" % i, partition=i % PARTITIONS)
        producer.flush(60)


def committed_offsets(admin: Admin) -> dict[int, int]:
    found = admin.list_consumer_group_offsets(GROUP, [TopicPartition(INPUT, p) for p in range(PARTITIONS)])
    return {tp.partition: meta.offset for tp, meta in found.items()}


def check_output(committed: dict[int, list[Read]]) -> list[str]:
    """Each output partition is exactly its transformed input partition, in order."""
    violations = []
    for partition, records in committed.items():
        got = [r.value for r in records]
        expected = expected_output(partition)
        if got == expected:
            continue
        counts = Counter(got)
        twice = sorted((v for v, n in counts.items() if n > 1), key=lambda v: int(v.split(b":")[0]))
        missing = sorted(set(expected) - set(got), key=lambda v: int(v.split(b":")[0]))
        unknown = sorted(set(got) - set(expected))
        first_off = next(
            (i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected))
        )
        where = records[first_off].offset if first_off < len(records) else "end"
        violations.append(
            f"p{partition}: {len(got)} records, {len(expected)} expected; first difference at index "
            f"{first_off} (offset {where}): got {got[first_off : first_off + 3]}, expected "
            f"{expected[first_off : first_off + 3]}; {len(twice)} more than once {twice[:5]}, "
            f"{len(missing)} missing {missing[:5]}, {len(unknown)} never input {unknown[:5]}"
        )
    return violations


def check_reader(seen: dict[int, list[Read]], committed: dict[int, list[Read]]) -> list[str]:
    """What the reader got during the faults is a prefix of the final committed output."""
    violations = []
    for partition, records in seen.items():
        final = committed[partition]
        for index, record in enumerate(records):
            if index >= len(final) or final[index] != record:
                there = final[index] if index < len(final) else "nothing"
                violations.append(
                    f"p{partition}: the reader's record #{index} was {record}, the final output has {there}"
                )
                break
    return violations


def check_aborted(
    uncommitted: dict[int, list[Read]], committed: dict[int, list[Read]]
) -> tuple[list[str], int]:
    """read_uncommitted holds the committed records plus records of aborted transactions, each a
    copy of an input's output (nothing else); how many extra records it holds."""
    violations = []
    extra = 0
    for partition, records in uncommitted.items():
        expected = set(expected_output(partition))
        committed_offsets_ = {r.offset for r in committed[partition]}
        for record in records:
            if record.value not in expected:
                violations.append(f"p{partition}@{record.offset}: {record.value!r} is no output of the input")
            if record.offset not in committed_offsets_:
                extra += 1
        missing = committed_offsets_ - {r.offset for r in records}
        if missing:
            violations.append(
                f"p{partition}: read_uncommitted misses committed offsets {sorted(missing)[:5]}"
            )
    return violations, extra


def pick_trigger(rng: random.Random) -> tuple[str, int]:
    kinds = [kind for kind, _, _ in TRIGGERS]
    weights = [weight for _, _, weight in TRIGGERS]
    kind = rng.choices(kinds, weights)[0]
    low, high = next(span for k, span, _ in TRIGGERS if k == kind)
    return kind, rng.randint(low, high)


def test_consume_transform_produce_is_exactly_once_under_kills(cluster: LocalCluster, tmp_path):
    started = time.monotonic()
    rng = random.Random(SEED)
    print(f"\nseed {SEED}")
    admin = Admin(servers=cluster.gateway)
    admin.create_topics([NewTopic(t, PARTITIONS, REPLICAS, dict(TOPIC_CONFIGS)) for t in (INPUT, OUTPUT)])
    wait_until(lambda: full_isr(admin, [INPUT, OUTPUT], REPLICAS), 30, "both topics online with full ISRs")
    pre_produce(cluster.gateway)
    input_end = end_offsets(admin, INPUT, PARTITIONS)
    assert sum(input_end.values()) == RECORDS

    app_args = [
        "--servers", cluster.gateway, "--input", INPUT, "--output", OUTPUT, "--group", GROUP,
        "--transactional-id", TRANSACTIONAL_ID, "--instance-id", "eos-app-instance-0",
    ]  # fmt: skip
    app_log = tmp_path / "app.log"
    faults = ClusterFaults(cluster, Admin(servers=cluster.gateway), [INPUT, OUTPUT], REPLICAS)
    runner = FaultRunner(faults, rng)
    reader = CommittedReader(cluster.gateway)
    reader.start()

    kills: list[tuple[str, int, Line | None]] = []  # trigger, k, last line before death
    faults_started: set[int] = set()
    unexpected_exits: list[tuple[int | None, Line | None]] = []
    app: AppProcess | None = None
    try:
        while len(kills) < APP_KILLS:
            run = len(kills)
            app = AppProcess([*app_args, *FAULT_PACE], app_log)
            start: int | None = 0
            planned = CLUSTER_FAULTS.get(run)
            if planned is not None and run not in faults_started:
                fault, when = planned
                start = app.nth(when, 1, 0, TRIGGER_TIMEOUT_S)
                if start is not None:
                    runner.start(fault)
                    faults_started.add(run)
            kind, k = pick_trigger(rng)
            if start and kind == "ready":  # already said: the next transaction's start instead
                kind, k = "begin", 1
            at = app.nth(kind, k, start, TRIGGER_TIMEOUT_S) if start is not None else None
            if at is None:  # it ended on its own before its kill point: a crash, counted
                app.stop()
                unexpected_exits.append((app.exited, app.lines[-1] if app.lines else None))
                assert len(unexpected_exits) <= 5, f"the application keeps failing: {unexpected_exits}"
                continue
            time.sleep(rng.uniform(0, 0.03))  # jitter: the kill lands a little after the line
            kills.append((kind, k, app.kill()))
        runner.join(FAULTS_TIMEOUT_S)
        faults_over_at = time.monotonic()
        progress = committed_offsets(admin)

        app = AppProcess([*app_args, *FINAL_PACE], app_log)
        wait_until(
            lambda: committed_offsets(admin) == input_end, FINISH_TIMEOUT_S, "the input is all processed"
        )
        finished_at = time.monotonic()
        app.stop()
        output_end = end_offsets(admin, OUTPUT, PARTITIONS)
        stable_end = end_offsets(admin, OUTPUT, PARTITIONS, committed=True)
        committed = read_topic(
            cluster.gateway, OUTPUT, PARTITIONS, isolation_level="read_committed", timeout_s=READ_TIMEOUT_S
        )
        uncommitted = read_topic(
            cluster.gateway, OUTPUT, PARTITIONS, isolation_level="read_uncommitted", timeout_s=READ_TIMEOUT_S
        )
        wait_until(
            lambda: all(reader.count(p) >= len(committed[p]) for p in range(PARTITIONS)),
            READ_TIMEOUT_S,
            "the reader running throughout reaches the end of the output",
        )
    finally:
        if app is not None:
            app.stop()
        faults.resume_all()
        reader.stop()
        faults.admin.close()

    markers = markers_on_disk(
        {p: cluster.data_dir / "storage-0" / f"{OUTPUT}-{p}" for p in range(PARTITIONS)}
    )
    aborted_txns = {(m.producer_id, m.producer_epoch) for m in markers if not m.commit}
    committed_txns = {(m.producer_id, m.producer_epoch) for m in markers if m.commit}
    aborted_violations, extra = check_aborted(uncommitted, committed)
    killed_in_txn = sum(1 for _, _, last in kills if in_open_transaction(last))
    summary = {
        "seed": SEED,
        "app_kills": len(kills),
        "kill_points": dict(Counter(last.event if last else "nothing" for _, _, last in kills)),
        "killed_in_open_transaction": killed_in_txn,
        "unexpected_exits": [(code, last.words if last else None) for code, last in unexpected_exits],
        "cluster_faults": [f"{f.kind} {f.target} replaced in {f.moved_s:.1f} s" for f in faults.done],
        "input_committed_when_faults_ended": progress,
        "abort_markers": sum(1 for m in markers if not m.commit),
        "aborted_transactions": len(aborted_txns),
        "committed_transactions_with_markers": len(committed_txns),
        "read_uncommitted_extra_records": extra,
        "output_high_watermarks": output_end,
        "output_last_stable_offsets": stable_end,
        "reader_poll_errors": dict(reader.poll_errors),
        "faults_s": round(faults_over_at - started, 1),
        "finish_s": round(finished_at - faults_over_at, 1),
        "total_s": round(time.monotonic() - started, 1),
    }
    print(f"exactly-once summary: {summary}")

    assert reader.error is None, f"the reader failed: {reader.error!r}"
    failures = "".join("".join(traceback.format_exception(error)) for error in runner.errors)
    assert not runner.errors, f"a cluster fault failed: {runner.errors!r}\n{failures}summary: {summary}"
    checks = {
        "read_committed output = transformed input, once each, in order": check_output(committed),
        "the reader during the faults got a prefix of the final output": check_reader(reader.seen, committed),
        "read_uncommitted = committed + copies from aborted transactions": aborted_violations,
        "no transaction left open (LSO = HW)": [
            f"p{p}: last stable offset {stable_end[p]}, high watermark {output_end[p]}"
            for p in range(PARTITIONS)
            if stable_end[p] != output_end[p]
        ],
    }
    broken = {name: v for name, v in checks.items() if v}
    assert not broken, (
        "\n".join(f"{name}: {quote(v)}" for name, v in broken.items()) + f"\nsummary: {summary}"
    )
    assert committed_offsets(admin) == input_end, f"group offsets are not the input's end: {summary}"
    admin.close()

    # The run must have been chaotic where it matters: kills inside open transactions, whose
    # records the log holds as aborted, and every cluster fault done while input remained.
    assert len(kills) == APP_KILLS
    assert killed_in_txn >= 5, f"too few kills inside an open transaction: {summary}"
    assert len(aborted_txns) >= 3 and extra > 0, f"no sign of aborted transactions in the output: {summary}"
    assert len(faults.done) == len(CLUSTER_FAULTS), f"not every cluster fault was done: {summary}"
    assert sum(progress.values()) < RECORDS, f"the input was all processed before the faults ended: {summary}"
