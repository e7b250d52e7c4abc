"""The transaction coordinator over an in-memory etcd and fake storage nodes: the RPC flows,
markers per leader, completion across terms, staged offsets all or nothing, timeouts, expiry, and
bad requests that change nothing. (The same flows against real processes are in
``tests/integration/coordinator/test_transactions.py``.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest

from coordinator import keys as metadata_keys
from coordinator.groups import keys as group_keys
from coordinator.groups.manager import GroupManager
from coordinator.groups.model import JoinParams, OffsetCommit, OffsetRecord, Subscription
from coordinator.groups.state import GroupState
from coordinator.groups.store import TXN_OPS, GroupEntry
from coordinator.metadata import MetadataCache
from coordinator.model import PartitionRecord, PartitionStatus, TopicRecord
from coordinator.transactions import keys
from coordinator.transactions.manager import TransactionManager, TransactionSettings
from coordinator.transactions.model import (
    InitProducerIdParams,
    ProducerRef,
    TxnMarker,
    TxnMetadata,
    TxnOffsetCommitParams,
    TxnState,
)
from services import errors
from services.broker_address import BrokerAddress
from services.clock import ManualClock
from services.cluster_keys import encode_broker_record
from services.etcd.values import EventType, KeyValue, WatchEvent, WatchResync
from services.topic_partition import TopicPartition as TP

from ._fake_etcd import FakeController, FakeEtcd

TID = "app-1"
#: Leaders of topic "t": partitions 0 and 2 on node 1, 1 and 3 on node 2.
LEADERS = {0: 1, 1: 2, 2: 1, 3: 2}


def run(coro, timeout: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


# ---- fakes and scene --------------------------------------------------------------------------------


class FakeStorage:
    """WriteTxnMarkers of every node: records each call; ``answer`` decides per partition (None:
    written), ``down`` makes a node's calls fail as a whole."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[TxnMarker, ...]]] = []
        self.answer: Callable[[int, TxnMarker, TP], errors.TributaryError | None] = lambda node, m, tp: None
        self.down: set[int] = set()
        self.written: list[tuple[int, int, int, bool, int, TP]] = []

    async def write_txn_markers(self, broker, markers):
        self.calls.append((broker.node_id, tuple(markers)))
        if broker.node_id in self.down:
            raise errors.NetworkError(f"node {broker.node_id} is down")
        answers = {}
        for m in markers:
            outcome = {}
            for tp in m.partitions:
                error = self.answer(broker.node_id, m, TP(*tp))
                outcome[(tp[0], tp[1])] = error
                if error is None:
                    self.written.append(
                        (
                            broker.node_id,
                            m.producer_id,
                            m.producer_epoch,
                            m.commit,
                            m.coordinator_epoch,
                            TP(*tp),
                        )
                    )
            answers[m.producer_id] = outcome
        return answers


_revision = iter(range(10, 1_000_000))


def _kv(key: str, value: bytes | str) -> KeyValue:
    rev = next(_revision)
    return KeyValue(key, value.encode() if isinstance(value, str) else value, rev, rev, 1)


def scene(offline: tuple[int, ...] = ()) -> list[KeyValue]:
    kvs = [
        _kv(
            metadata_keys.broker_key(n),
            encode_broker_record(BrokerAddress(n, "127.0.0.1", 9000 + n, 9100 + n)),
        )
        for n in (1, 2)
    ]
    topic = TopicRecord("t", "id-t", 1, {}, tuple((LEADERS[p],) for p in range(4)))
    kvs.append(_kv(metadata_keys.topic_key("t"), metadata_keys.encode_topic(topic)))
    for p, leader in LEADERS.items():
        status = PartitionStatus.OFFLINE if p in offline else PartitionStatus.ONLINE
        record = PartitionRecord((leader,), leader if p not in offline else -1, 0, (leader,), status)
        kvs.append(_kv(metadata_keys.partition_key("t", p), metadata_keys.encode_partition(record)))
    return kvs


