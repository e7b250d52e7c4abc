"""``FileRecords``: the bytes of one segment's ``.log`` file; ``FileSlice``: a zero-copy read.

A read never returns bytes. It returns a :class:`FileSlice` (open file, position, length) that the
fetch server hands to ``os.sendfile``, so record bytes go from the page cache to the socket
without entering the process (the paper's zero-copy path). ``FileSlice.read_bytes`` exists for
tests and for callers that must copy (gRPC ``Fetch``), and says so in its name.
"""

from __future__ import annotations

import heapq
import io
import itertools
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.errors import CorruptRecordError, KafkaStorageError
from services.records import LOG_OVERHEAD, RECORD_BATCH_OVERHEAD, BatchHeader, read_batch_header
from services.records.format import BATCH_LENGTH_OFFSET, INT32, MIN_BATCH_LENGTH
from storage_node.log.files import FilePosition

log = logging.getLogger(__name__)

#: Bytes read per ``pread`` when walking batch headers: most lookups start at an index entry at
#: most ``index.interval.bytes`` (4 KiB) before the target, so one read usually covers the walk.
HEADER_SCAN_CHUNK = 16 * 1024
#: Bytes read per ``pread`` when a recovery scan walks whole batches.
RECOVERY_SCAN_CHUNK = 1024 * 1024


class SegmentFileGoneError(OSError):
    """The segment file was deleted (retention) or closed while a caller still held it.

    An OSError, not a taxonomy error: the partition log retries reads that hit it (the segment
    went away under a lock-free reader) and treats it as a disk error anywhere else.
    """


class SegmentFile(io.FileIO):
    """An unbuffered binary file that closes itself quietly when the last reference goes.

    A ``.log`` file object is shared between its ``FileRecords`` and every outstanding
    ``FileSlice``. When retention deletes the segment, or the handle cache evicts it, the
    ``FileRecords`` only drops its reference: a fetch still sending from a slice keeps the file
    (and, after an unlink, the inode) alive until it is done. The plain ``FileIO`` finaliser would
    warn about an unclosed file at that point; closing here is the intended ownership model.
    """

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- nothing useful to do in a finaliser
            pass


@dataclass(frozen=True, slots=True)
class FileSlice:
    """A byte range of a segment file, to be sent with ``os.sendfile``; never the bytes.

    ``file`` is an open binary file object (``fileno()`` gives the descriptor; it also works with
    ``loop.sock_sendfile``). Never use its file position: the log reads and writes with
    ``pread``/``pwrite``. ``length`` was bounded by the file's size when the slice was taken and
    covers whole record batches only. Segment files only grow, except when recovery or replica
    truncation cuts the tail; a sender that finds the file shorter than the slice must fail the
    request loudly, never send fewer bytes than announced.
    """

    file: io.FileIO
    path: Path
    position: FilePosition
    length: int

    @property
    def end(self) -> int:
        return self.position + self.length

    def fileno(self) -> int:
        return self.file.fileno()

    def read_bytes(self) -> bytes:
        """Copy the slice into memory -- for tests and non-zero-copy callers only.

        Raises KafkaStorageError if the file no longer holds the whole range.
        """
        try:
            fd = self.file.fileno()
            size = os.fstat(fd).st_size
        except (OSError, ValueError) as exc:  # ValueError: the file object was closed
            raise KafkaStorageError(f"cannot read slice of {self.path}: {exc}") from exc
        if size < self.end:
            raise KafkaStorageError(
                f"{self.path} shrank to {size} bytes under a slice [{self.position}, {self.end})"
            )
        data = _pread_exactly(fd, self.length, self.position)
        if len(data) != self.length:
            raise KafkaStorageError(f"{self.path} ended early reading [{self.position}, {self.end})")
        return data


def _open_segment_file(path: Path, *, create: bool) -> SegmentFile:
    if create:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
    return SegmentFile(path, "r+")


