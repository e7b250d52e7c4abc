"""``LogCleaner``: the storage node's cleaner threads (Kafka's ``LogCleaner`` and
``LogCleanerManager``).

``log.cleaner.threads`` daemon threads each loop: pick the compacted partition with the highest
dirty ratio that is due (``planner.is_due``) and not being cleaned by another thread, clean it
(``cleaner.clean_partition``), and back off ``log.cleaner.backoff.ms`` when nothing is due. All
threads share one offset-map budget (``log.cleaner.dedupe.buffer.size``, split evenly, as in
Kafka) and one I/O throttle (``log.cleaner.io.max.bytes.per.second``). Nothing runs on the event
loop.

A partition whose round fails (a disk error, a corrupt batch) is logged and left alone for
:data:`FAILED_PARTITION_BACKOFF_ROUNDS` backoffs (Kafka marks it uncleanable); the others go on.
Per-partition progress (:meth:`progress`, :meth:`dirty_ratios`) feeds the metrics.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from services.errors import KafkaStorageError
from storage_node.log.cleaner import cleaner
from storage_node.log.cleaner.planner import CleanablePart, is_due
from storage_node.log.cleaner.throttle import Throttler
from storage_node.log.partition_log import PartitionLog

log = logging.getLogger(__name__)

DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024
#: How many backoffs a partition whose round failed is skipped for.
FAILED_PARTITION_BACKOFF_ROUNDS = 20
DEFAULT_BACKOFF_MS = 15_000
#: Unthrottled (Kafka's default is Double.MAX_VALUE).
DEFAULT_IO_MAX_BYTES_PER_SECOND = 0.0


@dataclass(frozen=True)
class CleanerSettings:
    """The broker-level cleaner settings (Kafka's ``log.cleaner.*``)."""

    threads: int = 1
    dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE
    #: 0 = unthrottled.
    io_max_bytes_per_second: float = DEFAULT_IO_MAX_BYTES_PER_SECOND
    backoff_ms: int = DEFAULT_BACKOFF_MS

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"log.cleaner.threads must be at least 1, got {self.threads}")
        if self.dedupe_buffer_size // self.threads < 1024:
            raise ValueError(
                f"log.cleaner.dedupe.buffer.size {self.dedupe_buffer_size} is below 1 KiB per cleaner thread"
            )
        if self.io_max_bytes_per_second < 0:
            raise ValueError(
                f"log.cleaner.io.max.bytes.per.second must be 0 (unthrottled) or positive, "
                f"got {self.io_max_bytes_per_second}"
            )
        if self.backoff_ms < 1:
            raise ValueError(f"log.cleaner.backoff.ms must be at least 1, got {self.backoff_ms}")


@dataclass(frozen=True)
class CleanerProgress:
    """One compacted partition as the cleaner last saw it."""

    dirty_ratio: float
    first_dirty_offset: int
    rounds: int
    bytes_read: int
    bytes_written: int
    last_clean_ms: int
    last_duration_s: float


class LogCleaner:
    """Cleans the compacted partitions of ``partitions()`` on background threads."""

    def __init__(
        self,
        partitions: Callable[[], list[PartitionLog]],
        settings: CleanerSettings,
        *,
        time_ms: Callable[[], int],
        on_clean: Callable[[cleaner.CleanResult], None] | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        self._partitions = partitions
        self.settings = settings
        self._time_ms = time_ms
        #: Called on the cleaner thread after each round (metrics).
        self.on_clean = on_clean
        self._on_step = on_step
        self.throttler = Throttler(settings.io_max_bytes_per_second)
        self._lock = threading.Lock()
        self._in_progress: set[tuple[str, int]] = set()
        self._progress: dict[tuple[str, int], CleanerProgress] = {}
        self._dirty_ratios: dict[tuple[str, int], float] = {}
        #: Partitions whose last round failed -> when they may be tried again (ms).
        self._failed_until: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            return
        for i in range(self.settings.threads):
            thread = threading.Thread(target=self._run, name=f"log-cleaner-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the threads; a round in progress finishes its current segment group first."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads.clear()

    def wake(self) -> None:
        """Look for work now rather than after the backoff (tests, config changes)."""
        self._wake.set()

    # ---- work ----------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cleaned = self.clean_once()
            except Exception:
                log.exception("Log cleaner round failed")
                cleaned = False
            if not cleaned:
                self._wake.wait(self.settings.backoff_ms / 1000)
                self._wake.clear()

    def clean_once(self) -> bool:
        """Clean the dirtiest due partition, if any; True if one was cleaned."""
        chosen = self._choose()
        if chosen is None:
            return False
        partition_log, part = chosen
        key = (partition_log.topic, partition_log.partition)
        try:
            result = cleaner.clean_partition(
                partition_log,
                map_memory_bytes=self.settings.dedupe_buffer_size // self.settings.threads,
                now_ms=self._time_ms(),
                throttler=self.throttler,
                on_step=self._on_step or (lambda step: None),
                part=part,
                should_stop=self._stop.is_set,
            )
        except Exception:
            if partition_log.closed:
                return False  # deleted or closed under the round: nothing to report
            with self._lock:
                self._failed_until[key] = (
                    self._time_ms() + FAILED_PARTITION_BACKOFF_ROUNDS * self.settings.backoff_ms
                )
            log.exception("Cleaning %s failed; it is skipped for a while", partition_log.name)
            return False
        finally:
            with self._lock:
                self._in_progress.discard(key)
        if result is None:
            return False
        with self._lock:
            before = self._progress.get(key)
            self._progress[key] = CleanerProgress(
                dirty_ratio=0.0 if result.completed else result.dirty_ratio,
                first_dirty_offset=result.map_end,
                rounds=(before.rounds if before else 0) + 1,
                bytes_read=(before.bytes_read if before else 0) + result.bytes_read,
                bytes_written=(before.bytes_written if before else 0) + result.bytes_written,
                last_clean_ms=self._time_ms(),
                last_duration_s=result.duration_s,
            )
        if self.on_clean is not None:
            self.on_clean(result)
        return True

    def _choose(self) -> tuple[PartitionLog, CleanablePart] | None:
        now = self._time_ms()
        best: tuple[float, PartitionLog, CleanablePart] | None = None
        for partition_log in self._partitions():
            config = partition_log.config
            if partition_log.closed or not config.compact_enabled:
                continue
            key = (partition_log.topic, partition_log.partition)
            try:
                part = cleaner.plan(partition_log, now)
            except (KafkaStorageError, OSError, LookupError):
                continue
            with self._lock:
                self._dirty_ratios[key] = part.dirty_ratio
                if key in self._in_progress or self._failed_until.get(key, 0) > now:
                    continue
            due = is_due(
                part,
                now_ms=now,
                min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
                max_compaction_lag_ms=config.max_compaction_lag_ms,
            )
            if due and (best is None or part.dirty_ratio > best[0]):
                best = (part.dirty_ratio, partition_log, part)
        if best is None:
            return None
        _, partition_log, part = best
        key = (partition_log.topic, partition_log.partition)
        with self._lock:
            if key in self._in_progress:
                return None
            self._in_progress.add(key)
        return partition_log, part

    # ---- reporting -----------------------------------------------------------------------------

    def progress(self, topic: str, partition: int) -> CleanerProgress | None:
        with self._lock:
            return self._progress.get((topic, partition))

    def dirty_ratios(self) -> dict[tuple[str, int], float]:
        """The dirty ratio of every compacted partition, as of the last look."""
        with self._lock:
            return dict(self._dirty_ratios)
