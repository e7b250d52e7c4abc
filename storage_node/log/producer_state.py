"""Producer state of one partition: idempotence and transactions (Kafka's ``ProducerStateManager``).

For every producer id that wrote to the partition, the state keeps its epoch, the sequence ranges
and offsets of its last :data:`BATCHES_KEPT` runs of batches, the time of its last write, and --
while it has a transaction open on the partition -- the offset where that transaction began.
A *run* is batches that follow each other in both sequence and offset (one request's batches
always do: a payload is appended as a unit), kept as one range: a request of many batches is
remembered whole, so the retry of any batch of it -- producers retry a lost request batch by
batch -- is recognised, where Kafka's one-entry-per-batch window of 5 would have forgotten its
first batches. From it:

* **idempotence**: a leader checks each producer batch before appending it
  (:meth:`ProducerStateManager.check`): a batch seen before (same epoch, its sequence range
  within a remembered run) is a retry and is answered with the offsets it got the first time
  (sequences and offsets advance together within a run); a gap in the sequence is
  OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch INVALID_PRODUCER_EPOCH; a producer the partition has
  no state for that does not start at sequence 0, UNKNOWN_PRODUCER_ID (KIP-360: the producer bumps
  its epoch and starts again);
* **transactions**: the first transactional batch of a producer opens a transaction at its first
  offset; a control batch (COMMIT / ABORT marker) closes it. The **last stable offset** is the
  first offset of the oldest open transaction (or the high watermark when none is open): a
  read_committed consumer reads below it. Aborted transactions are returned to the log, which
  keeps them in its aborted-transaction index.

The state is built by the same :meth:`update` whether the batch was appended by this replica as
leader, copied from a leader as follower, or replayed from the log at recovery -- so every
replica holds the same state and a new leader dedups retries of what its predecessor wrote.

Persistence (Kafka's snapshot files): ``<offset>.snapshot`` in the partition directory holds the
whole state as of ``offset``; one is written at every segment roll and at clean shutdown. Loading
takes the newest snapshot at or below the log end and replays the batches after it. Snapshot
format: a JSON object ``{"version": 1, "offset": ..., "producers": [...]}`` preceded by a line with
its CRC-32C, written atomically (a torn or corrupt snapshot is ignored and an older one, or the
log itself, is replayed).

Thread safety: none; the owning PartitionLog calls it under its lock.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import crc32c

from services import errors
from storage_node.log import checkpoint

log = logging.getLogger(__name__)

#: Runs of batches remembered per producer for duplicate detection (Kafka keeps 5 batches).
BATCHES_KEPT = 5
SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_VERSION = 1
INT32_MAX = 2**31 - 1


class BatchFacts(NamedTuple):
    """What the producer state needs of one batch (from its header)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    is_transactional: bool
    is_control: bool
    max_timestamp: int

    @property
    def last_sequence(self) -> int:
        """The sequence of the batch's last record (sequences wrap at 2**31 - 1 to 0)."""
        return (self.base_sequence + self.record_count - 1) % (INT32_MAX + 1)


@dataclass(frozen=True, slots=True)
class BatchEntry:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    #: The batch's max timestamp as stored (the append time on a LogAppendTime topic): a retry is
    #: answered with it, as the first append was (-1 in snapshots older than this field).
    max_timestamp: int = -1


