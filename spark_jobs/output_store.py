"""The loader's output directory: published Parquet, staged batches and offset manifests.

Layout (``_``-prefixed directories are skipped by Spark's and Hive's partition discovery, so
``spark.read.parquet(root)`` sees only published data)::

    <root>/date=YYYY-MM-DD/hour=HH/part-*.parquet    published records
    <root>/_offsets/00000007.json                     manifest of batch 7: offset ranges, files
    <root>/_staging/batch-00000007/date=.../hour=.../  batch 7 while it is written

A batch goes through three states; the manifest is the commit point:

1. *staged*: Spark wrote the batch under ``_staging/batch-N``. No manifest: if the loader dies
   now, the next run deletes the staging directory and loads the same offsets again.
2. *committed*: the files and their directories are fsynced, then ``_offsets/N.json`` is written
   to a temporary name, fsynced and renamed into place (atomic). It names every file of the batch
   and the offset range of every partition.
3. *published*: each file is renamed from staging into ``<root>``; renames within one file
   system are atomic, and a publish interrupted half-way is finished by the next run (files
   already moved are skipped). Then the staging directory is removed.

Each batch starts at the previous manifest's end offsets, so every offset is in exactly one
manifest, and each manifest's files are published exactly once: no duplicates, no gaps.

Local (POSIX) paths only: the commit protocol relies on ``rename`` and ``fsync``. Thread-safety:
one loader at a time per output directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.offsets import OffsetRange, Offsets

log = logging.getLogger("spark_jobs.loader")

OFFSETS_DIR = "_offsets"
STAGING_DIR = "_staging"
MANIFEST_VERSION = 1


class OutputCorruptError(RuntimeError):
    """A manifest names a file that is neither staged nor published."""


@dataclass(frozen=True)
class Manifest:
    """What one committed batch loaded: offset ranges of every partition and the files holding them."""

    batch_id: int
    ranges: tuple[OffsetRange, ...]
    files: tuple[str, ...]
    records: int
    created_ms: int
    #: Records per published directory (``date=.../hour=...``).
    by_directory: dict[str, int] = field(default_factory=dict)

    @property
    def end_offsets(self) -> Offsets:
        """Where the next batch starts, per partition."""
        return {r.topic_partition: r.until_offset for r in self.ranges}

    def to_json(self) -> dict:
        return {
            "version": MANIFEST_VERSION,
            "batch_id": self.batch_id,
            "offsets": _ranges_to_json(self.ranges),
            "records": self.records,
            "files": list(self.files),
            "by_directory": self.by_directory,
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        return cls(
            batch_id=int(data["batch_id"]),
            ranges=_ranges_from_json(data["offsets"]),
            files=tuple(data["files"]),
            records=int(data["records"]),
            created_ms=int(data["created_ms"]),
            by_directory=dict(data.get("by_directory", {})),
        )


def _ranges_to_json(ranges) -> dict:
    result: dict = {}
    for r in sorted(ranges):
        result.setdefault(r.topic, {})[str(r.partition)] = [r.from_offset, r.until_offset]
    return result


def _ranges_from_json(data: dict) -> tuple[OffsetRange, ...]:
    return tuple(
        sorted(
            OffsetRange(topic, int(p), int(bounds[0]), int(bounds[1]))
            for topic, parts in data.items()
            for p, bounds in parts.items()
        )
    )


class OutputStore:
    """One loader output directory (see the module docstring for the layout and protocol)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.offsets_dir = self.root / OFFSETS_DIR
        self.staging_root = self.root / STAGING_DIR

    # -- manifests ----------------------------------------------------------------------------

    def manifest_path(self, batch_id: int) -> Path:
        return self.offsets_dir / f"{batch_id:08d}.json"

    def manifests(self) -> list[Manifest]:
        """Every committed batch, oldest first."""
        if not self.offsets_dir.is_dir():
            return []
        paths = sorted(p for p in self.offsets_dir.glob("*.json") if p.stem.isdigit())
        return [Manifest.from_json(json.loads(p.read_text())) for p in paths]

    def last_manifest(self) -> Manifest | None:
        manifests = self.manifests()
        return manifests[-1] if manifests else None

    def committed_offsets(self) -> Offsets:
        """Per partition, where the next batch starts: the end of the last batch that read it."""
        offsets: Offsets = {}
        for manifest in self.manifests():
            offsets.update(manifest.end_offsets)
        return offsets

    def next_batch_id(self) -> int:
        last = self.last_manifest()
        return 0 if last is None else last.batch_id + 1

    # -- staging ------------------------------------------------------------------------------

    def staging_dir(self, batch_id: int) -> Path:
        return self.staging_root / f"batch-{batch_id:08d}"

    def staged_batches(self) -> list[int]:
        if not self.staging_root.is_dir():
            return []
        return sorted(
            int(p.name.split("-", 1)[1])
            for p in self.staging_root.glob("batch-*")
            if p.name.split("-", 1)[1].isdigit()
        )

    def staged_files(self, batch_id: int) -> list[str]:
        """Data files Spark wrote for a batch, relative to its staging directory.

        Not ``_SUCCESS`` nor the hidden ``.crc`` checksums, which stay behind and go with staging.
        """
        staging = self.staging_dir(batch_id)
        return sorted(
            str(p.relative_to(staging)) for p in staging.rglob("*.parquet") if not p.name.startswith(".")
        )

    # -- the commit protocol ------------------------------------------------------------------

    def commit(
        self, batch_id: int, ranges: list[OffsetRange], row_counts: dict[str, int], now_ms: int
    ) -> Manifest:
        """Make a staged batch durable and write its manifest atomically (the commit point).

        ``row_counts``: rows per staged file (relative path), read from the Parquet footers.
        """
        staging = self.staging_dir(batch_id)
        files = self.staged_files(batch_id)
        for relative in files:
            _fsync_file(staging / relative)
        _fsync_tree_dirs(staging)
        manifest = Manifest(
            batch_id=batch_id,
            ranges=tuple(sorted(ranges)),
            files=tuple(files),
            records=sum(row_counts.get(f, 0) for f in files),
            created_ms=now_ms,
            by_directory=_by_directory(files, row_counts),
        )
        text = json.dumps(manifest.to_json(), indent=1, sort_keys=True)
        _write_atomically(self.manifest_path(batch_id), text)
        return manifest

    def publish(self, manifest: Manifest) -> int:
        """Move a committed batch's files into place; idempotent. Returns how many were moved now."""
        staging = self.staging_dir(manifest.batch_id)
        moved, touched = 0, set()
        for relative in manifest.files:
            source, target = staging / relative, self.root / relative
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
                moved += 1
                touched.add(target.parent)
            elif not target.exists():
                raise OutputCorruptError(
                    f"batch {manifest.batch_id}: {relative} is neither staged nor published"
                )
        for directory in sorted(touched):
            _fsync_dir(directory)
            _fsync_dir(directory.parent)
        shutil.rmtree(staging, ignore_errors=True)
        _remove_if_empty(self.staging_root)
        return moved

    def recover(self) -> list[str]:
        """Settle what an interrupted run left: finish committed batches, drop uncommitted ones.

        Returns one line per action, for the job's report.
        """
        committed = {m.batch_id: m for m in self.manifests()}
        actions = []
        for batch_id in self.staged_batches():
            if batch_id in committed:
                moved = self.publish(committed[batch_id])
                actions.append(f"batch {batch_id}: committed earlier, publish finished ({moved} files moved)")
            else:
                shutil.rmtree(self.staging_dir(batch_id))
                _remove_if_empty(self.staging_root)
                actions.append(
                    f"batch {batch_id}: staged by a run that did not commit, discarded "
                    f"(its offsets are loaded again)"
                )
        return actions

    def published_files(self) -> list[Path]:
        return sorted(p for p in self.root.glob("date=*/hour=*/*.parquet"))


def _by_directory(files: list[str], row_counts: dict[str, int]) -> dict[str, int]:
    result: dict[str, int] = {}
    for relative in files:
        directory = str(Path(relative).parent)
        result[directory] = result.get(directory, 0) + row_counts.get(relative, 0)
    return dict(sorted(result.items()))


def _remove_if_empty(directory: Path) -> None:
    try:
        directory.rmdir()
    except OSError:
        pass  # not empty (another batch is staged) or already gone


# ---- durability helpers --------------------------------------------------------------------------


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    # A rename or a new file is durable only once its directory entry is: fsync the directory.
    _fsync_file(path)


def _fsync_tree_dirs(root: Path) -> None:
    for directory in sorted({p.parent for p in root.rglob("*")} | {root}):
        _fsync_dir(directory)
    _fsync_dir(root.parent)


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old state or the whole new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_dir(path.parent)
