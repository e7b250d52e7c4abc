"""Commit batching: how pending commits are grouped into transactions and checked (no etcd)."""

from __future__ import annotations

from typing import Any

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
