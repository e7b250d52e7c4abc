"""Swapping a cleaned segment in for the segments it was made from, crash-safe at every step
(Kafka's ``LocalLog.replaceSegments``).

File states, in order, and what the loader (``storage_node.log.loader``) does with each after
a crash:

====  ===============================================  =========================================
step  on disk                                          at the next start
====  ===============================================  =========================================
1     old segments live, ``<base>.*.cleaned`` written  ``.cleaned`` deleted: the old log stays
2     ``.cleaned`` renamed to ``.swap`` one file at a  a ``.swap`` with a ``.cleaned`` beside it
      time, the ``.log`` first                         is an unfinished round: deleted
3     all three ``.swap`` (the commit point)           the swap is completed: the live segments
                                                       it covers are deleted, it is renamed in
4     old segments renamed ``.deleted``, then removed  ``.deleted`` removed, swap completed
5     ``.swap`` renamed to the live names              a live segment; an index still ``.swap``
                                                       is deleted and rebuilt from the log
====  ===============================================  =========================================

The swap covers ``[base, next offset)`` of the cleaned segment; an old segment above that whose
records were all removed is left live by a recovery at step 3 or 4 -- it still holds exactly the
records it held, so nothing is lost or duplicated, only a little less is cleaned. The in-memory
segment list changes in one copy-on-write step (``Segments.replace``) after the commit point, so
a reader sees either the old segments or the cleaned one; a reader still holding an old segment
gets ``SegmentFileGoneError`` once it is deleted and reads again (``PartitionLog.read`` retries).

``on_step(name)`` is called after each step, for fault-injection tests (a crash there is what
the step names); production passes a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from storage_node.log import checkpoint, files
from storage_node.log.segment import Segment
from storage_node.log.segments import Segments

log = logging.getLogger(__name__)

#: The fault points, in the order the protocol passes them.
STEP_CLEANED_WRITTEN = "cleaned-written"
STEP_SWAP_LOG_RENAMED = "swap-log-renamed"
STEP_SWAP_RENAMED = "swap-renamed"
STEP_OLD_SEGMENT_DELETED = "old-segment-deleted"
STEP_SWAP_LIVE = "swap-live"
STEP_CHECKPOINTED = "checkpointed"
STEPS = (
    STEP_CLEANED_WRITTEN,
    STEP_SWAP_LOG_RENAMED,
    STEP_SWAP_RENAMED,
    STEP_OLD_SEGMENT_DELETED,
    STEP_SWAP_LIVE,
    STEP_CHECKPOINTED,
)


def swap_in_cleaned_segment(
    directory: Path, segments: Segments, old: list[Segment], cleaned: Segment, on_step: Callable[[str], None]
) -> None:
    """Steps 2 to 5 for ``cleaned`` (already written and flushed as ``.cleaned`` files) and the
    ``old`` segments; the caller holds the partition lock and has checked ``old`` is live."""
    base = cleaned.base_offset
    cleaned.log.rename_to(files.log_file(directory, base, files.SWAP_FILE_SUFFIX))
    on_step(STEP_SWAP_LOG_RENAMED)
    cleaned.offset_index.rename_to(files.offset_index_file(directory, base, files.SWAP_FILE_SUFFIX))
    cleaned.time_index.rename_to(files.time_index_file(directory, base, files.SWAP_FILE_SUFFIX))
    checkpoint.fsync_dir(directory)
    on_step(STEP_SWAP_RENAMED)
    segments.replace(old, cleaned)
    for segment in old:
        segment.delete()
        on_step(STEP_OLD_SEGMENT_DELETED)
    cleaned.change_file_suffixes("")
    checkpoint.fsync_dir(directory)
    log.info(
        "Swapped cleaned segment %d (%d bytes) in for %d segments of %s",
        base,
        cleaned.size,
        len(old),
        directory.name,
    )
    on_step(STEP_SWAP_LIVE)
