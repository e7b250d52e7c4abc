"""What the cleaner cleans next, as pure functions of segment facts (Kafka's
``LogCleanerManager`` and the grouping in ``Cleaner``).

A compacted partition's log splits into three parts::

    log start ............ first dirty ............ first uncleanable ........ log end
    |  clean: compacted before  |  dirty: not yet compacted  |  uncleanable  |

* **first dirty** is where the previous round's offset map ended (the cleaner checkpoint),
  clamped into the log.
* **first uncleanable** is the lowest of: the active segment's base offset (the active segment is
  never cleaned), the last stable offset (an open transaction's records may still abort, and
  uncommitted records may still be truncated: the LSO is at most the high watermark), and the
  base offset of the first segment holding a record newer than ``min.compaction.lag.ms``.
* the **dirty ratio** is dirty bytes / (clean + dirty bytes), counted in whole segments; only
  segments wholly below the first uncleanable offset are cleaned.

A partition is due when its dirty ratio reaches ``min.cleanable.dirty.ratio``, or when its
oldest dirty record is older than ``max.compaction.lag.ms`` (then it is cleaned whatever the
ratio); among the due partitions the cleaner takes the one with the highest dirty ratio.

Cleaned segments are regrouped: consecutive segments are rewritten into one while their combined
original size fits ``segment.bytes`` and their offsets fit one segment (int32 relative offsets),
so a log of many small cleaned segments does not stay that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.records.format import INT32_MAX


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    """What planning reads of one segment."""

    base_offset: int
    next_offset: int
    size: int
    #: The largest record timestamp (or the file's mtime when it has none).
    largest_timestamp: int
    #: The first batch's max timestamp, -1 if none (for max.compaction.lag.ms).
    first_timestamp: int


@dataclass(frozen=True, slots=True)
class CleanablePart:
    """One partition's split, as :func:`cleanable_part` computes it."""

    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    #: The oldest first-batch timestamp among the dirty segments, -1 if unknown.
    earliest_dirty_timestamp: int

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def first_uncleanable_offset(
    segments: Sequence[SegmentFacts], *, last_stable_offset: int, now_ms: int, min_compaction_lag_ms: int
) -> int:
    """The lowest offset the cleaner must not reach (see the module docstring); ``segments``
    in offset order, the last one active."""
    bound = min(segments[-1].base_offset, last_stable_offset) if segments else last_stable_offset
    if min_compaction_lag_ms > 0:
        for segment in segments[:-1]:
            if now_ms - segment.largest_timestamp < min_compaction_lag_ms:
                bound = min(bound, segment.base_offset)
                break
    return bound


def cleanable_part(
    segments: Sequence[SegmentFacts],
    *,
    log_start_offset: int,
    checkpoint: int | None,
    last_stable_offset: int,
    now_ms: int,
    min_compaction_lag_ms: int,
) -> CleanablePart:
    """Split a partition's segments into clean, dirty and uncleanable (module docstring).

    ``checkpoint`` is where the last round ended (None: never cleaned); one outside the log
    (the log was truncated or trimmed since) restarts from the log start.
    """
    log_end = segments[-1].next_offset if segments else log_start_offset
    first_dirty = log_start_offset
    if checkpoint is not None and log_start_offset <= checkpoint <= log_end:
        first_dirty = checkpoint
    first_uncleanable = first_uncleanable_offset(
        segments,
        last_stable_offset=last_stable_offset,
        now_ms=now_ms,
        min_compaction_lag_ms=min_compaction_lag_ms,
    )
    first_dirty = min(first_dirty, first_uncleanable)
    clean = dirty = 0
    earliest = -1
    for segment in segments:
        if segment.next_offset > first_uncleanable:
            break  # the active segment, or one holding uncleanable offsets: cleaned whole or not at all
        if segment.next_offset <= first_dirty:
            clean += segment.size
            continue
        dirty += segment.size
        if segment.first_timestamp >= 0 and (earliest < 0 or segment.first_timestamp < earliest):
            earliest = segment.first_timestamp
    return CleanablePart(first_dirty, first_uncleanable, clean, dirty, earliest)


def is_due(
    part: CleanablePart, *, now_ms: int, min_cleanable_dirty_ratio: float, max_compaction_lag_ms: int
) -> bool:
    """Whether the partition should be cleaned now (ratio reached, or max lag passed)."""
    if part.dirty_bytes <= 0:
        return False
    if part.dirty_ratio >= min_cleanable_dirty_ratio:
        return True
    return (
        part.earliest_dirty_timestamp >= 0 and now_ms - part.earliest_dirty_timestamp > max_compaction_lag_ms
    )


def group_segments(segments: Sequence[SegmentFacts], *, max_bytes: int) -> list[list[SegmentFacts]]:
    """Consecutive runs of ``segments`` to rewrite as one cleaned segment each: a run grows while
    the sum of original sizes stays within ``max_bytes`` and its offsets fit one segment. Every
    segment is in exactly one run, in order."""
    groups: list[list[SegmentFacts]] = []
    current: list[SegmentFacts] = []
    size = 0
    for segment in segments:
        fits = (
            current
            and size + segment.size <= max_bytes
            and segment.next_offset - 1 - current[0].base_offset <= INT32_MAX
        )
        if current and not fits:
            groups.append(current)
            current, size = [], 0
        current.append(segment)
        size += segment.size
    if current:
        groups.append(current)
    return groups
