"""``Segments``: a partition's segments sorted by base offset."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from storage_node.log.segment import Segment


class Segments:
    """The segments of one partition, sorted by base offset; the last one is the active segment.

    Thread safety: copy-on-write. Mutations (one writer, under the partition lock) build new
    tuples and swap them in with a single assignment, so a reader that took :meth:`snapshot` (or
    any lookup) sees one consistent list without locking, even while retention removes segments
    or a roll adds one. Kafka uses a concurrent skip-list map for the same reason; a partition
    has at most a few thousand segments, so copying a tuple per roll or deletion is cheap.
    """

    def __init__(self, segments: list[Segment] | None = None) -> None:
        ordered = sorted(segments or (), key=lambda s: s.base_offset)
        self._state: tuple[tuple[int, ...], tuple[Segment, ...]] = (
            tuple(s.base_offset for s in ordered),
            tuple(ordered),
        )
        if len(set(self._state[0])) != len(ordered):
            raise ValueError("two segments with the same base offset")

    def snapshot(self) -> tuple[Segment, ...]:
        """The segments in offset order, as of now."""
        return self._state[1]

    def __len__(self) -> int:
        return len(self._state[1])

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._state[1])

    def __bool__(self) -> bool:
        return bool(self._state[1])

    @property
    def active(self) -> Segment:
        """The last segment, the only one appended to."""
        segments = self._state[1]
        if not segments:
            raise LookupError("partition has no segments")
        return segments[-1]

    @property
    def first(self) -> Segment:
        segments = self._state[1]
        if not segments:
            raise LookupError("partition has no segments")
        return segments[0]

    def floor(self, offset: int) -> Segment | None:
        """The segment with the largest base offset <= ``offset``, or None."""
        bases, segments = self._state
        slot = bisect.bisect_right(bases, offset) - 1
        return segments[slot] if slot >= 0 else None

    def from_offset(self, offset: int) -> tuple[Segment, ...]:
        """The segment holding ``offset`` (its floor) and every later one."""
        bases, segments = self._state
        slot = max(bisect.bisect_right(bases, offset) - 1, 0)
        return segments[slot:]

    def higher(self, segment: Segment) -> Segment | None:
        """The segment after ``segment``, or None if it is the last."""
        bases, segments = self._state
        slot = bisect.bisect_right(bases, segment.base_offset)
        return segments[slot] if slot < len(segments) else None

    def contains(self, base_offset: int) -> bool:
        bases, _ = self._state
        slot = bisect.bisect_left(bases, base_offset)
        return slot < len(bases) and bases[slot] == base_offset

    def add(self, segment: Segment) -> None:
        """Insert ``segment`` (replacing none: base offsets are unique)."""
        bases, segments = self._state
        slot = bisect.bisect_left(bases, segment.base_offset)
        if slot < len(bases) and bases[slot] == segment.base_offset:
            raise ValueError(f"a segment with base offset {segment.base_offset} already exists")
        self._state = (
            bases[:slot] + (segment.base_offset,) + bases[slot:],
            segments[:slot] + (segment,) + segments[slot:],
        )

    def remove(self, segment: Segment) -> None:
        bases, segments = self._state
        slot = bisect.bisect_left(bases, segment.base_offset)
        if slot >= len(bases) or segments[slot] is not segment:
            raise ValueError(f"{segment} is not in this partition")
        self._state = (bases[:slot] + bases[slot + 1 :], segments[:slot] + segments[slot + 1 :])

    def replace(self, old: list[Segment], new: Segment) -> None:
        """Put ``new`` in place of ``old`` (consecutive, in order) in one step, so no reader ever
        sees the offsets they held missing (the log cleaner's swap)."""
        bases, segments = self._state
        if not old:
            raise ValueError("nothing to replace")
        slot = bisect.bisect_left(bases, old[0].base_offset)
        current = segments[slot : slot + len(old)]
        if len(current) != len(old) or any(a is not b for a, b in zip(current, old, strict=True)):
            raise ValueError("the segments to replace are not consecutive segments of this partition")
        rest = segments[slot + len(old) :]
        if new.base_offset != old[0].base_offset or (rest and rest[0].base_offset <= new.base_offset):
            raise ValueError(f"{new} cannot take the place of {old[0]}..{old[-1]}")
        kept = segments[:slot] + (new,) + rest
        self._state = (tuple(s.base_offset for s in kept), kept)

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._state[1])
