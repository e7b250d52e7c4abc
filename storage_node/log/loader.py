"""Startup recovery of one partition directory, in numbered passes (Kafka's ``LogLoader``).

1. Remove what an interrupted operation left half-done: ``.tmp`` checkpoints, ``.deleted``
   segment files (a delete whose rename had committed), ``.cleaned`` files (an unfinished
   compaction), index ``.swap`` files (indexes are always rebuilt), and any ``.swap`` at or above
   the lowest ``.cleaned`` offset (its compaction round never finished).
2. Complete every remaining ``.log.swap``: it is a finished replacement, so delete the live
   segments it covers and rename it in (rebuilding its indexes).
3. Open every ``.log`` as a segment; delete orphaned index files. Segments that will not be
   recovered in pass 4 are sanity-checked, and one whose indexes are missing or corrupt is
   recovered (indexes rebuilt) now.
4. Unless the clean-shutdown marker is present, recover every segment from the one holding the
   last flushed offset (the recovery point - 1) onward: validate batch by batch, truncate at the
   first bad batch, and delete all later segments (the log must stay contiguous). Then make sure
   one segment exists and that the log start offset is not past the log end.
5. Bring the leader-epoch cache in line with the recovered log: forget epochs past its end,
   learn the epochs of the batches pass 4 recovered (or of every batch when the checkpoint was
   never written), and clamp the high watermark checkpoint to the log.
6. Producer state and aborted transactions: load the newest producer-state snapshot at or below
   the log end and replay the batches after it (``producer_replay.py``), rebuilding the
   aborted-transaction index for that range; snapshots past the log end are deleted.

Every decision is logged with the file and byte offset concerned.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from services.clock import Clock
from storage_node.log import checkpoint, files
from storage_node.log.config import LogConfig
from storage_node.log.file_records import FileHandleCache
from storage_node.log.index import CorruptIndexError
from storage_node.log.leader_epochs import LEADER_EPOCH_CHECKPOINT_FILE, LeaderEpochCache, read_checkpoint
from storage_node.log.producer_replay import replay_segments
from storage_node.log.producer_state import ProducerStateManager
from storage_node.log.segment import Segment
from storage_node.log.transaction_index import AbortedTransactions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedLog:
    """What loading a partition directory found, ready for ``PartitionLog``."""

    segments: list[Segment]
    log_start_offset: int
    recovery_point: int
    next_offset: int
    had_clean_shutdown: bool
    truncated_bytes: int
    leader_epochs: LeaderEpochCache
    high_watermark: int
    producers: ProducerStateManager
    aborted: AbortedTransactions


@dataclass
class _Context:
    directory: Path
    config: LogConfig
    clock: Clock
    handle_cache: FileHandleCache | None

    def open_segment(self, base_offset: int, suffix: str = "") -> Segment:
        segment = Segment.open(
            self.directory,
            base_offset,
            self.config,
            self.clock,
            file_suffix=suffix,
            handle_cache=self.handle_cache,
        )
        # A log the cleaner has compacted keeps its offset gaps even if it is no longer compacted.
        segment.allows_offset_gaps |= (self.directory / files.CLEANER_CHECKPOINT_FILE).exists()
        return segment


def load_log(
    directory: Path,
    topic: str,
    partition: int,
    config: LogConfig,
    clock: Clock,
    *,
    handle_cache: FileHandleCache | None = None,
    high_watermark: int | None = None,
) -> LoadedLog:
    """Recover ``directory`` and return its segments and offsets. The caller owns the segments.

    ``high_watermark``: the checkpointed one (the log dir's checkpoint); None reads the
    partition directory's own (the layout before log-dir checkpoints), else 0."""
    ctx = _Context(directory, config, clock, handle_cache)
    had_clean_shutdown = (directory / files.CLEAN_SHUTDOWN_FILE).exists()
    recovery_point = (
        checkpoint.read_offset_checkpoint(directory / files.RECOVERY_POINT_CHECKPOINT_FILE, topic, partition)
        or 0
    )
    log_start_checkpoint = (
        checkpoint.read_offset_checkpoint(
            directory / files.LOG_START_OFFSET_CHECKPOINT_FILE, topic, partition
        )
        or 0
    )

    swaps = _first_pass_remove_temporary_files(directory)
    _second_pass_complete_swaps(ctx, swaps)
    segments = _third_pass_load_segments(ctx, recovery_point, had_clean_shutdown)
    try:
        truncated = 0
        if not had_clean_shutdown:
            segments, truncated = _fourth_pass_recover(ctx, segments, recovery_point)
        segments = _ensure_log_start_not_past_end(ctx, segments, log_start_checkpoint)
    except BaseException:
        close_segments(segments)  # a failed load (a full disk) must not keep file handles
        raise

    next_offset = segments[-1].next_offset
    log_start_offset = max(log_start_checkpoint, segments[0].base_offset)
    epochs = _fifth_pass_leader_epochs(ctx, segments, recovery_point, had_clean_shutdown, log_start_offset)
    if high_watermark is None:
        high_watermark = checkpoint.read_offset_checkpoint(
            directory / files.HIGH_WATERMARK_CHECKPOINT_FILE, topic, partition
        )
    high_watermark = min(max(high_watermark or 0, log_start_offset), next_offset)
    producers, aborted = _sixth_pass_producer_state(ctx, segments, next_offset, topic, partition)
    # Only a flush moves the recovery point forward (Kafka's rule): after an unclean shutdown the
    # recovered tail may still be only in the page cache.
    recovery_point = next_offset if had_clean_shutdown else min(recovery_point, next_offset)
    return LoadedLog(
        segments,
        log_start_offset,
        recovery_point,
        next_offset,
        had_clean_shutdown,
        truncated,
        epochs,
        high_watermark,
        producers,
        aborted,
    )


def _sixth_pass_producer_state(
    ctx: _Context, segments: list[Segment], next_offset: int, topic: str, partition: int
) -> tuple[ProducerStateManager, AbortedTransactions]:
    producers = ProducerStateManager(
        ctx.directory, files.partition_dir_name(topic, partition), log_append_time=ctx.config.log_append_time
    )
    producers.delete_snapshots(above=next_offset)
    start = producers.load(next_offset)
    aborted = AbortedTransactions.load(ctx.directory)
    aborted.truncate_from(next_offset)
    replayed = replay_segments(segments, producers, aborted, start)
    if replayed:
        log.info(
            "Rebuilt the producer state of %s from offset %d (%d batches)", ctx.directory, start, replayed
        )
    return producers, aborted


def _fifth_pass_leader_epochs(
    ctx: _Context, segments: list[Segment], recovery_point: int, had_clean_shutdown: bool, log_start: int
) -> LeaderEpochCache:
    """The leader-epoch cache as the recovered log says it must be (Kafka assigns the epoch of
    every batch it recovers). A log without a readable checkpoint (written before epochs were
    kept, or never flushed) is scanned whole: headers only."""
    path = ctx.directory / LEADER_EPOCH_CHECKPOINT_FILE
    stored = read_checkpoint(path)
    epochs = LeaderEpochCache(path, stored or ())
    next_offset = segments[-1].next_offset
    epochs.truncate_from_end(next_offset)
    if stored is None:  # never written (or torn by a crash): nothing is known
        scan_from = 0
    elif had_clean_shutdown:
        scan_from = next_offset
    else:
        scan_from = max((s.base_offset for s in segments if s.base_offset <= recovery_point), default=0)
    for segment in segments:
        if segment.next_offset <= scan_from:
            continue
        for _, header in segment.log.batch_headers():
            if header.partition_leader_epoch >= 0:
                epochs.assign(header.partition_leader_epoch, header.base_offset)
    epochs.truncate_from_start(log_start)
    return epochs


def _first_pass_remove_temporary_files(directory: Path) -> list[int]:
    """Delete leftovers of interrupted operations; return the base offsets of ``.log.swap`` files."""
    swaps: list[int] = []
    cleaned: list[int] = []
    for path in sorted(directory.iterdir()):
        if path.name.endswith(files.TEMP_FILE_SUFFIX):
            log.info("Deleting temporary file %s", path)
            path.unlink()
            continue
        parsed = files.parse_segment_file_name(path.name)
        if parsed is None:
            continue
        base_offset, kind, state = parsed
        if state in (files.DELETED_FILE_SUFFIX, files.CLEANED_FILE_SUFFIX):
            log.info(
                "Deleting %s left by an interrupted %s",
                path,
                "delete" if state == files.DELETED_FILE_SUFFIX else "compaction",
            )
            path.unlink()
            if state == files.CLEANED_FILE_SUFFIX:
                cleaned.append(base_offset)
        elif state == files.SWAP_FILE_SUFFIX:
            if kind == files.LOG_FILE_SUFFIX:
                swaps.append(base_offset)
            else:
                path.unlink()  # an index swap: indexes are rebuilt from the log swap
    if cleaned:
        lowest = min(cleaned)
        for base_offset in [b for b in swaps if b >= lowest]:
            path = files.log_file(directory, base_offset, files.SWAP_FILE_SUFFIX)
            log.info("Deleting %s: its compaction round never finished", path)
            path.unlink()
            swaps.remove(base_offset)
    return swaps


def _second_pass_complete_swaps(ctx: _Context, swaps: list[int]) -> None:
    for base_offset in swaps:
        swap = ctx.open_segment(base_offset, files.SWAP_FILE_SUFFIX)
        try:
            _complete_swap(ctx, swap)
        finally:
            swap.close()
        checkpoint.fsync_dir(ctx.directory)


def _complete_swap(ctx: _Context, swap: Segment) -> None:
    base_offset = swap.base_offset
    swap.recover()
    next_offset = swap.next_offset
    for path in ctx.directory.iterdir():
        parsed = files.parse_segment_file_name(path.name)
        if parsed and parsed[2] == "" and base_offset <= parsed[0] < max(next_offset, base_offset + 1):
            log.info("Deleting %s, replaced by swap segment %d", path, base_offset)
            path.unlink()
    swap.change_file_suffixes("")


def _third_pass_load_segments(ctx: _Context, recovery_point: int, had_clean_shutdown: bool) -> list[Segment]:
    bases: list[int] = []
    for path in ctx.directory.iterdir():
        parsed = files.parse_segment_file_name(path.name)
        if parsed is None or parsed[2]:
            continue
        base_offset, kind, _ = parsed
        if kind == files.LOG_FILE_SUFFIX:
            bases.append(base_offset)
        elif not files.log_file(ctx.directory, base_offset).exists():
            log.warning("Deleting orphaned index file %s with no log file", path)
            path.unlink()
    bases.sort()
    first_unflushed = first_recovered_base(bases, recovery_point)
    segments: list[Segment] = []
    try:
        for base_offset in bases:
            segment = ctx.open_segment(base_offset)
            segments.append(segment)
            if had_clean_shutdown or base_offset < first_unflushed:
                _sanity_check_or_recover(segment)
    except BaseException:
        close_segments(segments)
        raise
    return segments


def first_recovered_base(bases: list[int], recovery_point: int) -> int:
    """The base offset of the first segment an unclean open recovers (sorted ``bases``): the one
    holding the last flushed offset, ``recovery_point - 1``, not the one holding the recovery
    point. A flush leaves the indexes of the segment it ends in unsynced (``PartitionLog.flush``:
    rebuilding them here is cheaper than two more fsyncs per partition and flush), and a segment
    rolled later may start exactly at the recovery point; only segments wholly before the
    recovered one are trusted to have durable indexes (they are sanity-checked only)."""
    last_flushed = recovery_point - 1
    return max((b for b in bases if b <= last_flushed), default=bases[0] if bases else 0)


def close_segments(segments: list[Segment]) -> None:
    """Release the file handles of segments a failed open leaves behind (nothing is written)."""
    for segment in segments:
        try:
            segment.close()
        except OSError as exc:
            log.warning("Closing %s after a failed open failed: %s", segment.log.path, exc)


def _sanity_check_or_recover(segment: Segment) -> None:
    try:
        segment.sanity_check()
    except CorruptIndexError as exc:
        log.warning("Rebuilding the indexes of %s: %s", segment.log.path, exc)
        truncated = segment.recover()
        if truncated:
            log.error("Flushed segment %s lost %d bytes to corruption", segment.log.path, truncated)


def _fourth_pass_recover(
    ctx: _Context, segments: list[Segment], recovery_point: int
) -> tuple[list[Segment], int]:
    first_base = first_recovered_base([s.base_offset for s in segments], recovery_point)
    first_unflushed = next((i for i, s in enumerate(segments) if s.base_offset >= first_base), len(segments))
    for i in range(first_unflushed, len(segments)):
        segment = segments[i]
        log.info("Recovering unflushed segment %s", segment.log.path)
        truncated = segment.recover()
        following = segments[i + 1] if i + 1 < len(segments) else None
        overlaps = following is not None and segment.next_offset > following.base_offset
        if truncated or overlaps:
            if following is not None:
                log.warning(
                    "Deleting %d segments after %s: the log ends at offset %d there",
                    len(segments) - i - 1,
                    segment.log.path,
                    segment.next_offset,
                )
            for later in segments[i + 1 :]:
                later.delete()
            return segments[: i + 1], truncated
        if following is not None and segment.next_offset < following.base_offset:
            log.warning(
                "Offsets %d..%d are missing between %s and the next segment",
                segment.next_offset,
                following.base_offset - 1,
                segment.log.path,
            )
    return segments, 0


def _ensure_log_start_not_past_end(ctx: _Context, segments: list[Segment], log_start: int) -> list[Segment]:
    if segments and segments[-1].next_offset < log_start:
        log.warning(
            "Deleting all segments of %s: log end offset %d is below the log start offset "
            "%d (segment files were lost)",
            ctx.directory,
            segments[-1].next_offset,
            log_start,
        )
        for segment in segments:
            segment.delete()
        segments = []
    if not segments:
        segments = [ctx.open_segment(log_start)]
    return segments


def remove_clean_shutdown_marker(directory: Path) -> None:
    """Delete the marker durably, so a crash from now on is recognised as unclean."""
    marker = directory / files.CLEAN_SHUTDOWN_FILE
    if marker.exists():
        os.unlink(marker)
        checkpoint.fsync_dir(directory)


def write_clean_shutdown_marker(directory: Path) -> None:
    """Record that every segment and checkpoint was flushed and closed. Without fsyncs: all it
    vouches for is on disk already, so a crash either keeps it (rightly) or loses it (the next
    open recovers, which is safe) -- two fsyncs per partition of a node's shutdown saved."""
    checkpoint.write_atomically(directory / files.CLEAN_SHUTDOWN_FILE, b"", durable=False)