class Term:
    """One controller term's transaction manager (and groups) over a shared fake etcd."""

    def __init__(
        self, etcd: FakeEtcd, storage: FakeStorage, *, epoch: int = 1, clock=None, offline=(), **settings
    ):
        self.etcd, self.storage, self.clock = etcd, storage, clock or ManualClock()
        self.controller = FakeController(etcd, epoch)
        self.cache = MetadataCache()
        self.cache.apply(WatchResync(tuple(scene(offline)), 10))
        no_storage: Any = None  # the group side of these tests never calls a storage node
        self.groups = GroupManager(
            client=etcd, cache=self.cache, storage=no_storage, controller=self.controller, clock=self.clock
        )
        options = {"complete_wait_s": 2.0, "load_wait_s": 2.0, **settings}
        self.txns = TransactionManager(
            client=etcd,
            cache=self.cache,
            storage=cast(Any, storage),  # a fake with the calls the manager makes
            controller=self.controller,
            groups=self.groups,
            settings=TransactionSettings(**options),
            clock=self.clock,
        )
        self.task: asyncio.Task | None = None

    async def __aenter__(self) -> Term:
        await self.groups.store.load()
        self.task = asyncio.create_task(self.txns.run())
        await self.txns.store.ready()
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    async def init(
        self, tid: str = TID, timeout_ms: int = 60_000, pid: int = -1, epoch: int = -1
    ) -> ProducerRef:
        answer = await self.txns.init_producer_id(InitProducerIdParams(tid, timeout_ms, pid, epoch))
        return ProducerRef(tid, answer.producer_id, answer.epoch)

    def stored(self, tid: str = TID) -> TxnMetadata | None:
        kv = self.etcd.kvs.get(keys.transaction_key(tid))
        return keys.decode_txn(tid, kv.value) if kv else None

    def group_offsets(self, group: str) -> dict[TP, int]:
        prefix = group_keys.group_prefix(group) + "offsets/"
        return {
            tp: group_keys.decode_offset(kv.value).offset
            for k, kv in self.etcd.kvs.items()
            if k.startswith(prefix) and (tp := group_keys.parse_group_key(k).tp) is not None
        }


