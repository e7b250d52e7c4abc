"""Offset ranges and how they are planned: the pure core of the data source (no I/O, no Spark).

Vocabulary, Kafka's:

* an *offset bound* says where reading starts or ends: ``Earliest``, ``Latest``, specific offsets
  per partition (``-2`` = earliest, ``-1`` = latest, as in Spark's Kafka source JSON), one
  timestamp for every partition, or a timestamp per partition;
* an :class:`OffsetRange` is ``[from_offset, until_offset)`` of one partition -- the unit a Spark
  task reads. Ranges are fixed when a query is planned, so a retried task reads exactly the same
  records;
* offsets cross the Spark boundary as Kafka-style JSON dicts ``{"topic": {"0": 23}}`` (the
  streaming checkpoint stores them in that form).

Planning functions take the answers of the cluster (earliest / latest / by-timestamp offsets)
as plain dicts, so they are unit-tested without a cluster; :mod:`spark_jobs.cluster` asks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.client.structs import TopicPartition
from services.offset_spec import EARLIEST, LATEST

Offsets = dict[TopicPartition, int]


class PlanningError(ValueError):
    """The requested offsets cannot be read (beyond the log end, start after end, no such partition)."""


class OffsetRange(NamedTuple):
    """``[from_offset, until_offset)`` of one partition: what one Spark task reads."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}[{self.from_offset}, {self.until_offset})"


# ---- offset bounds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Earliest:
    """Every partition from its log start offset."""


@dataclass(frozen=True)
class Latest:
    """Every partition at its high watermark (nothing yet written)."""


@dataclass(frozen=True)
class SpecificOffsets:
    """Offsets per partition; ``-2``/``-1`` mean earliest/latest; unlisted partitions use the default."""

    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GlobalTimestamp:
    """For every partition, the first offset whose timestamp is >= ``timestamp_ms``."""

    timestamp_ms: int


@dataclass(frozen=True)
class SpecificTimestamps:
    """A timestamp per partition; unlisted partitions use the default."""

    timestamps: Mapping[TopicPartition, int] = field(default_factory=dict)


OffsetBound = Earliest | Latest | SpecificOffsets | GlobalTimestamp | SpecificTimestamps


