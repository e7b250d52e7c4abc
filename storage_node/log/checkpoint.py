"""Offset checkpoint files (``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``).

File format: Kafka's ``OffsetCheckpointFile`` text layout, with one entry because the file lives
in the partition's own directory::

    0                     version
    1                     number of entries
    <topic> <partition> <offset>

Crash behaviour: written to ``<name>.tmp``, fsynced, renamed over the real name, and the
directory fsynced, so a reader sees either the old or the new file, never a torn one. A file that
still fails to parse (disk corruption) is reported as missing with a warning; callers then fall
back to the safe default (recovery point 0 = recover everything).

Thread safety: a checkpoint file has one writer (the partition's flush path, serialised by its
flush lock).
"""

from __future__ import annotations

import logging
import os
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