async def eventually(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


ALL = [TP("t", p) for p in range(4)]


async def open_with_offsets(
    term: Term, producer: ProducerRef, offsets: dict[int, int], group: str = "g"
) -> None:
    await term.txns.add_partitions(producer, ALL)
    await term.txns.add_offsets(producer, group)
    commits = tuple(OffsetCommit("t", p, o) for p, o in offsets.items())
    results = await term.txns.txn_offset_commit(TxnOffsetCommitParams(producer, group, -1, "", commits))
    assert [r.error for r in results] == [None] * len(offsets)


# ---- producer ids ----------------------------------------------------------------------------------


def test_idempotent_producers_get_fresh_ids_and_kip360_bumps():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            first = await term.init("")
            second = await term.init("")
            assert (
                first.producer_id != second.producer_id and first.producer_epoch == second.producer_epoch == 0
            )
            bumped = await term.init("", pid=first.producer_id, epoch=0)
            assert (bumped.producer_id, bumped.producer_epoch) == (first.producer_id, 1)
            rotated = await term.init("", pid=first.producer_id, epoch=32_767)
            assert (
                rotated.producer_id not in (first.producer_id, second.producer_id)
                and rotated.producer_epoch == 0
            )
            with pytest.raises(errors.InvalidProducerIdMappingError):
                await term.init("", pid=10**9, epoch=0)
            assert (
                term.etcd.kvs.get(keys.transaction_key("")) is None
            )  # nothing stored per idempotent producer

    run(scenario())


def test_a_transactional_id_keeps_its_producer_id_and_bumps_its_epoch():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            first = await term.init()
            again = await term.init()
            assert (again.producer_id, again.producer_epoch) == (first.producer_id, first.producer_epoch + 1)
            stored = term.stored()
            assert stored.state is TxnState.EMPTY and stored.producer_epoch == again.producer_epoch
            with pytest.raises(errors.InvalidTransactionTimeoutError):
                await term.init(timeout_ms=900_001)
            with pytest.raises(errors.InvalidTransactionTimeoutError):
                await term.init(timeout_ms=-5)

    run(scenario())


# ---- commit and abort --------------------------------------------------------------------------------


def test_commit_writes_a_marker_to_each_leader_then_completes_with_the_staged_offsets():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            producer = await term.init()
            await open_with_offsets(term, producer, {0: 5, 3: 8})
            assert term.group_offsets("g") == {}  # staged, not committed
            assert term.stored().state is TxnState.ONGOING
            await term.txns.end_txn(producer, commit=True)
            assert term.stored().state is TxnState.COMPLETE_COMMIT
            by_node = {(node, tp) for node, *_, tp in term.storage.written}
            assert by_node == {(LEADERS[tp.partition], tp) for tp in ALL}
            assert {(pid, ep, commit, ce) for _, pid, ep, commit, ce, _ in term.storage.written} == {
                (producer.producer_id, producer.producer_epoch, True, 1)
            }
            assert len(term.storage.calls) == 2  # one request per node
            assert term.group_offsets("g") == {TP("t", 0): 5, TP("t", 3): 8}
            assert {tp: r.offset for tp, r in term.groups.store.groups["g"].offsets.items()} == {
                TP("t", 0): 5,
                TP("t", 3): 8,
            }
            # A retry of the same EndTxn succeeds and writes nothing.
            revision = term.etcd.revision
            await term.txns.end_txn(producer, commit=True)
            assert term.etcd.revision == revision

    run(scenario())


def test_abort_writes_abort_markers_and_discards_the_staged_offsets():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            producer = await term.init()
            await open_with_offsets(term, producer, {1: 3})
            await term.txns.end_txn(producer, commit=False)
            assert term.stored().state is TxnState.COMPLETE_ABORT
            assert {commit for *_, commit, _, _ in term.storage.written} == {False}
            assert term.group_offsets("g") == {}
            assert "g" not in term.groups.store.groups or not term.groups.store.groups["g"].offsets

    run(scenario())


def test_markers_are_retried_until_written_and_deleted_topics_are_skipped():
    async def scenario():
        storage = FakeStorage()
        refusals = {TP("t", 1): 2}

        def answer(node, marker, tp):
            if refusals.get(tp, 0) > 0:
                refusals[tp] -= 1
                return errors.NotLeaderOrFollowerError("moved")
            return None

        storage.answer = answer
        async with Term(FakeEtcd(), storage) as term:
            producer = await term.init()
            await term.txns.add_partitions(producer, ALL)
            storage.down.add(2)
            end = asyncio.create_task(term.txns.end_txn(producer, commit=True))
            await eventually(lambda: sum(1 for n, _ in storage.calls if n == 2) >= 2, "node 2 refused twice")
            assert term.stored().state is TxnState.PREPARE_COMMIT  # decided, waiting for node 2
            storage.down.clear()
            await end
            assert term.stored().state is TxnState.COMPLETE_COMMIT
            assert {tp for *_, tp in storage.written} == set(ALL)
            assert refusals[TP("t", 1)] == 0

    run(scenario())


def test_a_partition_of_a_deleted_topic_gets_no_marker():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            producer = await term.init()
            await term.txns.add_partitions(producer, ALL)
            term.cache.apply([WatchEvent(EventType.DELETE, _kv(metadata_keys.topic_key("t"), b""))])
            await term.txns.end_txn(producer, commit=True)
            assert term.stored().state is TxnState.COMPLETE_COMMIT and term.storage.written == []

    run(scenario())


def test_an_offline_partition_keeps_the_transaction_prepared_until_it_has_a_leader():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage(), offline=(3,), complete_wait_s=0.2) as term:
            producer = await term.init()
            await term.txns.add_partitions(producer, ALL)
            await term.txns.end_txn(producer, commit=True)  # answers: decided, still completing
            assert term.stored().state is TxnState.PREPARE_COMMIT
            with pytest.raises(errors.ConcurrentTransactionsError):
                await term.txns.add_partitions(producer, ALL[:1])
            term.cache.apply(WatchResync(tuple(scene()), term.cache.revision + 1))  # t-3 back online
            await eventually(lambda: term.stored().state is TxnState.COMPLETE_COMMIT, "completion")
            assert TP("t", 3) in {tp for *_, tp in term.storage.written}

    run(scenario())


