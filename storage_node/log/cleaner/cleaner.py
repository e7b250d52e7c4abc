"""Cleaning one partition: build the offset map over the dirty part, rewrite every cleanable
segment without the records it supersedes, swap the rewritten segments in (Kafka's ``Cleaner``).

A round, for one partition (see ``planner`` for the parts of the log):

1. **Map.** Walk the dirty segments' records in offset order and record each key's latest offset
   in the bounded :class:`OffsetMap`; stop early when a new key does not fit. The map's end
   (``map_end``) is where this round's cleaning stops and the next round's dirty part starts.
   Records of aborted transactions are skipped (they never count as a key's latest value), and
   so are transaction markers.
2. **Rewrite.** Every segment wholly below the first uncleanable offset and starting below
   ``map_end`` -- the clean part again, and the dirty part -- is regrouped (``group_segments``)
   and each group is rewritten into one ``.cleaned`` segment, batch by batch, keeping a record
   unless

   * the map holds a later offset for its key;
   * it belongs to an aborted transaction;
   * it is a tombstone (null value) below ``map_end`` whose segment's newest record is older
     than ``delete.retention.ms`` -- by then every older value of its key has been removed (they
     sit at lower offsets, all rewritten with this map or an earlier one).

   Records without a key and transaction markers are always kept (Kafka removes markers once
   their transaction's data is gone and ``delete.retention.ms`` passed; keeping them costs a few
   bytes and never changes what a reader sees). A producer's newest batch is kept at least as an
   empty batch (``batch_filter``).
3. **Swap.** Each group's ``.cleaned`` segment is flushed and swapped in (``swap``) under the
   partition lock, if the segments it replaces are still there unchanged.
4. **Checkpoint.** ``map_end`` goes to ``cleaner-offset-checkpoint`` in the partition directory
   (a crash before it only makes the next round redo work: cleaning is idempotent).

Offsets never change and retained records are byte-identical to what was produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from services.records import RecordBatchView
from services.records.aborted import AbortedTransactionFilter
from storage_node.log import checkpoint, files
from storage_node.log.cleaner.batch_filter import filter_batch
from storage_node.log.cleaner.offset_map import OffsetMap
from storage_node.log.cleaner.planner import (
    CleanablePart,
    SegmentFacts,
    cleanable_part,
    group_segments,
)
from storage_node.log.cleaner.swap import STEP_CHECKPOINTED, STEP_CLEANED_WRITTEN
from storage_node.log.cleaner.throttle import Throttler
from storage_node.log.partition_log import PartitionLog
from storage_node.log.segment import Segment

log = logging.getLogger(__name__)

#: Per partition directory: where the last round's offset map ended (Kafka keeps one such file
#: per log dir; one per partition keeps a partition directory self-contained, as the other
#: checkpoints here are). Written before the first swap of a partition's first round, so a log
#: holding cleaned segments always has it (the loader then accepts offset gaps).
CLEANER_CHECKPOINT_FILE = files.CLEANER_CHECKPOINT_FILE


def _no_fault(step: str) -> None:
    return None


@dataclass
class CleanResult:
    """What one round did to one partition."""

    topic: str
    partition: int
    first_dirty: int
    map_end: int
    dirty_ratio: float
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    segments_before: int = 0
    segments_after: int = 0
    duration_s: float = 0.0
    #: False when a swap was refused because the log changed under the round.
    completed: bool = True
    groups: list[int] = field(default_factory=list)


def segment_facts(segment: Segment) -> SegmentFacts:
    return SegmentFacts(
        segment.base_offset,
        segment.next_offset,
        segment.size,
        segment.largest_timestamp,
        segment.first_batch_timestamp,
    )


def read_checkpoint(partition_log: PartitionLog) -> int | None:
    return checkpoint.read_offset_checkpoint(
        partition_log.directory / CLEANER_CHECKPOINT_FILE, partition_log.topic, partition_log.partition
    )


def write_checkpoint(partition_log: PartitionLog, offset: int) -> None:
    checkpoint.write_offset_checkpoint(
        partition_log.directory / CLEANER_CHECKPOINT_FILE,
        partition_log.topic,
        partition_log.partition,
        offset,
    )


def plan(partition_log: PartitionLog, now_ms: int) -> CleanablePart:
    """The partition's clean / dirty / uncleanable split as of now."""
    config = partition_log.config
    return cleanable_part(
        [segment_facts(s) for s in partition_log.segments],
        log_start_offset=partition_log.log_start_offset,
        checkpoint=read_checkpoint(partition_log),
        last_stable_offset=partition_log.last_stable_offset,
        now_ms=now_ms,
        min_compaction_lag_ms=config.min_compaction_lag_ms,
    )


