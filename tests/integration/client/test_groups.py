"""Consumer groups through the SDK against real processes: assignment, cooperative and eager
rebalances seen by the listeners, a member killed with -9 (no record lost across the hand-off),
a static member restarting without a rebalance, commits, close() leaving at once, wakeup(), and
the admin client's group calls.

Sessions are the coordinator's minimum (6 s); heartbeats every 0.5 s keep rebalances quick.
Members run on threads of their own (one consumer per thread, as Kafka wants), except those the
test kills: they are processes (``group_member.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from gateway.client import (
    Consumer,
    NewTopic,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
    WakeupError,
)
from gateway.client.errors import GroupIdNotFoundError, NonEmptyGroupError
from tests.support.names import unique
from tests.support.wait import wait_until

SESSION_MS = 6000
HEARTBEAT_MS = 500
FAST = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": HEARTBEAT_MS}
MEMBER_SCRIPT = Path(__file__).with_name("group_member.py")
REPO = Path(__file__).resolve().parents[3]


class Member:
    """A group consumer polling on its own thread; records listener calls (with the thread they
    ran on) and what it consumed. ``stop()`` closes the consumer on that same thread."""

    def __init__(self, servers: str, group: str, topics: list[str], name: str, **settings) -> None:
        self.name = name
        self.events: list[tuple[str, frozenset, str, float]] = []
        self.owned: set[TopicPartition] = set()
        self.records: list = []
        self.error: BaseException | None = None
        self.close_seconds: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumer = Consumer(
            servers=servers,
            group_id=group,
            client_id=name,
            auto_offset_reset="earliest",
            **{**FAST, **settings},
        )
        self.consumer.subscribe(topics, listener=self)
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _event(self, kind: str, partitions) -> None:
        with self._lock:
            self.events.append(
                (kind, frozenset(partitions), threading.current_thread().name, time.monotonic())
            )
            if kind == "assigned":
                self.owned |= set(partitions)
            else:
                self.owned -= set(partitions)

    def on_partitions_assigned(self, assigned):
        self._event("assigned", assigned)

    def on_partitions_revoked(self, revoked):
        self._event("revoked", revoked)

    def on_partitions_lost(self, lost):
        self._event("lost", lost)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for records in self.consumer.poll(timeout_ms=100).values():
                    self.records.extend(records)
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc
        finally:
            started = time.monotonic()
            self.consumer.close()
            self.close_seconds = time.monotonic() - started

    def snapshot(self) -> tuple[frozenset, list]:
        with self._lock:
            return frozenset(self.owned), list(self.events)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), f"{self.name} did not stop"


@pytest.fixture
def members():
    started: list[Member] = []
    yield started
    for member in started:
        if member.thread.is_alive():
            member.stop()
    errors = [(m.name, m.error) for m in started if m.error is not None]
    assert not errors, errors


def start(members: list, servers: str, group: str, topic: str, count: int, **settings) -> list[Member]:
    new = [Member(servers, group, [topic], f"member-{len(members) + i}", **settings) for i in range(count)]
    members.extend(new)
    return new


def converged(group: list[Member], partitions: set[TopicPartition]) -> bool:
    """Every partition held by exactly one member, and the members balanced (sizes differ by at
    most one: every assignor here balances a single topic that way)."""
    owned = [tp for m in group for tp in m.snapshot()[0]]
    sizes = [len(m.snapshot()[0]) for m in group]
    return (
        len(owned) == len(set(owned)) == len(partitions)
        and set(owned) == partitions
        and max(sizes) - min(sizes) <= 1
    )


def all_partitions(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(count)}


def owners(group: list[Member]) -> dict[TopicPartition, str]:
    return {tp: m.name for m in group for tp in m.snapshot()[0]}


# ---- assignment and rebalances -------------------------------------------------------------------


def test_three_members_get_two_each_and_a_fourth_moves_only_what_it_takes(servers, make_topic, members):
    topic = make_topic(partitions=6)
    group = unique("coop")
    three = start(members, servers, group, topic, 3)
    everything = all_partitions(topic, 6)
    wait_until(lambda: converged(three, everything), timeout=20, what="three members converged")
    assert sorted(len(m.snapshot()[0]) for m in three) == [2, 2, 2]
    assert all(thread == m.name for m in three for _, _, thread, _ in m.snapshot()[1]), (
        "listeners run inside poll(), on the consumer's own thread"
    )
    time.sleep(3 * HEARTBEAT_MS / 1000)  # hand-offs of the joins done: nothing pending
    before, marks = owners(three), [len(m.snapshot()[1]) for m in three]

    four = three + start(members, servers, group, topic, 1)
    wait_until(lambda: converged(four, everything), timeout=20, what="four converged")
    after = owners(four)
    moved = {tp for tp in everything if after[tp] != before[tp]}
    assert sorted(len(m.snapshot()[0]) for m in four) == [1, 1, 2, 2]
    assert moved == set(four[3].snapshot()[0]), "only partitions the new member took changed hands"
    new_events = [(m, e) for m, mark in zip(three, marks) for e in m.snapshot()[1][mark:]]
    revoked = [tp for _, (kind, tps, _, _) in new_events if kind == "revoked" for tp in tps]
    assert sorted(revoked) == sorted(moved), "cooperative: only the moved partitions were revoked"
    assert all(kind == "revoked" for _, (kind, _, _, _) in new_events), "nothing new for the old members"
    revoked_at = {tp: at for _, (kind, tps, _, at) in new_events for tp in tps}
    (kind, assigned, _, assigned_at) = four[3].snapshot()[1][-1]
    assert kind == "assigned" and all(revoked_at[tp] < assigned_at for tp in assigned), (
        "the previous owner's on_partitions_revoked ran before the new owner's on_partitions_assigned"
    )


def test_eager_assignor_revokes_everything_before_the_new_assignment(servers, make_topic, members):
    topic = make_topic(partitions=4)
    group = unique("eager")
    (first,) = start(members, servers, group, topic, 1, partition_assignment_strategy="range")
    wait_until(lambda: len(first.snapshot()[0]) == 4, timeout=20, what="the first member holds everything")
    (second,) = start(members, servers, group, topic, 1, partition_assignment_strategy="range")
    wait_until(lambda: converged([first, second], all_partitions(topic, 4)), timeout=20, what="two converged")
    kinds = [(kind, len(tps)) for kind, tps, _, _ in first.snapshot()[1]]
    assert kinds == [("assigned", 4), ("revoked", 4), ("assigned", 2)]
    assert [(k, len(t)) for k, t, _, _ in second.snapshot()[1]] == [("assigned", 2)]


def test_close_leaves_the_group_at_once(servers, make_topic, members, admin):
    topic = make_topic(partitions=6)
    group = unique("leave")
    three = start(members, servers, group, topic, 3)
    everything = all_partitions(topic, 6)
    wait_until(lambda: converged(three, everything), timeout=20, what="three members converged")
    leaving, staying = three[0], three[1:]
    held = leaving.snapshot()[0]
    closed_at = time.monotonic()
    leaving.stop()
    wait_until(lambda: converged(staying, everything), timeout=SESSION_MS / 1000, what="the others took over")
    took = time.monotonic() - closed_at
    assert took < SESSION_MS / 2000, f"{took:.1f}s: the session timeout was waited out, not the LeaveGroup"
    assert leaving.close_seconds < 5
    kind, revoked, _, _ = leaving.snapshot()[1][-1]
    assert (kind, revoked) == ("revoked", held), "close() gave its partitions up through the listener"
    assert len(admin.describe_consumer_group(group).members) == 2


# ---- a member killed with -9 --------------------------------------------------------------------


class MemberProcess:
    """``group_member.py`` as a child process; its output lines are collected as they come."""

    def __init__(self, servers: str, topic: str, group: str, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(MEMBER_SCRIPT),
                servers,
                topic,
                group,
                "--session-ms",
                str(SESSION_MS),
                "--heartbeat-ms",
                str(HEARTBEAT_MS),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
            env=env,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None  # stdout=PIPE
        for line in self.process.stdout:
            if line.endswith("\n"):  # a line cut short by kill -9 was never fully processed
                self.lines.append(line.rstrip("\n"))

    def processed(self) -> list[str]:
        return [line.split(" ", 3)[3] for line in list(self.lines) if line.startswith("R ")]

    def uncommitted(self) -> int:
        """Records processed since the last commit (the script prints ``C`` after each)."""
        lines = list(self.lines)
        last_commit = max((i for i, line in enumerate(lines) if line == "C"), default=-1)
        return sum(1 for line in lines[last_commit + 1 :] if line.startswith("R "))

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for line in list(self.lines):
            kind, _, rest = line.partition(" ")
            if kind in ("A", "V", "L"):
                partitions = {int(p) for p in rest.split(",") if p}
                owned = owned | partitions if kind == "A" else owned - partitions
        return owned

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.reader.join(5)


def test_a_member_killed_with_minus_9_loses_no_record(servers, admin):
    topic = unique("kill")
    admin.create_topics([NewTopic(topic, 6)])
    group = unique("kill")
    produced: list[str] = []
    stop_producing = threading.Event()

    def produce() -> None:
        with Producer(servers=servers, linger_ms=5) as producer:
            i = 0
            while not stop_producing.is_set():
                value = f"v{i}"
                producer.send(topic, value.encode(), partition=i % 6).get(10)
                produced.append(value)
                i += 1
                time.sleep(0.005)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    # The victim is slow (50 ms a record, up to 20 records a poll): it falls behind, so when it is
    # killed it has records processed but not committed, and records fetched but not processed.
    processes = [MemberProcess(servers, topic, group, "--delay-ms", delay) for delay in ("50", "2", "2")]
    try:
        wait_until(
            lambda: sorted(len(p.owned()) for p in processes) == [2, 2, 2],
            timeout=30,
            what="three member processes holding two partitions each",
        )
        victim, survivors = processes[0], processes[1:]
        wait_until(
            lambda: len(victim.processed()) >= 30 and victim.uncommitted() >= 3,
            timeout=30,
            what="the victim in the middle of a batch",
        )
        victims_partitions = victim.owned()
        victim.process.kill()  # SIGKILL: no commit, no LeaveGroup
        killed_at = time.monotonic()
        victim.process.wait(10)
        # Count once the reader has drained the pipe to its end: lines the victim wrote before the
        # kill may still sit in the pipe when kill() returns.
        victim.reader.join(10)
        uncommitted_at_kill = victim.uncommitted()
        wait_until(
            lambda: set().union(*(p.owned() for p in survivors)) == set(range(6)),
            timeout=SESSION_MS / 1000 + 15,
            what="the survivors taking the victim's partitions",
        )
        takeover = time.monotonic() - killed_at
        time.sleep(1.0)  # keep producing through the hand-off
        stop_producing.set()
        producer.join(20)
        expected = set(produced)
        seen = lambda: Counter(v for p in processes for v in p.processed())  # noqa: E731
        wait_until(lambda: expected <= set(seen()), timeout=30, what="every produced record processed")
    finally:
        stop_producing.set()
        for process in processes:
            process.stop()
    counts = seen()
    missing = expected - set(counts)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:5]}"
    # Only what the victim processed after its last commit comes again: the survivors resumed at
    # its committed offsets (fewer if the kill fell between a commit and its "C" line).
    assert duplicates <= uncommitted_at_kill, (duplicates, uncommitted_at_kill)
    assert takeover < SESSION_MS / 1000 + 10, f"takeover took {takeover:.1f}s"
    assert victims_partitions and len(expected) > 300
    print(
        f"\n{len(expected)} records, {duplicates} processed twice across the hand-off ({uncommitted_at_kill} "
        f"processed but not committed at the kill), takeover {takeover:.1f}s"
    )


# ---- static membership --------------------------------------------------------------------------


def test_a_static_member_restarts_within_the_session_without_a_rebalance(servers, make_topic, members, admin):
    topic = make_topic(partitions=6)
    group = unique("static")
    everything = all_partitions(topic, 6)
    others = start(members, servers, group, topic, 2)
    (static,) = start(members, servers, group, topic, 1, group_instance_id="static-1")
    group_of = others + [static]
    wait_until(lambda: converged(group_of, everything), timeout=20, what="three members converged")
    time.sleep(3 * HEARTBEAT_MS / 1000)
    before = admin.describe_consumer_group(group)
    held, others_events = static.snapshot()[0], [len(m.snapshot()[1]) for m in others]
    static.stop()  # close(): a static member does not send LeaveGroup
    assert len(admin.describe_consumer_group(group).members) == 3, "still a member until its session ends"

    (restarted,) = start(members, servers, group, topic, 1, group_instance_id="static-1")
    wait_until(
        lambda: restarted.snapshot()[0], timeout=SESSION_MS / 1000, what="the restarted member's partitions"
    )
    time.sleep(4 * HEARTBEAT_MS / 1000)  # every other member heartbeats a few times meanwhile
    assert restarted.snapshot()[0] == held, "the same partitions, at once"
    assert [len(m.snapshot()[1]) for m in others] == others_events, "the others' listeners were not called"
    after = admin.describe_consumer_group(group)
    assert after.generation == before.generation, "no rebalance"
    ids_before = {m.member_id for m in before.members}
    ids_after = {m.member_id for m in after.members}
    assert len(ids_after) == 3 and len(ids_after - ids_before) == 1
    assert (
        next(m for m in after.members if m.group_instance_id == "static-1").member_id
        in ids_after - ids_before
    )


# ---- commits -----------------------------------------------------------------------------------


def fill(servers: str, topic: str, count: int, partitions: int) -> None:
    with Producer(servers=servers, linger_ms=0) as producer:
        for i in range(count):
            producer.send(topic, b"v%d" % i, partition=i % partitions)


def poll_until(consumer: Consumer, predicate, *, timeout: float, what: str) -> list:
    records: list = []
    deadline = time.monotonic() + timeout
    while not predicate(records):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for batch in consumer.poll(timeout_ms=100).values():
            records.extend(batch)
    return records


def test_commit_explicit_offsets_commit_async_and_committed(servers, make_topic, admin):
    topic = make_topic(partitions=2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    fill(servers, topic, 20, 2)
    group = unique("commit")
    with Consumer(
        servers=servers, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False, **FAST
    ) as consumer:
        consumer.subscribe([topic])
        records = poll_until(consumer, lambda r: len(r) >= 20, timeout=20, what="20 records")
        assert consumer.assignment() == {tp0, tp1}
        assert consumer.committed(tp0) is None
        consumer.commit({tp0: OffsetAndMetadata(5, "five"), tp1: 3})
        assert consumer.committed(tp0) == OffsetAndMetadata(5, "five")
        assert consumer.committed(tp1) == OffsetAndMetadata(3, "")
        assert admin.list_consumer_group_offsets(group) == {
            tp0: OffsetAndMetadata(5, "five"),
            tp1: OffsetAndMetadata(3, ""),
        }
        consumer.commit()  # everything poll returned
        assert consumer.committed(tp0).offset == consumer.position(tp0) == 10
        assert consumer.committed(tp1).offset == 10 and len(records) == 20
        outcomes = []
        consumer.commit_async(
            {tp1: 7},
            callback=lambda offsets, error: outcomes.append(
                (offsets, error, threading.current_thread().name)
            ),
        )
        poll_until(consumer, lambda _: outcomes, timeout=10, what="the commit callback")
        assert outcomes == [({tp1: OffsetAndMetadata(7)}, None, threading.current_thread().name)]
        assert admin.list_consumer_group_offsets(group, [tp1]) == {tp1: OffsetAndMetadata(7)}
        with pytest.raises(NonEmptyGroupError):
            admin.reset_consumer_group_offsets(group, [topic], "earliest")
    # After close (which left): the group is empty; a new member starts at the committed offsets.
    fill(servers, topic, 2, 2)
    with Consumer(servers=servers, group_id=group, **FAST) as consumer:
        consumer.subscribe([topic])
        records = poll_until(
            consumer, lambda r: len(r) >= 5, timeout=20, what="the records after the commits"
        )
        assert sorted((r.partition, r.offset) for r in records) == [(0, 10), (1, 7), (1, 8), (1, 9), (1, 10)]


def test_auto_commit_in_poll_and_on_close(servers, make_topic, admin):
    topic = make_topic(partitions=1)
    tp = TopicPartition(topic, 0)
    fill(servers, topic, 10, 1)
    group = unique("auto")
    consumer = Consumer(
        servers=servers, group_id=group, auto_offset_reset="earliest", auto_commit_interval_ms=300, **FAST
    )
    try:
        consumer.subscribe(topic)
        poll_until(consumer, lambda r: len(r) >= 10, timeout=20, what="10 records")
        deadline = time.monotonic() + 10
        while admin.list_consumer_group_offsets(group).get(tp) != OffsetAndMetadata(10):
            assert time.monotonic() < deadline, "auto-commit did not commit what poll returned"
            consumer.poll(timeout_ms=100)
        fill(servers, topic, 3, 1)
        poll_until(consumer, lambda r: len(r) >= 3, timeout=20, what="3 more records")
    finally:
        consumer.close()  # the final commit: no interval waited out
    assert admin.list_consumer_group_offsets(group) == {tp: OffsetAndMetadata(13)}


# ---- wakeup and admin -----------------------------------------------------------------------------


def test_wakeup_interrupts_a_blocking_poll_of_a_group_member(servers, make_topic, admin):
    topic = make_topic(partitions=1)
    group = unique("wake")
    with Consumer(servers=servers, group_id=group, **FAST) as consumer:
        consumer.subscribe([topic])
        poll_until(consumer, lambda _: consumer.assignment(), timeout=20, what="the assignment")
        threading.Timer(0.5, consumer.wakeup).start()
        started = time.monotonic()
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=30_000)
        assert time.monotonic() - started < 5
        assert consumer.assignment() == {TopicPartition(topic, 0)}, "still a member"
    assert admin.describe_consumer_group(group).state == "Empty", "close() after the wakeup left the group"


def test_admin_describes_resets_and_deletes_groups(servers, make_topic, admin):
    topic = make_topic(partitions=2)
    fill(servers, topic, 6, 2)
    group = unique("admin")
    with Consumer(servers=servers, group_id=group, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.subscribe([topic])
        poll_until(consumer, lambda r: len(r) >= 6, timeout=20, what="6 records")
        consumer.commit({TopicPartition(topic, 0): 1})
        described = admin.describe_consumer_group(group)
        assert described.state == "Stable" and described.assignor == "cooperative-sticky"
        (member,) = described.members
        assert member.client_id == "tributary-consumer" and member.topics == (topic,)
        assert set(member.assignment) == set(member.owned) == all_partitions(topic, 2)
        lags = {
            p.partition: (p.committed_offset, p.log_end_offset, p.lag, p.owner) for p in described.partitions
        }
        assert lags[0] == (1, 3, 2, member.member_id)
        assert group in {g.group_id for g in admin.list_consumer_groups()}
        with pytest.raises(NonEmptyGroupError):
            admin.delete_consumer_group(group)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    planned = admin.reset_consumer_group_offsets(group, [topic], "earliest", dry_run=True)
    assert planned == {tp0: OffsetAndMetadata(0), tp1: OffsetAndMetadata(0)}
    assert admin.list_consumer_group_offsets(group)[tp1] == OffsetAndMetadata(3), "dry run: nothing committed"
    assert admin.reset_consumer_group_offsets(group, [topic], "latest") == {
        tp0: OffsetAndMetadata(3),
        tp1: OffsetAndMetadata(3),
    }
    assert admin.reset_consumer_group_offsets(group, (), {tp0: 2}) == {tp0: OffsetAndMetadata(2)}
    assert admin.list_consumer_group_offsets(group) == {tp0: OffsetAndMetadata(2), tp1: OffsetAndMetadata(3)}
    admin.delete_consumer_group(group)
    assert group not in {g.group_id for g in admin.list_consumer_groups()}
    with pytest.raises(GroupIdNotFoundError):
        admin.describe_consumer_group(group)
