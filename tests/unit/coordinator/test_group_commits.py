"""Commit batching: how pending commits are grouped into transactions and checked (no etcd)."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.groups.commits import CommitBatcher, take_batch
from coordinator.groups.model import CommitParams, JoinParams, OffsetCommit, Subscription
from coordinator.groups.state import GroupState
from coordinator.groups.store import TXN_OPS, PendingCommit
from services import errors
from services.clock import ManualClock
from services.topic_partition import TopicPartition as TP


class FakeStore:
    def __init__(self, clock):
        self.clock = clock

    def topics(self):
        return {"t": 4}


def pending(member_id: str, generation: int, *offsets: tuple[int, int]) -> PendingCommit:
    commits = tuple(OffsetCommit("t", p, o) for p, o in offsets)
    never_awaited: Any = None  # these tests only plan batches
    return PendingCommit(CommitParams("g", member_id, generation, commits), future=never_awaited)


def test_take_batch_fills_one_transaction_and_always_takes_one():
    queue = [pending("m", 1, *[(0, 1)] * 60) for _ in range(3)]
    assert len(take_batch(queue)) == 1 and len(queue) == 2  # 60 + 60 > TXN_OPS
    small = [pending("m", 1, (0, i)) for i in range(TXN_OPS + 5)]
    assert len(take_batch(small)) == TXN_OPS and len(small) == 5
    huge = [pending("m", 1, *[(0, 1)] * (TXN_OPS * 2))]
    assert len(take_batch(huge)) == 1


def group_with_two_members(clock) -> GroupState:
    state = GroupState("g", clock)
    for name in ("a", "b"):
        state.join(
            JoinParams("g", subscription=Subscription(("t",)), assignor="range"),
            {"t": 4},
            member_id=name,
            lease_id=1,
        )
        state.heartbeat(name, state.generation, (), polled=True)
    state.heartbeat("a", state.generation, state.owned_by("a") & state.target["a"], polled=True)
    state.heartbeat("b", state.generation, (), polled=True)
    return state


def test_plan_checks_each_request_and_partition_and_later_offsets_win():
    clock = ManualClock()
    state = group_with_two_members(clock)
    batcher = CommitBatcher(FakeStore(clock), tasks=None, max_metadata_bytes=10)
    a_tp = sorted(state.owned_by("a"))[0]
    b_tp = sorted(state.owned_by("b"))[0]
    batch = [
        pending("a", state.generation, (a_tp.partition, 5)),
        pending("a", state.generation - 1, (a_tp.partition, 6)),  # stale generation
        pending("a", state.generation, (a_tp.partition, 7), (b_tp.partition, 1), (9, 1)),
        pending("nobody", state.generation, (a_tp.partition, 8)),
    ]
    outcomes, records = batcher._plan(state, batch)
    assert [r.error for r in outcomes[0]] == [None]
    assert isinstance(outcomes[1], errors.IllegalGenerationError)
    reasons = [r.error.reason if r.error else None for r in outcomes[2]]
    assert reasons == [None, "ILLEGAL_GENERATION", "UNKNOWN_TOPIC_OR_PARTITION"]  # b holds b_tp
    assert isinstance(outcomes[3], errors.UnknownMemberIdError)
    assert {tp: r.offset for tp, r in records.items()} == {TP("t", a_tp.partition): 7}
    assert records[a_tp].generation == state.generation and records[a_tp].commit_timestamp == clock.time_ms()


def test_an_unchanged_commit_is_not_written_again_but_any_change_is():
    from coordinator.groups.commits import _same_commit
    from coordinator.groups.model import OffsetRecord

    stored = OffsetRecord(7, "m", commit_timestamp=1, generation=3)
    assert _same_commit(stored, OffsetRecord(7, "m", commit_timestamp=99, generation=3))
    assert not _same_commit(None, OffsetRecord(7, "m", 99, 3))
    assert not _same_commit(stored, OffsetRecord(8, "m", 99, 3))
    assert not _same_commit(stored, OffsetRecord(7, "other", 99, 3))
    assert not _same_commit(stored, OffsetRecord(7, "m", 99, 4))


class CountingController:
    """Answers fenced transactions after a pause, counting how many were in flight at once;
    fails the transaction holding ``fail_key``."""

    def __init__(self, fail_key: str | None = None) -> None:
        self.in_flight = self.most_in_flight = 0
        self.written: list[str] = []
        self.fail_key = fail_key

    async def fenced_txn(self, ops, compares):
        import asyncio
        from types import SimpleNamespace

        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        if any(op.key == self.fail_key for op in ops):
            return SimpleNamespace(succeeded=False, revision=0)
        self.written.extend(op.key for op in ops)
        return SimpleNamespace(succeeded=True, revision=1)


def _write(controller, ops, *, ordered):
    import asyncio

    from coordinator.groups.store import GroupEntry, GroupStore

    store = GroupStore(client=None, cache=None, controller=controller, clock=ManualClock(), load_wait_s=1)
    entry = GroupEntry(GroupState("g", ManualClock()))
    asyncio.run(store.write(entry, ops, ordered=ordered))
    return entry


def test_unordered_writes_run_transactions_in_parallel_and_a_failure_marks_the_group_stale():
    from coordinator.groups.store import PARALLEL_TXNS
    from services.etcd.txn import Op

    ops = [Op.put(f"k{i}", b"v") for i in range(TXN_OPS * 20)]
    ordered = CountingController()
    _write(ordered, ops, ordered=True)
    assert ordered.most_in_flight == 1 and ordered.written == [op.key for op in ops]
    parallel = CountingController()
    entry = _write(parallel, ops, ordered=False)
    assert parallel.most_in_flight == PARALLEL_TXNS and sorted(parallel.written) == sorted(
        op.key for op in ops
    )
    assert not entry.stale
    failing = CountingController(fail_key="k150")
    with pytest.raises(errors.CoordinatorNotAvailableError, match="changed underneath"):
        _write(failing, ops, ordered=False)
    assert "k150" not in failing.written and len(failing.written) == len(ops) - TXN_OPS
