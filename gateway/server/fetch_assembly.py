"""Pure fetch-result assembly: trim fetched bytes to the byte budgets, decode typed records.

Typed decoding has budgets of its own (:class:`DecodeBudget`): a batch of a few MB on the wire
can hold millions of records, so an answer stops at a bound on decoded records and on the
answer's estimated size, and the rest comes in the next fetch. A batch that cannot be decoded
ends its partition's records there.

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

from dataclasses import dataclass

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


_NO_ABORTED: frozenset[tuple[int, int]] = frozenset()


class PartitionData:
    """What has been gathered for one partition of a fetch so far. (A plain class: a wide fetch
    session makes one per partition per fetch, so its construction is kept cheap.)"""

    __slots__ = (
        "aborted",
        "chunks",
        "error",
        "fetch_offset",
        "high_watermark",
        "log_start_offset",
        "max_bytes",
        "next_offset",
        "partition",
        "size",
        "topic",
    )

    def __init__(self, topic: str, partition: int, fetch_offset: int, max_bytes: int) -> None:
        self.topic = topic
        self.partition = partition
        #: The offset the client asked for; records below it are skipped in typed results.
        self.fetch_offset = fetch_offset
        self.max_bytes = max_bytes
        self.next_offset = fetch_offset
        self.chunks: list[bytes] = []
        self.size = 0
        self.high_watermark = -1
        self.log_start_offset = -1
        self.error: errors.TributaryError | None = None
        #: read_committed: the aborted transactions (producer id, first offset) met so far
        #: (grown by ``add_aborted``).
        self.aborted: frozenset[tuple[int, int]] = _NO_ABORTED

    def add_aborted(self, aborted: tuple[tuple[int, int], ...]) -> None:
        if aborted:
            self.aborted = self.aborted.union(aborted)

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


#: What a typed record costs in the answer beyond its decompressed bytes in the batch: protobuf
#: carries its absolute offset and timestamp, its timestamp type and the repeated field's framing
#: (measured: 9-10 bytes with no header, ~5 more per header; 24 covers up to three headers).
RECORD_FRAMING_BYTES = 24


def record_cost(record: Record) -> int:
    """A typed record's estimated size in the answer: its bytes plus the protobuf framing."""
    size = RECORD_FRAMING_BYTES + len(record.key or b"") + len(record.value or b"")
    for key, value in record.headers:
        size += len(key) + len(value or b"") + 6
    return size


class DecodeBudget:
    """What one typed answer may still decode, shared by its partitions in request order.

    Two bounds: records (each costs a few hundred bytes of Python objects and protobuf, whatever
    its size) and answer bytes: decompressed record bytes plus ``RECORD_FRAMING_BYTES`` per
    record, an estimate of the protobuf answer's size. The first batch with records always
    returns at least one record, so every answer makes progress; it is cut inside when its
    records do not fit (a compressed batch may decompress to far more than the bound). After
    that an answer stops at the first batch that does not fit, and the rest comes in the next
    fetch.
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

    @staticmethod
    def batch_cost(payload_size: int, record_count: int) -> int:
        return payload_size + RECORD_FRAMING_BYTES * record_count

    def window(self, payload_size: int, record_count: int = 0) -> int | None:
        """The most records a batch with ``payload_size`` decompressed bytes (and
        ``record_count`` records) may return, or None when the answer is full."""
        cost = self.batch_cost(payload_size, record_count)
        if self.records and (self.records_left <= 0 or cost > self.bytes_left):
            return None
        return max(1, self.records_left)

    def full_before(self, batch_size: int) -> bool:
        """Whether the answer is full before even decompressing a batch of ``batch_size`` bytes
        (its records take at least the bytes after the header)."""
        return bool(self.records) and (
            self.records_left <= 0 or batch_size - RECORD_BATCH_OVERHEAD > self.bytes_left
        )

    def fit(self, records: list[Record], payload_size: int, record_count: int) -> tuple[list[Record], int]:
        """The records of a decoded batch that fit, and what they cost.

        Only the answer's first batch can be over the bound here (:meth:`window` refuses the
        others); it keeps the records that fit, at least one. Each record is sized only then.
        """
        cost = self.batch_cost(payload_size, record_count)
        if cost <= self.bytes_left or not records:
            return records, cost
        kept = total = 0
        for record in records:
            size = record_cost(record)
            if kept and total + size > self.bytes_left:
                break
            kept += 1
            total += size
        return records[:kept], total

    def spend(self, records: int, cost: int) -> None:
        self.records_left -= records
        self.bytes_left -= cost
        self.records += records
        self.payload_bytes += cost


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
                window = budget.window(len(payload), batch.record_count)
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
            read = len(records)
            records, cost = budget.fit(records, len(payload), batch.record_count)
            budget.spend(len(records), cost)
            if records:
                decoded.append((batch.timestamp_type, records))
            if read == window or len(records) < read:  # cut: the batch may hold more
                return DecodedPartition(decoded, records[-1].offset + 1)
            next_offset = batch.next_offset
    return DecodedPartition(decoded, next_offset)