class Duplicate(NamedTuple):
    """Where an earlier append of a retried payload went: offsets and stored max timestamp."""

    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state on this partition."""

    producer_id: int
    epoch: int
    batches: deque[BatchEntry] = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_timestamp: int = -1
    #: The first offset of its open transaction on this partition, or None.
    transaction_first_offset: int | None = None
    #: The coordinator epoch of the last marker written for it (older markers are refused).
    coordinator_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1

    def find_duplicate(self, facts: BatchFacts) -> BatchEntry | None:
        """The earlier append of ``facts``' sequence range: a remembered run holding it, narrowed
        to the batch (offsets advance with sequences within a run)."""
        if facts.producer_epoch != self.epoch:
            return None
        first, last = facts.base_sequence, facts.last_sequence
        for entry in self.batches:
            if entry.first_sequence == first and entry.last_sequence == last:
                return entry
            if entry.first_sequence <= first <= last <= entry.last_sequence:  # runs never wrap
                return BatchEntry(
                    first,
                    last,
                    entry.first_offset + (first - entry.first_sequence),
                    entry.first_offset + (last - entry.first_sequence),
                    entry.max_timestamp,
                )
        return None

    def remember(self, batch: BatchEntry, *, same_time_only: bool) -> None:
        """Add an appended batch, extending the last run when it follows it in sequence and offset
        (and, with ``same_time_only``, was stamped with the same time: on a LogAppendTime topic a
        retry is answered with its batch's append time)."""
        if self.batches:
            run = self.batches[-1]
            if (
                run.first_sequence <= run.last_sequence < batch.first_sequence <= batch.last_sequence
                and batch.first_sequence == run.last_sequence + 1
                and batch.first_offset == run.last_offset + 1
                and (not same_time_only or batch.max_timestamp == run.max_timestamp)
            ):
                self.batches[-1] = BatchEntry(
                    run.first_sequence,
                    batch.last_sequence,
                    run.first_offset,
                    batch.last_offset,
                    max(run.max_timestamp, batch.max_timestamp),
                )
                return
        self.batches.append(batch)


class AbortedTransaction(NamedTuple):
    """A transaction aborted on this partition: its records lie in [first_offset, last_offset]
    (the marker's offset); a read_committed consumer drops them."""

    producer_id: int
    first_offset: int
    last_offset: int


def in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (last_sequence == INT32_MAX and next_sequence == 0)


class ProducerStateManager:
    """The producer state of one partition. See the module docstring."""

    def __init__(
        self, directory: Path | None, partition_name: str = "", *, log_append_time: bool = False
    ) -> None:
        self._directory = directory
        self._name = partition_name
        #: The topic stamps batches with their append time: runs join only batches of one time.
        self.log_append_time = log_append_time
        self.producers: dict[int, ProducerEntry] = {}
        #: The offset up to which the state reflects the log (the next offset to apply).
        self.map_end_offset = 0

    # ---- checks (leader appends) -------------------------------------------------------------

    def check(self, facts: BatchFacts) -> BatchEntry | None:
        """Check a producer batch before a leader appends it; the earlier append's entry when the
        batch is a retry of it (do not append again), else None. Raises the taxonomy's errors."""
        if facts.producer_id < 0:
            return None
        entry = self.producers.get(facts.producer_id)
        if entry is None:
            if facts.base_sequence != 0:
                raise errors.UnknownProducerIdError(
                    f"{self._name}: no state for producer {facts.producer_id}, and its batch starts at "
                    f"sequence {facts.base_sequence}, not 0 (the state expired or was removed with old "
                    "segments): bump the epoch and start again"
                )
            return None
        if facts.producer_epoch < entry.epoch:
            raise errors.InvalidProducerEpochError(
                f"{self._name}: producer {facts.producer_id} epoch {facts.producer_epoch} is older than "
                f"its current epoch {entry.epoch}"
            )
        duplicate = entry.find_duplicate(facts)
        if duplicate is not None:
            return duplicate
        if facts.producer_epoch > entry.epoch:
            if facts.base_sequence != 0:
                raise errors.OutOfOrderSequenceNumberError(
                    f"{self._name}: producer {facts.producer_id} starts epoch {facts.producer_epoch} at "
                    f"sequence {facts.base_sequence}, not 0"
                )
            return None
        if entry.batches and not in_sequence(entry.last_sequence, facts.base_sequence):
            raise errors.OutOfOrderSequenceNumberError(
                f"{self._name}: producer {facts.producer_id} epoch {facts.producer_epoch} sent sequence "
                f"{facts.base_sequence} after {entry.last_sequence}"
            )
        if not entry.batches and facts.base_sequence != 0 and entry.transaction_first_offset is None:
            raise errors.OutOfOrderSequenceNumberError(
                f"{self._name}: producer {facts.producer_id} epoch {facts.producer_epoch} has no batch "
                f"here yet and starts at sequence {facts.base_sequence}, not 0"
            )
        return None

    def check_payload(self, batches: list[BatchFacts]) -> Duplicate | None:
        """Check one producer's consecutive batches of a payload (appended as a unit); where they
        went earlier (offsets, stored max timestamp) when the payload is a retry, else None.

        A retry must be a retry of all of it: the first batch a duplicate and every one after it
        a duplicate right behind it (a payload is written atomically, so a resend of the same
        bytes is either all in the log or not at all). Anything else that starts with a duplicate
        is DUPLICATE_SEQUENCE_NUMBER; the rest must follow each other in sequence."""
        first = self.check(batches[0])
        if first is not None:
            entry = self.producers[batches[0].producer_id]
            last = first
            for facts in batches[1:]:
                found = entry.find_duplicate(facts)
                if found is None or found.first_offset != last.last_offset + 1:
                    raise errors.DuplicateSequenceNumberError(
                        f"{self._name}: producer {facts.producer_id} resent sequence "
                        f"{batches[0].base_sequence} with batches that are not all duplicates of one append"
                    )
                last = found
            return Duplicate(first.first_offset, last.last_offset, last.max_timestamp)
        for before, after in itertools.pairwise(batches):
            if not in_sequence(before.last_sequence, after.base_sequence):
                raise errors.OutOfOrderSequenceNumberError(
                    f"{self._name}: producer {after.producer_id} sequence {after.base_sequence} does not "
                    f"follow {before.last_sequence} within one payload"
                )
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """A transaction marker may be written unless it comes from an older producer epoch or an
        older coordinator than the last one seen for this producer."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise errors.InvalidProducerEpochError(
                f"{self._name}: marker for producer {producer_id} epoch {producer_epoch}, "
                f"older than its epoch {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise errors.TransactionCoordinatorFencedError(
                f"{self._name}: marker from coordinator epoch {coordinator_epoch}, older than "
                f"{entry.coordinator_epoch}"
            )

    # ---- updates (every replica, every append) ------------------------------------------------

    def update(
        self,
        facts: BatchFacts,
        first_offset: int,
        last_offset: int,
        *,
        marker_commit: bool | None = None,
        coordinator_epoch: int = -1,
    ) -> AbortedTransaction | None:
        """Apply one appended batch; for an ABORT marker, the transaction it aborted (or None).
        ``marker_commit``: for a control batch, whether it is a COMMIT (True) or ABORT (False)."""
        self.map_end_offset = max(self.map_end_offset, last_offset + 1)
        if facts.producer_id < 0:
            return None
        entry = self.producers.get(facts.producer_id)
        if entry is None or facts.producer_epoch > entry.epoch:
            previous = entry
            entry = ProducerEntry(facts.producer_id, facts.producer_epoch)
            if previous is not None:
                entry.transaction_first_offset = previous.transaction_first_offset
                entry.coordinator_epoch = previous.coordinator_epoch
            self.producers[facts.producer_id] = entry
        entry.last_timestamp = max(entry.last_timestamp, facts.max_timestamp)
        if facts.is_control:
            return self._end_transaction(entry, last_offset, bool(marker_commit), coordinator_epoch)
        entry.remember(
            BatchEntry(
                facts.base_sequence, facts.last_sequence, first_offset, last_offset, facts.max_timestamp
            ),
            same_time_only=self.log_append_time,
        )
        if facts.is_transactional and entry.transaction_first_offset is None:
            entry.transaction_first_offset = first_offset
        return None

    def _end_transaction(
        self, entry: ProducerEntry, marker_offset: int, commit: bool, coordinator_epoch: int
    ) -> AbortedTransaction | None:
        first = entry.transaction_first_offset
        entry.transaction_first_offset = None
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)
        if commit or first is None:
            return None
        return AbortedTransaction(entry.producer_id, first, marker_offset)

    # ---- transactions ------------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction, or None when none is open."""
        firsts = [
            e.transaction_first_offset
            for e in self.producers.values()
            if e.transaction_first_offset is not None
        ]
        return min(firsts) if firsts else None

    def open_transaction_of(self, producer_id: int) -> int | None:
        entry = self.producers.get(producer_id)
        return entry.transaction_first_offset if entry is not None else None

    # ---- expiry ------------------------------------------------------------------------------

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle for ``expiration_ms`` without an open transaction; their ids."""
        gone = [
            pid
            for pid, e in self.producers.items()
            if e.transaction_first_offset is None and 0 <= e.last_timestamp < now_ms - expiration_ms
        ]
        for pid in gone:
            del self.producers[pid]
        return gone

    # ---- snapshots ---------------------------------------------------------------------------

    def take_snapshot(self, offset: int | None = None) -> Path | None:
        """Write the state as of ``offset`` (default: :attr:`map_end_offset`) to a snapshot file."""
        if self._directory is None:
            return None
        offset = self.map_end_offset if offset is None else offset
        payload = json.dumps(
            {
                "version": _SNAPSHOT_VERSION,
                "offset": offset,
                "producers": [_entry_to_json(e) for e in self.producers.values()],
            },
            sort_keys=True,
        ).encode()
        path = snapshot_file(self._directory, offset)
        checkpoint.write_atomically(path, b"%d\n" % crc32c.crc32c(payload) + payload)
        return path

    def ensure_snapshot(self, offset: int) -> Path | None:
        """:meth:`take_snapshot` at ``offset`` unless one is there already: the state at an
        offset only changes by appends, which move it, and by expirations, which the next check
        after a load repeats (a node closing thousands of idle partitions rewrote each one's)."""
        if self._directory is not None and snapshot_file(self._directory, offset).exists():
            return None
        return self.take_snapshot(offset)

    def load(self, log_end_offset: int) -> int:
        """Load the newest readable snapshot at or below ``log_end_offset``; returns the offset
        from which the log must be replayed (0-based: the snapshot's offset, or 0)."""
        self.producers = {}
        self.map_end_offset = 0
        if self._directory is None:
            return 0
        for offset in sorted(snapshot_offsets(self._directory), reverse=True):
            if offset > log_end_offset:
                continue
            loaded = _read_snapshot(snapshot_file(self._directory, offset))
            if loaded is None:
                continue
            self.producers = loaded
            self.map_end_offset = offset
            return offset
        return 0

    def delete_old_snapshots(self, log_start_offset: int) -> None:
        """The log start moved: drop snapshots below it, keeping the newest of them (a replay
        from it reads only the segments that are left)."""
        if self._directory is None:
            return
        for offset in _keep_newest(snapshot_offsets(self._directory), log_start_offset):
            snapshot_file(self._directory, offset).unlink(missing_ok=True)

    def delete_snapshots(self, *, below: int | None = None, above: int | None = None) -> None:
        """Delete snapshot files below ``below`` (the log start moved) or above ``above``
        (the log was truncated)."""
        if self._directory is None:
            return
        for offset in snapshot_offsets(self._directory):
            if (below is not None and offset < below) or (above is not None and offset > above):
                snapshot_file(self._directory, offset).unlink(missing_ok=True)


def _keep_newest(offsets: list[int], below: int) -> list[int]:
    """The snapshot offsets below ``below`` that may go: all but the newest of them."""
    old = [o for o in offsets if o < below]
    return old[:-1]


def snapshot_file(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_offsets(directory: Path) -> list[int]:
    offsets = []
    for path in directory.glob(f"*{SNAPSHOT_SUFFIX}"):
        stem = path.name[: -len(SNAPSHOT_SUFFIX)]
        if stem.isdigit():
            offsets.append(int(stem))
    return sorted(offsets)


def _entry_to_json(entry: ProducerEntry) -> dict:
    return {
        "producer_id": entry.producer_id,
        "epoch": entry.epoch,
        "batches": [
            [b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.max_timestamp]
            for b in entry.batches
        ],
        "last_timestamp": entry.last_timestamp,
        "transaction_first_offset": entry.transaction_first_offset,
        "coordinator_epoch": entry.coordinator_epoch,
    }


def _read_snapshot(path: Path) -> dict[int, ProducerEntry] | None:
    try:
        data = path.read_bytes()
        header, _, payload = data.partition(b"\n")
        if int(header) != crc32c.crc32c(payload):
            raise ValueError("checksum mismatch")
        value = json.loads(payload)
        if value.get("version") != _SNAPSHOT_VERSION:
            raise ValueError(f"version {value.get('version')}")
        entries = {}
        for item in value["producers"]:
            entry = ProducerEntry(int(item["producer_id"]), int(item["epoch"]))
            for first_seq, last_seq, first_off, last_off, *timestamp in item["batches"]:
                entry.batches.append(
                    BatchEntry(
                        int(first_seq), int(last_seq), int(first_off), int(last_off), *map(int, timestamp)
                    )
                )
            entry.last_timestamp = int(item["last_timestamp"])
            txn = item.get("transaction_first_offset")
            entry.transaction_first_offset = None if txn is None else int(txn)
            entry.coordinator_epoch = int(item.get("coordinator_epoch", -1))
            entries[entry.producer_id] = entry
        return entries
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("Ignoring unreadable producer state snapshot %s: %s", path, exc)
        return None


def replay(
    manager: ProducerStateManager, batches: Iterable[tuple[BatchFacts, int, int, bool | None]]
) -> list[AbortedTransaction]:
    """Apply ``(facts, first offset, last offset, marker commit)`` of batches read from the log;
    the transactions they abort."""
    aborted = []
    for facts, first_offset, last_offset, commit in batches:
        found = manager.update(facts, first_offset, last_offset, marker_commit=commit)
        if found is not None:
            aborted.append(found)
    return aborted