# ---- failover and crashes ---------------------------------------------------------------------------


def test_a_new_term_completes_what_an_earlier_one_prepared():
    async def scenario():
        etcd, storage = FakeEtcd(), FakeStorage()
        prepared = TxnMetadata(
            TID,
            producer_id=77,
            producer_epoch=4,
            timeout_ms=60_000,
            state=TxnState.PREPARE_COMMIT,
            partitions=frozenset(ALL[:2]),
            groups=frozenset({"g"}),
            pending_offsets={"g": {TP("t", 2): OffsetRecord(40)}},
            start_ms=1,
            last_update_ms=2,
        )
        etcd.put_now(keys.transaction_key(TID), keys.encode_txn(prepared))
        async with Term(etcd, storage, epoch=7) as term:
            await eventually(
                lambda: term.stored().state is TxnState.COMPLETE_COMMIT, "the new term completing it"
            )
            assert {(pid, ep, commit, ce, tp) for _, pid, ep, commit, ce, tp in storage.written} == {
                (77, 4, True, 7, TP("t", 0)),
                (77, 4, True, 7, TP("t", 1)),
            }
            assert term.group_offsets("g") == {TP("t", 2): 40}

    run(scenario())


@pytest.mark.parametrize("count", [3, 150])
def test_staged_offsets_land_all_together_even_when_the_controller_dies_while_completing(count):
    """The completing write fails in term 1 (the coordinator is gone); term 2 completes it. With
    up to ~100 offsets they land in the same etcd transaction as COMPLETE_COMMIT: none before.
    More are written in several transactions, the last with COMPLETE_COMMIT: then a failure leaves
    a prefix of them, and the next term writes them all before completing."""

    async def scenario():
        etcd, storage = FakeEtcd(), FakeStorage()
        async with Term(etcd, storage) as term:
            # Another group's partitions: a topic with enough partitions for ``count`` offsets.
            big = TopicRecord("big", "id-big", 1, {}, tuple((1,) for _ in range(count)))
            term.cache.apply(
                [
                    WatchEvent(
                        EventType.PUT, _kv(metadata_keys.topic_key("big"), metadata_keys.encode_topic(big))
                    )
                ]
            )
            producer = await term.init()
            await term.txns.add_offsets(producer, "g")
            commits = tuple(OffsetCommit("big", p, 1000 + p) for p in range(count))
            await term.txns.txn_offset_commit(TxnOffsetCommitParams(producer, "g", -1, "", commits))
            completing = keys.transaction_key(TID)
            term.controller.fail = lambda ops: (
                "before"
                if any(op.key == completing for op in ops) and any(op.key.startswith("groups/") for op in ops)
                else None
            )
            await term.txns.end_txn(producer, commit=True)  # decided; completion keeps failing
            assert term.stored().state is TxnState.PREPARE_COMMIT
            landed = term.group_offsets("g")
            if count < TXN_OPS:
                assert landed == {}  # all or nothing: nothing
            else:
                assert len(landed) == TXN_OPS  # the first transaction; not the completing one
        async with Term(etcd, storage, epoch=2) as term2:
            await eventually(lambda: term2.stored().state is TxnState.COMPLETE_COMMIT, "term 2 completing")
            assert term2.group_offsets("g") == {TP("big", p): 1000 + p for p in range(count)}

    run(scenario())


def test_a_completing_write_that_applied_but_failed_is_not_done_twice():
    async def scenario():
        etcd, storage = FakeEtcd(), FakeStorage()
        async with Term(etcd, storage) as term:
            producer = await term.init()
            await open_with_offsets(term, producer, {0: 1})
            failed = []

            def fail(ops):
                if not failed and any(op.key.startswith("groups/") for op in ops):
                    failed.append(True)
                    return "after"  # applied, but the answer is lost
                return None

            term.controller.fail = fail
            await term.txns.end_txn(producer, commit=True)
            await eventually(lambda: term.stored().state is TxnState.COMPLETE_COMMIT, "completion")
            entry = term.txns.store.entries[TID]
            await eventually(lambda: entry.completion.done(), "the completion task ending")
            assert not entry.stale or term.stored().state is TxnState.COMPLETE_COMMIT
            assert term.group_offsets("g") == {TP("t", 0): 1}

    run(scenario())


