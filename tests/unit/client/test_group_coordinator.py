"""The consumer's group coordinator against a scripted gateway: rebalances applied in poll (listener
order, commits before revocation, lost partitions), auto-commit timing, commit error handling,
and how the heartbeat routine reacts to the coordinator's errors."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque

import pytest

from gateway.client.fetcher import Fetcher
from gateway.client.group_coordinator import (
    CommitOffsetsHandler,
    GroupCoordinator,
    GroupSettings,
    HeartbeatHandler,
    JoinGroupHandler,
    Reaction,
)
from gateway.client.io_thread import call_directly
from gateway.client.membership import GroupMembership
from gateway.client.structs import OffsetAndMetadata, TopicPartition
from gateway.client.subscription import SubscriptionState
from gateway.client.throttle import Throttles
from services import errors
from services.clock import ManualClock, SystemClock
from services.proto import pb
from services.serde import error_to_proto

T0, T1, T2, T3 = (TopicPartition("t", p) for p in range(4))


def tps(*partitions):
    return [pb.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions]


def decoded(messages):
    return {TopicPartition(m.topic, m.partition) for m in messages}


class FakeGateway:
    """Stands in for ``GatewayClient``: answers each method from a queue of scripted answers
    (a response, an exception, or a function of the request), else from a default."""

    def __init__(self, clock=None) -> None:
        self.clock = clock or ManualClock()
        self.request_timeout_ms = 2000
        self.fetch_throttles = Throttles("fetch")
        self.calls: list[tuple[str, object]] = []
        self.answers: dict[str, deque] = defaultdict(deque)
        self.defaults: dict[str, object] = {
            "CommitOffsets": lambda request: pb.CommitOffsetsResponse(
                results=[pb.OffsetCommitResult(topic=o.topic, partition=o.partition) for o in request.offsets]
            ),
            "FetchCommittedOffsets": lambda request: pb.FetchCommittedOffsetsResponse(),
            "LeaveGroup": pb.LeaveGroupResponse(),
        }

    def answer(self, method: str, *answers) -> None:
        self.answers[method].extend(answers)

    def requests(self, method: str) -> list:
        return [request for name, request in self.calls if name == method]

    async def call(self, method, request, *, timeout_ms=None, failover=True):
        self.calls.append((method, request))
        queue = self.answers[method]
        answer = queue.popleft() if queue else self.defaults[method]
        if callable(answer):
            answer = answer(request)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def call_with_retry(self, method, request, *, max_wait_ms=None):
        return await self.call(method, request)


class RecordingListener:
    def __init__(self, log: list, *, fail_on: str | None = None) -> None:
        self.log = log
        self.fail_on = fail_on

    def _record(self, what, partitions):
        self.log.append((what, set(partitions)))
        if what == self.fail_on:
            raise RuntimeError(f"listener failed in {what}")

    def on_partitions_revoked(self, revoked):
        self._record("revoked", revoked)

    def on_partitions_assigned(self, assigned):
        self._record("assigned", assigned)

    def on_partitions_lost(self, lost):
        self._record("lost", lost)


def make(*, clock=None, listener=None, subscribe=True, **settings):
    gateway = FakeGateway(clock)
    subscription = SubscriptionState("earliest")
    fetcher = Fetcher(gateway, subscription)
    defaults = dict(group_id="g", retry_backoff_ms=1, request_timeout_ms=2000, heartbeat_interval_ms=3000)
    coordinator = GroupCoordinator(
        gateway,
        subscription,
        fetcher,
        GroupSettings(**{**defaults, **settings}),
        attention=asyncio.Event(),
        call_back=call_directly,
        consumed_offsets=subscription.consumed_offsets,
    )
    if subscribe:
        subscription.subscribe(["t"])
        coordinator.listener = listener
    return coordinator, gateway, subscription


def join(coordinator, assignment, *, generation=1, member_id="m-1"):
    """As if the routine had joined: the coordinator's answer applied to the membership."""
    coordinator.membership.request_join()
    coordinator.membership.on_join(member_id, generation, assignment, [], 3000, now=0.0)