class _ReadBatches:
    """Whole batches of a segment, counted against the throttle (as are the bytes written)."""

    def __init__(self, throttler: Throttler | None, result: CleanResult) -> None:
        self._throttler = throttler
        self._result = result

    def __call__(self, segment: Segment) -> Iterator[tuple[int, RecordBatchView]]:
        """Each batch, its CRC checked: a rewritten batch gets a new CRC, so a corrupt one must
        never be rewritten (that would launder the corruption); the round fails instead."""
        for position, data in segment.log.batches(0):
            if position >= segment.size:
                return
            self._result.bytes_read += len(data)
            if self._throttler is not None:
                self._throttler.maybe_throttle(len(data))
            view = RecordBatchView(data)
            view.validate()
            yield position, view

    def count_written(self, size: int) -> None:
        if self._throttler is not None:
            self._throttler.maybe_throttle(size)


def clean_partition(
    partition_log: PartitionLog,
    *,
    map_memory_bytes: int,
    now_ms: int,
    throttler: Throttler | None = None,
    on_step: Callable[[str], None] = _no_fault,
    part: CleanablePart | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> CleanResult | None:
    """One cleaning round of ``partition_log`` (module docstring); None if nothing is cleanable.

    Runs on a cleaner thread; appends and reads continue meanwhile. ``should_stop`` is asked
    before each segment group: a stopping node ends the round there (``completed`` False; the
    groups already swapped in stay, the next round redoes the rest).
    """
    started = time.monotonic()
    part = part or plan(partition_log, now_ms)
    if part.dirty_bytes <= 0:
        return None
    segments = list(partition_log.segments)
    result = CleanResult(
        partition_log.topic, partition_log.partition, part.first_dirty, part.first_dirty, part.dirty_ratio
    )
    read_batches = _ReadBatches(throttler, result)
    dirty = [
        s for s in segments if s.next_offset > part.first_dirty and s.next_offset <= part.first_uncleanable
    ]
    offset_map = OffsetMap(map_memory_bytes)
    result.map_end = _build_offset_map(partition_log, dirty, part, offset_map, read_batches)
    if result.map_end <= part.first_dirty:
        return None
    to_clean = [
        s for s in segments if s.next_offset <= part.first_uncleanable and s.base_offset < result.map_end
    ]
    result.segments_before = len(to_clean)
    if read_checkpoint(partition_log) is None:
        write_checkpoint(partition_log, part.first_dirty)  # before any gap exists: CLEANER_CHECKPOINT_FILE
    keep_last = partition_log.producer_last_offsets()
    config = partition_log.config
    by_base = {s.base_offset: s for s in to_clean}
    for group in group_segments([segment_facts(s) for s in to_clean], max_bytes=config.segment_bytes):
        if should_stop():
            result.completed = False
            break
        old = [by_base[facts.base_offset] for facts in group]
        cleaned = _write_cleaned_segment(
            partition_log, old, offset_map, result, keep_last, now_ms, read_batches
        )
        on_step(STEP_CLEANED_WRITTEN)
        try:
            replaced = partition_log.replace_segments(old, cleaned, on_step)
        except BaseException:
            if not cleaned.log.path.name.endswith(files.LOG_FILE_SUFFIX):
                cleaned.close()  # not live: the loader finishes or discards what is on disk
            raise
        if not replaced:
            log.info("Cleaning of %s stopped: its segments changed during the round", partition_log.name)
            _discard(cleaned)
            result.completed = False
            break
        result.bytes_written += cleaned.size
        result.segments_after += 1
        result.groups.append(cleaned.base_offset)
    if result.completed:
        write_checkpoint(partition_log, result.map_end)
        on_step(STEP_CHECKPOINTED)
    result.duration_s = time.monotonic() - started
    log.info(
        "Cleaned %s up to offset %d: %d -> %d bytes in %d -> %d segments, %d records and %d tombstones "
        "removed, %.3f s",
        partition_log.name,
        result.map_end,
        result.bytes_read,
        result.bytes_written,
        result.segments_before,
        result.segments_after,
        result.records_removed,
        result.tombstones_removed,
        result.duration_s,
    )
    return result


def _aborted_filter(partition_log: PartitionLog, first: int, upper: int) -> AbortedTransactionFilter:
    aborted = partition_log.aborted_transactions(first, upper)
    return AbortedTransactionFilter((txn.producer_id, txn.first_offset) for txn in aborted)


def _build_offset_map(
    partition_log: PartitionLog,
    dirty: list[Segment],
    part: CleanablePart,
    offset_map: OffsetMap,
    read_batches: _ReadBatches,
) -> int:
    """Fill ``offset_map`` from the dirty segments; return the map's end offset."""
    if not dirty:
        return part.first_dirty
    aborted = _aborted_filter(partition_log, dirty[0].base_offset, part.first_uncleanable)
    for segment in dirty:
        for _, view in read_batches(segment):
            if aborted.drops(view) or view.last_offset < part.first_dirty:
                continue
            for record in view.records():
                if record.offset < part.first_dirty or record.key is None:
                    continue
                if not offset_map.put(record.key, record.offset):
                    return record.offset  # full: this round stops before the first key left out
    return dirty[-1].next_offset


def _write_cleaned_segment(
    partition_log: PartitionLog,
    old: list[Segment],
    offset_map: OffsetMap,
    result: CleanResult,
    keep_last: frozenset[int],
    now_ms: int,
    read_batches: _ReadBatches,
) -> Segment:
    config = partition_log.config
    directory = partition_log.directory
    base = old[0].base_offset
    for suffix_path in (
        files.log_file(directory, base, files.CLEANED_FILE_SUFFIX),
        files.offset_index_file(directory, base, files.CLEANED_FILE_SUFFIX),
        files.time_index_file(directory, base, files.CLEANED_FILE_SUFFIX),
    ):
        suffix_path.unlink(missing_ok=True)  # left by a round that failed in this process
    cleaned = Segment.open(
        directory,
        base,
        config,
        partition_log.clock,
        file_suffix=files.CLEANED_FILE_SUFFIX,
        handle_cache=partition_log.handle_cache,  # once swapped in, it counts like any segment
    )
    map_end = result.map_end
    delete_horizon = now_ms - config.delete_retention_ms
    aborted = _aborted_filter(partition_log, base, old[-1].next_offset)
    try:
        for segment in old:
            tombstones_expired = segment.largest_timestamp < delete_horizon

            def keep(
                offset: int,
                key: bytes | None,
                is_tombstone: bool,
                tombstones_expired: bool = tombstones_expired,
            ) -> bool:
                if key is None:
                    return True
                if offset < offset_map.get(key):
                    return False
                if is_tombstone and tombstones_expired and offset < map_end:
                    result.tombstones_removed += 1
                    return False
                return True

            for _, view in read_batches(segment):
                data = view.buffer
                keep_empty = view.producer_id >= 0 and view.last_offset in keep_last
                if view.is_control:
                    aborted.drops(view)
                    filtered_data: bytes | None = bytes(data)
                elif aborted.drops(view):
                    filtered = filter_batch(data, _drop_all, keep_empty=keep_empty)
                    result.records_removed += filtered.records_removed
                    filtered_data = filtered.data
                else:
                    filtered = filter_batch(data, keep, keep_empty=keep_empty)
                    result.records_removed += filtered.records_removed
                    filtered_data = filtered.data
                if filtered_data is not None:
                    cleaned.append(filtered_data, view.base_offset, view.last_offset, view.max_timestamp)
                    read_batches.count_written(len(filtered_data))
        cleaned.on_become_inactive()
        cleaned.flush()
    except BaseException:
        _discard(cleaned)
        raise
    return cleaned


def _drop_all(offset: int, key: bytes | None, is_tombstone: bool) -> bool:
    return False


def _discard(cleaned: Segment) -> None:
    """Remove a cleaned segment that will not be swapped in (its ``.cleaned`` files)."""
    cleaned.close()
    for path in (cleaned.log.path, cleaned.offset_index.path, cleaned.time_index.path):
        path.unlink(missing_ok=True)
