"""The consumer's group coordinator: the heartbeat routine, rebalances applied inside ``poll``,
and offset commits. aiokafka's ``GroupCoordinator``, over Tributary's server-side assignment.

Decisions live in the pure :class:`~gateway.client.membership.GroupMembership`; this module does
the I/O around it:

* :meth:`GroupCoordinator._heartbeat_routine` -- a task on the consumer's event loop (the I/O
  thread of the thread-based ``Consumer``), so heartbeats go on while the application processes
  records: it joins, then heartbeats when the membership says one is due (one in flight at a
  time), and reacts to errors (:class:`JoinGroupHandler`, :class:`HeartbeatHandler`).
* :meth:`GroupCoordinator.poll` -- called by every ``poll()``: raises a fatal membership error,
  applies the membership's :class:`~gateway.client.membership.RebalancePlan` (lost, then revoked
  -- auto-committed first --, then assigned), calling the rebalance listener through
  ``call_back`` (on the application's thread for the thread-based consumer), looks up committed
  offsets of new partitions, and auto-commits when due.
* Commits: :meth:`GroupCoordinator.commit` (retrying, Kafka's ``commitSync``),
  :meth:`GroupCoordinator.commit_async` (one attempt; its callback runs in a later ``poll``),
  :meth:`GroupCoordinator.fetch_committed`; one :class:`CommitOffsetsHandler` per request.
* :meth:`GroupCoordinator.leave_group` -- on ``close``/``unsubscribe``: a final auto-commit, the
  listener's ``on_partitions_revoked``, then LeaveGroup (not for a static member: a restart
  within the session timeout keeps its partitions, as in Kafka).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.client.client import GatewayClient
from gateway.client.errors import (
    FencedInstanceIdError,
    IllegalGenerationError,
    RebalanceInProgressError,
    RequestTimedOutError,
    TributaryError,
    UnknownMemberIdError,
)
from gateway.client.fetcher import Fetcher
from gateway.client.group_serde import (
    assignor_to_proto,
    commit_result_from_proto,
    committed_from_proto,
    offsets_to_proto,
    subscription_to_proto,
    tps_from_proto,
    tps_to_proto,
)
from gateway.client.listener import listener_method
from gateway.client.membership import AutoCommitTimer, GroupMembership, changed_offsets
from gateway.client.structs import OffsetAndMetadata, TopicPartition
from gateway.client.subscription import SubscriptionState
from services.proto import pb

log = logging.getLogger(__name__)

#: ``call_back(fn, *args)``: how listener methods and commit callbacks are run.
CallBack = Callable[..., Awaitable[Any]]
#: A commit callback: ``callback(offsets, exception_or_None)``.
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], BaseException | None], Any]

MAX_BACKOFF_S = 1.0


@dataclass(frozen=True)
class GroupSettings:
    """The consumer settings the group protocol uses (see the consumer's module docstring)."""

    group_id: str
    group_instance_id: str | None = None
    client_id: str = "tributary-consumer"
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    assignor: str | None = "cooperative-sticky"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100

    @property
    def is_static(self) -> bool:
        return bool(self.group_instance_id)


class Reaction(enum.Enum):
    """What the caller does after a failed group request."""

    CONTINUE = "continue"  # go on at once: the membership state says what comes next
    BACKOFF = "backoff"  # try again after a backoff
    REFRESH = "refresh"  # heartbeat to learn the current generation, then try again
    STOP = "stop"  # give up: the error is final (raise it / the membership is over)


# ---- one handler per request ------------------------------------------------------------------


class JoinGroupHandler:
    """One JoinGroup: ``create_request`` / ``handle_response`` / ``handle_error``."""

    def __init__(
        self, membership: GroupMembership, subscription: SubscriptionState, settings: GroupSettings
    ) -> None:
        self.membership = membership
        self.subscription = subscription
        self.settings = settings

    def create_request(self):
        s = self.settings
        return pb.JoinGroupRequest(
            group_id=s.group_id,
            member_id=self.membership.member_id,
            group_instance_id=s.group_instance_id or "",
            client_id=s.client_id,
            subscription=subscription_to_proto(self.subscription.topics, self.subscription.pattern),
            assignor=assignor_to_proto(s.assignor),
            session_timeout_ms=s.session_timeout_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
        )

    def handle_response(self, response, now: float) -> None:
        self.membership.on_join(
            response.member_id,
            response.generation_id,
            tps_from_proto(response.assignment),
            tps_from_proto(response.pending),
            response.heartbeat_interval_ms,
            now,
        )

    def handle_error(self, error: TributaryError) -> Reaction:
        if isinstance(error, UnknownMemberIdError):
            self.membership.on_member_lost()  # our id expired: join afresh
            return Reaction.CONTINUE
        if isinstance(error, FencedInstanceIdError) or not error.retriable:
            # FENCED_INSTANCE_ID, INVALID_GROUP_ID, INVALID_SESSION_TIMEOUT, INVALID_REQUEST,
            # INCONSISTENT_GROUP_PROTOCOL: joining again would fail the same way.
            self.membership.on_fenced(error)
            return Reaction.STOP
        return Reaction.BACKOFF


class HeartbeatHandler:
    """One Heartbeat: ``create_request`` / ``handle_response`` / ``handle_error``."""

    def __init__(self, membership: GroupMembership, settings: GroupSettings) -> None:
        self.membership = membership
        self.settings = settings
        self.member_id = membership.member_id

    def create_request(self, now: float):
        m = self.membership
        request = pb.HeartbeatRequest(
            group_id=self.settings.group_id,
            member_id=self.member_id,
            generation_id=m.generation,
            owned=tps_to_proto(m.owned_to_report()),
            polled=m.take_polled(),
            group_instance_id=self.settings.group_instance_id or "",
        )
        m.heartbeat_sent(now)
        return request

    def handle_response(self, response, now: float) -> bool:
        """Apply the answer; False (ignored) if the membership it belongs to has ended meanwhile."""
        if self.membership.member_id != self.member_id or self.membership.needs_join:
            return False
        self.membership.on_heartbeat(
            response.generation_id, tps_from_proto(response.assignment), tps_from_proto(response.pending), now
        )
        return True

    def handle_error(self, error: TributaryError) -> Reaction:
        if self.membership.member_id != self.member_id:
            return Reaction.CONTINUE  # about a membership that has ended already
        if isinstance(error, UnknownMemberIdError):
            self.membership.on_member_lost()
            return Reaction.CONTINUE
        if isinstance(error, FencedInstanceIdError):
            self.membership.on_fenced(error)
            return Reaction.STOP
        if isinstance(error, IllegalGenerationError):
            self.membership.request_join()  # we are ahead of the group (it was reloaded): join with our id
            return Reaction.CONTINUE
        return Reaction.BACKOFF  # COORDINATOR_NOT_AVAILABLE, NOT_CONTROLLER, the network: within the session


class CommitOffsetsHandler:
    """One CommitOffsets: ``create_request`` / ``handle_response`` / ``handle_error``.

    A group-managed consumer commits as a member (its id and latest generation); a consumer with
    manually assigned partitions commits standalone (no member id, generation -1), which the
    coordinator accepts only while the group has no members.
    """

    def __init__(
        self,
        membership: GroupMembership,
        settings: GroupSettings,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        group_managed: bool,
    ) -> None:
        self.membership = membership
        self.settings = settings
        self.offsets = dict(offsets)
        self.group_managed = group_managed

    def create_request(self):
        m, s = self.membership, self.settings
        member_id, generation = (m.member_id, m.generation) if self.group_managed else ("", -1)
        return pb.CommitOffsetsRequest(
            group_id=s.group_id,
            member_id=member_id,
            generation_id=generation,
            offsets=offsets_to_proto(self.offsets),
            group_instance_id=(s.group_instance_id or "") if self.group_managed else "",
        )

    def handle_response(self, response) -> dict[TopicPartition, TributaryError]:
        """The partitions that failed, with their errors; a partition refused with
        ILLEGAL_GENERATION has moved to another member, so it is dropped (lost)."""
        failed = {}
        for message in response.results:
            tp, error = commit_result_from_proto(message)
            if error is not None:
                failed[tp] = error
        moved = [tp for tp, error in failed.items() if isinstance(error, IllegalGenerationError)]
        if moved and self.group_managed:
            self.membership.mark_moved(moved)
        return failed

    def handle_error(self, error: TributaryError) -> Reaction:
        if not self.group_managed:
            return Reaction.BACKOFF if is_retriable_commit_error(error) else Reaction.STOP
        if isinstance(error, IllegalGenerationError):
            return Reaction.REFRESH
        if isinstance(error, UnknownMemberIdError):
            self.membership.on_member_lost()
            return Reaction.STOP
        if isinstance(error, FencedInstanceIdError):
            self.membership.on_fenced(error)
            return Reaction.STOP
        return Reaction.BACKOFF if is_retriable_commit_error(error) else Reaction.STOP


def is_retriable_commit_error(error: TributaryError) -> bool:
    """Worth sending the same commit again: the coordinator or the network was unavailable. (An
    unknown topic is 'retriable' for producers waiting for it to appear, not for a commit.)"""
    return error.retriable and not error.invalid_metadata


def commit_failure(failed: Mapping[TopicPartition, TributaryError]) -> TributaryError:
    """One error for a commit whose partitions failed: the first one's type, naming them all."""
    first = next(iter(failed.values()))
    details = "; ".join(f"{tp}: {error}" for tp, error in sorted(failed.items()))
    error = type(first)(f"commit failed for {len(failed)} partition(s): {details}")
    error.__cause__ = first
    return error


def backoff_s(retry_backoff_ms: int, attempt: int) -> float:
    return min(MAX_BACKOFF_S, retry_backoff_ms / 1000.0 * 2 ** max(0, attempt - 1))


# ---- the coordinator ----------------------------------------------------------------------------


class GroupCoordinator:
    """Group membership, rebalances and commits of one consumer. Lives on the consumer's loop."""

    def __init__(
        self,
        client: GatewayClient,
        subscription: SubscriptionState,
        fetcher: Fetcher,
        settings: GroupSettings,
        *,
        attention: asyncio.Event,
        call_back: CallBack,
        consumed_offsets: Callable[[], dict[TopicPartition, int]],
    ) -> None:
        self.client = client
        self.subscription = subscription
        self.fetcher = fetcher
        self.settings = settings
        self.membership = GroupMembership(heartbeat_interval_ms=settings.heartbeat_interval_ms)
        self.listener = None
        #: Set whenever ``poll`` has something to do besides returning records.
        self.attention = attention
        self._call_back = call_back
        self._consumed_offsets = consumed_offsets
        clock = client.clock
        self._auto_commit = (
            AutoCommitTimer(settings.auto_commit_interval_ms, clock.monotonic())
            if settings.enable_auto_commit
            else None
        )
        #: The last offset this consumer committed per partition (auto-commit skips unchanged ones).
        self._committed: dict[TopicPartition, int] = {}
        self._completed_commits: deque[tuple[CommitCallback, dict, BaseException | None]] = deque()
        self._commit_tasks: set[asyncio.Task] = set()
        self._routine: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._answered: list[asyncio.Future] = []
        self._retry_at = 0.0
        self._committed_retry_at = 0.0

    @property
    def group_managed(self) -> bool:
        return self.subscription.is_group_managed

    def _now(self) -> float:
        return self.client.clock.monotonic()

    # -- subscription -----------------------------------------------------------------------

    def subscribe(self, listener) -> None:
        """(Re)join with the subscription now in the subscription state; start heartbeating."""
        self.listener = listener
        self.membership.request_join()
        self._wake.set()
        self.ensure_routine()

    def ensure_routine(self) -> None:
        """Start the heartbeat routine (on the running loop) if subscribed and not running."""
        loop = asyncio._get_running_loop()
        if loop is None or not self.group_managed or self.membership.fatal is not None:
            return  # (not on a loop yet: the consumer's start() comes back here)
        if self._routine is None or self._routine.done():
            self._routine = loop.create_task(self._heartbeat_routine(), name="tributary-heartbeat")
            self._routine.add_done_callback(self._routine_ended)

    def _routine_ended(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            # A bug, not a server's answer: say so; the next poll starts the routine again.
            log.error("group %s: heartbeat routine failed", self.settings.group_id, exc_info=task.exception())

    # -- the heartbeat routine --------------------------------------------------------------

    async def _heartbeat_routine(self) -> None:
        """Join, then heartbeat whenever one is due, until cancelled or the membership is over."""
        failures = 0
        while self.membership.fatal is None:
            delay = max(self.membership.heartbeat_delay(self._now()), self._retry_at - self._now())
            if delay > 0:
                await self._sleep(delay)
                continue
            reaction = await (self._do_join() if self.membership.needs_join else self._do_heartbeat())
            self._notify_answered()
            if reaction is Reaction.STOP:
                self.attention.set()
                log.error("group %s: membership ended: %s", self.settings.group_id, self.membership.fatal)
                return
            failures = failures + 1 if reaction is Reaction.BACKOFF else 0
            self._retry_at = (
                self._now() + backoff_s(self.settings.retry_backoff_ms, failures) if failures else 0.0
            )
            if self.membership.plan():
                self.attention.set()

    async def _sleep(self, delay: float) -> None:
        """Wait ``delay`` seconds or until woken. (Not ``asyncio.wait_for``: before Python 3.12 it
        can swallow a cancellation that arrives as the wait completes, and the routine must stop
        when ``close`` cancels it.)"""
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({woken}, timeout=None if math.isinf(delay) else delay)
        finally:
            woken.cancel()
        self._wake.clear()

    async def _do_join(self) -> Reaction:
        handler = JoinGroupHandler(self.membership, self.subscription, self.settings)
        try:
            response = await self.client.call("JoinGroup", handler.create_request())
        except TributaryError as exc:
            log.info("group %s: join failed: %s", self.settings.group_id, exc)
            return handler.handle_error(exc)
        handler.handle_response(response, self._now())
        log.info(
            "group %s: joined as %s, generation %d, %d partitions assigned",
            self.settings.group_id,
            response.member_id,
            response.generation_id,
            len(response.assignment),
        )
        return Reaction.CONTINUE

    async def _do_heartbeat(self) -> Reaction:
        handler = HeartbeatHandler(self.membership, self.settings)
        request = handler.create_request(self._now())
        timeout_ms = min(self.settings.request_timeout_ms, self.settings.session_timeout_ms)
        try:
            response = await self.client.call("Heartbeat", request, timeout_ms=timeout_ms)
        except TributaryError as exc:
            log.log(
                logging.DEBUG if exc.retriable else logging.INFO,
                "group %s: heartbeat failed: %s",
                self.settings.group_id,
                exc,
            )
            return handler.handle_error(exc)
        handler.handle_response(response, self._now())
        return Reaction.CONTINUE

    def _notify_answered(self) -> None:
        waiters, self._answered = self._answered, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _await_next_heartbeat(self) -> None:
        """Heartbeat now and wait for its answer (to learn the current generation)."""
        waiter = asyncio.get_running_loop().create_future()
        self._answered.append(waiter)
        self.membership.heartbeat_soon()
        self._wake.set()
        self.ensure_routine()
        await asyncio.wait({waiter}, timeout=self.settings.request_timeout_ms / 1000.0)
        if not waiter.done():
            waiter.cancel()
            raise RequestTimedOutError(
                f"no heartbeat answer from group {self.settings.group_id} within "
                f"{self.settings.request_timeout_ms} ms"
            )

    # -- inside poll ------------------------------------------------------------------------

    def poll_started(self) -> None:
        rejoin = self.membership.needs_join
        self.membership.poll_started()
        if rejoin:
            self._wake.set()  # a member that lost its membership joins again now

    def poll_finished(self) -> None:
        self.membership.poll_finished()

    async def poll(self) -> None:
        """What ``poll`` does for the group before returning records (see the module docstring)."""
        await self.deliver_commit_callbacks()
        if self.group_managed:
            self.ensure_routine()
            await self.maybe_rebalance()
            if self.membership.fatal is not None:
                raise self.membership.fatal
        await self.refresh_committed_offsets()
        self.maybe_auto_commit()

    async def maybe_rebalance(self) -> None:
        """Apply the membership's plan: drop lost partitions, give up revoked ones, take new ones.

        Listener errors do not stop it; the first is raised once every step is done.
        """
        failures: list[BaseException] = []
        lost = self.membership.plan().lost
        if lost:
            await self._give_up(lost, lost=True, failures=failures)
        revoked = self.membership.plan().revoked
        if revoked:
            await self._give_up(revoked, lost=False, failures=failures)
        assigned = self.membership.plan().assigned
        if assigned:
            await self._take(assigned, failures)
        if failures:
            raise failures[0]

    async def _give_up(
        self, partitions: frozenset[TopicPartition], *, lost: bool, failures: list, commit: bool = True
    ) -> None:
        """Stop consuming ``partitions``: auto-commit (revoked only), the listener, then release."""
        log.info(
            "group %s: %s %s",
            self.settings.group_id,
            "lost" if lost else "giving up",
            ", ".join(map(str, sorted(partitions))),
        )
        if not lost and commit and self.settings.enable_auto_commit:
            consumed = self._consumed_offsets()
            await self._commit_quietly(
                {tp: consumed[tp] for tp in partitions if tp in consumed}, "before giving partitions up"
            )
        await self._call_listener(
            "on_partitions_lost" if lost else "on_partitions_revoked", partitions, failures
        )
        for tp in partitions:
            self.fetcher.discard(tp)
            self._committed.pop(tp, None)
        self.subscription.remove_partitions(partitions)
        if lost:
            self.membership.complete_loss(partitions)
        else:
            self.membership.complete_revocation(partitions)
            self._wake.set()  # report the smaller owned set at once: that releases them
        self.fetcher.wakeup(restart_fetch=True)

    async def _take(self, partitions: frozenset[TopicPartition], failures: list) -> None:
        """Start consuming ``partitions``: the listener first (it may seek), then committed offsets."""
        log.info("group %s: assigned %s", self.settings.group_id, ", ".join(map(str, sorted(partitions))))
        self.subscription.add_group_partitions(partitions)
        self.membership.complete_assignment(partitions)
        await self._call_listener("on_partitions_assigned", partitions, failures)
        self._committed_retry_at = 0.0
        await self.refresh_committed_offsets()
        self.fetcher.wakeup(restart_fetch=True)

    async def _call_listener(self, name: str, partitions: frozenset[TopicPartition], failures: list) -> None:
        method = listener_method(self.listener, name)
        if method is None:
            return
        try:
            await self._call_back(method, set(partitions))
        except Exception as exc:  # noqa: BLE001 -- the rebalance goes on; poll raises it afterwards
            log.warning("group %s: rebalance listener %s raised %r", self.settings.group_id, name, exc)
            failures.append(exc)

    async def refresh_committed_offsets(self) -> None:
        """Start partitions awaiting their committed offset there (or at the default reset)."""
        waiting = self.subscription.partitions_awaiting_committed()
        if not waiting or self._now() < self._committed_retry_at:
            return
        try:
            found = await self.fetch_committed(list(waiting))
        except TributaryError as exc:
            log.warning("group %s: committed offsets not read (%s); retrying", self.settings.group_id, exc)
            self._committed_retry_at = self._now() + self.settings.retry_backoff_ms / 1000.0
            return
        for tp, epoch in waiting.items():
            committed = found.get(tp)
            self.subscription.complete_committed(
                tp, epoch, committed.offset if committed is not None else None
            )
            if committed is not None:
                self._committed[tp] = committed.offset
        self.fetcher.wakeup()

    # -- commits ----------------------------------------------------------------------------

    def offsets_to_commit(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata] | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """``offsets``, or (None) the consumed position of every partition this consumer holds."""
        if offsets is not None:
            return dict(offsets)
        consumed = self._consumed_offsets()
        return {
            tp: OffsetAndMetadata(offset)
            for tp, offset in sorted(consumed.items())
            if not self.group_managed or self.membership.holds(tp)
        }

    def _ensure_can_commit(self) -> None:
        if self.membership.fatal is not None:
            raise self.membership.fatal
        if self.group_managed and not self.membership.is_member:
            raise RebalanceInProgressError(
                f"the consumer is (re)joining group {self.settings.group_id}; commit after the next poll"
            )

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit and wait (Kafka's ``commitSync``): retries while the coordinator is unavailable
        and after a generation change (for the partitions still held), up to ``request_timeout_ms``."""
        self._ensure_can_commit()
        remaining = dict(offsets)
        deadline = self._now() + self.settings.request_timeout_ms / 1000.0
        attempt = 0
        while remaining:
            attempt += 1
            handler = CommitOffsetsHandler(
                self.membership, self.settings, remaining, group_managed=self.group_managed
            )
            try:
                failed = await self._do_commit_offsets(handler)
            except TributaryError as exc:
                reaction = handler.handle_error(exc)
                if reaction is Reaction.STOP or self._now() >= deadline:
                    self._maybe_attention(exc)
                    raise
                remaining = await self._before_retry(reaction, remaining, attempt)
                continue
            retry = {tp: remaining[tp] for tp, error in failed.items() if is_retriable_commit_error(error)}
            final = {tp: error for tp, error in failed.items() if tp not in retry}
            if final or (retry and self._now() >= deadline):
                raise commit_failure(final or {tp: failed[tp] for tp in retry})
            remaining = retry
            if retry:
                await asyncio.sleep(backoff_s(self.settings.retry_backoff_ms, attempt))

    async def _before_retry(self, reaction: Reaction, remaining: dict, attempt: int) -> dict:
        if reaction is Reaction.REFRESH:
            await self._await_next_heartbeat()
            kept = {tp: om for tp, om in remaining.items() if self.membership.holds(tp)}
            if len(kept) < len(remaining):
                moved = sorted(set(remaining) - set(kept))
                raise IllegalGenerationError(
                    f"partitions {', '.join(map(str, moved))} moved to another member "
                    "of the group before the commit; not committed"
                )
            self._ensure_can_commit()
            return kept
        await asyncio.sleep(backoff_s(self.settings.retry_backoff_ms, attempt))
        return remaining

    async def _do_commit_offsets(self, handler: CommitOffsetsHandler) -> dict[TopicPartition, TributaryError]:
        """One CommitOffsets round trip; returns the per-partition failures."""
        response = await self.client.call("CommitOffsets", handler.create_request())
        failed = handler.handle_response(response)
        for tp, om in handler.offsets.items():
            if tp not in failed:
                self._committed[tp] = om.offset
        if failed and self.membership.lost:
            self.attention.set()
        return failed

    def _maybe_attention(self, error: TributaryError) -> None:
        if isinstance(error, (UnknownMemberIdError, FencedInstanceIdError)) and self.group_managed:
            self._wake.set()
            self.attention.set()

    async def _commit_quietly(self, offsets: Mapping[TopicPartition, int], why: str) -> None:
        if not offsets:
            return
        try:
            self._ensure_can_commit()
            await self.commit({tp: OffsetAndMetadata(o) for tp, o in offsets.items()})
        except TributaryError as exc:
            log.warning("group %s: auto-commit %s failed: %s", self.settings.group_id, why, exc)

    def commit_async(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], callback: CommitCallback | None = None
    ) -> None:
        """Send one commit without waiting (no retries, as Kafka's ``commitAsync``);
        ``callback(offsets, exception_or_None)`` runs in a later ``poll``/``commit``/``close``."""
        task = asyncio.get_running_loop().create_task(self._do_commit_async(dict(offsets), callback))
        self._commit_tasks.add(task)
        task.add_done_callback(self._commit_tasks.discard)

    async def _do_commit_async(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], callback: CommitCallback | None
    ) -> None:
        error: BaseException | None = None
        handler = CommitOffsetsHandler(
            self.membership, self.settings, offsets, group_managed=self.group_managed
        )
        try:
            self._ensure_can_commit()
            failed = await self._do_commit_offsets(handler)
            if failed:
                error = commit_failure(failed)
        except TributaryError as exc:
            handler.handle_error(exc)
            self._maybe_attention(exc)
            error = exc
        if callback is not None:
            self._completed_commits.append((callback, offsets, error))
        elif error is not None:
            log.warning("group %s: auto-commit failed: %s", self.settings.group_id, error)

    async def deliver_commit_callbacks(self) -> None:
        """Run the callbacks of finished async commits (in the application's thread)."""
        while self._completed_commits:
            callback, offsets, error = self._completed_commits.popleft()
            try:
                await self._call_back(callback, offsets, error)
            except Exception:
                log.exception("group %s: error in a commit callback", self.settings.group_id)

    def maybe_auto_commit(self) -> None:
        """Inside ``poll``: commit what earlier polls returned, every ``auto_commit_interval_ms``."""
        now = self._now()
        if self._auto_commit is None or not self._auto_commit.due(now):
            return
        self._auto_commit.reset(now)
        if self.group_managed and not self.membership.is_member:
            return
        held = self.offsets_to_commit()
        changed = changed_offsets({tp: om.offset for tp, om in held.items()}, self._committed)
        if changed:
            self.commit_async({tp: OffsetAndMetadata(o) for tp, o in changed.items()})

    async def fetch_committed(
        self,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition (None where nothing is committed)."""
        partitions = list(partitions)
        request = pb.FetchCommittedOffsetsRequest(
            group_id=self.settings.group_id, partitions=tps_to_proto(partitions)
        )
        response = await self.client.call_with_retry("FetchCommittedOffsets", request)
        found: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(partitions)
        for message in response.offsets:
            tp, committed, error = committed_from_proto(message)
            if error is not None:
                raise error
            found[tp] = committed
        return found

    # -- leaving ----------------------------------------------------------------------------

    async def leave_group(self, reason: str) -> None:
        """``close``/``unsubscribe``: commit (auto-commit), revoke through the listener, stop
        heartbeating, and send LeaveGroup unless this is a static member."""
        failures: list[BaseException] = []
        try:
            if self.settings.enable_auto_commit and (not self.group_managed or self.membership.is_member):
                await self._commit_quietly(
                    {tp: om.offset for tp, om in self.offsets_to_commit().items()}, f"on {reason}"
                )
            await self.deliver_commit_callbacks()
            if self.group_managed:
                await self._release_everything(failures)
        finally:
            await self._stop_routine()
            await self._maybe_send_leave(reason)
            self.membership.leave()
        if failures:
            raise failures[0]

    async def _release_everything(self, failures: list) -> None:
        plan = self.membership.plan()
        if plan.lost:
            await self._give_up(plan.lost, lost=True, failures=failures)
        held = frozenset(self.membership.held)
        if held:
            await self._give_up(held, lost=not self.membership.is_member, failures=failures, commit=False)

    async def _stop_routine(self) -> None:
        routine, self._routine = self._routine, None
        if routine is not None:
            routine.cancel()
            await asyncio.gather(routine, return_exceptions=True)
        if self._commit_tasks:
            await asyncio.wait(set(self._commit_tasks), timeout=self.settings.request_timeout_ms / 1000.0)

    async def _maybe_send_leave(self, reason: str) -> None:
        m = self.membership
        if not m.member_id or m.fatal is not None or self.settings.is_static:
            return  # a static member keeps its partitions through a restart within the session
        request = pb.LeaveGroupRequest(group_id=self.settings.group_id, member_id=m.member_id)
        try:
            await self.client.call("LeaveGroup", request)
            log.info("group %s: member %s left (%s)", self.settings.group_id, m.member_id, reason)
        except TributaryError as exc:
            log.warning(
                "group %s: LeaveGroup failed (%s); the session times out instead", self.settings.group_id, exc
            )