def heartbeat_answer(coordinator, assignment, *, generation, pending=()):
    handler = HeartbeatHandler(coordinator.membership, coordinator.settings)
    handler.create_request(now=0.0)
    assert handler.handle_response(
        pb.HeartbeatResponse(generation_id=generation, assignment=tps(*assignment), pending=tps(*pending)),
        now=0.0,
    )


def run(coro):
    return asyncio.run(coro)


# ---- rebalances applied in poll ---------------------------------------------------------------


def test_revoked_partitions_are_committed_then_revoked_before_new_ones_are_assigned():
    log = []
    coordinator, gateway, subscription = make(listener=RecordingListener(log))
    gateway.defaults["CommitOffsets"] = lambda request: (
        log.append(("commit", {(o.partition, o.offset) for o in request.offsets})),
        FakeGateway().defaults["CommitOffsets"](request),
    )[1]

    async def scenario():
        join(coordinator, [T0, T1])
        await coordinator.maybe_rebalance()
        subscription.seek(T1, 42)
        heartbeat_answer(coordinator, [T0, T2], generation=2)
        await coordinator.maybe_rebalance()

    run(scenario())
    assert log == [("assigned", {T0, T1}), ("commit", {(1, 42)}), ("revoked", {T1}), ("assigned", {T2})]
    assert subscription.assigned_partitions() == {T0, T2}
    commit = gateway.requests("CommitOffsets")[0]
    assert (commit.member_id, commit.generation_id) == ("m-1", 2), "the answer's generation"


def test_eager_rebalance_revokes_everything_then_assigns():
    log = []
    coordinator, gateway, _subscription = make(listener=RecordingListener(log), enable_auto_commit=False)

    async def scenario():
        join(coordinator, [T0, T1, T2])
        await coordinator.maybe_rebalance()
        heartbeat_answer(coordinator, [], generation=2, pending=[T0])
        await coordinator.maybe_rebalance()
        assert coordinator.membership.owned_to_report() == []
        heartbeat_answer(coordinator, [T0], generation=2)
        await coordinator.maybe_rebalance()

    run(scenario())
    assert log == [("assigned", {T0, T1, T2}), ("revoked", {T0, T1, T2}), ("assigned", {T0})]
    assert gateway.requests("CommitOffsets") == [], "no auto-commit when it is disabled"


def test_new_partitions_start_at_the_committed_offset_unless_the_listener_seeks():
    coordinator, gateway, subscription = make()

    class Seeker:
        def on_partitions_assigned(self, assigned):
            subscription.seek(T2, 7)

    coordinator.listener = Seeker()
    gateway.answer(
        "FetchCommittedOffsets",
        lambda request: pb.FetchCommittedOffsetsResponse(
            offsets=[
                pb.CommittedOffset(
                    topic=m.topic, partition=m.partition, offset=100 if m.partition == 0 else -1
                )
                for m in request.partitions
            ]
        ),
    )

    async def scenario():
        join(coordinator, [T0, T1, T2])
        await coordinator.maybe_rebalance()

    run(scenario())
    asked = decoded(gateway.requests("FetchCommittedOffsets")[0].partitions)
    assert asked == {T0, T1}, "the partition the listener seeks needs no lookup"
    assert subscription.position(T0) == 100
    assert subscription.position(T2) == 7
    assert subscription.position(T1) is None and subscription.partitions_awaiting_reset() == {
        T1: ("earliest", 0)
    }


def test_a_failing_listener_does_not_stop_the_rebalance():
    log = []
    coordinator, _, subscription = make(
        listener=RecordingListener(log, fail_on="revoked"), enable_auto_commit=False
    )

    async def scenario():
        join(coordinator, [T0, T1])
        await coordinator.maybe_rebalance()
        heartbeat_answer(coordinator, [T0, T2], generation=2)
        with pytest.raises(RuntimeError, match="revoked"):
            await coordinator.maybe_rebalance()

    run(scenario())
    assert log[-2:] == [("revoked", {T1}), ("assigned", {T2})]
    assert subscription.assigned_partitions() == {T0, T2}
    assert coordinator.membership.owned_to_report() == [T0, T2]


