"""The aborted-transaction index of a partition: one ``.txnindex`` file per segment (Kafka's
``TransactionIndex``).

An entry is written when an ABORT marker is appended: the producer id, the first offset of the
aborted transaction and the marker's offset, in the file of the segment holding the marker. A
read_committed fetch asks which aborted transactions overlap the offsets it returns
(:meth:`AbortedTransactions.overlapping`), so the consumer can drop their records.

File format: fixed 24-byte entries, big-endian ``producer_id int64, first_offset int64,
last_offset int64``. A torn last entry is ignored. Like the other indexes, it is derived data:
recovery rebuilds the files of the segments it replays, truncation rewrites the file it cuts,
retention deletes the files of deleted segments.

Thread safety: none; the owning PartitionLog calls it under its lock (reads copy a tuple).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from storage_node.log.files import filename_prefix_from_offset
from storage_node.log.producer_state import AbortedTransaction

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">qqq")


def txn_index_file(directory: Path, segment_base: int) -> Path:
    return directory / f"{filename_prefix_from_offset(segment_base)}{TXN_INDEX_SUFFIX}"


class AbortedTransactions:
    """Every aborted transaction of the partition, in marker order, with their files."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        #: (segment base, entry), ordered by the entry's last (marker) offset.
        self._entries: list[tuple[int, AbortedTransaction]] = []

    @classmethod
    def load(cls, directory: Path) -> AbortedTransactions:
        index = cls(directory)
        for path in sorted(directory.glob(f"*{TXN_INDEX_SUFFIX}")):
            stem = path.name[: -len(TXN_INDEX_SUFFIX)]
            if not stem.isdigit():
                continue
            data = path.read_bytes()
            usable = len(data) - len(data) % _ENTRY.size
            for offset in range(0, usable, _ENTRY.size):
                index._entries.append((int(stem), AbortedTransaction(*_ENTRY.unpack_from(data, offset))))
        index._entries.sort(key=lambda item: item[1].last_offset)
        return index

    @property
    def entries(self) -> tuple[AbortedTransaction, ...]:
        return tuple(e for _, e in self._entries)

    def append(self, segment_base: int, aborted: AbortedTransaction) -> None:
        with open(txn_index_file(self._directory, segment_base), "ab") as handle:
            handle.write(_ENTRY.pack(*aborted))
        self._entries.append((segment_base, aborted))

    def overlapping(self, first_offset: int, upper_offset: int) -> list[AbortedTransaction]:
        """Aborted transactions with records in ``[first_offset, upper_offset)``."""
        lasts = [e.last_offset for _, e in self._entries]
        start = bisect.bisect_left(lasts, first_offset)
        return [e for _, e in self._entries[start:] if e.first_offset < upper_offset]

    def truncate_from(self, offset: int) -> None:
        """Forget aborts whose marker is at or after ``offset`` (the log was truncated there)."""
        kept = [(b, e) for b, e in self._entries if e.last_offset < offset]
        if len(kept) != len(self._entries):
            self._rewrite(kept, {b for b, _ in self._entries})

    def forget_segments(self, bases: Iterable[int]) -> None:
        """Retention deleted these segments: their files and entries go."""
        doomed = set(bases)
        self._entries = [(b, e) for b, e in self._entries if b not in doomed]
        for base in doomed:
            txn_index_file(self._directory, base).unlink(missing_ok=True)

    def rebuild(self, from_offset: int, entries: Iterable[tuple[int, AbortedTransaction]]) -> None:
        """Replace what is known from ``from_offset`` on with ``entries`` (recovery replayed it)."""
        kept = [(b, e) for b, e in self._entries if e.last_offset < from_offset]
        self._rewrite(kept + list(entries), {b for b, _ in self._entries})

    def clear(self) -> None:
        self._rewrite([], {b for b, _ in self._entries})

    def _rewrite(self, entries: list[tuple[int, AbortedTransaction]], touched: set[int]) -> None:
        entries.sort(key=lambda item: item[1].last_offset)
        by_segment: dict[int, list[AbortedTransaction]] = {}
        for base, entry in entries:
            by_segment.setdefault(base, []).append(entry)
        for base in touched | set(by_segment):
            path = txn_index_file(self._directory, base)
            items = by_segment.get(base)
            if not items:
                path.unlink(missing_ok=True)
                continue
            tmp = path.with_name(path.name + ".tmp")
            with open(tmp, "wb") as handle:
                handle.write(b"".join(_ENTRY.pack(*e) for e in items))
            os.replace(tmp, path)
        self._entries = entries
