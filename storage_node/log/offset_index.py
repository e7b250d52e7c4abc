"""The offset index (``.index``): logical offset -> byte position in the segment's ``.log``."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from storage_node.log.files import FilePosition, Offset
from storage_node.log.index import CorruptIndexError, FixedWidthIndex

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """A batch's base offset and the byte position in ``.log`` where that batch starts."""

    offset: Offset
    position: FilePosition


class OffsetIndex(FixedWidthIndex):
    """Sparse map from a batch's base offset to the byte position where the batch starts.

    File format: 8-byte big-endian entries, no header::

        relative offset  int32   batch base offset - segment base offset
        position         int32   byte position of that batch in the segment's .log file

    Both columns strictly increase. Entries are sparse: the segment adds one when more than
    ``index.interval.bytes`` of log were written since the last entry, so a lookup lands at most
    about that many bytes before the wanted batch and the reader walks batch headers from there.
    Unlike Kafka (which indexes a batch's *last* offset), the key is the batch's *base* offset, so
    a lookup for an offset inside an indexed batch lands exactly on that batch.

    Crash behaviour: not checksummed; a torn, unsorted or out-of-range index is rebuilt from the
    log at load (see :class:`~storage_node.log.index.FixedWidthIndex`). Thread safety: as the base.
    """

    ENTRY_SIZE = 8
    _ENTRY = struct.Struct(">ii")
    _KEY_TYPECODE = "i"
    _VALUE_TYPECODE = "i"

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The indexed batch start at or before ``target_offset``; ``(base_offset, 0)`` if none."""
        slot = self._floor_slot_by_key(target_offset - self.base_offset)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        relative, position = self._entry(slot)
        return OffsetPosition(self.base_offset + relative, position)

    def lookup_by_position(self, position: int) -> OffsetPosition:
        """The last indexed batch starting at or before byte ``position``; ``(base, 0)`` if none."""
        slot = self._floor_slot_by_value(position)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        relative, start = self._entry(slot)
        return OffsetPosition(self.base_offset + relative, start)

    @property
    def last_entry(self) -> OffsetPosition:
        """The last entry, or ``(base_offset, 0)`` for an empty index."""
        if not self.entries:
            return OffsetPosition(self.base_offset, 0)
        relative, position = self._entry(self.entries - 1)
        return OffsetPosition(self.base_offset + relative, position)

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must grow. ValueError on a caller bug."""
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX or not 0 <= position <= _INT32_MAX:
            raise ValueError(f"entry ({offset}, {position}) does not fit index {self.path}")
        if self.entries and (relative <= self._keys[-1] or position <= self._values[-1]):
            raise ValueError(
                f"index {self.path}: entry ({offset}, {position}) is not after {self.last_entry}"
            )
        self._append_entry(relative, position)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry for a batch whose base offset >= ``offset``."""
        self._truncate_to_entries(self._floor_slot_by_key(offset - self.base_offset - 1) + 1)

    def ensure_within(self, log_size: int) -> None:
        """Raise CorruptIndexError if an entry points at or past the end of the log."""
        if self.entries and self._values[-1] >= log_size:
            raise CorruptIndexError(
                f"index file {self.path}: last entry {self.last_entry} points past the log end "
                f"(log size {log_size})"
            )