def test_lost_partitions_go_to_on_partitions_lost_without_a_commit():
    log = []
    coordinator, gateway, subscription = make(listener=RecordingListener(log))

    async def scenario():
        join(coordinator, [T0, T1])
        await coordinator.maybe_rebalance()
        subscription.seek(T0, 5)
        coordinator.membership.on_member_lost()
        await coordinator.maybe_rebalance()

    run(scenario())
    assert log == [("assigned", {T0, T1}), ("lost", {T0, T1})]
    assert gateway.requests("CommitOffsets") == []
    assert subscription.assigned_partitions() == set()


def test_a_listener_without_on_partitions_lost_hears_on_partitions_revoked():
    heard = []

    class Minimal:
        def on_partitions_revoked(self, revoked):
            heard.append(set(revoked))

    coordinator, _, _ = make(listener=Minimal())

    async def scenario():
        join(coordinator, [T0])
        await coordinator.maybe_rebalance()
        coordinator.membership.on_member_lost()
        await coordinator.maybe_rebalance()

    run(scenario())
    assert heard == [{T0}]


# ---- auto-commit ------------------------------------------------------------------------------


def test_auto_commit_sends_changed_positions_once_per_interval():
    clock = ManualClock()
    coordinator, gateway, subscription = make(clock=clock, auto_commit_interval_ms=5000)

    async def scenario():
        join(coordinator, [T0, T1])
        await coordinator.maybe_rebalance()
        subscription.seek(T0, 10)
        subscription.seek(T1, 20)
        coordinator.maybe_auto_commit()
        assert gateway.requests("CommitOffsets") == [], "not due yet"
        clock.advance(5000)
        coordinator.maybe_auto_commit()
        await asyncio.sleep(0)
        coordinator.maybe_auto_commit()
        await asyncio.sleep(0)
        assert len(gateway.requests("CommitOffsets")) == 1, "once per interval"
        clock.advance(5000)
        coordinator.maybe_auto_commit()
        await asyncio.sleep(0)
        assert len(gateway.requests("CommitOffsets")) == 1, "nothing changed: nothing sent"
        subscription.advance(T1, 25)
        clock.advance(5000)
        coordinator.maybe_auto_commit()
        await asyncio.sleep(0)

    run(scenario())
    first, second = gateway.requests("CommitOffsets")
    assert {(o.partition, o.offset) for o in first.offsets} == {(0, 10), (1, 20)}
    assert {(o.partition, o.offset) for o in second.offsets} == {(1, 25)}


def test_no_auto_commit_while_rejoining():
    clock = ManualClock()
    coordinator, gateway, subscription = make(clock=clock, auto_commit_interval_ms=1000)

    async def scenario():
        join(coordinator, [T0])
        await coordinator.maybe_rebalance()
        subscription.seek(T0, 3)
        coordinator.membership.on_member_lost()
        clock.advance(1000)
        coordinator.maybe_auto_commit()
        await asyncio.sleep(0)

    run(scenario())
    assert gateway.requests("CommitOffsets") == []


# ---- commits ----------------------------------------------------------------------------------


def commit_results(*failures):
    """A CommitOffsets answer failing the given ``(tp, error)`` pairs and accepting the rest."""
    failed = dict(failures)

    def answer(request):
        results = []
        for o in request.offsets:
            tp = TopicPartition(o.topic, o.partition)
            error = error_to_proto(failed[tp]) if tp in failed else None
            results.append(pb.OffsetCommitResult(topic=o.topic, partition=o.partition, error=error))
        return pb.CommitOffsetsResponse(results=results)

    return answer


