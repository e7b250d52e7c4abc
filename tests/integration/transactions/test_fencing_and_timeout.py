"""Zombie fencing and transaction timeouts, with the SDK against a real cluster.

* A producer that lost its transactional id to a newer instance (``init_transactions`` with the
  same id) is a zombie: its sends fail, its commit fails as fenced, and nothing it wrote in the
  transaction that was open -- before or after the takeover -- is ever read_committed. Once with
  two producers in this process, once with two real application processes (the first frozen with
  SIGSTOP mid-transaction, replaced, then resumed).
* A transaction left open (its producer hangs) is aborted by the coordinator after its
  ``transaction_timeout_ms``, not before: the last stable offset, stuck at its first record
  while it is open, moves to the high watermark, read_committed readers move past it to the
  records committed behind it, and its producer is fenced. Once with a producer in this process
  that never commits, once with an application process frozen with SIGSTOP mid-transaction:
  when it wakes it is fenced, and a successor finishes the input exactly once.

Real processes: a LocalCluster of etcd, a coordinator (checking for timed-out transactions every
200 ms), 3 storage nodes and a gateway; topics RF 3 with ``min.insync.replicas=2``.
"""

from __future__ import annotations

import signal
import time

import pytest

from gateway.client import Admin, NewTopic, Producer
from gateway.client.errors import IllegalStateError, TributaryError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import errors
from tests.integration.transactions._eos import (
    AppProcess,
    end_offsets,
    full_isr,
    markers_on_disk,
    read_topic,
    wait_until,
)
from tests.integration.transactions._eos_app import SUFFIX

REPLICAS = 3
PARTITIONS = 2
ABORT_CHECK_MS = 200
FENCING_ERRORS = (errors.ProducerFencedError, errors.InvalidProducerEpochError)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(
        storage_nodes=3,
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        coordinator_args=["--transaction-abort-check-interval-ms", str(ABORT_CHECK_MS)],
    )
    local = LocalCluster(tmp_path_factory.mktemp("fencing") / "cluster", spec)
    try:
        local.start()
        yield local
    finally:
        for node in local.storage_nodes.values():
            node.signal(signal.SIGCONT)
        local.stop()


@pytest.fixture(scope="module")
def admin(cluster):
    with Admin(servers=cluster.gateway) as client:
        yield client


def new_topics(admin: Admin, *names: str, partitions: int = PARTITIONS) -> None:
    admin.create_topics(
        [NewTopic(name, partitions, REPLICAS, {"min.insync.replicas": "2"}) for name in names]
    )
    wait_until(lambda: full_isr(admin, names, REPLICAS), 30, f"{names} online with full ISRs")


