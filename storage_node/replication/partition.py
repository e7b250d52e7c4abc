"""``Partition``: one partition on this node -- its log and its replication role (Kafka's
``Partition``).

The controller sets the role (:meth:`Partition.apply_state`). As **leader** the partition stamps
its leader epoch on appends, tracks each follower's position from the fetches it serves, moves
the high watermark (the smallest log end in the ISR), completes ``acks=all`` appends once the high
watermark passes them, and asks the controller to shrink or expand the ISR (AlterPartition, one
change in flight at a time; KIP-497: a joining replica counts at once, a leaving one until the
controller has committed its removal). As **follower** it refuses appends and consumer reads
(NOT_LEADER_OR_FOLLOWER); a replica fetcher (``fetcher.py``) copies the leader's log into it.

Thread safety: every method runs on the storage node's event loop. The log it wraps is
thread-safe on its own (flushes run on worker threads).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from services import errors
from services.clock import Clock
from services.fetchport.multi import NO_EPOCH, PartitionFetch
from services.leader_and_isr import LeaderAndIsr
from storage_node.log.leader_epochs import EpochEndOffset
from storage_node.log.partition_log import AppendInfo, FetchInfo, PartitionLog
from storage_node.replication import rules
from storage_node.replication.rules import FollowerState

log = logging.getLogger(__name__)

#: How long a leader waits before asking again to add a follower the controller called
#: ineligible (INELIGIBLE_REPLICA: in controlled shutdown, or not live). It would otherwise ask
#: again on every fetch of that follower while it still fetches.
INELIGIBLE_BACKOFF_MS = 500

#: ``submit(partition, new_isr)``: send an AlterPartition for ``partition``'s current state.
IsrChangeSender = Callable[["Partition", tuple[int, ...]], None]


@dataclass(order=True)
class _AckWaiter:
    """An ``acks=all`` append waiting for the high watermark to reach ``required_offset``."""

    required_offset: int
    sequence: int
    future: asyncio.Future[None] = field(compare=False)


class Partition:
    """One partition replica on this node. See the module docstring."""

    def __init__(
        self,
        node_id: int,
        log: PartitionLog,
        clock: Clock,
        *,
        on_high_watermark: Callable[[tuple[str, int]], None] = lambda key: None,
        send_isr_change: IsrChangeSender | None = None,
    ) -> None:
        self.node_id = node_id
        self.log = log
        self._clock = clock
        self._on_high_watermark = on_high_watermark
        self._send_isr_change = send_isr_change
        self.state: LeaderAndIsr | None = None
        self._followers: dict[int, FollowerState] = {}
        self._pending_isr: tuple[int, ...] | None = None
        self._leader_epoch_start_offset = 0
        #: Follower -> clock time (ms) before which it is not proposed for the ISR again.
        self._ineligible_until: dict[int, int] = {}
        self._waiters: list[_AckWaiter] = []
        self._sequence = itertools.count()

    @property
    def key(self) -> tuple[str, int]:
        return (self.log.topic, self.log.partition)

    @property
    def name(self) -> str:
        return self.log.name

    @property
    def is_leader(self) -> bool:
        state = self.state
        return state is not None and state.leader == self.node_id and not state.deleting

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch if self.state is not None else NO_EPOCH

    @property
    def isr(self) -> tuple[int, ...]:
        return self.state.isr if self.state is not None else ()

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR plus the replica an in-flight expansion adds (KIP-497)."""
        isr = self.isr
        pending = self._pending_isr
        if pending is None:
            return isr
        return isr + tuple(r for r in pending if r not in isr)

    @property
    def under_replicated(self) -> bool:
        state = self.state
        return state is not None and len(state.isr) < len(state.replicas)

    @property
    def under_min_isr(self) -> bool:
        return self.state is not None and len(self.state.isr) < self.log.config.min_insync_replicas

    def follower_log_end(self, node_id: int) -> int:
        follower = self._followers.get(node_id)
        return follower.log_end_offset if follower is not None else rules.UNKNOWN_OFFSET

    # ---- roles -----------------------------------------------------------------------------------

    def apply_state(self, state: LeaderAndIsr) -> bool:
        """Take the role the controller (or an AlterPartition answer) gives; False if ``state``
        is not newer than the one held. A state of an older leader epoch is FENCED_LEADER_EPOCH."""
        current = self.state
        if current is not None:
            if state.leader_epoch < current.leader_epoch:
                raise errors.FencedLeaderEpochError(
                    f"{self.name}: state of leader epoch {state.leader_epoch} is older than "
                    f"{current.leader_epoch}"
                )
            if not state.newer_than(current) and state.deleting == current.deleting:
                return False
        was_leader = self.is_leader
        new_epoch = current is None or state.leader_epoch > current.leader_epoch
        self.state = state
        self._pending_isr = None  # whatever was in flight is answered against an old version
        if self.is_leader:
            if new_epoch or not was_leader:
                self._become_leader(state)
            self._track_followers(state)
            self._maybe_increment_high_watermark()
        elif was_leader or new_epoch or state.deleting:
            self._become_follower(state)
        return True

    def _become_leader(self, state: LeaderAndIsr) -> None:
        self.log.assign_leader_epoch(state.leader_epoch)
        self._leader_epoch_start_offset = self.log.log_end_offset
        now = self._clock.time_ms()
        self._followers = {}
        for replica in state.replicas:
            if replica != self.node_id:
                follower = FollowerState(replica)
                follower.reset(now, in_sync=replica in state.isr)
                self._followers[replica] = follower
        log.info(
            "%s: leader for epoch %d from offset %d, ISR %s, high watermark %d",
            self.name,
            state.leader_epoch,
            self._leader_epoch_start_offset,
            list(state.isr),
            self.log.high_watermark,
        )

    def _track_followers(self, state: LeaderAndIsr) -> None:
        """Follow the replica list within an epoch: a reassignment adds replicas (out of sync,
        until they catch up) and removes others."""
        for replica in list(self._followers):
            if replica not in state.replicas:
                del self._followers[replica]
        now = self._clock.time_ms()
        for replica in state.replicas:
            if replica != self.node_id and replica not in self._followers:
                follower = FollowerState(replica)
                follower.reset(now, in_sync=replica in state.isr)
                self._followers[replica] = follower

    def _become_follower(self, state: LeaderAndIsr) -> None:
        self._followers = {}
        what = "stopped: its topic is being deleted" if state.deleting else f"leader is {state.leader}"
        self._fail_waiters(
            errors.NotLeaderOrFollowerError(f"{self.name}: this node no longer leads it ({what})")
        )
        log.info("%s: follower in leader epoch %d (%s)", self.name, state.leader_epoch, what)

    def stop(self, reason: str) -> None:
        """This replica is going away (deleted, node stopping): fail whatever waits on it."""
        self._fail_waiters(errors.NotLeaderOrFollowerError(f"{self.name}: {reason}"))
        self._followers = {}

    # ---- checks ----------------------------------------------------------------------------------

    def ensure_leader(self, leader_epoch: int | None = None) -> LeaderAndIsr:
        """The state, if this replica leads; else NOT_LEADER_OR_FOLLOWER. With ``leader_epoch``
        (what the caller believes current): older is FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH."""
        state = self.state
        if state is None or state.leader != self.node_id or state.deleting:
            leader = "unknown" if state is None else state.leader
            raise errors.NotLeaderOrFollowerError(
                f"node {self.node_id} does not lead {self.name} (leader: {leader})"
            )
        if leader_epoch is not None and leader_epoch >= 0:
            if leader_epoch < state.leader_epoch:
                raise errors.FencedLeaderEpochError(
                    f"{self.name}: leader epoch {leader_epoch} is older than the current {state.leader_epoch}"
                )
            if leader_epoch > state.leader_epoch:
                raise errors.UnknownLeaderEpochError(
                    f"{self.name}: leader epoch {leader_epoch} is newer than this leader's "
                    f"{state.leader_epoch}"
                )
        return state

    # ---- produce ---------------------------------------------------------------------------------

    def append_as_leader(self, data, *, acks_all: bool, leader_epoch: int | None = None) -> AppendInfo:
        """Append a producer's batches with this leader's epoch. With ``acks_all`` the ISR must
        hold at least ``min.insync.replicas`` replicas first (NOT_ENOUGH_REPLICAS, nothing
        written); then :meth:`wait_committed` waits for the high watermark."""
        state = self.ensure_leader(leader_epoch)
        if acks_all:
            self._ensure_enough_replicas(state, errors.NotEnoughReplicasError, "before the append")
        info = self.log.append(data, leader_epoch=state.leader_epoch)
        self._maybe_increment_high_watermark()
        return info

    def append_marker(
        self, *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> int:
        """Write a transaction marker as leader; its offset (then :meth:`wait_committed`)."""
        state = self.ensure_leader()
        offset = self.log.append_marker(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            commit=commit,
            coordinator_epoch=coordinator_epoch,
            leader_epoch=state.leader_epoch,
        )
        self._maybe_increment_high_watermark()
        return offset

    def _ensure_enough_replicas(
        self, state: LeaderAndIsr, error: type[errors.TributaryError], when: str
    ) -> None:
        min_isr = self.log.config.min_insync_replicas
        if len(state.isr) < min_isr:
            raise error(
                f"{self.name}: the ISR {list(state.isr)} has {len(state.isr)} replicas {when}, "
                f"min.insync.replicas is {min_isr}"
            )

    async def wait_committed(self, required_offset: int, timeout_s: float) -> None:
        """Wait until the high watermark reaches ``required_offset`` (the offset after the last
        appended record), then check the ISR still holds ``min.insync.replicas``.

        REQUEST_TIMED_OUT after ``timeout_s``; NOT_LEADER_OR_FOLLOWER if leadership is lost;
        NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below the minimum to commit it.
        """
        if self.log.high_watermark < required_offset:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters, _AckWaiter(required_offset, next(self._sequence), future))
            try:
                async with asyncio.timeout(timeout_s):  # not wait_for: see storage_node/notifier.py
                    await future
            except TimeoutError:
                raise errors.RequestTimedOutError(
                    f"{self.name}: offset {required_offset - 1} was not replicated to the ISR "
                    f"{list(self.isr)} within {timeout_s * 1000:.0f} ms "
                    f"(high watermark {self.log.high_watermark})"
                ) from None
        state = self.ensure_leader()
        self._ensure_enough_replicas(state, errors.NotEnoughReplicasAfterAppendError, "when it was committed")

    def _complete_waiters(self, high_watermark: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0].required_offset <= high_watermark:
            waiter = heapq.heappop(waiters)
            if not waiter.future.done():
                waiter.future.set_result(None)

    def _fail_waiters(self, error: errors.TributaryError) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)

    # ---- reads -----------------------------------------------------------------------------------

    def read_for_consumer(
        self,
        offset: int,
        max_bytes: int,
        leader_epoch: int | None = None,
        *,
        committed: bool = False,
        bounds_only: bool = False,
    ) -> FetchInfo:
        """A consumer's read: only the leader serves it, and only below the high watermark --
        below the last stable offset for a read_committed consumer (``bounds_only``: the offsets
        without records)."""
        self.ensure_leader(leader_epoch)
        bound = self.log.last_stable_offset if committed else self.log.high_watermark
        return self.log.read(offset, max_bytes, max_offset=bound, bounds_only=bounds_only)

    def committed_view(self, offset: int) -> tuple[int, list[tuple[int, int]]]:
        """For a read_committed fetch from ``offset``: the last stable offset and the aborted
        transactions (producer id, first offset) with records between the two."""
        last_stable = self.log.last_stable_offset
        aborted = self.log.aborted_transactions(offset, last_stable)
        return last_stable, [(a.producer_id, a.first_offset) for a in aborted]

    def read_for_follower(
        self, replica_id: int, fetch: PartitionFetch
    ) -> tuple[FetchInfo | None, EpochEndOffset | None]:
        """A follower's fetch: check its history against ours (KIP-320), record its position,
        and read up to the log end. Returns ``(info, None)``, or ``(None, diverging)`` when the
        follower must truncate first."""
        self.ensure_leader(fetch.current_leader_epoch if fetch.current_leader_epoch >= 0 else None)
        follower = self._followers.get(replica_id)
        if follower is None:
            raise errors.NotLeaderOrFollowerError(f"node {replica_id} is not a replica of {self.name}")
        log_end = self.log.log_end_offset
        diverging = rules.diverging_epoch(
            self.log.leader_epochs, log_end, fetch.fetch_offset, fetch.last_fetched_epoch
        )
        if diverging is not None:
            if diverging.undefined:
                raise errors.OffsetOutOfRangeError(
                    f"{self.name}: no epoch at or below {fetch.last_fetched_epoch} on the leader"
                )
            return None, diverging
        if not self.log.log_start_offset <= fetch.fetch_offset <= log_end:
            raise errors.OffsetOutOfRangeError(
                f"{self.name}: fetch offset {fetch.fetch_offset} outside "
                f"[{self.log.log_start_offset}, {log_end}] on the leader"
            )
        self._on_follower_fetch(follower, fetch.fetch_offset)
        return self.log.read(fetch.fetch_offset, fetch.partition_max_bytes), None

    def _on_follower_fetch(self, follower: FollowerState, fetch_offset: int) -> None:
        follower.on_fetch(fetch_offset, self.log.log_end_offset, self._clock.time_ms())
        self._maybe_expand_isr(follower)
        self._maybe_increment_high_watermark()

    # ---- high watermark and ISR ------------------------------------------------------------------

    def _maybe_increment_high_watermark(self) -> bool:
        if not self.is_leader:
            return False
        candidate = rules.high_watermark(self.log.log_end_offset, self._followers, self.maximal_isr)
        if not self.log.maybe_increment_high_watermark(candidate):
            return False
        self._complete_waiters(self.log.high_watermark)
        self._on_high_watermark(self.key)
        return True

    def _maybe_expand_isr(self, follower: FollowerState) -> None:
        state = self.state
        if state is None or self._pending_isr is not None or follower.node_id in state.isr:
            return
        if self._ineligible_until and self._clock.time_ms() < self._ineligible_until.get(follower.node_id, 0):
            return
        if rules.may_join_isr(follower, self.log.high_watermark, self._leader_epoch_start_offset):
            self._request_isr((*state.isr, follower.node_id), f"node {follower.node_id} caught up")

    def maybe_shrink_isr(self, max_lag_ms: int) -> None:
        """Ask to drop the in-sync followers that have lagged for ``max_lag_ms`` (periodic)."""
        state = self.state
        if not self.is_leader or state is None or self._pending_isr is not None:
            return
        lagging = rules.out_of_sync_followers(
            state.isr,
            self.node_id,
            self._followers,
            self.log.log_end_offset,
            self._clock.time_ms(),
            max_lag_ms,
        )
        if lagging:
            kept = tuple(r for r in state.isr if r not in lagging)
            ends = {r: self.follower_log_end(r) for r in lagging}
            self._request_isr(
                kept,
                f"out of sync for {max_lag_ms} ms (log ends {ends}, leader at {self.log.log_end_offset})",
            )

    def _request_isr(self, isr: tuple[int, ...], why: str) -> None:
        if self._send_isr_change is None:
            return  # no controller to ask (a standalone node)
        log.info("%s: asking to change the ISR %s -> %s: %s", self.name, list(self.isr), list(isr), why)
        self._pending_isr = isr
        self._send_isr_change(self, isr)
        self._maybe_increment_high_watermark()  # a joining replica counts at once

    def on_isr_change_failed(self, isr: tuple[int, ...], error: errors.TributaryError) -> None:
        """The controller refused or could not be asked; a later tick or fetch asks again."""
        if self._pending_isr == isr:
            self._pending_isr = None
        if isinstance(error, errors.IneligibleReplicaError) and self.state is not None:
            until = self._clock.time_ms() + INELIGIBLE_BACKOFF_MS
            for joining in set(isr).difference(self.state.isr):
                self._ineligible_until[joining] = until
        log.info("%s: ISR change to %s not made: %s", self.name, list(isr), error)

    def __repr__(self) -> str:
        return f"Partition({self.name}, state={self.state}, hw={self.log.high_watermark})"