def test_commit_retries_while_the_coordinator_is_unavailable():
    coordinator, gateway, _ = make()
    join(coordinator, [T0])
    gateway.answer(
        "CommitOffsets", errors.CoordinatorNotAvailableError("electing"), errors.NotControllerError("moved")
    )
    run(coordinator.commit({T0: OffsetAndMetadata(5, "m")}))
    assert len(gateway.requests("CommitOffsets")) == 3


def test_a_per_partition_error_is_raised_without_retrying():
    coordinator, gateway, _ = make()
    join(coordinator, [T0, T1])
    gateway.answer("CommitOffsets", commit_results((T1, errors.UnknownTopicOrPartitionError("gone"))))
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="t-1"):
        run(coordinator.commit({T0: OffsetAndMetadata(1), T1: OffsetAndMetadata(2)}))
    assert len(gateway.requests("CommitOffsets")) == 1


def test_a_partition_refused_with_illegal_generation_has_moved_and_is_lost():
    log = []
    coordinator, gateway, _ = make(listener=RecordingListener(log))

    async def scenario():
        join(coordinator, [T0, T1])
        await coordinator.maybe_rebalance()
        gateway.answer("CommitOffsets", commit_results((T1, errors.IllegalGenerationError("held by m-2"))))
        with pytest.raises(errors.IllegalGenerationError):
            await coordinator.commit({T0: OffsetAndMetadata(1), T1: OffsetAndMetadata(2)})
        await coordinator.maybe_rebalance()

    run(scenario())
    assert log[-1] == ("lost", {T1})
    assert coordinator.membership.held == {T0}


def test_whole_commit_illegal_generation_heartbeats_then_retries_with_the_new_generation():
    coordinator, gateway, _subscription = make(clock=SystemClock())
    gateway.answer(
        "JoinGroup",
        pb.JoinGroupResponse(
            member_id="m-1", generation_id=1, assignment=tps(T0, T1), heartbeat_interval_ms=3000
        ),
    )
    gateway.answer("Heartbeat", pb.HeartbeatResponse(generation_id=2, assignment=tps(T0, T1)))
    gateway.answer("CommitOffsets", errors.IllegalGenerationError("generation 1 is not 2"))

    async def scenario():
        coordinator.subscribe(None)
        while not coordinator.membership.is_member:
            await asyncio.sleep(0.001)
        await coordinator.maybe_rebalance()
        await coordinator.commit({T0: OffsetAndMetadata(3)})
        await coordinator.leave_group("test")

    run(scenario())
    first, second = gateway.requests("CommitOffsets")[:2]
    assert (first.generation_id, second.generation_id) == (1, 2)
    assert len(gateway.requests("Heartbeat")) >= 1


def test_unknown_member_on_commit_ends_the_membership():
    coordinator, gateway, _ = make()
    join(coordinator, [T0])
    coordinator.membership.complete_assignment([T0])
    gateway.answer("CommitOffsets", errors.UnknownMemberIdError("expired"))
    with pytest.raises(errors.UnknownMemberIdError):
        run(coordinator.commit({T0: OffsetAndMetadata(1)}))
    assert coordinator.membership.needs_join and coordinator.membership.plan().lost == {T0}


def test_commit_between_memberships_is_refused():
    coordinator, gateway, _ = make()
    coordinator.membership.request_join()
    with pytest.raises(errors.RebalanceInProgressError):
        run(coordinator.commit({T0: OffsetAndMetadata(1)}))
    assert gateway.requests("CommitOffsets") == []


def test_a_manually_assigned_consumer_commits_standalone():
    coordinator, gateway, subscription = make(subscribe=False)
    subscription.assign_from_user([T0])
    subscription.seek(T0, 9)
    run(coordinator.commit(coordinator.offsets_to_commit()))
    (request,) = gateway.requests("CommitOffsets")
    assert (request.member_id, request.generation_id) == ("", -1)
    assert [(o.partition, o.offset) for o in request.offsets] == [(0, 9)]