def _pread_exactly(fd: int, length: int, position: int) -> bytes:
    """``pread`` until ``length`` bytes or end of file (a short result means the file is shorter)."""
    chunks = []
    remaining = length
    while remaining > 0:
        chunk = os.pread(fd, remaining, position)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
        position += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class FileHandleCache:
    """Bounds how many ``.log`` file handles are open: an LRU over ``FileRecords``.

    Every use of a ``FileRecords`` touches it; when more than ``max_open`` hold an open handle,
    the least recently used ones release theirs (:meth:`FileRecords.release_handle`) and reopen
    lazily on their next use. A released handle still serving a ``FileSlice`` stays open until
    that slice is dropped, so the bound is on idle handles, not on in-flight fetches.

    A touch of a member only stamps it with the next tick of a counter, without the lock (an
    OrderedDict reordered under a lock on every use was ~1-3 us an append once appends went to
    many partitions in turn, where the one-partition fast path no longer held). Membership
    changes -- a new or reopened handle, eviction, :meth:`forget` -- take the lock; eviction
    picks the members with the oldest stamps, so the order is still least recently used. It
    evicts a tenth of ``max_open`` at once, so that a node touching more files than it may keep
    open does not scan every member for every file it opens.

    Thread-safe. A touch racing an eviction on another thread may see its file evicted just
    after: harmless, as the caller holds the file object it is using (see
    ``FileRecords._handle``), and the next use reopens.
    """

    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.max_open = max_open
        #: The members, by identity: those holding (or about to hold) an open handle.
        self._open: dict[int, FileRecords] = {}
        self._lock = threading.Lock()
        self.evictions = 0
        #: The use counter: ``next`` of it is atomic (one C call under the GIL).
        self._uses = itertools.count()
        #: How many members one eviction releases (below the bound by this, less one).
        self._evict_batch = max(1, max_open // 10)

    def touch(self, records: FileRecords) -> None:
        """``records`` is being used: it becomes the most recently used member."""
        records._last_use = next(self._uses)
        if records._cached:
            return
        evicted: list[FileRecords] = []
        with self._lock:
            if records._cached:  # joined on another thread meanwhile
                return
            self._open[id(records)] = records
            records._cached = True
            if len(self._open) > self.max_open:
                # Never the one being touched: it is the most recent (its stamp may have been
                # overtaken on another thread, hence excluded by identity).
                candidates = (r for r in self._open.values() if r is not records)
                for victim in heapq.nsmallest(self._evict_batch, candidates, key=_last_use):
                    del self._open[id(victim)]
                    victim._cached = False
                    evicted.append(victim)
                self.evictions += len(evicted)
        for victim in evicted:
            victim.release_handle()

    def forget(self, records: FileRecords) -> None:
        """``records`` is closed for good: no longer a member."""
        with self._lock:
            if self._open.pop(id(records), None) is not None:
                records._cached = False

    def __len__(self) -> int:
        return len(self._open)


def _last_use(records: FileRecords) -> int:
    return records._last_use


class FileRecords:
    """One segment's ``.log`` file: concatenated RecordBatch v2 bytes, nothing else.

    File format: record batches back to back exactly as validated and offset-stamped by the
    partition log (``services.records.format``); no header, no padding, no footer. The logical
    size (:attr:`size`) is tracked in memory and is the end of the last complete append.

    Crash behaviour: an append is one ``pwrite`` that may be torn by a crash (the OS does not
    order the inode size update against the data blocks, as the design document notes), so the
    tail of the file is untrusted until ``Segment.recover`` has validated it batch by batch and
    truncated what fails. Durable only after :meth:`flush` (fsync).

    Thread safety: one writer at a time (``append``/``truncate_to``, serialised by the partition
    lock). ``slice``/``read``/header walks may run concurrently with an append: they are bounded
    by the size read at their start and use ``pread`` with explicit positions.
    """

    def __init__(
        self, path: Path, file: SegmentFile | None, size: int, handle_cache: FileHandleCache | None = None
    ) -> None:
        """Visible for tests; use :meth:`open`."""
        self.path = path
        self._file = file
        self._size = size
        self._handle_cache = handle_cache
        self._closed = False
        #: The handle cache's state of this file (its own to read and write): whether this is a
        #: member, and the counter value of the last use.
        self._cached = False
        self._last_use = 0

    @classmethod
    def open(cls, path: Path, *, handle_cache: FileHandleCache | None = None) -> FileRecords:
        """Open (creating if missing) ``path``; its current length is the starting size."""
        file = _open_segment_file(path, create=True)
        records = cls(path, file, os.fstat(file.fileno()).st_size, handle_cache)
        if handle_cache is not None:
            handle_cache.touch(records)
        return records

    # ---- handle management ---------------------------------------------------------------------

    def _handle(self) -> SegmentFile:
        """The open file, reopened if the handle cache released it.

        A caller must keep the returned object referenced for as long as it uses the descriptor
        (``file = self._handle(); fd = file.fileno()``), never ``self._handle().fileno()``: the
        handle cache (on another thread) or a delete may drop this object's reference at any
        moment, and the last reference going closes the file. The descriptor number would then
        be free for the next ``open`` anywhere in the process, and a write through it would land
        in another file."""
        file = self._file
        if file is None or file.closed:
            if self._closed:
                raise SegmentFileGoneError(f"{self.path} is closed or deleted")
            try:
                file = _open_segment_file(self.path, create=False)
            except FileNotFoundError as exc:
                raise SegmentFileGoneError(f"{self.path} no longer exists") from exc
            self._file = file
        if self._handle_cache is not None:
            self._handle_cache.touch(self)
        return file

    def release_handle(self) -> None:
        """Drop this object's reference to the open file (it reopens on next use)."""
        self._file = None

    @property
    def has_open_handle(self) -> bool:
        return self._file is not None and not self._file.closed

    # ---- size ----------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of complete appends (the file may be longer only before recovery)."""
        return self._size

    def file_size(self) -> int:
        """The file's length on disk (longer than :attr:`size` only before recovery)."""
        file = self._handle()  # held: see _handle
        return os.fstat(file.fileno()).st_size

    # ---- writes --------------------------------------------------------------------------------

    def append(self, data) -> FilePosition:
        """Write ``data`` at the end; returns the position it was written at."""
        file = self._handle()  # held while fd is in use: see _handle
        fd = file.fileno()
        position = self._size
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.pwrite(fd, view[written:], position + written)
        self._size = position + written  # only now is the append visible to readers
        return position

    def truncate_to(self, size: int) -> int:
        """Cut the file to ``size`` bytes; returns how many bytes were removed."""
        file = self._handle()  # held while fd is in use: see _handle
        fd = file.fileno()
        file_size = os.fstat(fd).st_size
        if size < 0 or size > file_size:
            raise ValueError(f"cannot truncate {self.path} (size {file_size}) to {size} bytes")
        removed = file_size - size
        os.ftruncate(fd, size)
        self._size = size
        return removed

    def flush(self) -> None:
        """fsync the file. A closed or deleted file has nothing left to flush."""
        file = self._file
        if self._closed and (file is None or file.closed):
            return
        try:
            file = self._handle()  # held: see _handle
            os.fsync(file.fileno())
        except SegmentFileGoneError:
            if not self._closed:
                raise

    # ---- reads ---------------------------------------------------------------------------------

    def slice(self, position: FilePosition, length: int) -> FileSlice:
        """A zero-copy view of ``[position, position + length)``, cut at the current size."""
        size = self._size
        if position < 0 or position > size or length < 0:
            raise ValueError(f"slice [{position}, +{length}) outside {self.path} (size {size})")
        return FileSlice(self._handle(), self.path, position, min(length, size - position))

    def read(self, position: int, length: int) -> bytes:
        """Copy up to ``length`` bytes from ``position`` -- for recovery and tests."""
        file = self._handle()  # held: see _handle
        return _pread_exactly(file.fileno(), length, position)

    def read_into(self, position: int, buffer) -> int:
        """Fill ``buffer`` from ``position``; returns the bytes read (short only at end of file)."""
        view = memoryview(buffer).cast("B")
        file = self._handle()  # held while fd is in use: see _handle
        fd = file.fileno()
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], position + done)
            if n == 0:
                break
            done += n
        return done

    def batch_headers(self, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """Yield ``(position, header)`` for each batch starting in ``[start, end)``.

        Reads only headers, ``HEADER_SCAN_CHUNK`` bytes at a time. ``end`` defaults to the size at
        the call. Stops at a batch the range does not hold whole (end of the appended data).
        ``start`` must be a batch boundary. No CRC check: use it on validated data only.
        """
        limit = self._size if end is None else min(end, self._size)
        file = self._handle()  # held while fd is in use: see _handle
        fd = file.fileno()
        buf = b""
        buf_start = start
        position = start
        while position + RECORD_BATCH_OVERHEAD <= limit:
            rel = position - buf_start
            if rel + RECORD_BATCH_OVERHEAD > len(buf):
                buf = os.pread(fd, min(HEADER_SCAN_CHUNK, limit - position), position)
                buf_start, rel = position, 0
                if len(buf) < RECORD_BATCH_OVERHEAD:
                    return
            header = read_batch_header(buf, rel)
            size = header.batch_length + LOG_OVERHEAD
            if header.batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(
                    f"{self.path}: batch at position {position} has length {header.batch_length}"
                )
            if position + size > limit:
                return
            yield position, header
            position += size

    def batches(self, start: int = 0) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(position, bytes of one whole batch)`` from ``start`` to the end of the file.

        For recovery: reads ``RECOVERY_SCAN_CHUNK`` bytes at a time and trusts nothing but the
        length field, which it checks. Stops silently at a batch the file does not hold whole (a
        torn tail); raises CorruptRecordError at a length below the minimum, past which the walk
        cannot continue. The batches are not validated: that is the caller's job.
        """
        file = self._handle()  # held while fd is in use: see _handle
        fd = file.fileno()
        end = os.fstat(fd).st_size
        buf = b""
        buf_start = start
        position = start
        while position + LOG_OVERHEAD <= end:
            rel = position - buf_start
            if rel + LOG_OVERHEAD > len(buf):
                buf = _pread_exactly(fd, min(RECOVERY_SCAN_CHUNK, end - position), position)
                buf_start, rel = position, 0
            (length,) = INT32.unpack_from(buf, rel + BATCH_LENGTH_OFFSET)
            if length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(
                    f"batch at position {position} has length {length}, below the minimum {MIN_BATCH_LENGTH}"
                )
            size = length + LOG_OVERHEAD
            if position + size > end:
                return
            if rel + size > len(buf):
                buf = _pread_exactly(fd, min(max(RECOVERY_SCAN_CHUNK, size), end - position), position)
                buf_start, rel = position, 0
            yield position, memoryview(buf)[rel : rel + size]
            position += size

    # ---- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close for good. Outstanding slices keep their file open until they are dropped."""
        self._closed = True
        self._file = None
        if self._handle_cache is not None:
            self._handle_cache.forget(self)

    def rename_to(self, path: Path) -> None:
        """Rename the file; open handles (and outstanding slices) stay valid."""
        os.replace(self.path, path)
        self.path = path

    def delete_file(self) -> None:
        """Unlink the file and close. Slices already taken can still be sent (POSIX)."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"FileRecords({self.path}, size={self._size})"
