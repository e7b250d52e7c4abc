"""``Segment``: one ``.log`` file with its offset index and time index."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from services.clock import Clock
from services.errors import CorruptRecordError, InvalidRecordError
from services.records import LOG_OVERHEAD, MAGIC, BatchHeader, RecordBatchView, TimestampType
from services.records.format import NO_TIMESTAMP
from storage_node.log import files
from storage_node.log.config import LogConfig
from storage_node.log.file_records import FileHandleCache, FileRecords, FileSlice
from storage_node.log.files import FilePosition, Offset
from storage_node.log.index import CorruptIndexError
from storage_node.log.offset_index import OffsetIndex
from storage_node.log.time_index import TimeIndex

log = logging.getLogger(__name__)

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchLocation:
    """Where a batch sits in a segment's ``.log``: its start position and its header."""

    position: FilePosition
    header: BatchHeader

    @property
    def end(self) -> int:
        return self.position + self.header.batch_length + LOG_OVERHEAD


@dataclass(slots=True)
class _TailState:
    """What appends maintain and a load has to recompute: the segment's end, in offsets and time."""

    next_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    bytes_since_last_index_entry: int


class Segment:
    """One segment: ``<base>.log`` plus the sparse ``<base>.index`` and ``<base>.timeindex``.

    File format: see :class:`FileRecords`, :class:`OffsetIndex`, :class:`TimeIndex`. Offsets in
    the segment run from ``base_offset`` (the first batch's base offset, also the file name) to
    ``next_offset - 1``, densely except in a segment the log cleaner rewrote (gaps where it
    removed batches); ``last offset - base_offset`` fits in int32 (the partition log
    rolls before it would not).

    Index maintenance: after each appended batch that follows more than
    ``index.interval.bytes`` of unindexed log, the batch gets an offset-index entry and the time
    index gets ``(largest timestamp so far, offset of the first batch with it)`` if that grew.
    :meth:`recover` rebuilds both indexes with exactly the same rule.

    Crash behaviour: the log tail and both indexes are untrusted after a crash. :meth:`recover`
    scans from position 0, validates each batch (length, magic, CRC, offsets continuing densely --
    or skipping ahead, in a compacted log), stops at the first bad one, truncates the file there
    and rebuilds the indexes. A segment that was flushed (below the recovery point) is only
    sanity-checked (:meth:`sanity_check`).

    Thread safety: one writer (append, recover, truncate, roll, delete), serialised by the
    partition lock. :meth:`read`, :meth:`translate_offset` and :meth:`find_offset_for_timestamp`
    may run concurrently with appends: they see a consistent prefix of the segment.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        log_records: FileRecords,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        config: LogConfig,
        clock: Clock,
        *,
        index_files_existed: bool = True,
    ) -> None:
        """Visible for tests; use :meth:`open`."""
        self.directory = directory
        self.base_offset = base_offset
        self.log = log_records
        self.offset_index = offset_index
        self.time_index = time_index
        self._config = config
        self._clock = clock
        self._index_files_existed = index_files_existed
        self.created_ms = clock.time_ms()
        self._tail: _TailState | None = None  # computed lazily after open (see _tail_state)
        self._first_batch_timestamp: int | None = None
        # Guards the two lazy computations above: a reader must not install a stale result
        # over what a concurrent append has just updated.
        self._lazy_lock = threading.Lock()
        # Only for segments without timestamps: when it was last written, from the file for a
        # segment found on disk, from the clock for one this process creates or appends to.
        self._last_modified_ms = _mtime_ms(log_records.path) if log_records.size else clock.time_ms()
        self.deleted = False
        #: Whether recovery accepts batches that skip offsets: true in a compacted log (the
        #: cleaner removes whole batches), once compacted always (see ``loader``).
        self.allows_offset_gaps = config.compact_enabled

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        clock: Clock,
        *,
        file_suffix: str = "",
        handle_cache: FileHandleCache | None = None,
    ) -> Segment:
        """Open the segment's files, creating any that are missing (empty).

        Indexes are loaded into memory but not checked: call :meth:`sanity_check` (the loader
        does) or :meth:`recover`.
        """
        index_path = files.offset_index_file(directory, base_offset, file_suffix)
        time_index_path = files.time_index_file(directory, base_offset, file_suffix)
        existed = index_path.exists() and time_index_path.exists()
        log_records = FileRecords.open(
            files.log_file(directory, base_offset, file_suffix), handle_cache=handle_cache
        )
        try:
            offset_index = OffsetIndex.open(index_path, base_offset, config.segment_index_bytes)
            time_index = TimeIndex.open(time_index_path, base_offset, config.segment_index_bytes)
        except BaseException:
            log_records.close()  # e.g. ENOSPC creating an index: release the .log handle
            raise
        return cls(
            directory,
            base_offset,
            log_records,
            offset_index,
            time_index,
            config,
            clock,
            index_files_existed=existed,
        )

    def update_config(self, config: LogConfig) -> None:
        """New index interval and sizes apply to later appends."""
        self._config = config
        self.allows_offset_gaps = self.allows_offset_gaps or config.compact_enabled

    # ---- state ---------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes in the ``.log`` file."""
        return self.log.size

    @property
    def next_offset(self) -> int:
        """One past the last offset in the segment (``base_offset`` when empty)."""
        return self._tail_state().next_offset

    @property
    def max_timestamp_so_far(self) -> int:
        """The largest batch max timestamp in the segment, or -1 (NO_TIMESTAMP)."""
        return self._tail_state().max_timestamp

    @property
    def largest_timestamp(self) -> int:
        """What time retention compares with: the largest record timestamp, else the file's
        last-modified time (only for segments without timestamps, as in Kafka)."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self._last_modified_ms

    @property
    def first_batch_timestamp(self) -> int:
        """The first batch's max timestamp, or -1 if the segment is empty or has none."""
        if self._first_batch_timestamp is None:
            with self._lazy_lock:
                if self._first_batch_timestamp is None:
                    first = NO_TIMESTAMP
                    for _, header in self.log.batch_headers(0):
                        first = header.max_timestamp
                        break
                    self._first_batch_timestamp = first
        return self._first_batch_timestamp

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """How old the segment is for ``segment.ms`` (Kafka's rule): the incoming batch's
        timestamp minus the first batch's, when both exist -- so it survives restarts, and
        replaying old data does not roll on every append -- else time since this process created
        or opened the segment."""
        first = self.first_batch_timestamp
        if first >= 0 and message_timestamp >= 0:
            return message_timestamp - first
        return now_ms - self.created_ms

    def can_hold(self, last_offset: int) -> bool:
        """Whether ``last_offset`` is representable relative to this segment's base offset."""
        return 0 <= last_offset - self.base_offset <= _INT32_MAX

    @property
    def indexes_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    def _tail_state(self) -> _TailState:
        tail = self._tail
        if tail is None:
            with self._lazy_lock:
                tail = self._tail
                if tail is None:
                    tail, _ = self._load_tail_state()
                    self._tail = tail
        return tail

    def _load_tail_state(self) -> tuple[_TailState, int]:
        """Recompute next offset and max timestamp from the indexes plus the unindexed tail.

        Whenever an offset-index entry is added, the time index is brought up to the largest
        timestamp so far, so no batch up to the last offset-index entry has a timestamp above the
        time index's last entry: walking headers from that entry's position (about
        ``index.interval.bytes``) is exact. The exception is a time index that filled up and
        skipped entries (only when rebuilding with a smaller ``segment.index.bytes``); then the
        walk starts at the first batch with the last indexed timestamp, which is always exact.
        Also returns the byte position where the walk ended (the log size, for an intact segment).
        """
        last_time = self.time_index.last_entry
        last_indexed = self.offset_index.last_entry
        start = last_indexed.position
        if self.time_index.is_full:
            start = min(start, self.offset_index.lookup(last_time.offset).position)
        tail = _TailState(self.base_offset, last_time.timestamp, last_time.offset, 0)
        end = start
        for position, header in self.log.batch_headers(start):
            if header.max_timestamp > tail.max_timestamp:
                tail.max_timestamp = header.max_timestamp
                tail.offset_of_max_timestamp = header.base_offset
            tail.next_offset = header.base_offset + header.last_offset_delta + 1
            end = position + header.batch_length + LOG_OVERHEAD
        if self.offset_index.entries:
            tail.bytes_since_last_index_entry = self.log.size - last_indexed.position
        else:
            tail.bytes_since_last_index_entry = self.log.size
        return tail, end

    # ---- writes --------------------------------------------------------------------------------

    def append(self, batch, base_offset: Offset, last_offset: Offset, max_timestamp: int) -> FilePosition:
        """Append one validated, offset-stamped batch; returns its position in the ``.log``.

        ``base_offset``/``last_offset``/``max_timestamp`` are the batch's own header values,
        passed in so the segment need not parse it. ValueError on a caller bug (offsets that go
        backwards or do not fit this segment).
        """
        tail = self._tail_state()
        if base_offset < tail.next_offset or not self.can_hold(last_offset):
            raise ValueError(
                f"segment {self.base_offset}: cannot append offsets [{base_offset}, {last_offset}] "
                f"after next offset {tail.next_offset}"
            )
        if not self.log.size:
            with self._lazy_lock:
                self._first_batch_timestamp = max_timestamp
        position = self.log.append(batch)
        self._index_batch(tail, position, len(batch), base_offset, last_offset, max_timestamp)
        self._last_modified_ms = self._clock.time_ms()
        return position

    def _index_batch(
        self,
        tail: _TailState,
        position: int,
        size: int,
        base_offset: int,
        last_offset: int,
        max_timestamp: int,
    ) -> None:
        """The one indexing rule, shared by append and recover."""
        if max_timestamp > tail.max_timestamp:
            tail.max_timestamp = max_timestamp
            tail.offset_of_max_timestamp = base_offset
        if tail.bytes_since_last_index_entry > self._config.index_interval_bytes:
            # A full index only makes lookups walk further; the partition log rolls on a full
            # index before appending, so this skip only happens when rebuilding a segment that
            # was written with a larger segment.index.bytes.
            if not self.offset_index.is_full:
                self.offset_index.append(base_offset, position)
            if not self.time_index.is_full:
                self.time_index.maybe_append(tail.max_timestamp, tail.offset_of_max_timestamp)
            tail.bytes_since_last_index_entry = 0
        tail.bytes_since_last_index_entry += size
        tail.next_offset = last_offset + 1

    def on_become_inactive(self) -> None:
        """At roll: record the final largest timestamp and release the index write handles."""
        tail = self._tail_state()
        if tail.max_timestamp >= 0:
            self.time_index.maybe_append(
                tail.max_timestamp, tail.offset_of_max_timestamp, skip_full_check=True
            )
        self.close_index_handles()

    def close_index_handles(self) -> None:
        """Release the index files' append handles (only the active segment needs them)."""
        self.offset_index.close_for_writes()
        self.time_index.close_for_writes()

    def truncate_to(self, offset: Offset) -> int:
        """Remove every batch whose last offset >= ``offset`` (the batch holding ``offset`` goes
        whole); returns the bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        self.offset_index.truncate_to(found.header.base_offset)
        self.time_index.truncate_to(found.header.base_offset)
        removed = self.log.truncate_to(found.position)
        with self._lazy_lock:
            self._tail, _ = self._load_tail_state()
            if found.position == 0:
                self._first_batch_timestamp = NO_TIMESTAMP
        return removed

    # ---- reads ---------------------------------------------------------------------------------

    def translate_offset(self, offset: Offset, size: int | None = None) -> BatchLocation | None:
        """The first batch whose last offset >= ``offset``, or None if the segment ends before.

        ``size`` bounds the walk (a snapshot of the log size, so a read is consistent).
        """
        start = self.offset_index.lookup(offset).position
        for position, header in self.log.batch_headers(start, size):
            if header.base_offset + header.last_offset_delta >= offset:
                return BatchLocation(position, header)
        return None

    def read(
        self, start_offset: Offset, max_bytes: int, max_position: FilePosition | None = None
    ) -> FileSlice | None:
        """Whole batches from the one holding ``start_offset``, at most ``max_bytes`` in all --
        except that the first batch is returned whole even when larger (as Kafka does, so a
        consumer with a small fetch size cannot get stuck on a big batch).

        ``max_position`` (a batch boundary, e.g. the high watermark's position) bounds the slice.
        None if the segment holds no batch at or after ``start_offset`` below ``max_position``.
        """
        size = self.log.size
        limit = size if max_position is None else min(max_position, size)
        first = self.translate_offset(start_offset, limit)
        if first is None:
            return None
        target = min(first.position + max(max_bytes, 0), limit)
        end = first.end if target <= first.end else self._last_boundary_at_or_before(target, first)
        return self.log.slice(first.position, end - first.position)

    def _last_boundary_at_or_before(self, target: int, first: BatchLocation) -> int:
        """The end of the last whole batch ending at or before byte ``target`` (> first.end).

        Starts from the last indexed batch before ``target`` so the header walk is short (about
        ``index.interval.bytes``) however large ``max_bytes`` is.
        """
        indexed = self.offset_index.lookup_by_position(target).position
        scan_from = indexed if indexed > first.position else first.end
        boundary = scan_from
        for position, header in self.log.batch_headers(scan_from, target):
            boundary = position + header.batch_length + LOG_OVERHEAD
        return boundary

    def find_offset_for_timestamp(
        self, timestamp: int, start_offset: int | None = None
    ) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with timestamp >= ``timestamp`` and offset
        >= ``start_offset``, or None if this segment has none.

        Walks batch headers from the time index's hint and decodes only the one batch that holds
        the answer (a ListOffsets request, not the produce/fetch path).
        """
        start_offset = self.base_offset if start_offset is None else start_offset
        hint = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(hint.offset, start_offset)).position
        for batch_position, header in self.log.batch_headers(position):
            last_offset = header.base_offset + header.last_offset_delta
            if header.max_timestamp < timestamp or last_offset < start_offset:
                continue
            found = self._first_record_at_or_after(batch_position, header, timestamp, start_offset)
            if found is not None:
                return found
        return None

    def _first_record_at_or_after(
        self, position: int, header: BatchHeader, timestamp: int, start_offset: int
    ) -> tuple[int, int] | None:
        view = RecordBatchView(self.log.read(position, header.batch_length + LOG_OVERHEAD))
        if view.timestamp_type == TimestampType.LOG_APPEND_TIME:
            return max(header.base_offset, start_offset), header.max_timestamp
        for record in view.records():
            if record.timestamp >= timestamp and record.offset >= start_offset:
                return record.offset, record.timestamp
        return None

    # ---- recovery ------------------------------------------------------------------------------

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless both index files exist, hold whole sorted entries, and
        agree with the log: the last offset-index entry points at the header of the batch it
        names, and walking headers from there ends exactly at the end of the file.

        Cheap: the entries are already in memory; only the unindexed tail's headers are read.
        """
        if not self._index_files_existed and self.log.size:
            raise CorruptIndexError(f"index files of segment {self.log.path} are missing")
        self.offset_index.sanity_check()
        self.time_index.sanity_check()
        self.offset_index.ensure_within(self.log.size)
        try:
            self._ensure_last_index_entry_matches_log()
            tail, end = self._load_tail_state()
        except CorruptRecordError as exc:
            raise CorruptIndexError(f"segment {self.log.path}: tail unreadable from index: {exc}") from exc
        if end != self.log.size:
            raise CorruptIndexError(
                f"segment {self.log.path}: batches walked from the index end at byte {end}, "
                f"file size {self.log.size}"
            )
        self.time_index.ensure_within(tail.next_offset)
        self._tail = tail

    def _ensure_last_index_entry_matches_log(self) -> None:
        if not self.offset_index.entries:
            return
        entry = self.offset_index.last_entry
        for _, header in self.log.batch_headers(entry.position):
            if header.base_offset == entry.offset and header.magic == MAGIC:
                return
            break
        raise CorruptIndexError(f"index {self.offset_index.path}: entry {entry} does not point at that batch")

    def recover(self, max_message_bytes: int | None = None) -> int:
        """Rebuild the indexes by validating every batch from position 0; truncate at the first
        bad one. Returns the bytes truncated (0 if the whole file was valid).

        A batch is valid if its length fits the file, magic and CRC check out, its base offset
        continues the segment densely (or skips ahead, when :attr:`allows_offset_gaps`: a
        compacted segment) and its last offset fits the segment. ``max_message_bytes``,
        if given, also rejects batches larger than it; the partition log passes None, because a
        topic's max.message.bytes may have been lowered after larger batches were written, and
        dropping them would be data loss. The length field is always bounded by the file size.
        """
        self.offset_index.reset()
        self.time_index.reset()
        tail = _TailState(self.base_offset, NO_TIMESTAMP, self.base_offset, 0)
        self._first_batch_timestamp = None
        valid_bytes = 0
        reason = "incomplete batch at the end of the file"
        try:
            for position, data in self.log.batches(0):
                view = RecordBatchView(data)
                self._ensure_recoverable(view, tail.next_offset, max_message_bytes)
                if position == 0:
                    self._first_batch_timestamp = view.max_timestamp
                self._index_batch(
                    tail, position, view.size_in_bytes, view.base_offset, view.last_offset, view.max_timestamp
                )
                valid_bytes = position + view.size_in_bytes
        except (CorruptRecordError, InvalidRecordError) as exc:
            reason = str(exc)
        file_size = self.log.file_size()
        truncated = 0
        if valid_bytes < file_size:
            log.warning(
                "Truncating %s at byte %d: dropping %d bytes (%s)",
                self.log.path,
                valid_bytes,
                file_size - valid_bytes,
                reason,
            )
            truncated = self.log.truncate_to(valid_bytes)
        if tail.max_timestamp >= 0:
            # A cleanly rolled segment always ends its time index with its largest timestamp.
            self.time_index.maybe_append(
                tail.max_timestamp, tail.offset_of_max_timestamp, skip_full_check=True
            )
        self._tail = tail
        self._index_files_existed = True
        return truncated

    def _ensure_recoverable(
        self, view: RecordBatchView, expected_offset: int, max_message_bytes: int | None
    ) -> None:
        view.validate()
        if view.base_offset < expected_offset or (
            view.base_offset > expected_offset and not self.allows_offset_gaps
        ):
            # baseOffset is outside the CRC: this is what catches a corrupted offset field. A
            # forward gap is legal only in a compacted log, where the cleaner removes whole
            # batches (Kafka's recovery accepts gaps everywhere, and so misses such corruption).
            raise CorruptRecordError(
                f"batch base offset {view.base_offset} does not continue the segment at {expected_offset}"
            )
        if not self.can_hold(view.last_offset):
            raise CorruptRecordError(
                f"batch last offset {view.last_offset} overflows segment {self.base_offset}"
            )
        if max_message_bytes is not None and view.size_in_bytes > max_message_bytes:
            raise CorruptRecordError(
                f"batch of {view.size_in_bytes} bytes exceeds max.message.bytes {max_message_bytes}"
            )

    # ---- lifecycle -----------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the log and both indexes."""
        self.log.flush()
        self.flush_indexes()

    def flush_indexes(self) -> None:
        """fsync the offset and time indexes, if either was written since its last fsync (the
        partition log defers this for the segment a flush ends in: see ``PartitionLog.flush``)."""
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        self.offset_index.close()
        self.time_index.close()
        self.log.close()

    def change_file_suffixes(self, new_suffix: str) -> None:
        """Rename all three files to ``<base>.<kind><new_suffix>`` (e.g. ``.deleted``, or ``""``
        to turn a ``.swap`` segment into a live one)."""
        base = self.base_offset
        self.log.rename_to(files.log_file(self.directory, base, new_suffix))
        self.offset_index.rename_to(files.offset_index_file(self.directory, base, new_suffix))
        self.time_index.rename_to(files.time_index_file(self.directory, base, new_suffix))

    def delete(self) -> None:
        """Rename the files to ``.deleted`` (the commit point: a crash after it finishes the
        delete at load), then remove them. Readers holding a FileSlice can finish sending."""
        self.deleted = True
        self.change_file_suffixes(files.DELETED_FILE_SUFFIX)
        self.log.delete_file()
        self.offset_index.delete_file()
        self.time_index.delete_file()

    def __repr__(self) -> str:
        return f"Segment(base_offset={self.base_offset}, size={self.size}, path={self.log.path})"


def _mtime_ms(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns // 1_000_000
    except FileNotFoundError:
        return 0
