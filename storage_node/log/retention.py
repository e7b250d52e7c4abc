"""Retention policies as predicates, and the one routine that picks what they allow to delete.

Each policy is a ``should_delete(segment, next_segment)`` function over one segment and the one
after it (None for the last). :func:`deletable_segments` walks the segments from the oldest and
returns the leading run the predicate accepts -- stopping at the first segment it refuses, so
retention only ever removes a prefix of the log and never leaves a hole -- and never returns the
active (last) segment or a segment holding offsets at or above the high watermark.

Pure functions of their inputs: time comes in as ``now_ms`` from the injected clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class RetainedSegment(Protocol):
    """What the policies read from a segment."""

    base_offset: int

    @property
    def size(self) -> int: ...

    @property
    def largest_timestamp(self) -> int: ...


ShouldDelete = Callable[[RetainedSegment, "RetainedSegment | None"], bool]


def retention_ms_breached(now_ms: int, retention_ms: int) -> ShouldDelete:
    """Delete a segment whose newest record is more than ``retention_ms`` old; -1 = keep forever.

    A segment whose timestamps lie in the future is kept until they are in the past, as in Kafka.
    """

    def should_delete(segment: RetainedSegment, next_segment: RetainedSegment | None) -> bool:
        return retention_ms >= 0 and now_ms - segment.largest_timestamp > retention_ms

    return should_delete


def retention_size_breached(total_size: int, retention_bytes: int) -> ShouldDelete:
    """Delete the oldest segments while the partition (``total_size``, active segment included)
    is over ``retention_bytes``; only whole segments that fit in the excess go; -1 = no limit.

    Stateful: each accepted segment reduces the excess, so use a fresh predicate per pass.
    """
    excess = total_size - retention_bytes

    def should_delete(segment: RetainedSegment, next_segment: RetainedSegment | None) -> bool:
        nonlocal excess
        if retention_bytes < 0 or excess - segment.size < 0:
            return False
        excess -= segment.size
        return True

    return should_delete


def log_start_offset_breached(log_start_offset: int) -> ShouldDelete:
    """Delete a segment entirely below the log start offset: the next one starts at or before it."""

    def should_delete(segment: RetainedSegment, next_segment: RetainedSegment | None) -> bool:
        return next_segment is not None and next_segment.base_offset <= log_start_offset

    return should_delete


S = TypeVar("S", bound=RetainedSegment)


def deletable_segments(segments: Sequence[S], should_delete: ShouldDelete, *, high_watermark: int) -> list[S]:
    """The oldest run of segments ``should_delete`` accepts, never the active (last) one.

    A segment is also kept unless every offset in it is below ``high_watermark`` (its successor's
    base offset <= high watermark): retention must not delete records not yet committed.
    """
    deletable: list[S] = []
    for segment, next_segment in itertools.pairwise(segments):
        if next_segment.base_offset > high_watermark or not should_delete(segment, next_segment):
            break
        deletable.append(segment)
    return deletable