def timestamps_needed(bound: OffsetBound, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """The by-timestamp lookups ``bound`` needs for ``tps`` (empty for offset bounds)."""
    if isinstance(bound, GlobalTimestamp):
        return {tp: bound.timestamp_ms for tp in tps}
    if isinstance(bound, SpecificTimestamps):
        return {tp: bound.timestamps[tp] for tp in tps if tp in bound.timestamps}
    return {}


def listed_partitions(bound: OffsetBound) -> set[TopicPartition]:
    """Partitions a bound names explicitly (they must exist)."""
    if isinstance(bound, SpecificOffsets):
        return set(bound.offsets)
    if isinstance(bound, SpecificTimestamps):
        return set(bound.timestamps)
    return set()


def resolve_bound(
    bound: OffsetBound,
    tps: Iterable[TopicPartition],
    *,
    earliest: Offsets,
    latest: Offsets,
    by_timestamp: Mapping[TopicPartition, int | None],
    default: int,
    option: str,
    no_match: str = "latest",
) -> Offsets:
    """Concrete offsets of ``bound`` for ``tps``.

    ``default`` (EARLIEST or LATEST) applies to partitions a specific bound does not list.
    ``by_timestamp`` holds the lookups of :func:`timestamps_needed` (``None``: no record at or
    after the timestamp); ``no_match`` says what that means: ``"latest"`` (nothing to read there)
    or ``"error"``.
    """
    resolved = {}
    for tp in tps:
        spec = _spec_for(bound, tp, default)
        if spec == EARLIEST:
            resolved[tp] = earliest[tp]
        elif spec == LATEST:
            resolved[tp] = latest[tp]
        elif spec is _BY_TIMESTAMP:
            resolved[tp] = _offset_at_timestamp(tp, by_timestamp, latest, option, no_match)
        else:
            resolved[tp] = spec
    return resolved


_BY_TIMESTAMP = object()


def _spec_for(bound: OffsetBound, tp: TopicPartition, default: int):
    if isinstance(bound, Earliest):
        return EARLIEST
    if isinstance(bound, Latest):
        return LATEST
    if isinstance(bound, SpecificOffsets):
        return bound.offsets.get(tp, default)
    if isinstance(bound, GlobalTimestamp) or tp in getattr(bound, "timestamps", {}):
        return _BY_TIMESTAMP
    return default


def _offset_at_timestamp(
    tp: TopicPartition,
    by_timestamp: Mapping[TopicPartition, int | None],
    latest: Offsets,
    option: str,
    no_match: str,
) -> int:
    offset = by_timestamp.get(tp)
    if offset is not None and offset >= 0:
        return offset
    if no_match == "error":
        raise PlanningError(
            f"{option}: partition {tp} has no record at or after the timestamp; set "
            f"startingOffsetsByTimestampStrategy=latest to start at its end instead"
        )
    return latest[tp]


# ---- batch planning ----------------------------------------------------------------------------


def plan_batch(
    start: Offsets, end: Offsets, latest: Offsets, *, min_partitions: int | None = None
) -> list[OffsetRange]:
    """Ranges ``start -> end`` of a batch query, checked against the log, split for ``min_partitions``.

    A start below the log start is *not* an error here: the reader finds those records gone and
    applies ``failOnDataLoss`` (retention may also delete records between planning and reading).
    """
    ranges = []
    for tp in sorted(end):
        ensure_readable(tp, start[tp], end[tp], latest[tp])
        if end[tp] > start[tp]:
            ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
    return split_for_min_partitions(ranges, min_partitions)


def ensure_readable(tp: TopicPartition, start: int, end: int, latest: int) -> None:
    """Raise PlanningError unless ``start <= end <= latest`` (a batch cannot read the future)."""
    if start > latest:
        raise PlanningError(f"startingOffsets: offset {start} of {tp} is beyond its latest offset {latest}")
    if end > latest:
        raise PlanningError(
            f"endingOffsets: offset {end} of {tp} is beyond its latest offset {latest} "
            f"(those records are not written yet)"
        )
    if start > end:
        raise PlanningError(f"{tp}: the starting offset {start} is after the ending offset {end}")


def split_for_min_partitions(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges into at least ``min_partitions`` pieces (if there are that many records).

    Each range gets pieces in proportion to its size -- at least one, never more than its
    records -- by largest-remainder apportionment, so the count is exact where Spark's Kafka
    source rounds each range on its own and can fall short. Deterministic: the same ranges give
    the same pieces.
    """
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    parts = _apportion([r.size for r in ranges], min_partitions)
    return [piece for r, n in zip(ranges, parts) for piece in _split(r, n)]


def _apportion(sizes: list[int], pieces: int) -> list[int]:
    """Pieces per size: proportional, each in ``[1, size]``, summing to ``pieces`` where possible."""
    total = sum(sizes)
    quotas = [pieces * size / total for size in sizes]
    parts = [min(size, max(1, math.floor(q))) for size, q in zip(sizes, quotas)]
    while sum(parts) < pieces:
        room = [i for i, size in enumerate(sizes) if parts[i] < size]
        if not room:
            break
        best = max(room, key=lambda i: (quotas[i] - parts[i], -i))
        parts[best] += 1
    return parts


def _split(r: OffsetRange, parts: int) -> list[OffsetRange]:
    pieces, start, remaining = [], r.from_offset, r.size
    for part in range(parts):
        size = remaining // (parts - part)  # the last pieces take the rounding
        remaining -= size
        if size > 0:
            pieces.append(OffsetRange(r.topic, r.partition, start, start + size))
        start += size
    return pieces


# ---- streaming planning ------------------------------------------------------------------------


@dataclass
class StreamStep:
    """Where the next micro-batch ends, and what went missing since the last one."""

    end: Offsets
    #: Human-readable data-loss findings (partitions gone, logs truncated below the checkpoint).
    losses: list[str] = field(default_factory=list)


def plan_stream_end(
    start: Offsets,
    current: Iterable[TopicPartition],
    *,
    earliest: Offsets,
    latest: Offsets,
    target: Offsets | None = None,
    max_rows: int | None = None,
) -> StreamStep:
    """The end offsets of the next micro-batch.

    * A partition seen for the first time enters at its earliest offset with an empty range, so
      the *next* batch reads it from an offset recorded in the checkpoint (re-planning a batch
      after a failure never re-resolves "earliest" differently).
    * ``target`` (Trigger.AvailableNow) caps every partition at what existed when the query
      started; partitions created later are left for the next run.
    * ``max_rows`` (maxOffsetsPerTrigger) is split across partitions in proportion to their lag.
    """
    current = set(current)
    step = StreamStep(end={})
    lag_from: Offsets = {}
    upper: Offsets = {}
    for tp in sorted(current | set(start)):
        if tp not in current:
            step.losses.append(f"partition {tp} no longer exists; records after offset {start[tp]} are gone")
        elif target is not None and tp not in target:
            if tp in start:
                step.end[tp] = start[tp]
        elif tp not in start:
            step.end[tp] = earliest[tp]
        elif start[tp] > latest[tp]:
            step.losses.append(
                f"partition {tp} now ends at offset {latest[tp]}, before the checkpointed "
                f"offset {start[tp]} (truncated or re-created); restarting it at its earliest "
                f"offset"
            )
            step.end[tp] = earliest[tp]
        else:
            lag_from[tp] = start[tp]
            upper[tp] = min(latest[tp], target[tp]) if target is not None else latest[tp]
            upper[tp] = max(upper[tp], start[tp])
    step.end.update(rate_limit(lag_from, upper, max_rows))
    return step


def rate_limit(start: Offsets, upper: Offsets, max_rows: int | None) -> Offsets:
    """End offsets that read at most ``max_rows`` in all, shared in proportion to each lag.

    Largest-remainder apportionment: every partition gets ``floor(limit * lag / total)``, and the
    offsets left over go to the largest fractions (ties in partition order). The result reads
    exactly ``min(max_rows, total lag)`` records and never passes ``upper``.
    """
    if max_rows is None:
        return dict(upper)
    lags = {tp: upper[tp] - start[tp] for tp in sorted(start)}
    total = sum(lags.values())
    if total <= max_rows:
        return dict(upper)
    shares = {tp: max_rows * lag / total for tp, lag in lags.items()}
    taken = {tp: math.floor(share) for tp, share in shares.items()}
    left = max_rows - sum(taken.values())
    by_remainder = sorted(lags, key=lambda tp: (-(shares[tp] - taken[tp]), tp))
    for tp in by_remainder[:left]:
        taken[tp] += 1
    return {tp: start[tp] + taken[tp] for tp in lags}


def plan_stream_ranges(
    start: Offsets, end: Offsets, *, min_partitions: int | None = None
) -> list[OffsetRange]:
    """Ranges of one micro-batch. Partitions absent from ``start`` (just discovered) or moved
    backwards (truncation already reported by :func:`plan_stream_end`) read nothing."""
    ranges = [
        OffsetRange(tp.topic, tp.partition, start[tp], end[tp])
        for tp in sorted(end)
        if tp in start and end[tp] > start[tp]
    ]
    return split_for_min_partitions(ranges, min_partitions)


# ---- JSON form ---------------------------------------------------------------------------------


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{tp: offset}`` -> ``{"topic": {"0": offset}}`` (Spark's Kafka source JSON, sorted)."""
    result: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        result.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return result


def offsets_from_json(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    """The inverse of :func:`offsets_to_json`."""
    return {TopicPartition(topic, int(p)): int(o) for topic, parts in data.items() for p, o in parts.items()}