# ---- fencing, timeouts, expiry -------------------------------------------------------------------------


def test_init_with_an_open_transaction_aborts_it_and_fences_the_old_producer():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            old = await term.init()
            await open_with_offsets(term, old, {0: 9})
            new = await term.init()
            assert new.producer_id == old.producer_id and new.producer_epoch == old.producer_epoch + 2
            assert {(ep, commit) for _, _, ep, commit, _, _ in term.storage.written} == {
                (old.producer_epoch + 1, False)
            }
            assert term.group_offsets("g") == {}
            with pytest.raises(errors.ProducerFencedError):
                await term.txns.end_txn(old, commit=True)
            with pytest.raises(errors.ProducerFencedError):
                await term.txns.add_partitions(old, ALL)

    run(scenario())


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced():
    async def scenario():
        clock = ManualClock()
        async with Term(FakeEtcd(), FakeStorage(), clock=clock, abort_check_interval_s=0.01) as term:
            producer = await term.init(timeout_ms=1_000)
            await open_with_offsets(term, producer, {2: 4})
            clock.advance(1_000)
            await asyncio.sleep(0.1)
            assert term.stored().state is TxnState.ONGOING  # not past it yet
            clock.advance(1)
            await eventually(lambda: term.stored().state is TxnState.COMPLETE_ABORT, "the timeout abort")
            assert term.stored().producer_epoch == producer.producer_epoch + 1
            assert {(ep, commit) for _, _, ep, commit, _, _ in term.storage.written} == {
                (producer.producer_epoch + 1, False)
            }
            with pytest.raises(errors.ProducerFencedError):
                await term.txns.end_txn(producer, commit=True)
            assert term.group_offsets("g") == {}

    run(scenario())


def test_idle_transactional_ids_expire():
    async def scenario():
        clock = ManualClock()
        async with Term(
            FakeEtcd(), FakeStorage(), clock=clock, id_expiration_ms=5_000, expiration_check_interval_s=0.01
        ) as term:
            idle = await term.init("idle")
            busy = await term.init("busy")
            await term.txns.add_partitions(busy, ALL[:1])
            clock.advance(5_000)
            await eventually(lambda: term.stored("idle") is None, "the idle id expiring")
            assert "idle" not in term.txns.store.entries
            assert term.stored("busy").state is TxnState.ONGOING  # open: never expires
            with pytest.raises(errors.InvalidProducerIdMappingError):
                await term.txns.end_txn(idle, commit=False)
            again = await term.init("idle")
            assert again.producer_id != idle.producer_id and again.producer_epoch == 0

    run(scenario())


# ---- bad requests change nothing ------------------------------------------------------------------------


def test_bad_requests_get_typed_errors_and_change_nothing():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            producer = await term.init()
            before = (term.etcd.revision, dict(term.etcd.kvs))
            wrong_id = ProducerRef(TID, producer.producer_id + 1, producer.producer_epoch)
            unknown = ProducerRef("never-initialised", 5, 0)
            cases = [
                (term.txns.end_txn(producer, commit=True), errors.InvalidTxnStateError),
                (term.txns.end_txn(producer, commit=False), errors.InvalidTxnStateError),
                (term.txns.end_txn(wrong_id, commit=True), errors.InvalidProducerIdMappingError),
                (term.txns.end_txn(unknown, commit=True), errors.InvalidProducerIdMappingError),
                (term.txns.add_partitions(wrong_id, ALL), errors.InvalidProducerIdMappingError),
                (term.txns.add_offsets(unknown, "g"), errors.InvalidProducerIdMappingError),
                (
                    term.txns.txn_offset_commit(
                        TxnOffsetCommitParams(producer, "g", -1, "", (OffsetCommit("t", 0, 1),))
                    ),
                    errors.InvalidTxnStateError,
                ),
            ]
            for call, error in cases:
                with pytest.raises(error):
                    await call
            results = await term.txns.add_partitions(producer, [TP("t", 0), TP("nope", 0), TP("t", 99)])
            assert [r.error.reason for r in results] == [
                "OPERATION_NOT_ATTEMPTED",
                "UNKNOWN_TOPIC_OR_PARTITION",
                "UNKNOWN_TOPIC_OR_PARTITION",
            ]
            assert (term.etcd.revision, dict(term.etcd.kvs)) == before
            assert "never-initialised" not in term.txns.store.entries  # no memory for unknown ids
            # A stale epoch after a bump.
            await term.init()
            with pytest.raises(errors.ProducerFencedError):
                await term.txns.add_partitions(producer, ALL)

    run(scenario())