def fenced(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the producer was fenced (itself, or what caused it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, FENCING_ERRORS):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def values(records) -> list[bytes]:
    return [r.value for records_ in records.values() for r in records_]


# ---- zombie fencing ----------------------------------------------------------------------------


def test_a_zombie_producer_is_fenced_and_nothing_it_wrote_in_the_open_transaction_is_committed(
    cluster: LocalCluster, admin: Admin
):
    topic = "zombie-sdk"
    new_topics(admin, topic)
    servers = cluster.gateway
    with Producer(servers=servers, transactional_id="zombie-sdk") as old:
        old.init_transactions()
        old.begin_transaction()
        before = [old.send(topic, b"old-before-%d" % i, partition=0) for i in range(5)]
        old.flush(30)
        assert all(f.get(0).offset >= 0 for f in before), "the zombie's first records are written"

        with Producer(servers=servers, transactional_id="zombie-sdk") as new:
            new.init_transactions()  # fences `old` and aborts its open transaction

            # The zombie goes on: to a partition of its transaction (the leader refuses its epoch)
            # and to a new one (the coordinator refuses to add it).
            after = [
                old.send(topic, b"old-after-0", partition=0),
                old.send(topic, b"old-after-1", partition=1),
            ]
            for future in after:
                with pytest.raises(TributaryError) as failure:
                    future.get(30)
                assert fenced(failure.value), f"a zombie's send failed with {failure.value!r}, not as fenced"
            with pytest.raises((TributaryError, IllegalStateError)) as refused:
                old.commit_transaction(30)
            assert fenced(refused.value), (
                f"the zombie's commit_transaction raised {type(refused.value).__name__}: {refused.value} "
                "-- not ProducerFencedError, nor caused by it: an application cannot tell it was fenced"
            )

            new.begin_transaction()
            for i in range(5):
                new.send(topic, b"new-%d" % i, partition=i % PARTITIONS)
            new.commit_transaction(30)

    committed = read_topic(servers, topic, PARTITIONS, isolation_level="read_committed", timeout_s=30)
    uncommitted = read_topic(servers, topic, PARTITIONS, isolation_level="read_uncommitted", timeout_s=30)
    assert sorted(values(committed)) == [b"new-%d" % i for i in range(5)]
    assert not [v for v in values(uncommitted) if v.startswith(b"old-after")], (
        "a fenced write reached the log"
    )
    assert sorted(v for v in values(uncommitted) if v.startswith(b"old-before")) == [
        b"old-before-%d" % i for i in range(5)
    ], "the zombie's records are in the log, aborted"
    stable, high = (end_offsets(admin, topic, PARTITIONS, committed=c) for c in (True, False))
    assert stable == high, "a transaction is still open"


def test_a_frozen_application_instance_replaced_by_a_new_one_cannot_commit_when_it_wakes(
    cluster: LocalCluster, admin: Admin, tmp_path
):
    source, sink, group = "zombie-in", "zombie-out", "zombie-app"
    new_topics(admin, source, sink)
    records = 3_000
    with Producer(servers=cluster.gateway) as producer:
        for i in range(records):
            producer.send(source, b"%d" % i, partition=i % PARTITIONS)
        producer.flush(30)
    common = [
        "--servers", cluster.gateway, "--input", source, "--output", sink, "--group", group,
        "--transactional-id", "zombie-app", "--instance-id", "zombie-app-0",
        "--polls-per-txn", "3", "--max-records", "20", "--pause-ms", "50",
    ]  # fmt: skip
    log_file = tmp_path / "apps.log"
    zombie = AppProcess([*common, "--tag", "zombie"], log_file)
    successor: AppProcess | None = None
    try:
        # Freeze the first instance with records of its second transaction sent (one committed).
        assert zombie.wait_for(lambda line: line.words[:2] == ("sent", "2"), 0, 60) is not None
        zombie.popen.send_signal(signal.SIGSTOP)
        frozen_at = len(zombie.lines)
        committed_by_zombie = {int(line.words[1]) for line in zombie.lines if line.event == "committed"}

        successor = AppProcess([*common, "--pause-ms", "0", "--tag", "successor"], log_file)
        wait_until(
            lambda: (
                {tp.partition: o.offset for tp, o in admin.list_consumer_group_offsets(group).items()}
                == end_offsets(admin, source, PARTITIONS)
            ),
            60,
            "the successor processes the whole input",
        )
        zombie.popen.send_signal(signal.SIGCONT)
        status = zombie.wait_exit(60)
        after_wake = zombie.lines[frozen_at:]
        successor.stop()
    finally:
        zombie.popen.send_signal(signal.SIGCONT)
        zombie.stop()
        if successor is not None:
            successor.stop()

    woke = [line.words for line in after_wake]
    print(f"\nzombie: committed {sorted(committed_by_zombie)} before it was frozen; after waking: {woke}")
    assert not [line for line in after_wake if line.event == "committed"], f"the zombie committed: {woke}"
    assert status == 4 and woke and woke[-1][0] == "fenced", (
        f"the zombie did not stop as fenced (status {status}): {woke}"
    )
    committed = read_topic(cluster.gateway, sink, PARTITIONS, isolation_level="read_committed", timeout_s=30)
    for partition, found in committed.items():
        expected = [b"%d" % i + SUFFIX for i in range(partition, records, PARTITIONS)]
        got = [r.value for r in found]
        assert got == expected, f"p{partition}: not the transformed input once each, in order"
        by_zombie = {int(r.header("txn") or -1) for r in found if r.header("writer") == b"zombie"}
        assert by_zombie <= committed_by_zombie, (
            f"p{partition}: records of the zombie's transactions {sorted(by_zombie - committed_by_zombie)} "
            f"are committed; it committed only {sorted(committed_by_zombie)} before it was frozen"
        )
    stable, high = (end_offsets(admin, sink, PARTITIONS, committed=c) for c in (True, False))
    assert stable == high, "a transaction is still open"


# ---- transaction timeout -----------------------------------------------------------------------


def test_a_transaction_left_open_is_aborted_after_its_timeout_and_readers_move_past_it(
    cluster: LocalCluster, admin: Admin
):
    topic = "hung"
    new_topics(admin, topic, partitions=1)
    timeout_ms = 2_000
    servers = cluster.gateway
    with Producer(servers=servers, transactional_id="hung", transaction_timeout_ms=timeout_ms) as hung:
        hung.init_transactions()
        hung.begin_transaction()
        opened = time.monotonic()
        first = hung.send(topic, b"hung-0", partition=0)
        for i in range(1, 10):
            hung.send(topic, b"hung-%d" % i, partition=0)
        hung.flush(30)
        first_offset = first.get(0).offset
        # Records committed behind the open transaction: read_committed must not pass it yet.
        with Producer(servers=servers) as plain:
            for i in range(5):
                plain.send(topic, b"plain-%d" % i, partition=0)
            plain.flush(30)
        high = end_offsets(admin, topic, 1)[0]
        stable = end_offsets(admin, topic, 1, committed=True)[0]
        still_open = time.monotonic() - opened < timeout_ms / 1000
        assert stable == first_offset and high == first_offset + 15, (
            f"while the transaction is open the last stable offset is its first offset {first_offset} "
            f"(got {stable}, high watermark {high})"
        )
        assert still_open, "the setup took longer than the timeout: the check above proved nothing"

        # The producer now hangs: it never commits. The coordinator aborts the transaction.
        aborted_s = wait_until(
            lambda: (
                end_offsets(admin, topic, 1, committed=True)[0] > first_offset and time.monotonic() - opened
            ),
            timeout_ms / 1000 + 15,
            "the coordinator aborts the timed-out transaction",
            interval_s=0.05,
        )
        assert aborted_s >= timeout_ms / 1000, (
            f"aborted after {aborted_s:.2f} s, before its {timeout_ms} ms timeout"
        )
        stable, high = end_offsets(admin, topic, 1, committed=True)[0], end_offsets(admin, topic, 1)[0]
        assert stable == high, f"the last stable offset {stable} did not reach the high watermark {high}"
        committed = read_topic(servers, topic, 1, isolation_level="read_committed", timeout_s=30)
        assert values(committed) == [b"plain-%d" % i for i in range(5)], (
            "readers move past the aborted records"
        )

        # The hung producer wakes up: its transaction is gone and it is fenced.
        with pytest.raises((TributaryError, IllegalStateError)) as refused:
            hung.commit_transaction(30)
        assert fenced(refused.value), f"commit after the timeout raised {refused.value!r}, not as fenced"

    markers = markers_on_disk({0: cluster.data_dir / "storage-0" / f"{topic}-0"})
    assert [m.commit for m in markers] == [False], (
        f"one ABORT marker for the timed-out transaction: {markers}"
    )
    assert markers[0].offset == first_offset + 15
    uncommitted = read_topic(servers, topic, 1, isolation_level="read_uncommitted", timeout_s=30)
    assert values(uncommitted)[:10] == [b"hung-%d" % i for i in range(10)]


def test_a_frozen_application_s_transaction_is_aborted_after_its_timeout_and_a_successor_finishes(
    cluster: LocalCluster, admin: Admin, tmp_path
):
    source, sink, group = "frozen-in", "frozen-out", "frozen-app"
    new_topics(admin, source, sink)
    records = 2_000
    with Producer(servers=cluster.gateway) as producer:
        for i in range(records):
            producer.send(source, b"%d" % i, partition=i % PARTITIONS)
        producer.flush(30)
    timeout_ms = 2_000
    common = [
        "--servers", cluster.gateway, "--input", source, "--output", sink, "--group", group,
        "--transactional-id", "frozen-app", "--instance-id", "frozen-app-0",
        "--transaction-timeout-ms", str(timeout_ms),
    ]  # fmt: skip
    log_file = tmp_path / "apps.log"
    app = AppProcess([*common, "--polls-per-txn", "4", "--max-records", "10", "--pause-ms", "60"], log_file)
    successor: AppProcess | None = None

    def open_transaction_with_records() -> bool:
        stable, high = (end_offsets(admin, sink, PARTITIONS, committed=c) for c in (True, False))
        return stable != high

    def transaction():
        (described,) = admin.describe_transactions(["frozen-app"])
        return described

    try:
        # Freeze it while a transaction of it holds records in the output (LSO below the HW) and
        # is still Ongoing: frozen after it asked to commit, the commit completes without it (the
        # LSO reaches the HW with no abort at all). It may commit between the look and the
        # SIGSTOP: then look again (a few tries). Asked twice, so an EndTxn already on its way
        # when the application stopped has landed by the second answer.
        for _attempt in range(5):
            wait_until(open_transaction_with_records, 30, "a transaction with records open", interval_s=0.01)
            app.popen.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            frozen = transaction()
            if (
                frozen.state == "Ongoing"
                and transaction().state == "Ongoing"
                and open_transaction_with_records()
            ):
                break
            app.popen.send_signal(signal.SIGCONT)
        else:
            raise AssertionError("never froze the application inside a transaction")
        frozen_lines = len(app.lines)
        # Aborted by the coordinator for its timeout: the epoch moves on (the frozen instance is
        # fenced) and the transaction's records are no longer held open.
        aborted_s = wait_until(
            lambda: (
                transaction().producer_epoch > frozen.producer_epoch
                and not open_transaction_with_records()
                and time.monotonic() - frozen_at
            ),
            timeout_ms / 1000 + 15,
            "the coordinator aborts the frozen application's transaction",
            interval_s=0.05,
        )
        committed_offsets = {
            tp.partition: o.offset for tp, o in admin.list_consumer_group_offsets(group).items()
        }
        app.popen.send_signal(signal.SIGCONT)
        status = app.wait_exit(60)
        woke = [line.words for line in app.lines[frozen_lines:]]
        print(f"\nfrozen application: aborted {aborted_s:.1f} s after the freeze; after waking: {woke}")
        assert status == 4 and woke[-1][0] == "fenced", f"the application woke up and was not fenced: {woke}"
        assert "committed" not in [words[0] for words in woke]

        successor = AppProcess([*common, "--pause-ms", "0", "--max-records", "500"], log_file)
        wait_until(
            lambda: (
                {tp.partition: o.offset for tp, o in admin.list_consumer_group_offsets(group).items()}
                == end_offsets(admin, source, PARTITIONS)
            ),
            60,
            "the successor processes the rest of the input",
        )
    finally:
        app.popen.send_signal(signal.SIGCONT)
        app.stop()
        if successor is not None:
            successor.stop()

    assert sum(committed_offsets.values()) < records, "the input was all processed before the freeze"
    committed = read_topic(cluster.gateway, sink, PARTITIONS, isolation_level="read_committed", timeout_s=30)
    for partition, found in committed.items():
        expected = [b"%d" % i + SUFFIX for i in range(partition, records, PARTITIONS)]
        assert [r.value for r in found] == expected, f"p{partition}: not the transformed input once each"
    stable, high = (end_offsets(admin, sink, PARTITIONS, committed=c) for c in (True, False))
    assert stable == high, "a transaction is still open"
