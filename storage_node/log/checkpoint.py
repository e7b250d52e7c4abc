"""Offset checkpoint files: per partition (``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint``) and per log dir (``replication-offset-checkpoint``, the high
watermarks).

File format: Kafka's ``OffsetCheckpointFile`` text layout -- with one entry in a partition's own
directory, with one per partition of the log dir in a log dir's::

    0                     version
    1                     number of entries
    <topic> <partition> <offset>

Crash behaviour: written to ``<name>.tmp``, fsynced, renamed over the real name, and the
directory fsynced, so a reader sees either the old or the new file, never a torn one. A file that
still fails to parse (disk corruption) is reported as missing with a warning; callers then fall
back to the safe default (recovery point 0 = recover everything).

Thread safety: a checkpoint file has one writer (a partition's by its flush path, serialised by
its flush lock; a log dir's by the log manager's periodic tick and its close).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from storage_node.log.files import TEMP_FILE_SUFFIX

log = logging.getLogger(__name__)

_VERSION = 0


def fsync_dir(directory: Path) -> None:
    """fsync a directory so renames and new files in it survive a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    ``durable=False`` skips both fsyncs: for content whose loss costs nothing (a crash may then
    leave the old content, or none), written only so a full disk fails the call now."""
    tmp = path.with_name(path.name + TEMP_FILE_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. ENOSPC: leave no half-written file behind
        raise
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def write_offset_checkpoint(
    path: Path, topic: str, partition: int, offset: int, *, durable: bool = True
) -> None:
    write_atomically(path, f"{_VERSION}\n1\n{topic} {partition} {offset}\n".encode(), durable=durable)


def write_offsets_checkpoint(path: Path, entries: Iterable[tuple[str, int, int]]) -> None:
    """A checkpoint of many partitions' offsets: ``entries`` are (topic, partition, offset)."""
    lines = [f"{topic} {partition} {offset}" for topic, partition, offset in entries]
    write_atomically(path, "\n".join([str(_VERSION), str(len(lines)), *lines, ""]).encode())


def read_offsets_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Every (topic, partition) -> offset in a many-partition checkpoint; empty (with a warning
    unless the file is missing) when it is missing, unreadable or malformed."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("Ignoring unreadable checkpoint %s: %s", path, exc)
        return {}
    lines = text.split("\n")
    offsets: dict[tuple[str, int], int] = {}
    try:
        if int(lines[0]) != _VERSION:
            raise ValueError(f"unexpected version {lines[0]!r}")
        count = int(lines[1])
        for line in lines[2 : 2 + count]:
            topic, partition, offset = line.split(" ")
            if int(offset) < 0 or int(partition) < 0:
                raise ValueError(f"entry {line!r} is negative")
            offsets[(topic, int(partition))] = int(offset)
        if len(offsets) != count:
            raise ValueError(f"{len(offsets)} distinct entries, {count} announced")
    except (ValueError, IndexError) as exc:
        log.warning("Ignoring malformed checkpoint %s: %s", path, exc)
        return {}
    return offsets


def read_offset_checkpoint(path: Path, topic: str, partition: int) -> int | None:
    """The checkpointed offset, or None if the file is missing, malformed or for another partition."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("Ignoring unreadable checkpoint %s: %s", path, exc)
        return None
    lines = text.split("\n")
    try:
        if int(lines[0]) != _VERSION or int(lines[1]) != 1:
            raise ValueError(f"unexpected header {lines[:2]}")
        name, part, offset = lines[2].split(" ")
        if name != topic or int(part) != partition or int(offset) < 0:
            raise ValueError(f"entry {lines[2]!r} is not for {topic}-{partition}")
        return int(offset)
    except (ValueError, IndexError) as exc:
        log.warning("Ignoring malformed checkpoint %s: %s", path, exc)
        return None