def test_commit_async_callbacks_run_in_a_later_poll():
    coordinator, gateway, _ = make()
    join(coordinator, [T0])
    outcomes = []
    gateway.answer("CommitOffsets", commit_results(), errors.UnknownMemberIdError("expired"))

    async def scenario():
        coordinator.commit_async(
            {T0: OffsetAndMetadata(4)}, lambda offsets, error: outcomes.append((offsets, error))
        )
        await asyncio.sleep(0.01)
        assert outcomes == [], "delivered by poll, not by the I/O routine"
        await coordinator.deliver_commit_callbacks()
        coordinator.commit_async(
            {T0: OffsetAndMetadata(5)}, lambda offsets, error: outcomes.append((offsets, error))
        )
        await asyncio.sleep(0.01)
        await coordinator.deliver_commit_callbacks()

    run(scenario())
    assert outcomes[0] == ({T0: OffsetAndMetadata(4)}, None)
    assert outcomes[1][0] == {T0: OffsetAndMetadata(5)} and isinstance(
        outcomes[1][1], errors.UnknownMemberIdError
    )
    assert len(gateway.requests("CommitOffsets")) == 2, "no retries"


# ---- the heartbeat routine --------------------------------------------------------------------


def test_heartbeats_report_held_and_granted_partitions_and_polls():
    coordinator, _, _ = make()
    join(coordinator, [T0, T1])
    coordinator.membership.complete_assignment([T0])
    coordinator.poll_started()
    coordinator.poll_finished()
    request = HeartbeatHandler(coordinator.membership, coordinator.settings).create_request(now=0.0)
    assert decoded(request.owned) == {T0, T1} and request.polled and request.generation_id == 1
    request = HeartbeatHandler(coordinator.membership, coordinator.settings).create_request(now=0.0)
    assert not request.polled


def test_unknown_member_on_heartbeat_rejoins_with_an_empty_member_id():
    coordinator, gateway, _ = make(clock=SystemClock(), heartbeat_interval_ms=20, session_timeout_ms=6000)
    gateway.answer(
        "JoinGroup",
        pb.JoinGroupResponse(member_id="m-1", generation_id=1, assignment=tps(T0), heartbeat_interval_ms=20),
        pb.JoinGroupResponse(member_id="m-2", generation_id=2, assignment=tps(T1), heartbeat_interval_ms=20),
    )
    gateway.answer("Heartbeat", errors.UnknownMemberIdError("session expired"))
    gateway.defaults["Heartbeat"] = pb.HeartbeatResponse(generation_id=2, assignment=tps(T1))

    async def scenario():
        coordinator.subscribe(None)
        while not gateway.requests("Heartbeat"):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)
        assert coordinator.membership.needs_join and len(gateway.requests("JoinGroup")) == 1, (
            "lost while the application was not polling: no rejoin in the background"
        )
        coordinator.poll_started()
        for _ in range(500):
            if coordinator.membership.member_id == "m-2":
                break
            await asyncio.sleep(0.005)
        coordinator.poll_finished()
        await coordinator.leave_group("test")

    run(scenario())
    joins = gateway.requests("JoinGroup")
    assert [j.member_id for j in joins] == ["", ""]
    assert joins[0].session_timeout_ms == 6000 and joins[0].assignor == pb.ASSIGNOR_COOPERATIVE_STICKY


