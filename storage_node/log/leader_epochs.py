"""The leader-epoch cache of one partition: which leader epoch wrote which offsets (KIP-101).

Every batch carries the ``partitionLeaderEpoch`` of the leader that appended it. This cache keeps,
per epoch, the first offset written in it, so a replica can answer "where did epoch E end?" --
the question on which truncation after a leader change rests (KIP-101 / KIP-279 / KIP-320):
truncating to the high watermark alone can lose acknowledged records or leave replicas that
diverge, truncating to where the leader's history and ours part cannot.

Entries are strictly increasing in both epoch and start offset. A new entry (:meth:`assign`)
removes every entry whose epoch or start offset is not below its own (a follower that truncated
and learns the leader's history again). The log keeps the cache in step with its own changes:
:meth:`truncate_from_end` when the log is truncated, :meth:`truncate_from_start` when its start
moves (retention, delete-records).

File format (``leader-epoch-checkpoint`` in the partition directory, Kafka's layout)::

    0                     version
    2                     number of entries
    0 0                   <epoch> <start offset>
    3 1170

Durability: changed entries are written (atomically, ``checkpoint.write_atomically``, two fsyncs)
by :meth:`LeaderEpochCache.flush`, which the log calls when it flushes -- before its recovery
point moves past them -- and when it closes; not when they change. Every entry for an offset
below the recovery point is therefore on disk, and whatever a crash loses above it the loader
learns again from the batches it recovers there (it scans them from the recovery point, and the
whole log when the file is missing or malformed). An entry of an epoch that wrote nothing is
lost with nothing to relearn: harmless, a leader that restarts gets a new epoch, and "where did
the epoch before it end?" is answered the same -- at the log end -- either way. Writing on
every change (once per leader change) cost two fsyncs per partition on the node's event loop: a
node taking the lead of 3,333 partitions after a create or a restart was busy for seconds, and
appends to them waited (Kafka, KAFKA-15046, likewise stopped fsyncing this file on truncation).

Thread safety: the owning ``PartitionLog`` mutates it under its lock; :meth:`flush` may run on
another thread (the log's flush), serialised with itself by a lock of its own. Readers on other
threads see a consistent tuple (entries are replaced, never mutated).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
from pathlib import Path
from typing import NamedTuple

from storage_node.log import checkpoint

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
#: Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET.
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
_VERSION = 0


class EpochEntry(NamedTuple):
    """The first offset written by the leader of ``epoch``."""

    epoch: int
    start_offset: int


class EpochEndOffset(NamedTuple):
    """The answer to "where did ``epoch`` end?": the largest epoch at or below the one asked
    about, and the offset just past its last record (the start of the next epoch, or the log
    end for the latest one). ``(UNDEFINED_EPOCH, UNDEFINED_OFFSET)`` when nothing is known."""

    epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.epoch == UNDEFINED_EPOCH or self.end_offset == UNDEFINED_OFFSET


UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)


class LeaderEpochCache:
    """Epoch -> start offset of one partition, persisted in ``path`` (None: memory only)."""

    def __init__(self, path: Path | None, entries: tuple[EpochEntry, ...] = ()) -> None:
        _ensure_increasing(entries)
        self._path = path
        self._entries = tuple(entries)
        #: The entries as the checkpoint file last got them (see :meth:`flush`).
        self._written = self._entries
        self._write_lock = threading.Lock()

    @classmethod
    def load(cls, directory: Path) -> LeaderEpochCache:
        """The cache checkpointed in ``directory`` (empty when the file is missing or malformed)."""
        path = directory / LEADER_EPOCH_CHECKPOINT_FILE
        return cls(path, read_checkpoint(path) or ())

    @property
    def dirty(self) -> bool:
        """Whether the entries changed since the checkpoint file was last written."""
        return self._entries != self._written

    def needs_flush(self, below: int) -> bool:
        """Whether the entries for offsets below ``below`` differ from the file's (those the log
        is about to make durable; later ones -- an epoch that wrote nothing yet -- need not be)."""
        entries, written = self._entries, self._written
        if entries == written:
            return False
        return _below(entries, below) != _below(written, below)

    def flush(self, below: int | None = None) -> bool:
        """Write the entries to the checkpoint file, durably, if they changed since the last
        write (with ``below``: if those for offsets below it did); True if written. The log
        calls it before moving its recovery point to ``below``."""
        if self._path is None:
            return False
        with self._write_lock:
            entries = self._entries  # one read: a change made meanwhile stays to write next time
            if entries == self._written or (below is not None and not self.needs_flush(below)):
                return False
            write_checkpoint(self._path, entries)
            self._written = entries
            return True

    # ---- reads ---------------------------------------------------------------------------------

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return self._entries

    @property
    def latest_epoch(self) -> int:
        """The newest epoch in the log, or UNDEFINED_EPOCH when the log holds no epoch."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    def start_offset_of(self, epoch: int) -> int | None:
        """The first offset of ``epoch`` if this log holds it."""
        for entry in reversed(self._entries):
            if entry.epoch == epoch:
                return entry.start_offset
            if entry.epoch < epoch:
                return None
        return None

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEndOffset:
        """Where ``epoch`` ended in this log (Kafka's ``endOffsetFor``).

        * the latest epoch: it is still being written, so it ends at the log end;
        * an epoch between two known ones: the largest known epoch at or below it, ending where
          the next known epoch starts;
        * an epoch below every known one: that epoch, ending where the first known one starts
          (what was before is gone from this log, so a follower may copy from there);
        * UNDEFINED_EPOCH, or an epoch above every known one: undefined.
        """
        entries = self._entries
        if epoch == UNDEFINED_EPOCH or not entries:
            return UNDEFINED
        if epoch == entries[-1].epoch:
            return EpochEndOffset(epoch, log_end_offset)
        higher = bisect.bisect_right([e.epoch for e in entries], epoch)
        if higher == len(entries):
            return UNDEFINED
        if higher == 0:
            return EpochEndOffset(epoch, entries[0].start_offset)
        return EpochEndOffset(entries[higher - 1].epoch, entries[higher].start_offset)

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch that wrote ``offset`` (UNDEFINED_EPOCH if before every entry)."""
        starts = [e.start_offset for e in self._entries]
        index = bisect.bisect_right(starts, offset)
        return self._entries[index - 1].epoch if index else UNDEFINED_EPOCH

    # ---- changes -------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        A no-op for the latest epoch at or after its known start (the common case: every append
        of the current leader). Otherwise every entry with an epoch >= ``epoch`` or a start
        offset >= ``start_offset`` is dropped first, so the entries stay increasing in both.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"leader epoch entry ({epoch}, {start_offset}) is negative")
        latest = self.latest_entry
        if latest is not None and latest.epoch == epoch and latest.start_offset <= start_offset:
            return False
        kept = tuple(e for e in self._entries if e.epoch < epoch and e.start_offset < start_offset)
        dropped = len(self._entries) - len(kept)
        if dropped:
            log.info(
                "%s: new epoch %d at %d replaces %d later entries",
                self._path or "epoch cache",
                epoch,
                start_offset,
                dropped,
            )
        self._replace((*kept, EpochEntry(epoch, start_offset)))
        return True

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there)."""
        kept = tuple(e for e in self._entries if e.start_offset < end_offset)
        if len(kept) != len(self._entries):
            self._replace(kept)

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget what lies before ``start_offset`` (the log start moved there): entries wholly
        before it go, and the one covering it now starts at it."""
        entries = self._entries
        covering = bisect.bisect_right([e.start_offset for e in entries], start_offset)
        if covering <= 1 and (not entries or entries[0].start_offset >= start_offset):
            return
        first = entries[covering - 1]
        self._replace((EpochEntry(first.epoch, start_offset), *entries[covering:]))

    def clear(self) -> None:
        """Forget every epoch (the log was emptied and restarted elsewhere)."""
        if self._entries:
            self._replace(())

    def _replace(self, entries: tuple[EpochEntry, ...]) -> None:
        _ensure_increasing(entries)
        self._entries = entries

    def __repr__(self) -> str:
        return f"LeaderEpochCache({list(self._entries)})"


def _below(entries: tuple[EpochEntry, ...], offset: int) -> tuple[EpochEntry, ...]:
    return tuple(e for e in entries if e.start_offset < offset)


def _ensure_increasing(entries: tuple[EpochEntry, ...] | list[EpochEntry]) -> None:
    for before, after in itertools.pairwise(entries):
        if not (before.epoch < after.epoch and before.start_offset < after.start_offset):
            raise ValueError(f"leader epoch entries out of order: {before} then {after}")


def write_checkpoint(path: Path, entries: tuple[EpochEntry, ...]) -> None:
    lines = [str(_VERSION), str(len(entries)), *(f"{e.epoch} {e.start_offset}" for e in entries)]
    checkpoint.write_atomically(path, ("\n".join(lines) + "\n").encode())


def read_checkpoint(path: Path) -> tuple[EpochEntry, ...] | None:
    """The entries in ``path``; None (with a warning unless missing) when missing, unreadable or
    malformed -- then nothing is known, unlike a file of no entries."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("Ignoring unreadable leader epoch checkpoint %s: %s", path, exc)
        return None
    try:
        lines = text.split("\n")
        if int(lines[0]) != _VERSION:
            raise ValueError(f"version {lines[0]!r}")
        count = int(lines[1])
        entries = []
        for line in lines[2 : 2 + count]:
            epoch, start = line.split(" ")
            entries.append(EpochEntry(int(epoch), int(start)))
        if len(entries) != count or any(e.epoch < 0 or e.start_offset < 0 for e in entries):
            raise ValueError(f"expected {count} non-negative entries")
        _ensure_increasing(entries)
        return tuple(entries)
    except (ValueError, IndexError) as exc:
        log.warning("Ignoring malformed leader epoch checkpoint %s: %s", path, exc)
        return None
