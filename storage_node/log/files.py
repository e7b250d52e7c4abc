"""File-name rules for a partition's directory: suffixes, zero-padded offsets, directory names.

A partition lives in ``<log dir>/<topic>-<partition>/``. Each segment is a set of files sharing
one stem, the segment's base offset zero-padded to 20 digits (so ``ls`` order is offset order and
any int64 offset fits)::

    00000000000000000000.log          the record batches, byte for byte as the producer sent them
    00000000000000000000.index        sparse offset -> file position index
    00000000000000000000.timeindex    sparse max timestamp -> offset index

Intermediate states of multi-step file operations are named by an extra suffix, so a crash at
any point leaves a name the loader knows how to resolve (see ``loader.py``):

* ``.deleted`` -- a segment file being deleted: the rename is the commit point, removal follows.
* ``.cleaned`` -- output of an interrupted compaction; never complete, always discarded.
* ``.swap``    -- a complete replacement for one or more segments, waiting to be renamed in.
* ``.tmp``     -- a checkpoint being written; the rename over the real name is the commit point.

Checkpoint files and the clean-shutdown marker sit beside the segments in the partition
directory (one of each per partition, unlike Kafka's per-log-dir files, so a partition directory
is self-contained), except the high watermarks: they move with every acknowledged append, and
one file per partition rewritten every second cost a node two fsyncs per busy partition per
second (a node with 3,333 busy partitions never caught up), so they are one file per log dir,
as Kafka keeps them (``replication-offset-checkpoint``). Losing an entry is safe: the high
watermark then starts at the log start and the leader moves it on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeAlias

# Names for what an int means in a signature (aliases, not NewTypes: offsets and positions are
# computed with plain arithmetic everywhere, and wrapping each result would say nothing more).
#: A logical record offset (0, 1, 2, ...), never a byte position.
Offset: TypeAlias = int
#: A byte position inside one segment's ``.log`` file.
FilePosition: TypeAlias = int

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
DELETED_FILE_SUFFIX = ".deleted"
CLEANED_FILE_SUFFIX = ".cleaned"
SWAP_FILE_SUFFIX = ".swap"
TEMP_FILE_SUFFIX = ".tmp"

#: The suffixes of one segment's files, in the order they are created.
SEGMENT_FILE_SUFFIXES = (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)

RECOVERY_POINT_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE = "log-start-offset-checkpoint"
#: The high watermarks as last checkpointed (Kafka's replication-offset-checkpoint): one file per
#: log dir; a file of this name in a partition directory is the old per-partition layout, read
#: only for a partition the log dir's file does not name.
HIGH_WATERMARK_CHECKPOINT_FILE = "replication-offset-checkpoint"
#: Where the log cleaner's last round ended; its presence also says the log holds compacted
#: segments, whose offsets may skip (Kafka keeps one per log dir, ``cleaner-offset-checkpoint``).
CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
#: Present only between a clean ``close()`` and the next open; its absence means "recover".
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"

_OFFSET_DIGITS = 20
_STEM_RE = re.compile(r"^(\d{20})(\.[a-z]+)(\.[a-z]+)?$")
# Kafka's legal topic characters; the partition is the digits after the LAST dash, because topic
# names may themselves contain dashes.
_PARTITION_DIR_RE = re.compile(r"^([a-zA-Z0-9._-]+)-(\d+)$")
#: NAME_MAX of every common Linux filesystem; Kafka caps topic names at 249 for the same reason.
MAX_DIR_NAME_BYTES = 255


def filename_prefix_from_offset(offset: int) -> str:
    """``42`` -> ``"00000000000000000042"``."""
    if offset < 0:
        raise ValueError(f"segment base offset must be >= 0, got {offset}")
    return f"{offset:0{_OFFSET_DIGITS}d}"


def log_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{LOG_FILE_SUFFIX}{suffix}"


def offset_index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{INDEX_FILE_SUFFIX}{suffix}"


def time_index_file(directory: Path, base_offset: int, suffix: str = "") -> Path:
    return directory / f"{filename_prefix_from_offset(base_offset)}{TIME_INDEX_FILE_SUFFIX}{suffix}"


def offset_from_file_name(name: str) -> int:
    """The base offset a segment file name encodes (``00..42.log.swap`` -> 42).

    Raises ValueError for a name that is not a segment file.
    """
    match = _STEM_RE.match(name)
    if match is None:
        raise ValueError(f"not a segment file name: {name!r}")
    return int(match.group(1))


def parse_segment_file_name(name: str) -> tuple[int, str, str] | None:
    """``(base_offset, kind suffix, state suffix or "")`` for a segment file, else None.

    ``"00000000000000000042.index.deleted"`` -> ``(42, ".index", ".deleted")``.
    """
    match = _STEM_RE.match(name)
    if match is None or match.group(2) not in SEGMENT_FILE_SUFFIXES:
        return None
    state = match.group(3) or ""
    if state and state not in (DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX):
        return None
    return int(match.group(1)), match.group(2), state


def partition_dir_name(topic: str, partition: int) -> str:
    """``("orders", 3)`` -> ``"orders-3"``."""
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    if not topic or not _PARTITION_DIR_RE.match(f"{topic}-0") or topic in (".", ".."):
        raise ValueError(f"illegal topic name for a directory: {topic!r}")
    name = f"{topic}-{partition}"
    if len(name) > MAX_DIR_NAME_BYTES:  # ASCII only (the pattern above): characters are bytes
        raise ValueError(f"topic name too long for a directory: {len(name)} > {MAX_DIR_NAME_BYTES} bytes")
    return name


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``"orders-3"`` -> ``("orders", 3)``; None for anything that is not a partition dir.

    The partition number is taken after the last dash, so ``"my-topic-12"`` -> ``("my-topic", 12)``.
    """
    match = _PARTITION_DIR_RE.match(name)
    if match is None or match.group(1) in (".", ".."):
        return None
    return match.group(1), int(match.group(2))