def test_fenced_static_member_stops_and_poll_raises_after_dropping_its_partitions():
    log = []
    coordinator, gateway, _ = make(
        clock=SystemClock(),
        listener=RecordingListener(log),
        heartbeat_interval_ms=20,
        group_instance_id="static-1",
    )
    gateway.answer(
        "JoinGroup",
        pb.JoinGroupResponse(member_id="m-1", generation_id=1, assignment=tps(T0), heartbeat_interval_ms=20),
    )
    gateway.defaults["Heartbeat"] = errors.FencedInstanceIdError("replaced by a newer incarnation")

    async def scenario():
        coordinator.subscribe(coordinator.listener)
        while not coordinator.membership.is_member:
            await asyncio.sleep(0.001)
        await coordinator.maybe_rebalance()
        await asyncio.wait_for(coordinator._routine, 5)
        with pytest.raises(errors.FencedInstanceIdError):
            await coordinator.poll()
        await coordinator.leave_group("test")

    run(scenario())
    assert log == [("assigned", {T0}), ("lost", {T0})]
    assert gateway.requests("JoinGroup")[0].group_instance_id == "static-1"
    assert gateway.requests("LeaveGroup") == []


@pytest.mark.parametrize("static, expected_leaves", [(None, 1), ("static-1", 0)])
def test_leave_group_commits_revokes_then_leaves_unless_static(static, expected_leaves):
    log = []
    coordinator, gateway, subscription = make(listener=RecordingListener(log), group_instance_id=static)

    async def scenario():
        join(coordinator, [T0])
        await coordinator.maybe_rebalance()
        subscription.seek(T0, 12)
        await coordinator.leave_group("close")

    run(scenario())
    assert log == [("assigned", {T0}), ("revoked", {T0})]
    assert [(o.partition, o.offset) for o in gateway.requests("CommitOffsets")[0].offsets] == [(0, 12)]
    assert len(gateway.requests("LeaveGroup")) == expected_leaves, static


@pytest.mark.parametrize(
    "error, reaction, fatal",
    [
        (errors.UnknownMemberIdError("x"), Reaction.CONTINUE, False),
        (errors.InvalidSessionTimeoutError("x"), Reaction.STOP, True),
        (errors.InconsistentGroupProtocolError("x"), Reaction.STOP, True),
        (errors.FencedInstanceIdError("x"), Reaction.STOP, True),
        (errors.NotControllerError("x"), Reaction.BACKOFF, False),
        (errors.NetworkError("x"), Reaction.BACKOFF, False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_join_errors(error, reaction, fatal):
    membership = GroupMembership(heartbeat_interval_ms=3000)
    membership.request_join()
    subscription = SubscriptionState()
    subscription.subscribe(["t"])
    assert JoinGroupHandler(membership, subscription, GroupSettings("g")).handle_error(error) is reaction
    assert (membership.fatal is error) is fatal


def test_heartbeat_answers_for_an_ended_membership_are_ignored():
    membership = GroupMembership(heartbeat_interval_ms=3000)
    membership.on_join("m-1", 1, [T0], [], 3000, now=0.0)
    handler = HeartbeatHandler(membership, GroupSettings("g"))
    handler.create_request(now=0.0)
    membership.on_member_lost()
    assert not handler.handle_response(pb.HeartbeatResponse(generation_id=1, assignment=tps(T0, T1)), now=0.0)
    assert membership.assignment == frozenset()
    assert handler.handle_error(errors.UnknownMemberIdError("late")) is Reaction.CONTINUE


def test_commit_handler_whole_call_reactions():
    membership = GroupMembership(heartbeat_interval_ms=3000)
    membership.on_join("m-1", 1, [T0], [], 3000, now=0.0)
    handler = CommitOffsetsHandler(
        membership, GroupSettings("g"), {T0: OffsetAndMetadata(1)}, group_managed=True
    )
    assert handler.handle_error(errors.IllegalGenerationError("x")) is Reaction.REFRESH
    assert handler.handle_error(errors.CoordinatorNotAvailableError("x")) is Reaction.BACKOFF
    assert handler.handle_error(errors.UnknownTopicOrPartitionError("x")) is Reaction.STOP
    standalone = CommitOffsetsHandler(
        membership, GroupSettings("g"), {T0: OffsetAndMetadata(1)}, group_managed=False
    )
    assert standalone.handle_error(errors.UnknownMemberIdError("group has members")) is Reaction.STOP
    assert membership.member_id == "m-1", "a standalone commit's refusal says nothing about a membership"
