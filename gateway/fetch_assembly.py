"""Pure fetch-result assembly: trim fetched bytes to the byte budgets, decode typed records.

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
from services.records import Record, RecordBatchView, TimestampType, iter_batches


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


def decode_typed(chunks: list[bytes], fetch_offset: int) -> list[TypedBatch]:
    """Decode whole batches (CRC checked, as Kafka consumers do), skipping records below
    ``fetch_offset`` and control batches. Raises CorruptRecordError on bad bytes."""
    decoded: list[TypedBatch] = []
    for chunk in chunks:
        for batch in iter_batches(chunk):
            if batch.is_control or batch.last_offset < fetch_offset:
                continue
            decoded.append((batch.timestamp_type, _records_from(batch, fetch_offset)))
    return decoded


def _records_from(batch: RecordBatchView, fetch_offset: int) -> list[Record]:
    batch.validate()
    records = list(batch.records())
    if batch.base_offset < fetch_offset:
        records = [r for r in records if r.offset >= fetch_offset]
    return records
