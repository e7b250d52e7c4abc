"""The rules of replication, as pure functions and small values. No I/O, no clock reads.

What a leader knows of each follower (:class:`FollowerState`, Kafka's ``Replica``), and the
decisions made from it:

* **caught up** -- a follower is caught up while it has fetched up to the leader's log end within
  the last ``replica.lag.time.max.ms`` (Kafka's ``lastCaughtUpTimeMs`` rule: a fetch that reaches
  the log end as of *this* fetch, or as of the *previous* one, proves it was caught up then);
* **ISR shrink** -- in-sync followers that are no longer caught up leave the ISR;
* **ISR expansion** -- a follower outside the ISR rejoins once its log end reaches the high
  watermark and the start of the current leader epoch (so it holds everything committed and has
  seen this leader's history);
* **high watermark** -- the smallest log end offset among the leader and the followers of the
  *maximal* ISR (the committed ISR plus any replica an in-flight expansion adds: KIP-497 counts a
  joining replica at once, and a leaving one until the controller has committed its removal, so
  the ISR in etcd is always a superset of what the high watermark was computed over);
* **truncation** -- where a follower must cut its log when its leader's history diverges from its
  own (KIP-101 / KIP-279 / KIP-320), from the leader's answer for the follower's last epoch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from storage_node.log.leader_epochs import EpochEndOffset, LeaderEpochCache

#: A follower whose log end the leader has not heard since it became leader (Kafka's UnknownOffset).
UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class FollowerState:
    """The leader's view of one follower, updated on every fetch it serves that follower.

    Reset when this node becomes leader: the follower's log end is unknown until it fetches,
    and an in-sync follower is given a full lag window (``last_caught_up_ms`` = now) before it can
    be judged out of sync.
    """

    node_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    #: The leader's log end and the time at the previous fetch from this follower.
    last_fetch_leader_log_end: int = UNKNOWN_OFFSET
    last_fetch_ms: int = 0

    def on_fetch(self, fetch_offset: int, leader_log_end: int, now_ms: int) -> None:
        """A fetch at ``fetch_offset`` proves the follower holds every offset below it."""
        if fetch_offset >= leader_log_end:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end = leader_log_end
        self.last_fetch_ms = now_ms

    def is_caught_up(self, leader_log_end: int, now_ms: int, max_lag_ms: int) -> bool:
        return self.log_end_offset == leader_log_end or now_ms - self.last_caught_up_ms < max_lag_ms

    def reset(self, now_ms: int, *, in_sync: bool) -> None:
        self.log_end_offset = UNKNOWN_OFFSET
        self.last_fetch_leader_log_end = UNKNOWN_OFFSET
        self.last_fetch_ms = 0
        self.last_caught_up_ms = now_ms if in_sync else 0


def high_watermark(
    leader_log_end: int, followers: Mapping[int, FollowerState], maximal_isr: Collection[int]
) -> int:
    """The smallest log end offset in the maximal ISR (the leader's own included).

    A follower of the ISR whose log end is unknown holds the high watermark where it is (the
    result is then :data:`UNKNOWN_OFFSET`; callers only ever move the high watermark forward).
    """
    result = leader_log_end
    for node_id in maximal_isr:
        follower = followers.get(node_id)
        if follower is not None and follower.log_end_offset < result:
            result = follower.log_end_offset
    return result


def out_of_sync_followers(
    isr: Iterable[int],
    leader_id: int,
    followers: Mapping[int, FollowerState],
    leader_log_end: int,
    now_ms: int,
    max_lag_ms: int,
) -> tuple[int, ...]:
    """The followers of the ISR that have not been caught up within ``max_lag_ms``."""
    lagging = []
    for node_id in isr:
        if node_id == leader_id:
            continue
        follower = followers.get(node_id)
        if follower is None or not follower.is_caught_up(leader_log_end, now_ms, max_lag_ms):
            lagging.append(node_id)
    return tuple(lagging)


def may_join_isr(follower: FollowerState, high_watermark: int, leader_epoch_start_offset: int) -> bool:
    """Whether a follower outside the ISR holds enough to be counted in it."""
    return (
        follower.log_end_offset != UNKNOWN_OFFSET
        and follower.log_end_offset >= high_watermark
        and follower.log_end_offset >= leader_epoch_start_offset
    )


@dataclass(frozen=True, slots=True)
class Truncation:
    """Where a follower cuts its log. ``complete``: the logs now agree up to ``offset``; when
    False the follower cut to its own end of an older epoch and must ask again."""

    offset: int
    complete: bool


def truncation_for_divergence(
    local: LeaderEpochCache, log_end_offset: int, leader_answer: EpochEndOffset
) -> Truncation:
    """Where to truncate when the leader says our history diverges from its own.

    ``leader_answer`` is the leader's end offset for the epoch we asked about (the largest epoch
    the leader holds at or below our last fetched epoch). Kafka's rules:

    * we hold the leader's epoch: the logs agree up to the smaller of both ends of that epoch;
    * we hold only older epochs than the one the leader answered with: cut to the end of our
      largest older epoch, then ask again with it;
    * we hold no epoch at or below it: cut to the leader's end offset.
    """
    ours = local.end_offset_for(leader_answer.epoch, log_end_offset)
    if ours.undefined:
        return Truncation(min(leader_answer.end_offset, log_end_offset), True)
    if ours.epoch != leader_answer.epoch:
        return Truncation(min(ours.end_offset, log_end_offset), False)
    return Truncation(min(ours.end_offset, leader_answer.end_offset, log_end_offset), True)


def diverging_epoch(
    leader: LeaderEpochCache, leader_log_end: int, fetch_offset: int, last_fetched_epoch: int
) -> EpochEndOffset | None:
    """The leader's side of fetch-based truncation (KIP-320): None when a follower fetching at
    ``fetch_offset`` after a batch of ``last_fetched_epoch`` agrees with the leader's log, else
    the epoch end offset to send back so it can truncate.

    :data:`~storage_node.log.leader_epochs.UNDEFINED` when the leader holds no epoch at or below
    the follower's (a follower ahead of every epoch the leader knows): the caller answers
    OFFSET_OUT_OF_RANGE, as Kafka does, and the follower falls back to the leader's offsets.
    A follower with no epoch yet (``last_fetched_epoch`` < 0) has nothing to compare: None.
    """
    if last_fetched_epoch < 0:
        return None
    answer = leader.end_offset_for(last_fetched_epoch, leader_log_end)
    if answer.undefined:
        return answer
    if answer.epoch < last_fetched_epoch or answer.end_offset < fetch_offset:
        return answer
    return None
