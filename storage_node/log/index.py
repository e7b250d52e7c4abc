"""The shared base of the two per-segment indexes: a sparse, fixed-width, append-only file.

Why a plain file plus in-memory arrays rather than mmap (Kafka's choice): Python's ``mmap`` must
be re-created to grow and cannot be shrunk in place on every platform, and a Python-level binary
search over an mmap decodes every probed entry with ``struct``. Two ``array`` columns searched
with the C ``bisect`` module are faster, and small: a full 1 GiB segment at the default 4 KiB
index interval has 262,144 offset-index entries, 2 MiB of arrays. Kafka's cache-friendly "warm
section" search solves a page-fault problem that in-memory arrays do not have. The file is only
written (appended) and read once, at open; there is no preallocation, so the file holds exactly
the entries written and its size says how many.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from array import array
from pathlib import Path
from typing import ClassVar

log = logging.getLogger(__name__)


class CorruptIndexError(Exception):
    """An index file failed its sanity check; the caller rebuilds it from the log.

    Internal to the log package (Kafka's CorruptIndexException): the loader always handles it,
    so it is deliberately not part of the wire-level error taxonomy.
    """


class FixedWidthIndex:
    """A sparse index of ``(key, value)`` entries, both columns non-decreasing, kept in memory.

    File format: a flat sequence of big-endian entries of ``ENTRY_SIZE`` bytes, no header, no
    checksum. Entries are sparse (one per ``index.interval.bytes`` of log) and keys and values are
    relative to the segment's base offset where they are offsets, so each fits in 32 bits.

    Crash behaviour: nothing in the file is trusted without the log. At open, :meth:`sanity_check`
    rejects a torn tail (size not a multiple of ``ENTRY_SIZE``) or unsorted entries; the segment
    additionally rejects entries beyond its log. A rejected or missing index is rebuilt by scanning
    the log (``Segment.recover``); it is never repaired in place.

    Thread safety: one writer (append, truncate, reset) at a time, serialised by the owning
    partition's lock. Lookups may run concurrently with appends: an append only adds an entry at
    the end of each column, which a concurrent floor search either sees or does not, and either
    answer is a valid (maybe less tight) starting point. Truncation requires no concurrent readers.
    """

    ENTRY_SIZE: ClassVar[int]
    _ENTRY: ClassVar[struct.Struct]
    _KEY_TYPECODE: ClassVar[str]
    _VALUE_TYPECODE: ClassVar[str]

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        """Visible for tests; use the subclass ``open`` factory."""
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(max_index_size // self.ENTRY_SIZE, 1)
        self._keys = array(self._KEY_TYPECODE)
        self._values = array(self._VALUE_TYPECODE)
        #: Entries written since the last fsync. Appends open the file, write and close it (an
        #: entry every index.interval.bytes of records: ~1 us more than a kept descriptor), so an
        #: index holds no descriptor at rest: kept open per active segment, they took two
        #: descriptors per partition that ever got an entry, unbounded (26,000 at 13,000
        #: partitions on a node, beyond the usual limit). Reads never touch the file.
        self._unsynced = False

    @classmethod
    def open(cls, path: Path, base_offset: int, max_index_size: int):
        """Load ``path`` (created empty if missing) into memory. Does not sanity-check it."""
        index = cls(path, base_offset, max_index_size)
        index._load()
        return index

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
            self.path.touch()
        whole = len(data) - len(data) % self.ENTRY_SIZE
        self._torn_bytes = len(data) - whole
        for key, value in self._ENTRY.iter_unpack(memoryview(data)[:whole]):
            self._keys.append(key)
            self._values.append(value)

    # ---- state ---------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return len(self._keys)

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def size_in_bytes(self) -> int:
        return self.entries * self.ENTRY_SIZE

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless the file holds whole, sorted entries."""
        if self._torn_bytes:
            raise CorruptIndexError(
                f"index file {self.path} has a torn last entry ({self._torn_bytes} bytes after "
                f"{self.entries} whole {self.ENTRY_SIZE}-byte entries)"
            )
        keys, values = self._keys, self._values
        for i in range(1, len(keys)):
            if keys[i] <= keys[i - 1] or values[i] < values[i - 1]:
                raise CorruptIndexError(
                    f"index file {self.path} is not sorted at entry {i}: "
                    f"({keys[i - 1]}, {values[i - 1]}) then ({keys[i]}, {values[i]})"
                )
        if keys and (keys[0] < 0 or values[0] < 0):
            raise CorruptIndexError(f"index file {self.path} has a negative first entry")

    # ---- search --------------------------------------------------------------------------------

    def _floor_slot_by_key(self, key: int) -> int:
        """The slot of the largest entry whose key <= ``key``, or -1 if there is none."""
        return bisect.bisect_right(self._keys, key) - 1

    def _floor_slot_by_value(self, value: int) -> int:
        """The slot of the last entry whose value <= ``value``, or -1 (values are sorted too)."""
        return bisect.bisect_right(self._values, value) - 1

    def _entry(self, slot: int) -> tuple[int, int]:
        return self._keys[slot], self._values[slot]

    # ---- mutation ------------------------------------------------------------------------------

    def _append_entry(self, key: int, value: int, *, check_full: bool = True) -> None:
        if self.entries >= self.max_entries or (check_full and self.is_full):
            raise ValueError(f"attempt to append to a full index {self.path} ({self.entries} entries)")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, self._ENTRY.pack(key, value))
        finally:
            os.close(fd)
        self._unsynced = True
        self._keys.append(key)
        self._values.append(value)

    def _truncate_to_entries(self, count: int) -> None:
        if count >= self.entries and not self._torn_bytes:
            return
        del self._keys[count:]
        del self._values[count:]
        os.truncate(self.path, count * self.ENTRY_SIZE)
        self._torn_bytes = 0
        # The shorter file must reach the disk too: entries cut here and left there by a crash
        # could point into batches appended after the truncation.
        self._unsynced = True

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._truncate_to_entries(0)

    def flush(self) -> None:
        """fsync the index file, if written or truncated since the last fsync."""
        if self._unsynced:
            try:
                fd = os.open(self.path, os.O_RDONLY)  # fsync syncs the file, whichever descriptor
            except FileNotFoundError:  # deleted meanwhile: nothing left to make durable
                self._unsynced = False
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._unsynced = False

    def close_for_writes(self) -> None:
        """Nothing to release any more (appends hold no descriptor); kept for the segment's
        lifecycle calls. Lookups keep working from memory."""

    def close(self) -> None:
        self.close_for_writes()

    def rename_to(self, path: Path) -> None:
        """Rename the file (the in-memory entries are unaffected)."""
        self.close_for_writes()
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def delete_file(self) -> None:
        self.close_for_writes()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path.name}, entries={self.entries})"
