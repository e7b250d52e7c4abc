"""The time index (``.timeindex``): largest timestamp so far -> offset of the batch holding it."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from storage_node.log.index import CorruptIndexError, FixedWidthIndex

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A timestamp and the base offset of the first batch that reached it."""

    timestamp: int
    offset: int


class TimeIndex(FixedWidthIndex):
    """Sparse map from "largest timestamp so far" to the base offset of the batch that first had it.

    File format: 12-byte big-endian entries, no header::

        timestamp        int64   the segment's largest timestamp up to this point (ms)
        relative offset  int32   base offset of the first batch with that timestamp - segment base

    Timestamps strictly increase; offsets never decrease. An entry is added only together with
    an offset-index entry (once per ``index.interval.bytes``) and only when the largest timestamp
    has grown, plus one final entry when the segment stops being active, so the last entry of an
    inactive segment is its largest timestamp. Every batch before an entry's offset has a smaller
    max timestamp, which is what lets :meth:`lookup` give a safe place to start scanning.

    As in Kafka, the last slot is reserved for that final entry: the index reports itself full
    one entry early.

    Crash behaviour: not checksummed; rebuilt from the log at load if torn, unsorted or pointing
    past the segment. Thread safety: as the base.
    """

    ENTRY_SIZE = 12
    _ENTRY = struct.Struct(">qi")
    _KEY_TYPECODE = "q"
    _VALUE_TYPECODE = "i"

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries - 1

    def lookup(self, timestamp: int) -> TimestampOffset:
        """The last entry with timestamp <= ``timestamp``; ``(-1, base_offset)`` if none."""
        slot = self._floor_slot_by_key(timestamp)
        if slot < 0:
            return TimestampOffset(-1, self.base_offset)
        ts, relative = self._entry(slot)
        return TimestampOffset(ts, self.base_offset + relative)

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or ``(-1, base_offset)`` for an empty index."""
        if not self.entries:
            return TimestampOffset(-1, self.base_offset)
        ts, relative = self._entry(self.entries - 1)
        return TimestampOffset(ts, self.base_offset + relative)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Add ``(timestamp, offset)`` if ``timestamp`` is larger than the last entry's.

        ``skip_full_check`` is for the final entry at roll, which uses the reserved last slot.
        ValueError if the offset goes backwards or the index is full (caller bugs).
        """
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise ValueError(f"offset {offset} does not fit time index {self.path}")
        if not skip_full_check and self.is_full:
            raise ValueError(f"attempt to append to a full time index {self.path}")
        if self.entries:
            last = self.last_entry
            if offset < last.offset:
                raise ValueError(f"time index {self.path}: offset {offset} is before {last}")
            if timestamp <= last.timestamp:
                return
        if self.entries >= self.max_entries:
            return  # even the reserved slot is used: the index stays correct, only sparser
        self._append_entry(timestamp, relative, check_full=False)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset >= ``offset``."""
        relative = offset - self.base_offset
        count = self.entries
        while count and self._values[count - 1] >= relative:
            count -= 1
        self._truncate_to_entries(count)

    def ensure_within(self, next_offset: int) -> None:
        """Raise CorruptIndexError if an entry names an offset the segment does not hold."""
        if self.entries and self.last_entry.offset >= next_offset:
            raise CorruptIndexError(
                f"time index {self.path}: last entry {self.last_entry} is past the segment's "
                f"next offset {next_offset}"
            )