def test_txn_offset_commit_checks_the_member_and_each_partition():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            state = GroupState("g", term.clock)
            state.join(
                JoinParams("g", subscription=Subscription(("t",))), {"t": 4}, member_id="m1", lease_id=1
            )
            term.groups.store.groups["g"] = GroupEntry(state)
            producer = await term.init()
            await term.txns.add_offsets(producer, "g")

            def commit(generation, member, *offsets):
                return term.txns.txn_offset_commit(
                    TxnOffsetCommitParams(producer, "g", generation, member, tuple(offsets))
                )

            with pytest.raises(errors.IllegalGenerationError):
                await commit(state.generation + 1, "m1", OffsetCommit("t", 0, 1))
            with pytest.raises(errors.UnknownMemberIdError):
                await commit(state.generation, "m2", OffsetCommit("t", 0, 1))
            results = await commit(
                state.generation,
                "m1",
                OffsetCommit("t", 0, 7),
                OffsetCommit("t", 9, 1),
                OffsetCommit("t", 1, -3),
                OffsetCommit("t", 2, 1, "x" * 5000),
            )
            assert [r.error.reason if r.error else None for r in results] == [
                None,
                "UNKNOWN_TOPIC_OR_PARTITION",
                "OFFSET_OUT_OF_RANGE",
                "OFFSET_METADATA_TOO_LARGE",
            ]
            staged = term.stored().pending_offsets["g"]
            assert {tp: r.offset for tp, r in staged.items()} == {TP("t", 0): 7}
            assert staged[TP("t", 0)].generation == state.generation

    run(scenario())


def test_a_transaction_too_large_for_etcd_is_refused_and_changes_nothing():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            big = TopicRecord("big", "id", 1, {}, tuple((1,) for _ in range(300)))
            term.cache.apply(
                [
                    WatchEvent(
                        EventType.PUT, _kv(metadata_keys.topic_key("big"), metadata_keys.encode_topic(big))
                    )
                ]
            )
            producer = await term.init()
            await term.txns.add_offsets(producer, "g")
            revision = term.etcd.revision
            commits = tuple(OffsetCommit("big", p, 1, "m" * 4000) for p in range(300))  # ~1.2 MB staged
            with pytest.raises(errors.PolicyViolationError):
                await term.txns.txn_offset_commit(TxnOffsetCommitParams(producer, "g", -1, "", commits))
            assert term.etcd.revision == revision and not term.stored().pending_offsets
            await term.txns.txn_offset_commit(TxnOffsetCommitParams(producer, "g", -1, "", commits[:10]))
            assert len(term.stored().pending_offsets["g"]) == 10  # the entry is still usable

    run(scenario())


def test_concurrent_end_txn_calls_complete_once():
    async def scenario():
        async with Term(FakeEtcd(), FakeStorage()) as term:
            producer = await term.init()
            await term.txns.add_partitions(producer, ALL)
            await asyncio.gather(*(term.txns.end_txn(producer, commit=True) for _ in range(5)))
            assert term.stored().state is TxnState.COMPLETE_COMMIT
            assert len(term.storage.written) == 4  # each partition's marker once

    run(scenario())
