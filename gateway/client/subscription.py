"""Which partitions a consumer reads and where it stands in each: pure state, no I/O.

aiokafka's ``SubscriptionState`` / Kafka's ``SubscriptionState``. The fetcher reads it to build
requests; ``poll`` advances positions; ``seek*`` and ``pause``/``resume`` change it.

* A partition's *position* is the offset of the next record ``poll`` will return.
* A partition without a position is *awaiting reset*: to ``"earliest"`` or ``"latest"`` (looked
  up with ListOffsets), or ``"none"`` -- then ``poll``/``position`` raise
  ``OffsetOutOfRangeError`` until the application seeks (Kafka's ``auto.offset.reset=none``).
* Every change of position by the application bumps the partition's *epoch*, so results of a
  fetch or offset lookup started before the change are recognised as stale and dropped.

Subscription types follow Kafka's (``NONE``, ``USER_ASSIGNED``, ``AUTO_TOPICS``,
``AUTO_PATTERN``); only manual assignment exists until consumer groups arrive, and that is where
``subscribe`` will set the group-managed ones.

Not thread-safe: owned by the consumer's event loop.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.client.errors import IllegalStateError
from gateway.client.structs import TopicPartition

RESET_STRATEGIES = ("earliest", "latest", "none")


class SubscriptionType(enum.Enum):
    NONE = "none"
    USER_ASSIGNED = "user_assigned"
    AUTO_TOPICS = "auto_topics"
    AUTO_PATTERN = "auto_pattern"


@dataclass
class TopicPartitionState:
    """Where the consumer stands in one partition."""

    position: int | None = None
    reset_strategy: str | None = None
    paused: bool = False
    epoch: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1

    @property
    def has_valid_position(self) -> bool:
        return self.position is not None


def validate_reset_strategy(strategy: str) -> str:
    if strategy not in RESET_STRATEGIES:
        raise ValueError(f"auto_offset_reset must be one of {', '.join(RESET_STRATEGIES)}, not {strategy!r}")
    return strategy


class SubscriptionState:
    """Assignment, positions, pauses and pending resets of one consumer."""

    def __init__(self, default_reset: str = "latest") -> None:
        self.default_reset = validate_reset_strategy(default_reset)
        self.subscription_type = SubscriptionType.NONE
        self._assignment: dict[TopicPartition, TopicPartitionState] = {}

    # -- assignment ------------------------------------------------------------------------

    def assign_from_user(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment; partitions kept keep their position and pause state."""
        if self.subscription_type not in (SubscriptionType.NONE, SubscriptionType.USER_ASSIGNED):
            raise IllegalStateError("assign() cannot be mixed with subscribe()")
        wanted = [TopicPartition(*tp) for tp in partitions]
        self._assignment = {tp: self._assignment.get(tp) or self._new_state() for tp in wanted}
        self.subscription_type = SubscriptionType.USER_ASSIGNED if wanted else SubscriptionType.NONE

    def unsubscribe(self) -> None:
        self._assignment = {}
        self.subscription_type = SubscriptionType.NONE

    def _new_state(self) -> TopicPartitionState:
        return TopicPartitionState(reset_strategy=self.default_reset)

    def assigned_partitions(self) -> set[TopicPartition]:
        return set(self._assignment)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._assignment

    def state(self, tp: TopicPartition) -> TopicPartitionState:
        """The partition's state; IllegalStateError when it is not assigned."""
        try:
            return self._assignment[tp]
        except KeyError:
            raise IllegalStateError(f"partition {tp} is not assigned to this consumer") from None

    # -- positions -------------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Set the next offset to consume (the application's choice: bumps the epoch)."""
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, not {offset!r}")
        state = self.state(tp)
        state.position, state.reset_strategy = offset, None
        state.epoch += 1

    def request_reset(self, tp: TopicPartition, strategy: str | None = None) -> None:
        """Forget the position; it is looked up again with ``strategy`` (default: auto_offset_reset)."""
        state = self.state(tp)
        state.position = None
        state.reset_strategy = validate_reset_strategy(strategy or self.default_reset)
        state.epoch += 1

    def position(self, tp: TopicPartition) -> int | None:
        return self.state(tp).position

    def advance(self, tp: TopicPartition, position: int) -> None:
        """Move the position forward as records are handed out (no epoch change)."""
        state = self._assignment.get(tp)
        if state is not None and state.position is not None and position > state.position:
            state.position = position

    def complete_reset(self, tp: TopicPartition, epoch: int, offset: int) -> bool:
        """Apply a looked-up offset if the partition still awaits that reset; returns whether it did."""
        state = self._assignment.get(tp)
        if state is None or state.epoch != epoch or state.position is not None:
            return False
        state.position, state.reset_strategy = offset, None
        return True

    def partitions_awaiting_reset(self) -> dict[TopicPartition, tuple[str, int]]:
        """``{tp: (strategy, epoch)}`` for every assigned partition without a position."""
        return {tp: (s.reset_strategy or self.default_reset, s.epoch)
                for tp, s in self._assignment.items() if s.position is None}

    # -- pause / resume --------------------------------------------------------------------

    def pause(self, tp: TopicPartition) -> None:
        self.state(tp).paused = True

    def resume(self, tp: TopicPartition) -> None:
        self.state(tp).paused = False

    def is_paused(self, tp: TopicPartition) -> bool:
        state = self._assignment.get(tp)
        return state is not None and state.paused

    def paused_partitions(self) -> set[TopicPartition]:
        return {tp for tp, s in self._assignment.items() if s.paused}

    def is_fetchable(self, tp: TopicPartition) -> bool:
        state = self._assignment.get(tp)
        return state is not None and not state.paused and state.position is not None

    def fetchable_partitions(self) -> list[TopicPartition]:
        """Assigned, not paused, with a position: what the fetcher may ask for."""
        return [tp for tp, s in self._assignment.items() if not s.paused and s.position is not None]

    # -- watermarks ------------------------------------------------------------------------

    def update_watermarks(self, tp: TopicPartition, high_watermark: int, log_start_offset: int) -> None:
        state = self._assignment.get(tp)
        if state is not None:
            state.high_watermark, state.log_start_offset = high_watermark, log_start_offset

    def high_watermark(self, tp: TopicPartition) -> int | None:
        state = self.state(tp)
        return state.high_watermark if state.high_watermark >= 0 else None
