"""Pure fetch-result assembly: trim fetched bytes to the byte budgets, decode typed records.

Typed decoding has budgets of its own (:class:`DecodeBudget`): a batch of a few MB on the wire
can hold millions of records, so an answer stops at a bound on decoded records and bytes and the
rest comes in the next fetch. A batch that cannot be decoded ends its partition's records there.

Byte budgets follow the Kafka rules the public proto promises:

* a partition returns at most its ``max_bytes``, and the response at most the request's
  ``max_bytes``, counting whole batches only -- except that a partition's first batch is returned
  whole even when larger than the partition's budget, and the response's first batch even when
  larger than the response's budget, so a consumer always makes progress;
* only batches wholly below the high watermark are returned (the high watermark sits on a batch
  boundary, so nothing committed is held back);
* a partial batch at the end of what the node sent is dropped (the next fetch starts there).

Trimming reads only the 12-byte log overhead and the header of each batch; raw batches leave as
the very bytes the node sent (``bytes`` sliced once when trimmed, passed through when not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services import errors
from services.records import RECORD_BATCH_OVERHEAD, Record, TimestampType, iter_batches
from services.records.aborted import AbortedTransactionFilter


@dataclass(frozen=True, slots=True)
class Taken:
    """How much of a fetched chunk to keep: its first ``length`` bytes, ending before ``next_offset``."""

    length: int
    next_offset: int
    #: Set when a corrupt batch stopped the walk before anything could be kept.
    error: errors.TributaryError | None = None


def take_batches(
    data: bytes,
    *,
    fetch_offset: int,
    high_watermark: int,
    partition_room: int,
    total_room: int,
    partition_empty: bool,
    response_empty: bool,
) -> Taken:
    """Whole batches from the start of ``data`` that fit the budgets (see the module docstring).

    ``*_room`` are the bytes still allowed; ``*_empty`` say whether nothing was taken yet for the
    partition / the response, which lets an oversized first batch through.
    """
    kept = 0
    next_offset = fetch_offset
    try:
        for batch in iter_batches(data, allow_partial_tail=True):
            if batch.last_offset >= high_watermark:
                break
            size = batch.size_in_bytes
            first = kept == 0
            if size > partition_room - kept and not (first and partition_empty):
                break
            if size > total_room - kept and not (first and response_empty):
                break
            kept += size
            next_offset = max(next_offset, batch.next_offset)
    except errors.CorruptRecordError as exc:
        if kept == 0:
            return Taken(0, fetch_offset, exc)
    return Taken(kept, next_offset)


@dataclass(slots=True)
class PartitionData:
    """What has been gathered for one partition of a fetch so far."""

    topic: str
    partition: int
    #: The offset the client asked for; records below it are skipped in typed results.
    fetch_offset: int
    max_bytes: int
    next_offset: int = -1
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    error: errors.TributaryError | None = None
    #: read_committed: the aborted transactions (producer id, first offset) met so far.
    aborted: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.next_offset < 0:
            self.next_offset = self.fetch_offset

    @property
    def room(self) -> int:
        return self.max_bytes - self.size

    def add(self, data: bytes, taken: Taken) -> None:
        """Keep ``data[:taken.length]`` (no copy when it is all of it)."""
        if taken.length:
            self.chunks.append(data if taken.length == len(data) else data[: taken.length])
            self.size += taken.length
            self.next_offset = taken.next_offset

    def raw(self) -> bytes:
        if not self.chunks:
            return b""
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)


#: Records of one batch with the batch's timestamp type (ConsumedRecord carries it per record).
TypedBatch = tuple[TimestampType, list[Record]]


class DecodeBudget:
    """What one typed answer may still decode, shared by its partitions in request order.

    Two bounds: records (each costs a few hundred bytes of Python objects and protobuf, whatever
    its size) and decompressed record bytes. The first batch with records gets a window of at
    least one record whatever the bounds say, so every answer makes progress; after that an
    answer stops at the first batch that does not fit, and the rest comes in the next fetch.
    """

    __slots__ = ("bytes_left", "payload_bytes", "records", "records_left")

    def __init__(self, *, max_records: int, max_bytes: int) -> None:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("decode bounds must be positive")
        self.records_left = max_records
        self.bytes_left = max_bytes
        #: Spent so far: what the answer holds, for memory accounting.
        self.records = 0
        self.payload_bytes = 0

    def window(self, payload_size: int) -> int | None:
        """The most records a batch with ``payload_size`` decompressed bytes may return, or
        None when the answer is full."""
        if self.records and (self.records_left <= 0 or payload_size > self.bytes_left):
            return None
        return max(1, self.records_left)

    def full_before(self, batch_size: int) -> bool:
        """Whether the answer is full before even decompressing a batch of ``batch_size`` bytes
        (its records take at least the bytes after the header)."""
        return bool(self.records) and (
            self.records_left <= 0 or batch_size - RECORD_BATCH_OVERHEAD > self.bytes_left
        )

    def spend(self, records: int, payload_size: int) -> None:
        self.records_left -= records
        self.bytes_left -= payload_size
        self.records += records
        self.payload_bytes += payload_size


@dataclass(frozen=True, slots=True)
class DecodedPartition:
    """One partition's typed result: the records, where the next fetch starts, or the error."""

    batches: list[TypedBatch]
    #: One past the last record returned (past trailing control batches), else the fetch offset.
    next_offset: int
    error: errors.CorruptRecordError | None = None


def decode_typed(
    chunks: list[bytes],
    *,
    topic: str,
    partition: int,
    fetch_offset: int,
    budget: DecodeBudget,
    aborted: AbortedTransactionFilter | None = None,
) -> DecodedPartition:
    """Decode whole batches (CRC checked, as Kafka consumers do) within ``budget``, skipping
    records below ``fetch_offset`` and control batches -- and, for a read_committed fetch
    (``aborted``), the batches of aborted transactions.

    A corrupt batch (stored by an older version) ends the result before it: the records in front
    of it are returned, and the fetch that starts at it gets the error -- a CorruptRecordError
    naming the batch's offsets and where to fetch from to skip it.
    """
    decoded: list[TypedBatch] = []
    next_offset = fetch_offset
    for chunk in chunks:
        for batch in iter_batches(chunk):
            if batch.last_offset < next_offset:
                continue  # wholly before the position (the first batch may start earlier)
            # Control batches (markers) are never records; read_committed also drops aborted ones.
            dropped = aborted.drops(batch) if aborted is not None else batch.is_control
            if dropped:
                next_offset = batch.next_offset
                continue
            if budget.full_before(batch.size_in_bytes):
                return DecodedPartition(decoded, next_offset)
            try:
                batch.validate()
                payload = batch.payload()
                window = budget.window(len(payload))
                if window is None:
                    return DecodedPartition(decoded, next_offset)
                records = batch.read_records(payload, first_offset=next_offset, max_records=window)
            except errors.CorruptRecordError as exc:
                if decoded:
                    return DecodedPartition(decoded, next_offset)
                error = errors.CorruptRecordError.unreadable_batch(
                    exc,
                    topic=topic,
                    partition=partition,
                    base_offset=batch.base_offset,
                    next_offset=batch.next_offset,
                )
                return DecodedPartition([], fetch_offset, error)
            budget.spend(len(records), len(payload))
            if records:
                decoded.append((batch.timestamp_type, records))
            if len(records) == window:  # the window is full: the batch may hold more
                return DecodedPartition(decoded, records[-1].offset + 1)
            next_offset = batch.next_offset
    return DecodedPartition(decoded, next_offset)
