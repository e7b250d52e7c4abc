"""``PartitionLog``: one partition's log on local disk -- append, read, list offsets, flush,
retention, recovery at open."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from services.clock import Clock
from services.errors import CorruptRecordError, KafkaStorageError, OffsetOutOfRangeError
from services.records import set_log_append_time
from services.records.control import marker_batch
from services.records.format import INT32_MAX, INT32_MIN
from services.records.header import read_batch_header
from services.records.inplace import stamp_validated_batch
from storage_node.log import checkpoint, files, loader, retention
from storage_node.log.config import LogConfig
from storage_node.log.file_records import FileHandleCache, FileSlice, SegmentFileGoneError
from storage_node.log.leader_epochs import EpochEndOffset, LeaderEpochCache
from storage_node.log.producer_replay import batch_facts, marker_of, replay_segments
from storage_node.log.producer_state import AbortedTransaction, ProducerStateManager
from storage_node.log.replica_validation import ReplicatedBatch, validate_replicated_batches
from storage_node.log.segment import Segment
from storage_node.log.segments import Segments
from storage_node.log.validation import ValidatedBatch, validate_producer_batches

log = logging.getLogger(__name__)

#: How many times a read retries when retention deleted the segment it was reading.
_READ_RETRIES = 3
#: The flush policy's flushes (``maybe_flush``) rewrite the recovery-point checkpoint at most
#: this often (Kafka's ``log.flush.offset.checkpoint.interval.ms`` default). The rewrite is two
#: fsyncs (~0.3 ms CPU here): at ``flush.ms`` 1000 on 256 partitions, 256 of them a second were
#: ~50 us of a node's CPU per produce request. A stale checkpoint only makes the recovery after a
#: crash start earlier (what it re-validates was flushed, so it validates); a direct ``flush()``
#: (a clean shutdown's, an explicit one) always writes it.
RECOVERY_CHECKPOINT_INTERVAL_MS = 60_000


class AppendInfo(NamedTuple):
    """The result of one append: the offsets assigned and the log's start after it. (A
    NamedTuple: one is made per batch appended, three times cheaper than a frozen dataclass.)"""

    first_offset: int
    last_offset: int
    log_append_time: int  # the broker timestamp stamped on the batches, -1 for CreateTime topics
    record_count: int
    log_start_offset: int
    batch_count: int
    #: The batch was a producer's retry of one already in the log: nothing was written.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReplicatedAppendInfo:
    """The result of a follower's append: the leader's offsets, as written."""

    first_offset: int
    last_offset: int
    batch_count: int


@dataclass(frozen=True, slots=True)
class FetchInfo:
    """The result of one read: whole batches (or None if there is nothing yet) and the bounds."""

    slice: FileSlice | None
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


AppendListener = Callable[["PartitionLog", int], None]
_T = TypeVar("_T")


def _disk_errors_as_storage_errors(method: Callable[..., _T]) -> Callable[..., _T]:
    """Public methods raise the taxonomy: an OSError from the disk becomes KafkaStorageError
    (the cause chained), so callers never see a bare OSError (Kafka's KafkaStorageException)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as exc:
            raise KafkaStorageError(f"{self.name}: {method.__name__} failed: {exc}") from exc

    return wrapper


class _LogEnd(NamedTuple):
    """The log end offset with where it is on disk (Kafka's LogOffsetMetadata): a read bounded
    by ``position`` in segment ``segment_base_offset`` sees exactly the offsets below ``offset``,
    even while an append is half-way through updating the segment."""

    offset: int
    segment_base_offset: int
    position: int


class PartitionLog:
    """The log of one partition in ``<log dir>/<topic>-<partition>/``.

    Layout and format: segment files named by base offset (see ``files.py``, ``Segment``), plus
    ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and, only between a
    clean close and the next open, the ``.clean-shutdown`` marker.

    Offsets: dense from ``log_start_offset`` to ``log_end_offset - 1``. ``high_watermark`` is what
    consumers may read up to. The log never moves it on its own: replication does
    (:meth:`maybe_increment_high_watermark` on a leader, :meth:`update_high_watermark` on a
    follower); the log manager checkpoints it, with every partition of the log dir, in one file
    (:attr:`high_watermark_checkpoint_due`, :meth:`high_watermark_checkpointed`).

    Leader epochs: :attr:`leader_epochs` (``leader_epochs.py``) records the first offset of every
    leader epoch in the log; appends, truncation and moves of the log start keep it in step.

    Durability and crash behaviour: an append is in the page cache when ``append`` returns and on
    disk after :meth:`flush` (by the ``flush.messages``/``flush.ms`` policy in
    :meth:`maybe_flush`, or on demand through ``GroupCommit``). ``recovery_point`` is the first
    offset not known to be on disk; it only moves at a flush and is checkpointed then. At open,
    the loader recovers every segment from the recovery point on, unless the previous close was
    clean; a torn or corrupt tail is truncated at the last whole valid batch.

    Thread safety: appends, rolls, truncation, retention and config changes take the partition
    lock, so there is one writer at a time. Reads take no lock: the segment list is copy-on-write,
    files only grow under a reader, and offsets are read once per call, so a read concurrent with
    an append sees a consistent prefix (its slice is bounded by the size at read time). ``flush``
    may run on another thread (``GroupCommit`` does) while appends continue; it takes the lock
    only to snapshot and to publish the new recovery point, never across an fsync.
    """

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        loaded: loader.LoadedLog,
        handle_cache: FileHandleCache | None = None,
    ) -> None:
        """Visible for tests; use :meth:`open`."""
        self.directory = directory
        #: The log dir holding the partition's directory.
        self.log_dir = directory.parent
        self.topic = topic
        self.partition = partition
        self._config = config
        self._clock = clock
        self._handle_cache = handle_cache
        self._segments = Segments(loaded.segments)
        for segment in loaded.segments[:-1]:
            segment.close_index_handles()  # recovery may have rewritten their indexes
        self._log_start_offset = loaded.log_start_offset
        active = loaded.segments[-1]
        self._end = _LogEnd(loaded.next_offset, active.base_offset, active.size)
        self._high_watermark = loaded.high_watermark
        self._checkpointed_high_watermark = loaded.high_watermark
        self._epochs = loaded.leader_epochs
        self._producers = loaded.producers
        self._aborted = loaded.aborted
        self._recovery_point = loaded.recovery_point
        #: What the recovery-point and log-start checkpoint files hold (written at open).
        self._checkpointed_recovery_point = loaded.recovery_point
        #: When the recovery-point checkpoint was last rewritten by a policy flush, or the log
        #: opened (the checkpoint says the recovery point then): the first policy flush no longer
        #: rewrites it at once, which cost every partition two fsyncs in the first tick after a
        #: node start or a topic's creation (512 at once for a new 256-partition topic).
        self._recovery_checkpoint_ms = clock.time_ms()
        self._checkpointed_log_start = loaded.log_start_offset
        self._last_flush_ms = clock.time_ms()
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._dir_needs_fsync = False
        self._listeners: list[AppendListener] = []
        self._closed = False
        self._failure: BaseException | None = None

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        clock: Clock,
        *,
        handle_cache: FileHandleCache | None = None,
        high_watermark: int | None = None,
        sync_parent: bool = True,
    ) -> PartitionLog:
        """Open (creating if needed) and recover the partition directory ``directory``;
        ``high_watermark`` is the one the log dir's checkpoint holds (None: not there). A new
        directory is made durable by an fsync of the log dir, unless ``sync_parent`` is False
        (the caller fsyncs it once for many new partitions).

        Raises KafkaStorageError when the disk fails (a full disk: ENOSPC). A failed open keeps
        no file open, and a directory this call created is removed again, so retrying on a full
        disk costs nothing.
        """
        created = not directory.exists()
        try:
            if created:
                directory.mkdir(parents=True)
                if sync_parent:
                    checkpoint.fsync_dir(directory.parent)  # the new partition must survive a crash
            loaded = loader.load_log(
                directory,
                topic,
                partition,
                config,
                clock,
                handle_cache=handle_cache,
                high_watermark=0 if created else high_watermark,
            )
            try:
                cls._write_open_checkpoints(directory, topic, partition, loaded, durable=not created)
            except BaseException:
                loader.close_segments(loaded.segments)
                raise
        except OSError as exc:
            if created:
                shutil.rmtree(directory, ignore_errors=True)
            raise KafkaStorageError(
                f"{files.partition_dir_name(topic, partition)}: open failed: {exc}"
            ) from exc
        partition_log = cls(directory, topic, partition, config, clock, loaded, handle_cache)
        log.info(
            "Loaded %s: log start %d, log end %d, recovery point %d, %d segments%s",
            partition_log.name,
            loaded.log_start_offset,
            loaded.next_offset,
            loaded.recovery_point,
            len(loaded.segments),
            " (clean shutdown)"
            if loaded.had_clean_shutdown
            else f" (recovered, {loaded.truncated_bytes} bytes truncated)",
        )
        return partition_log

    @staticmethod
    def _write_open_checkpoints(
        directory: Path, topic: str, partition: int, loaded: loader.LoadedLog, *, durable: bool = True
    ) -> None:
        """The offsets the log opened with. A new log's (``durable=False``) say 0, as their
        absence does, so they are written without fsyncs (four per partition, most of what
        creating thousands of partitions cost a node) -- written still, so that a full disk
        fails the create now rather than its first append."""
        # Each write is two fsyncs; a checkpoint already saying the value is left as it is (a
        # node restarting with tens of thousands of partitions spent most of its start here).
        for name, offset in (
            (files.LOG_START_OFFSET_CHECKPOINT_FILE, loaded.log_start_offset),
            (files.RECOVERY_POINT_CHECKPOINT_FILE, loaded.recovery_point),
        ):
            # A missing checkpoint reads as 0, as the loader takes it (a new log's may be lost).
            if (
                not durable
                or (checkpoint.read_offset_checkpoint(directory / name, topic, partition) or 0) != offset
            ):
                checkpoint.write_offset_checkpoint(
                    directory / name, topic, partition, offset, durable=durable
                )
        # From here on a crash must be treated as unclean.
        loader.remove_clean_shutdown_marker(directory)

    # ---- state ---------------------------------------------------------------------------------

    @property
    def _next_offset(self) -> int:
        return self._end.offset

    def _set_log_end(self, offset: int, segment: Segment) -> None:
        # One assignment, so a lock-free reader sees offset and byte position that agree.
        self._end = _LogEnd(offset, segment.base_offset, segment.size)

    @property
    def name(self) -> str:
        return files.partition_dir_name(self.topic, self.partition)

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        """Every offset below this is on disk (fsynced)."""
        return self._recovery_point

    @property
    def size_in_bytes(self) -> int:
        return self._segments.size_in_bytes

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments as of now, oldest first (for tools and tests)."""
        return self._segments.snapshot()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def offline(self) -> bool:
        """A disk error left the log unusable (a failed flush, or an append that could not be
        rolled back): every operation raises KafkaStorageError until the node reopens it."""
        return self._failure is not None

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def handle_cache(self) -> FileHandleCache | None:
        """The node's bound on open ``.log`` handles, for segments made outside this class."""
        return self._handle_cache

    def _ensure_usable(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"partition log {self.name} is closed")
        if self._failure is not None:
            raise KafkaStorageError(f"partition log {self.name} failed: {self._failure}")

    def update_config(self, config: LogConfig) -> None:
        """Apply new topic configs; they take effect from the next append, roll or retention pass."""
        with self._lock:
            self._config = config
            self._producers.log_append_time = config.log_append_time
            for segment in self._segments:
                segment.update_config(config)

    def update_high_watermark(self, offset: int) -> None:
        """Set the high watermark (a follower copies its leader's), clamped to [log start, log end]."""
        with self._lock:
            self._high_watermark = max(self._log_start_offset, min(offset, self._next_offset))

    def maybe_increment_high_watermark(self, offset: int) -> bool:
        """Move the high watermark forward to ``offset`` (a leader's rule: it never goes back);
        True if it moved. Clamped to the log end."""
        with self._lock:
            offset = min(offset, self._next_offset)
            if offset <= self._high_watermark:
                return False
            self._high_watermark = offset
            return True

    @property
    def high_watermark_checkpoint_due(self) -> bool:
        """Whether the high watermark moved since it was last checkpointed.

        The log manager checkpoints it with the log dir's others, periodically and at close, not
        per append: after a crash the checkpoint may be behind, which is safe (a replica only
        exposes less until its leader tells it more)."""
        return self._high_watermark != self._checkpointed_high_watermark

    def high_watermark_checkpointed(self, high_watermark: int) -> None:
        """``high_watermark`` is now in the log dir's checkpoint."""
        self._checkpointed_high_watermark = high_watermark

    # ---- leader epochs -------------------------------------------------------------------------

    @property
    def leader_epochs(self) -> LeaderEpochCache:
        """Epoch -> start offset of this log (read-only for callers; the log keeps it in step)."""
        return self._epochs

    @property
    def latest_epoch(self) -> int:
        """The epoch of the newest batch (or of the latest assigned leader epoch); -1 if none."""
        return self._epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """Where ``epoch`` ends in this log (see ``LeaderEpochCache.end_offset_for``)."""
        return self._epochs.end_offset_for(epoch, self._next_offset)

    def assign_leader_epoch(self, epoch: int) -> None:
        """This replica leads ``epoch`` from the current log end on (called on becoming leader,
        before any append of the epoch, so followers can truncate against it at once)."""
        with self._lock:
            self._ensure_usable()
            self._epochs.assign(epoch, self._next_offset)

    # ---- listeners -----------------------------------------------------------------------------

    def add_append_listener(self, listener: AppendListener) -> None:
        """Call ``listener(log, log_end_offset)`` after every append, on the appending thread
        (from another thread, hop to the event loop with ``loop.call_soon_threadsafe``)."""
        self._listeners.append(listener)

    def remove_append_listener(self, listener: AppendListener) -> None:
        self._listeners.remove(listener)

    def _notify_listeners(self, log_end_offset: int) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(self, log_end_offset)
            except Exception:  # a listener's bug must not fail an append that is already written
                log.exception("append listener %r failed for %s", listener, self.name)

    # ---- append --------------------------------------------------------------------------------

    @_disk_errors_as_storage_errors
    def append(self, data: bytes | bytearray | memoryview, *, leader_epoch: int = 0) -> AppendInfo:
        """Validate, assign offsets to, and append a producer's batches.

        Every batch is validated (structure, CRC, records vs count, sizes) before any byte is
        written; on any error nothing is written. Offsets and the leader epoch (and, for
        LogAppendTime topics, the timestamp) are rewritten in place in one copy of ``data``;
        batches are never re-encoded. Rolls a new segment first when the active one is full or
        too old. Raises the taxonomy's errors (see ``validate_producer_batches``), and
        KafkaStorageError if the disk fails.
        """
        if not INT32_MIN <= leader_epoch <= INT32_MAX:
            raise ValueError(f"leader epoch {leader_epoch} does not fit int32")
        config = self._config
        batches = validate_producer_batches(
            data, max_message_bytes=config.max_message_bytes, segment_bytes=config.segment_bytes
        )
        payload = bytearray(data)
        with self._lock:
            self._ensure_usable()
            idempotent = batches[0].facts.producer_id >= 0
            duplicate = self._producers.check_payload([b.facts for b in batches]) if idempotent else None
            if duplicate is not None:
                # A retry of batches already appended: answer as the first append was answered
                # (offsets, and the append time on a LogAppendTime topic), write nothing.
                return AppendInfo(
                    duplicate.first_offset,
                    duplicate.last_offset,
                    duplicate.max_timestamp if config.log_append_time else -1,
                    sum(b.record_count for b in batches),
                    self._log_start_offset,
                    0,
                    duplicate=True,
                )
            now = self._clock.time_ms()
            log_append_time = now if config.log_append_time else -1
            first_offset = self._next_offset
            self._stamp_batches(payload, batches, first_offset, leader_epoch, log_append_time)
            if leader_epoch >= 0:
                self._epochs.assign(leader_epoch, first_offset)
            self._write_batches(payload, batches, first_offset, log_append_time, now)
            last_offset = self._next_offset - 1
            if idempotent:
                offset = first_offset
                for batch in batches:
                    facts = batch.facts
                    if log_append_time >= 0:  # the timestamp stored, as a follower will read it
                        facts = facts._replace(max_timestamp=log_append_time)
                    self._producers.update(facts, offset, offset + batch.last_offset_delta)
                    offset += batch.last_offset_delta + 1
            info = AppendInfo(
                first_offset,
                last_offset,
                log_append_time,
                sum(b.record_count for b in batches),
                self._log_start_offset,
                len(batches),
            )
        self._notify_listeners(info.last_offset + 1)
        self.maybe_flush(by_time=False)
        return info

    @_disk_errors_as_storage_errors
    def append_replicated(self, data: bytes | bytearray | memoryview) -> ReplicatedAppendInfo:
        """Append batches copied from the leader, byte for byte (a follower's append).

        Offsets and leader epochs are the leader's: nothing is stamped. Structure and CRC are
        checked, and the batches must continue this log exactly (the first starts at the log
        end, each follows the previous, epochs never go back) -- or, in a compacted log, skip
        ahead where the leader's cleaner removed batches; anything else is CorruptRecordError
        and nothing is written. Empty ``data`` is a no-op.
        """
        allow_gaps = self._config.compact_enabled  # the leader's cleaner removes whole batches
        batches = validate_replicated_batches(
            data, self._next_offset, self._epochs.latest_epoch, allow_gaps=allow_gaps
        )
        if not batches:
            return ReplicatedAppendInfo(self._next_offset, self._next_offset - 1, 0)
        with self._lock:
            self._ensure_usable()
            first = batches[0].base_offset
            if first < self._next_offset or (first > self._next_offset and not allow_gaps):
                raise CorruptRecordError(
                    f"{self.name}: replicated batch starts at {batches[0].base_offset}, "
                    f"the log ends at {self._next_offset}"
                )
            first_offset = self._next_offset
            self._write_replicated(data, batches)
            info = ReplicatedAppendInfo(first_offset, self._next_offset - 1, len(batches))
        self._notify_listeners(info.last_offset + 1)
        self.maybe_flush(by_time=False)
        return info

    def _write_replicated(self, data, batches: list[ReplicatedBatch]) -> None:
        view = memoryview(data)
        segments_before = self._segments.snapshot()
        epochs_before = self._epochs.entries
        first_offset = self._next_offset
        now = self._clock.time_ms()
        try:
            for batch in batches:
                if batch.leader_epoch >= 0:
                    self._epochs.assign(batch.leader_epoch, batch.base_offset)
                segment = self._maybe_roll(batch.size, batch.last_offset, batch.max_timestamp, now)
                segment.append(
                    view[batch.position : batch.position + batch.size],
                    batch.base_offset,
                    batch.last_offset,
                    batch.max_timestamp,
                )
                self._set_log_end(batch.last_offset + 1, segment)
                self._apply_to_producer_state(view[batch.position : batch.position + batch.size], segment)
        except OSError as exc:
            self._roll_back_failed_append(first_offset, segments_before, exc)
            if self._epochs.entries != epochs_before:
                self._epochs.truncate_from_end(first_offset)
            raise KafkaStorageError(f"replicated append to {self.name} failed: {exc}") from exc

    def _apply_to_producer_state(self, batch_bytes, segment: Segment) -> None:
        """Track a batch written as it is (a follower's copy, a marker) in the producer state and,
        for an ABORT marker, the aborted-transaction index."""
        header = read_batch_header(batch_bytes)
        facts = batch_facts(header)
        if facts.producer_id < 0:
            self._producers.map_end_offset = header.last_offset + 1
            return
        commit, coordinator_epoch = marker_of(batch_bytes) if facts.is_control else (None, -1)
        ended = self._producers.update(
            facts,
            header.base_offset,
            header.last_offset,
            marker_commit=commit,
            coordinator_epoch=coordinator_epoch,
        )
        if ended is not None:
            self._aborted.append(segment.base_offset, ended)

    @_disk_errors_as_storage_errors
    def append_marker(
        self,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        leader_epoch: int,
    ) -> int:
        """End a producer's transaction on this partition (a leader, on the transaction
        coordinator's request): append a COMMIT or ABORT control batch; returns its offset.

        INVALID_PRODUCER_EPOCH / TRANSACTION_COORDINATOR_FENCED for a marker older than what this
        partition has seen of the producer. A marker for a producer with no open transaction here
        is still written (the coordinator retries markers; the second one is harmless).
        """
        with self._lock:
            self._ensure_usable()
            self._producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            now = self._clock.time_ms()
            payload = bytearray(
                marker_batch(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    commit=commit,
                    coordinator_epoch=coordinator_epoch,
                    timestamp=now,
                )
            )
            offset = self._next_offset
            stamp_validated_batch(payload, 0, offset, leader_epoch)
            if leader_epoch >= 0:
                self._epochs.assign(leader_epoch, offset)
            segments_before = self._segments.snapshot()
            try:
                segment = self._maybe_roll(len(payload), offset, now, now)
                segment.append(memoryview(payload), offset, offset, now)
                self._set_log_end(offset + 1, segment)
            except OSError as exc:
                self._roll_back_failed_append(offset, segments_before, exc)
                raise KafkaStorageError(f"marker append to {self.name} failed: {exc}") from exc
            self._apply_to_producer_state(memoryview(payload), segment)
        self._notify_listeners(offset + 1)
        self.maybe_flush(by_time=False)
        return offset

    # ---- transactions --------------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """What a read_committed consumer may read up to: the first offset of the oldest open
        transaction, or the high watermark when that is lower (or none is open)."""
        first_open = self._producers.first_unstable_offset()
        high_watermark = self._high_watermark
        return high_watermark if first_open is None else min(first_open, high_watermark)

    def aborted_transactions(self, first_offset: int, upper_offset: int) -> list[AbortedTransaction]:
        """The aborted transactions with records in ``[first_offset, upper_offset)``."""
        return self._aborted.overlapping(first_offset, upper_offset)

    @property
    def producer_state(self) -> ProducerStateManager:
        """For tools and tests: the producer state (do not mutate)."""
        return self._producers

    def transaction_open(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether ``producer_id`` at ``producer_epoch`` has a transaction open on this partition
        (its first transactional batch here was appended, no marker since)."""
        entry = self._producers.producers.get(producer_id)
        return (
            entry is not None and entry.epoch == producer_epoch and entry.transaction_first_offset is not None
        )

    def expire_producers(self, expiration_ms: int) -> list[int]:
        """Forget producers idle longer than ``expiration_ms`` (producer.id.expiration.ms)."""
        with self._lock:
            return self._producers.expire(self._clock.time_ms(), expiration_ms)

    @staticmethod
    def _stamp_batches(
        payload: bytearray,
        batches: list[ValidatedBatch],
        first_offset: int,
        leader_epoch: int,
        log_append_time: int,
    ) -> None:
        view = memoryview(payload)
        offset = first_offset
        for batch in batches:
            stamp_validated_batch(payload, batch.position, offset, leader_epoch)
            if log_append_time >= 0:  # rewrites a CRC-covered field: the checked path
                set_log_append_time(view[batch.position : batch.position + batch.size], log_append_time)
            offset += batch.last_offset_delta + 1

    def _write_batches(
        self,
        payload: bytearray,
        batches: list[ValidatedBatch],
        first_offset: int,
        log_append_time: int,
        now: int,
    ) -> None:
        view = memoryview(payload)
        segments_before = self._segments.snapshot()
        offset = first_offset
        try:
            for batch in batches:
                last_offset = offset + batch.last_offset_delta
                max_timestamp = log_append_time if log_append_time >= 0 else batch.max_timestamp
                segment = self._maybe_roll(batch.size, last_offset, max_timestamp, now)
                segment.append(
                    view[batch.position : batch.position + batch.size], offset, last_offset, max_timestamp
                )
                offset = last_offset + 1
                self._set_log_end(offset, segment)
        except OSError as exc:
            self._roll_back_failed_append(first_offset, segments_before, exc)
            raise KafkaStorageError(f"append to {self.name} failed: {exc}") from exc

    def _roll_back_failed_append(
        self, first_offset: int, segments_before: tuple[Segment, ...], cause: OSError
    ) -> None:
        """Undo a partly written append so the log holds none of it; if even that fails, the
        log refuses further work (as Kafka takes a failed log dir offline)."""
        log.error("Append to %s failed at offset %d, rolling back: %s", self.name, self._next_offset, cause)
        try:
            for segment in self._segments.snapshot():
                if segment not in segments_before:
                    self._segments.remove(segment)
                    segment.delete()
            self._segments.active.truncate_to(first_offset)
            self._set_log_end(first_offset, self._segments.active)
        except OSError as exc:
            self._failure = exc
            log.exception("Rolling back the failed append to %s failed; the log is now offline", self.name)

    # ---- roll ----------------------------------------------------------------------------------

    def _maybe_roll(self, batch_size: int, last_offset: int, max_timestamp: int, now: int) -> Segment:
        """The segment to append a batch to, rolling a new one first if the active one is full
        (segment.bytes, an index, or relative offsets) or too old (segment.ms).

        An empty segment is never rolled: its successor would have the same base offset.
        """
        active = self._segments.active
        if not active.size:
            return active
        config = self._config
        if active.size + batch_size > config.segment_bytes:
            reason = f"segment.bytes {config.segment_bytes} reached"
        elif active.time_waited_for_roll(now, max_timestamp) > config.max_segment_ms:
            reason = f"segment.ms {config.max_segment_ms} reached"
        elif active.indexes_full:
            reason = "index full"
        elif not active.can_hold(last_offset):
            reason = "relative offset overflow"
        else:
            return active
        return self._roll(reason)

    @_disk_errors_as_storage_errors
    def maybe_roll(self) -> bool:
        """Roll a non-empty active segment that is older than ``segment.ms`` by the clock (the
        periodic tick's check, so an idle partition's last segment can eventually expire)."""
        active = self._segments.active  # a look without the lock first: the tick asks every partition
        if not active.size or self._clock.time_ms() - active.created_ms <= self._config.max_segment_ms:
            return False
        with self._lock:
            self._ensure_usable()
            active = self._segments.active
            if active.size and self._clock.time_ms() - active.created_ms > self._config.max_segment_ms:
                self._roll(f"segment.ms {self._config.max_segment_ms} reached while idle")
                return True
        return False

    @_disk_errors_as_storage_errors
    def roll(self) -> Segment:
        """Start a new active segment at the log end (no-op if the active one is empty)."""
        with self._lock:
            self._ensure_usable()
            if not self._segments.active.size:
                return self._segments.active
            return self._roll("requested")

    def _roll(self, reason: str) -> Segment:
        old = self._segments.active
        base_offset = self._next_offset
        if self._segments.contains(base_offset):
            raise KafkaStorageError(f"{self.name}: a segment with base offset {base_offset} already exists")
        if files.log_file(self.directory, base_offset).exists():
            # Left by something the loader did not know about; appending into it could interleave
            # foreign bytes with ours.
            raise KafkaStorageError(
                f"{self.name}: {files.log_file(self.directory, base_offset)} already exists"
            )
        old.on_become_inactive()
        segment = Segment.open(
            self.directory, base_offset, self._config, self._clock, handle_cache=self._handle_cache
        )
        self._segments.add(segment)
        # Recovery replays producer state from the newest snapshot: one per segment bounds it.
        self._producers.take_snapshot(base_offset)
        self._dir_needs_fsync = True
        log.info("Rolled %s to a new segment at offset %d (%s)", self.name, base_offset, reason)
        return segment

    # ---- read ----------------------------------------------------------------------------------

    @_disk_errors_as_storage_errors
    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, bounds_only: bool = False
    ) -> FetchInfo:
        """Whole batches starting with the one holding ``offset``, about ``max_bytes`` in all
        (the first batch whole even if larger), below ``max_offset`` if given. With
        ``bounds_only``, no records: the offsets (and the range check) of a partition a fetch
        reached past its response's byte budget, without looking into the segments.

        ``offset == log_end_offset`` -> a FetchInfo with ``slice=None`` (nothing yet);
        ``offset`` below the log start or above the log end -> OffsetOutOfRangeError.
        """
        for _ in range(_READ_RETRIES):
            if self._closed:
                raise KafkaStorageError(f"partition log {self.name} is closed")
            high_watermark = self._high_watermark
            end = self._end
            log_start = self._log_start_offset
            self._ensure_offset_in_range(offset, log_start, end.offset)
            if bounds_only:
                return FetchInfo(None, log_start, end.offset, high_watermark)
            try:
                file_slice = self._read_segments(offset, max_bytes, end, max_offset)
            except SegmentFileGoneError:
                continue  # retention deleted the segment under us: re-check the bounds
            return FetchInfo(file_slice, log_start, end.offset, high_watermark)
        raise KafkaStorageError(f"{self.name}: segments kept disappearing while reading offset {offset}")

    def _ensure_offset_in_range(self, offset: int, log_start: int, log_end: int) -> None:
        if offset < log_start or offset > log_end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for partition {self.name}: "
                f"log start offset {log_start}, log end offset {log_end}"
            )

    def _read_segments(
        self, offset: int, max_bytes: int, end: _LogEnd, max_offset: int | None
    ) -> FileSlice | None:
        upper = end.offset if max_offset is None else min(max_offset, end.offset)
        if offset >= upper:
            return None
        for segment in self._segments.from_offset(offset):
            if segment.base_offset >= upper:
                break
            max_position = end.position if segment.base_offset == end.segment_base_offset else None
            if upper < end.offset:
                bound = segment.translate_offset(upper, max_position)
                if bound is not None:
                    max_position = bound.position
            file_slice = segment.read(offset, max_bytes, max_position)
            if file_slice is not None and file_slice.length:
                return file_slice
        return None

    # ---- list offsets --------------------------------------------------------------------------

    def list_offset_earliest(self) -> int:
        """The first readable offset (ListOffsets EARLIEST)."""
        return self._log_start_offset

    def list_offset_latest(self) -> int:
        """The offset the next committed record will get (ListOffsets LATEST): the high
        watermark, which equals the log end offset with one replica."""
        return self._high_watermark

    @_disk_errors_as_storage_errors
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with timestamp >= ``timestamp``, among the
        readable records (log start .. high watermark); None if there is none."""
        for _ in range(_READ_RETRIES):
            try:
                return self._find_offset_for_timestamp(timestamp)
            except SegmentFileGoneError:
                continue  # retention deleted a segment under us: look again
        raise KafkaStorageError(f"{self.name}: segments kept disappearing while searching by time")

    def _find_offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        log_start, high_watermark = self._log_start_offset, self._high_watermark
        segments = self._segments.snapshot()
        for i, segment in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1].base_offset <= log_start:
                continue
            if segment.max_timestamp_so_far < timestamp:
                continue
            found = segment.find_offset_for_timestamp(timestamp, max(log_start, segment.base_offset))
            if found is not None:
                return found if found[0] < high_watermark else None
        return None

    # ---- flush ---------------------------------------------------------------------------------

    def maybe_flush(self, *, by_time: bool = True) -> bool:
        """Flush if ``flush.messages`` records are unflushed or (``by_time``) the last flush is
        ``flush.ms`` old (the paper's M messages or T ms). Returns whether it flushed.

        Appends pass ``by_time=False``: the time rule is the periodic tick's job, which runs off
        the event loop (measured: a due flush.ms fsync inside appends to 256 partitions cut
        produce from ~26k to ~17k msg/s)."""
        if self.flush_due(by_time=by_time):
            self.flush(policy=True)
            return True
        return False

    def flush_due(self, *, by_time: bool = True) -> bool:
        """Whether :meth:`maybe_flush` would flush now (the periodic tick asks every partition,
        then flushes the due ones side by side)."""
        unflushed = self._next_offset - self._recovery_point
        if unflushed <= 0 or self._closed:
            return False
        config = self._config
        return unflushed >= config.flush_messages or (
            by_time and self._clock.time_ms() - self._last_flush_ms >= config.flush_ms
        )

    @_disk_errors_as_storage_errors
    def flush(self, *, policy: bool = False) -> None:
        """fsync every segment holding offsets at or above the recovery point, then move the
        recovery point to the log end as of the start of the flush and checkpoint it (a flush of
        the flush policy's -- ``policy`` -- at most every :data:`RECOVERY_CHECKPOINT_INTERVAL_MS`).

        Safe to call from a worker thread while appends continue; concurrent flushes queue.
        """
        with self._flush_lock:
            with self._lock:
                self._ensure_usable()
                end = self._next_offset
                # Only what changed since the last flush is synced: a node closing thousands of
                # idle (or new, empty) partitions spent its shutdown rewriting what was on disk.
                # Indexes are looked at from the segment holding the last offset flushed before
                # (``recovery point - 1``): the previous flush may have left its indexes unsynced.
                moved = end > self._recovery_point
                segments = self._segments.from_offset(self._recovery_point) if moved else ()
                index_segments = self._segments.from_offset(self._recovery_point - 1) if moved else ()
                dir_needs_fsync, self._dir_needs_fsync = self._dir_needs_fsync, False
            try:
                # The segment holding the last offset this flush covers (``end - 1``) is where
                # recovery after a crash starts (``loader.first_recovered_base``): its indexes are
                # rebuilt from its log then, so they need no fsync until a later flush moves the
                # recovery point past that segment. That saves one or two of a busy partition's
                # three fsyncs per flush. Every segment before it must have durable indexes
                # before the recovery point moves.
                for segment in segments:
                    segment.log.flush()
                tail_base = max((s.base_offset for s in index_segments if s.base_offset < end), default=-1)
                for segment in index_segments:
                    if segment.base_offset < tail_base:
                        segment.flush_indexes()
                if dir_needs_fsync:
                    checkpoint.fsync_dir(self.directory)  # new segment files must survive too
                # The epochs of the offsets about to fall below the recovery point must be on
                # disk first: the loader relearns epochs from the batches above it only.
                self._epochs.flush(below=end)
            except OSError as exc:
                # The log goes offline (as Kafka takes a log dir whose flush failed offline): after
                # a failed write-back Linux may mark the lost pages clean, so a retried fsync can
                # succeed without them and move the recovery point past records no longer there.
                with self._lock:
                    self._failure = exc
                log.error("Flush of %s failed; the log is now offline: %s", self.name, exc)
                raise KafkaStorageError(f"flush of {self.name} failed: {exc}") from exc
            with self._lock:
                if end > self._recovery_point:
                    self._recovery_point = end
                self._last_flush_ms = self._clock.time_ms()
            if end != self._checkpointed_recovery_point:
                now = self._clock.time_ms()
                last = self._recovery_checkpoint_ms
                # Never leave the file above the log's flushed history (after a truncation).
                behind = end < self._checkpointed_recovery_point
                if not policy or behind or now - last >= RECOVERY_CHECKPOINT_INTERVAL_MS:
                    self._write_recovery_checkpoint(end)
                    if policy:
                        self._recovery_checkpoint_ms = now

    # ---- retention -----------------------------------------------------------------------------

    @_disk_errors_as_storage_errors
    def delete_old_segments(self) -> int:
        """Apply retention: segments below the log start offset, then (when ``cleanup.policy``
        includes ``delete``) over ``retention.bytes``, then older than ``retention.ms``. Never
        the active segment. Returns how many segments were deleted."""
        if len(self._segments) < 2:  # only the active segment (read without the lock): nothing to do
            return 0
        with self._lock:
            self._ensure_usable()
            deleted = self._delete_segments(
                retention.log_start_offset_breached(self._log_start_offset), "log start offset"
            )
            if self._config.delete_enabled:
                deleted += self._delete_segments(
                    retention.retention_size_breached(self.size_in_bytes, self._config.retention_bytes),
                    f"retention.bytes {self._config.retention_bytes}",
                )
                deleted += self._delete_segments(
                    retention.retention_ms_breached(self._clock.time_ms(), self._config.retention_ms),
                    f"retention.ms {self._config.retention_ms}",
                )
            return deleted

    @_disk_errors_as_storage_errors
    def delete_records_before(self, offset: int) -> int:
        """Make ``offset`` the new log start (Kafka's DeleteRecords): reads below it fail with
        OffsetOutOfRangeError and segments entirely below it are deleted. Returns the log start.

        OffsetOutOfRangeError if ``offset`` is above the high watermark.
        """
        with self._lock:
            self._ensure_usable()
            if offset > self._high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot delete records before {offset} in {self.name}: above the high "
                    f"watermark {self._high_watermark}"
                )
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                self._epochs.truncate_from_start(offset)
                self._checkpoint_log_start_offset()
                log.info("Log start offset of %s moved to %d by a delete-records request", self.name, offset)
                self._delete_segments(retention.log_start_offset_breached(offset), "delete records")
            return self._log_start_offset

    def _delete_segments(self, should_delete: retention.ShouldDelete, reason: str) -> int:
        doomed = retention.deletable_segments(
            self._segments.snapshot(), should_delete, high_watermark=self._high_watermark
        )
        if not doomed:
            return 0
        for segment in doomed:
            self._segments.remove(segment)  # first: new reads no longer find it
        new_start = max(self._log_start_offset, self._segments.first.base_offset)
        if new_start != self._log_start_offset:
            self._log_start_offset = new_start
            self._epochs.truncate_from_start(new_start)
            self._checkpoint_log_start_offset()
        for segment in doomed:
            log.info("Deleting segment %s of %s (%s)", segment.base_offset, self.name, reason)
            segment.delete()
        self._aborted.forget_segments(s.base_offset for s in doomed)
        self._producers.delete_old_snapshots(self._log_start_offset)
        return len(doomed)

    def _checkpoint_log_start_offset(self) -> None:
        log_start = self._log_start_offset
        checkpoint.write_offset_checkpoint(
            self.directory / files.LOG_START_OFFSET_CHECKPOINT_FILE, self.topic, self.partition, log_start
        )
        self._checkpointed_log_start = log_start

    # ---- compaction (the log cleaner's hooks; the logic is in storage_node.log.cleaner) ---------

    def producer_last_offsets(self) -> frozenset[int]:
        """The last offset of each producer's newest batch: the batches compaction must keep (at
        least as empty batches) so a replay can rebuild the producers' sequence numbers."""
        with self._lock:
            return frozenset(
                entry.batches[-1].last_offset for entry in self._producers.producers.values() if entry.batches
            )

    @_disk_errors_as_storage_errors
    def replace_segments(self, old: list[Segment], cleaned: Segment, on_step: Callable[[str], None]) -> bool:
        """Swap ``cleaned`` in for ``old`` (consecutive inactive segments it was made from) with
        the crash-safe ``.cleaned``/``.swap`` protocol (``cleaner.swap``), under the partition
        lock. False, touching nothing, when ``old`` changed since the cleaner read it (retention
        deleted one, a truncation made one active or cut it)."""
        from storage_node.log.cleaner.swap import swap_in_cleaned_segment

        with self._lock:
            self._ensure_usable()
            live = self._segments.snapshot()
            active = live[-1]
            first = next((i for i, s in enumerate(live) if s is old[0]), None)
            unchanged = (
                first is not None
                and all(a is b for a, b in zip(live[first : first + len(old)], old, strict=False))
                and first + len(old) < len(live)  # the active segment is never among them
                and not any(s.deleted for s in old)
            )
            if not unchanged or cleaned.next_offset > active.base_offset:
                return False  # checked before the commit point: nothing on disk has changed
            swap_in_cleaned_segment(self.directory, self._segments, old, cleaned, on_step)
            return True

    # ---- truncation (for replicas) -------------------------------------------------------------

    @_disk_errors_as_storage_errors
    def truncate_to(self, offset: int) -> None:
        """Remove every offset >= ``offset`` (a follower diverging from its leader). Offsets
        below the log start cannot be truncated to; ``offset`` >= log end cuts nothing but an
        epoch entry at the log end (Kafka does the same). Waits for a flush in progress: one
        that began before the cut must not move the recovery point past it afterwards."""
        with self._flush_lock, self._lock:
            self._ensure_usable()
            if offset >= self._next_offset:
                # Nothing to cut, but an epoch may start at the log end with no batch of it (this
                # replica led that epoch and wrote nothing): it is not this log's history.
                self._epochs.truncate_from_end(self._next_offset)
                return
            if offset < self._log_start_offset:
                raise OffsetOutOfRangeError(
                    f"cannot truncate {self.name} to {offset}, "
                    f"below the log start offset {self._log_start_offset}"
                )
            for segment in reversed(self._segments.snapshot()):
                if segment.base_offset > offset and len(self._segments) > 1:
                    self._segments.remove(segment)
                    segment.delete()
            self._segments.active.truncate_to(offset)
            self._set_log_end(self._segments.active.next_offset, self._segments.active)
            self._epochs.truncate_from_end(self._next_offset)
            self._reload_producer_state()
            self._high_watermark = min(self._high_watermark, self._next_offset)
            self._recovery_point = min(self._recovery_point, self._next_offset)
            self._lower_recovery_checkpoint()
            log.info("Truncated %s to offset %d", self.name, self._next_offset)

    @_disk_errors_as_storage_errors
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and restart it empty at ``offset`` (a follower whose fetch offset
        fell below its leader's log start, or past its log end after an unclean election).

        Crash safety: segments are deleted first, then the new log start is checkpointed; a crash
        in between reloads an empty log at the old start, which the next fetch from the leader
        resolves the same way.
        """
        if offset < 0:
            raise ValueError(f"cannot restart {self.name} at negative offset {offset}")
        with self._flush_lock, self._lock:  # as in truncate_to
            self._ensure_usable()
            old = self._segments.snapshot()
            for segment in old:
                self._segments.remove(segment)
            for segment in old:
                segment.delete()
            segment = Segment.open(
                self.directory, offset, self._config, self._clock, handle_cache=self._handle_cache
            )
            self._segments.add(segment)
            self._dir_needs_fsync = True
            self._epochs.clear()
            self._producers.delete_snapshots(above=-1)
            self._producers.load(0)
            self._producers.map_end_offset = offset
            self._aborted.clear()
            self._epochs.flush()  # rare: an emptied log must not reload the old epochs after a crash
            self._log_start_offset = offset
            self._checkpoint_log_start_offset()
            self._set_log_end(offset, segment)
            self._high_watermark = offset
            self._recovery_point = offset
            self._lower_recovery_checkpoint()
            log.info("Emptied %s; it restarts at offset %d", self.name, offset)

    def _lower_recovery_checkpoint(self) -> None:
        """After a truncation (under the lock): a checkpoint above the new recovery point would
        let a crash skip the recovery of history written after the cut, so it is rewritten now
        (Kafka checkpoints recovery points after a truncation too), not at the next timed flush."""
        if self._recovery_point < self._checkpointed_recovery_point:
            self._write_recovery_checkpoint(self._recovery_point)

    def _write_recovery_checkpoint(self, offset: int) -> None:
        checkpoint.write_offset_checkpoint(
            self.directory / files.RECOVERY_POINT_CHECKPOINT_FILE, self.topic, self.partition, offset
        )
        self._checkpointed_recovery_point = offset

    def _reload_producer_state(self) -> None:
        """After a truncation: the newest snapshot at or below the new log end, then a replay."""
        end = self._next_offset
        self._producers.delete_snapshots(above=end)
        self._aborted.truncate_from(end)
        start = self._producers.load(end)
        replay_segments(self._segments.snapshot(), self._producers, self._aborted, start)

    # ---- lifecycle -----------------------------------------------------------------------------

    @_disk_errors_as_storage_errors
    def close(self) -> None:
        """Flush everything, checkpoint, close the files and leave the clean-shutdown marker so
        the next open skips recovery. Idempotent."""
        if self._closed:
            return
        if self._failure is None:
            self.flush()
        with self._flush_lock, self._lock:
            if self._failure is None:
                # The clean-shutdown marker vouches for every index, and flushes leave the indexes
                # of the segment they end in unsynced.
                for segment in self._segments:
                    segment.flush_indexes()
            self._closed = True
            for segment in self._segments:
                segment.close()
            if self._failure is None:
                # Only what changed: an idle partition's close writes nothing but its marker.
                if self._log_start_offset != self._checkpointed_log_start:
                    self._checkpoint_log_start_offset()
                if self._next_offset > self._log_start_offset:  # an empty log replays nothing
                    self._producers.ensure_snapshot(self._next_offset)
                loader.write_clean_shutdown_marker(self.directory)

    @_disk_errors_as_storage_errors
    def delete(self) -> None:
        """Delete the partition: rename the directory to ``<name>.<id>-delete`` (the commit
        point; the log manager finishes such leftovers at load), then remove it."""
        with self._flush_lock, self._lock:
            self._closed = True
            for segment in self._segments:
                segment.close()
            doomed = self.directory.with_name(f"{self.directory.name}.{uuid.uuid4().hex}-delete")
            os.replace(self.directory, doomed)
            checkpoint.fsync_dir(doomed.parent)
            shutil.rmtree(doomed, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.name}, log_start={self._log_start_offset}, "
            f"log_end={self._next_offset}, segments={len(self._segments)})"
        )
