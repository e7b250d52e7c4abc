"""``LogManager``: every partition log of one storage node, across its data directories."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.clock import Clock
from services.errors import KafkaStorageError, TributaryError, UnknownTopicOrPartitionError
from storage_node.log import checkpoint, files
from storage_node.log.config import LogConfig
from storage_node.log.file_records import FileHandleCache
from storage_node.log.partition_log import PartitionLog

log = logging.getLogger(__name__)

#: Default bound on open segment (``.log``) handles; Kafka keeps every segment open and asks
#: operators to raise ``ulimit -n`` instead.
DEFAULT_MAX_OPEN_SEGMENTS = 1024
#: Kafka's producer.id.expiration.ms (a day) and its check interval (10 minutes).
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS = 600_000
#: Threads issuing one tick's due flushes side by side. Concurrent fsyncs on one file system
#: share its journal commits: measured here (ext4, 256 files of 8 KB), 4 threads cut the wall
#: time of 256 flushes 5-9x for the same CPU, so a tick's burst of flush.ms flushes holds
#: the tick (and the GIL hand-offs between its fsyncs) for far less time.
DEFAULT_FLUSH_THREADS = 4
_DELETE_DIR_SUFFIX = "-delete"


@dataclass(frozen=True, slots=True)
class PartitionDirInfo:
    """A snapshot of one partition's log, as DescribeLogDirs reports it."""

    topic: str
    partition: int
    size_in_bytes: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    segment_count: int
    recovery_point: int
    latest_epoch: int

    @classmethod
    def of(cls, partition_log: PartitionLog) -> PartitionDirInfo:
        return cls(
            partition_log.topic,
            partition_log.partition,
            partition_log.size_in_bytes,
            partition_log.log_start_offset,
            partition_log.log_end_offset,
            partition_log.high_watermark,
            partition_log.segment_count,
            partition_log.recovery_point,
            partition_log.latest_epoch,
        )


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """One data directory, as DescribeLogDirs reports it."""

    path: Path
    partitions: tuple[PartitionDirInfo, ...]
    total_bytes: int  # bytes of segment data of the partitions here (not the disk's size)
    free_bytes: int  # free space on the file system holding it


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one :meth:`LogManager.tick` did."""

    rolled: int
    flushed: int
    deleted_segments: int
    failed: int


class LogManager:
    """Owns the partition logs of one storage node, spread over several data dirs (``log.dirs``).

    Layout: each partition is a directory ``<log dir>/<topic>-<partition>/`` in exactly one of
    the log dirs; a new partition goes to the dir holding the fewest partitions (Kafka's rule,
    which fills a newly added disk first). A partition being deleted is first renamed to
    ``<topic>-<partition>.<id>-delete``; :meth:`load` removes such leftovers.

    Open files: ``.log`` handles go through one :class:`FileHandleCache` of ``max_open_segments``;
    index files are read into memory at open and only the active segment keeps index handles.

    High watermarks: one ``replication-offset-checkpoint`` per log dir, naming every partition
    in it, rewritten by :meth:`tick` when any of them moved and at :meth:`close` (Kafka's
    layout; one file per partition cost two fsyncs per busy partition per tick).

    Topic configs: ``default_config`` (broker-level defaults, Kafka names) overlaid by each
    topic's overrides as given to :meth:`create_partition`, :meth:`load` or
    :meth:`update_topic_config` -- the coordinator owns them; nothing is persisted here.

    Thread safety: the partition map is guarded by a lock; each PartitionLog is thread-safe as
    documented there. :meth:`tick` is meant to be called from one periodic task.
    """

    def __init__(
        self,
        log_dirs: list[Path],
        clock: Clock,
        default_config: Mapping[str, Any] | None = None,
        *,
        max_open_segments: int = DEFAULT_MAX_OPEN_SEGMENTS,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        producer_id_expiration_check_interval_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS,
        recovery_threads_per_dir: int = 1,
        flush_threads: int = DEFAULT_FLUSH_THREADS,
    ) -> None:
        if not log_dirs:
            raise ValueError("at least one log dir is needed")
        if len({Path(d).resolve() for d in log_dirs}) != len(log_dirs):
            raise ValueError(f"log dirs must be distinct: {log_dirs}")
        self.log_dirs = [Path(d) for d in log_dirs]
        if recovery_threads_per_dir < 1:
            raise ValueError(f"recovery threads per log dir must be >= 1, got {recovery_threads_per_dir}")
        #: Threads opening and recovering partitions in :meth:`load`, per log dir (Kafka's
        #: num.recovery.threads.per.data.dir).
        self.recovery_threads_per_dir = recovery_threads_per_dir
        if flush_threads < 1:
            raise ValueError(f"flush threads must be >= 1, got {flush_threads}")
        self.flush_threads = flush_threads
        self._flush_pool: ThreadPoolExecutor | None = None  # made at the first tick with 2 due
        self._closed = False  # no flush pool is made after close (a tick racing it runs inline)
        self._clock = clock
        self._default_config = dict(default_config or {})
        LogConfig.from_dict(self._default_config)  # fail now on a bad default, not at first use
        self._topic_overrides: dict[str, dict[str, Any]] = {}
        #: Topic -> (the overrides it was resolved from, the resolved config).
        self._resolved: dict[str, tuple[dict[str, Any], LogConfig]] = {}
        self.handle_cache = FileHandleCache(max_open_segments)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        #: Partitions per log dir (new partitions go to the emptiest).
        self._dir_counts: dict[Path, int] = {}
        self._lock = threading.Lock()
        #: Idempotent producers idle this long (no transaction open) are forgotten; their next
        #: batch gets UNKNOWN_PRODUCER_ID and the producer moves to a new epoch (KIP-360).
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._expiration_check_interval_ms = producer_id_expiration_check_interval_ms
        self._last_expiration_check_ms = clock.time_ms()

    def _config_for(self, topic: str) -> LogConfig:
        """The topic's config, resolved once per change of its overrides (every partition of the
        topic shares the object, so a confirmation can tell by identity that nothing changed)."""
        overrides = self._topic_overrides.get(topic, {})
        cached = self._resolved.get(topic)
        if cached is not None and cached[0] == overrides:
            return cached[1]
        config = LogConfig.from_dict(self._default_config, overrides)
        self._resolved[topic] = (dict(overrides), config)
        return config

    # ---- loading -------------------------------------------------------------------------------

    def load(self, topic_configs: Mapping[str, Mapping[str, Any]] | None = None) -> list[tuple[str, int]]:
        """Open and recover every partition found in every log dir; returns them.

        ``topic_configs`` maps topic -> config overrides for topics known at startup. Raises
        KafkaStorageError if one partition is found in two log dirs.
        """
        for topic, overrides in (topic_configs or {}).items():
            self._topic_overrides[topic] = dict(overrides)
            self._config_for(topic)  # validate
        found: dict[tuple[str, int], Path] = {}
        high_watermarks: dict[tuple[str, int], int] = {}
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            high_watermarks.update(
                checkpoint.read_offsets_checkpoint(log_dir / files.HIGH_WATERMARK_CHECKPOINT_FILE)
            )
            for child in sorted(log_dir.iterdir()):
                key = self._partition_dir_key(child)
                if key is None:
                    continue
                if key in found or key in self._logs:
                    raise KafkaStorageError(
                        f"partition {files.partition_dir_name(*key)} found in two log dirs: "
                        f"{found.get(key) or self._logs[key].directory} and {child}"
                    )
                found[key] = child

        def open_one(item: tuple[tuple[str, int], Path]) -> None:
            (topic, partition), path = item
            partition_log = PartitionLog.open(
                path,
                topic,
                partition,
                self._config_for(topic),
                self._clock,
                handle_cache=self.handle_cache,
                high_watermark=high_watermarks.get((topic, partition)),
            )
            with self._lock:
                self._logs[(topic, partition)] = partition_log
                self._count_in_dir(partition_log, 1)

        # Opening is mostly file I/O (listing, reading indexes and the tail to recover after a
        # crash), which threads overlap; the first error is raised once the others finished.
        workers = self.recovery_threads_per_dir * len(self.log_dirs)
        if workers == 1 or len(found) < 2:
            for item in found.items():
                open_one(item)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="log-recovery") as pool:
                for future in [pool.submit(open_one, item) for item in found.items()]:
                    future.result()
        return sorted(found)

    @staticmethod
    def _partition_dir_key(path: Path) -> tuple[str, int] | None:
        if not path.is_dir():
            return None
        if path.name.endswith(_DELETE_DIR_SUFFIX):
            log.info("Finishing the deletion of %s", path)
            shutil.rmtree(path, ignore_errors=True)
            return None
        return files.parse_partition_dir_name(path.name)

    # ---- partitions ----------------------------------------------------------------------------

    def create_partition(
        self, topic: str, partition: int, configs: Mapping[str, Any] | None = None
    ) -> PartitionLog:
        """The partition's log, created in the log dir with the fewest partitions if new.

        Idempotent: for an existing partition, applies ``configs`` (when given) and returns it.
        InvalidConfigError for bad configs, ValueError for an illegal topic name.
        """
        return self._create(topic, partition, configs, sync_parent=True)

    def create_partitions(
        self, items: Sequence[tuple[str, int, Mapping[str, Any] | None]]
    ) -> list[PartitionLog | TributaryError]:
        """:meth:`create_partition` of each (topic, partition, configs), each its own outcome
        (the log, or the error: InvalidConfigError, KafkaStorageError, ...). New partitions'
        directories are made durable with one fsync of each log dir they went to, not one each
        (most of what a create of thousands of partitions cost a node)."""
        outcomes: list[PartitionLog | TributaryError] = []
        new_in: dict[Path, list[int]] = {}
        for topic, partition, configs in items:
            existed = (topic, partition) in self._logs
            try:
                partition_log = self._create(topic, partition, configs, sync_parent=False)
            except TributaryError as exc:
                outcomes.append(exc)
                continue
            if not existed:
                new_in.setdefault(partition_log.log_dir, []).append(len(outcomes))
            outcomes.append(partition_log)
        for log_dir, indexes in new_in.items():
            try:
                checkpoint.fsync_dir(log_dir)
            except OSError as exc:
                failure = KafkaStorageError(f"{log_dir}: making new partitions durable failed: {exc}")
                for index in indexes:
                    outcomes[index] = failure
        return outcomes

    def _create(
        self, topic: str, partition: int, configs: Mapping[str, Any] | None, *, sync_parent: bool
    ) -> PartitionLog:
        name = files.partition_dir_name(topic, partition)
        with self._lock:
            existing = self._logs.get((topic, partition))
            if existing is not None:
                if configs is not None:
                    # Overrides unchanged (a controller confirming the log is here): no new config
                    # to resolve, and none to apply unless this log has an older one.
                    unchanged = self._topic_overrides.get(topic) == dict(configs)
                    config = self._config_for(topic) if unchanged else self._replace_overrides(topic, configs)
                    if existing.config is not config:
                        existing.update_config(config)
                return existing
            config = self._config_for(topic) if configs is None else self._replace_overrides(topic, configs)
            log_dir = self._least_loaded_dir()
            partition_log = PartitionLog.open(
                log_dir / name,
                topic,
                partition,
                config,
                self._clock,
                handle_cache=self.handle_cache,
                sync_parent=sync_parent,
            )
            self._logs[(topic, partition)] = partition_log
            self._count_in_dir(partition_log, 1)
            log.info("Created partition %s in %s", name, log_dir)
            return partition_log

    def _replace_overrides(self, topic: str, configs: Mapping[str, Any]) -> LogConfig:
        """Make ``configs`` the topic's overrides and return its resulting config; if they do not
        validate, the previous overrides stay and the error is raised. Call with the lock held."""
        previous = self._topic_overrides.get(topic)
        self._topic_overrides[topic] = dict(configs)
        try:
            return self._config_for(topic)
        except Exception:
            if previous is None:
                self._topic_overrides.pop(topic, None)
            else:
                self._topic_overrides[topic] = previous
            raise

    def _least_loaded_dir(self) -> Path:
        """The log dir holding the fewest partitions (kept counted: counting them here walked
        every partition, so each create cost in proportion to the partitions already held)."""
        return min(self.log_dirs, key=lambda d: self._dir_counts.get(d, 0))  # ties: first listed

    def _count_in_dir(self, partition_log: PartitionLog, delta: int) -> None:
        parent = partition_log.log_dir
        self._dir_counts[parent] = self._dir_counts.get(parent, 0) + delta

    def update_topic_config(self, topic: str, configs: Mapping[str, Any]) -> None:
        """Replace a topic's overrides and apply them to its partitions here."""
        with self._lock:
            config = self._replace_overrides(topic, configs)
            for (log_topic, _), partition_log in self._logs.items():
                if log_topic == topic:
                    partition_log.update_config(config)

    def get(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log; UnknownTopicOrPartitionError if this node does not host it."""
        partition_log = self._logs.get((topic, partition))
        if partition_log is None:
            raise UnknownTopicOrPartitionError(
                f"this storage node does not host partition {topic}-{partition}"
            )
        return partition_log

    def delete_partition(self, topic: str, partition: int) -> None:
        """Close and delete the partition's directory; UnknownTopicOrPartitionError if absent."""
        with self._lock:
            partition_log = self._logs.pop((topic, partition), None)
            if partition_log is not None:
                self._count_in_dir(partition_log, -1)
        if partition_log is None:
            raise UnknownTopicOrPartitionError(
                f"this storage node does not host partition {topic}-{partition}"
            )
        partition_log.delete()
        log.info("Deleted partition %s-%d", topic, partition)

    def partitions(self) -> list[PartitionLog]:
        """Every hosted partition's log, sorted by (topic, partition)."""
        logs = dict(self._logs)
        return [logs[key] for key in sorted(logs)]

    def describe_log_dirs(self) -> list[LogDirDescription]:
        logs = list(self._logs.values())
        descriptions = []
        for log_dir in self.log_dirs:
            infos = tuple(
                sorted(
                    (PartitionDirInfo.of(pl) for pl in logs if pl.log_dir == log_dir),
                    key=lambda info: (info.topic, info.partition),
                )
            )
            descriptions.append(
                LogDirDescription(
                    log_dir, infos, sum(i.size_in_bytes for i in infos), shutil.disk_usage(log_dir).free
                )
            )
        return descriptions

    # ---- periodic work -------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """One round of periodic work for every partition: roll idle segments past
        ``segment.ms``, apply retention, flush by ``flush.ms``/``flush.messages``; every
        ``producer_id_expiration_check_interval_ms``, forget idle producers; then checkpoint the
        high watermarks of each log dir where one moved.

        A partition whose disk fails is logged and skipped; the others still get their turn.
        """
        rolled = deleted = failed = 0
        now = self._clock.time_ms()
        expire = now - self._last_expiration_check_ms >= self._expiration_check_interval_ms
        if expire:
            self._last_expiration_check_ms = now
        due: list[PartitionLog] = []
        for partition_log in list(self._logs.values()):
            if partition_log.closed or partition_log.offline:  # offline: logged when it failed
                continue
            try:
                if expire:
                    partition_log.expire_producers(self.producer_id_expiration_ms)
                rolled += partition_log.maybe_roll()
                deleted += partition_log.delete_old_segments()
                if partition_log.flush_due():
                    due.append(partition_log)
            except (KafkaStorageError, OSError):
                failed += 1
                log.exception("Periodic work failed for %s", partition_log.name)
        outcomes = self._flush_side_by_side(due)
        flushed = outcomes.count(True)
        failed += outcomes.count(False)
        self.checkpoint_high_watermarks()
        return TickResult(rolled, flushed, deleted, failed)

    def _flush_side_by_side(self, due: list[PartitionLog]) -> list[bool | None]:
        """Flush each log (the flush policy's flush), several at once; each one's outcome: True
        flushed, False failed (logged), None no longer due."""

        def flush_one(partition_log: PartitionLog) -> bool | None:
            try:
                return partition_log.maybe_flush() or None
            except (KafkaStorageError, OSError):
                log.exception("Periodic flush failed for %s", partition_log.name)
                return False

        pool = None
        if len(due) >= 2 and self.flush_threads > 1:
            with self._lock:
                if self._flush_pool is None and not self._closed:
                    self._flush_pool = ThreadPoolExecutor(self.flush_threads, thread_name_prefix="log-flush")
                pool = self._flush_pool
        if pool is not None:
            try:
                return list(pool.map(flush_one, due))
            except RuntimeError:  # shut down by a close racing this tick: the logs are closed
                pass
        return [flush_one(partition_log) for partition_log in due]

    def checkpoint_high_watermarks(self, *, force: bool = False) -> int:
        """Rewrite the high-watermark checkpoint of each log dir in which one moved since the
        last (every one with ``force``); returns how many were written. A dir whose write fails
        is logged and tried again next time."""
        by_dir: dict[Path, list[PartitionLog]] = {log_dir: [] for log_dir in self.log_dirs}
        due: set[Path] = set(self.log_dirs) if force else set()
        for partition_log in list(self._logs.values()):
            parent = partition_log.log_dir
            by_dir.setdefault(parent, []).append(partition_log)
            if partition_log.high_watermark_checkpoint_due:
                due.add(parent)
        for log_dir in due:
            logs = by_dir[log_dir]
            marks = [partition_log.high_watermark for partition_log in logs]
            try:
                checkpoint.write_offsets_checkpoint(
                    log_dir / files.HIGH_WATERMARK_CHECKPOINT_FILE,
                    ((pl.topic, pl.partition, mark) for pl, mark in zip(logs, marks, strict=True)),
                )
            except OSError:
                log.exception("Checkpointing the high watermarks of %s failed", log_dir)
                continue
            for partition_log, mark in zip(logs, marks, strict=True):
                partition_log.high_watermark_checkpointed(mark)
        return len(due)

    def _write_final_high_watermarks(self, logs: list[PartitionLog]) -> None:
        by_dir: dict[Path, list[PartitionLog]] = {log_dir: [] for log_dir in self.log_dirs}
        for partition_log in logs:
            by_dir.setdefault(partition_log.log_dir, []).append(partition_log)
        for log_dir, dir_logs in by_dir.items():
            try:
                checkpoint.write_offsets_checkpoint(
                    log_dir / files.HIGH_WATERMARK_CHECKPOINT_FILE,
                    ((pl.topic, pl.partition, pl.high_watermark) for pl in dir_logs),
                )
            except OSError:
                log.exception("Checkpointing the high watermarks of %s failed", log_dir)

    def close(self) -> None:
        """Close every partition cleanly (each leaves its clean-shutdown marker) and checkpoint
        the high watermarks."""
        with self._lock:
            logs = list(self._logs.values())
            self._logs.clear()
            flush_pool, self._flush_pool = self._flush_pool, None
            self._closed = True
        if flush_pool is not None:
            flush_pool.shutdown(wait=True)  # a tick's flushes in progress finish first
        errors = []

        def close_one(partition_log: PartitionLog) -> None:
            try:
                partition_log.close()
            except (KafkaStorageError, OSError) as exc:
                errors.append(exc)
                log.exception("Closing %s failed", partition_log.name)

        # As Kafka's shutdown, with the recovery threads: each close is fsyncs (segments, the
        # recovery point, the clean-shutdown marker), which threads overlap.
        workers = self.recovery_threads_per_dir * len(self.log_dirs)
        if workers == 1 or len(logs) < 2:
            for partition_log in logs:
                close_one(partition_log)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="log-close") as pool:
                list(pool.map(close_one, logs))
        self._write_final_high_watermarks(logs)
        if errors:
            raise KafkaStorageError(f"{len(errors)} partition logs failed to close: {errors[0]}")
