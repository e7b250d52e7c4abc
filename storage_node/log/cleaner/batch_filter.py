"""Rewriting one record batch without the records compaction drops. Pure byte-format code.

Kafka's ``MemoryRecords.filterTo``, for RecordBatch v2: the records a caller keeps are copied
byte for byte (a record's bytes hold only deltas from the batch's base offset and base
timestamp, both of which the rewritten batch keeps), recompressed with the batch's own codec,
under a header that keeps every field but ``recordCount``, ``batchLength`` and the CRC:

* ``baseOffset`` and ``lastOffsetDelta`` -- so offsets never change and the batch still ends at
  the same offset (the producer's last sequence is ``baseSequence + lastOffsetDelta``);
* ``producerId``, ``producerEpoch``, ``baseSequence``, the transactional and control bits --
  what idempotence and transactions read;
* ``baseTimestamp``, ``maxTimestamp``, the timestamp type -- so record timestamps, the time
  index and time retention see what they saw before.

A batch whose records all go is dropped, unless the caller must keep it (the last batch of a
producer, whose sequence numbers idempotence needs after a restart): then an empty batch -- the
header alone, ``recordCount`` 0, no compression -- keeps the other header fields (Kafka writes
the same).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import crc32c

from services.errors import CorruptRecordError
from services.records import Compression, RecordBatchView
from services.records.compression import compress
from services.records.format import (
    COMPRESSION_CODEC_MASK,
    CRC_COVERED_HEADER_STRUCT,
    MAGIC,
    MIN_BATCH_LENGTH,
    PREFIX_STRUCT,
)
from services.records.varint import decode_varint, decode_varlong


@dataclass(frozen=True, slots=True)
class RecordSpan:
    """One record inside a batch's (decompressed) payload, with what compaction decides on."""

    start: int
    end: int
    offset: int
    key: bytes | None
    is_tombstone: bool


def record_spans(view: RecordBatchView, payload: bytes | None = None) -> list[RecordSpan]:
    """Every record of ``view`` as a byte range of its decompressed payload (``payload`` if the
    caller has it), with its absolute offset, key and whether its value is null.

    Raises CorruptRecordError for records that do not parse or do not fill the payload exactly.
    """
    data = view.payload() if payload is None else payload
    base_offset = view.base_offset
    spans: list[RecordSpan] = []
    pos, end = 0, len(data)
    try:
        for _ in range(view.record_count):
            start = pos
            length, pos = decode_varint(data, pos, end)
            record_end = pos + length
            if length < 0 or record_end > end:
                raise CorruptRecordError(f"record length {length} runs past the batch")
            cursor = pos + 1  # attributes
            _, cursor = decode_varlong(data, cursor, record_end)  # timestamp delta
            offset_delta, cursor = decode_varint(data, cursor, record_end)
            key_length, cursor = decode_varint(data, cursor, record_end)
            key: bytes | None = None
            if key_length >= 0:
                key = bytes(data[cursor : cursor + key_length])
                cursor += key_length
            value_length, cursor = decode_varint(data, cursor, record_end)
            if cursor > record_end or value_length < -1:
                raise CorruptRecordError("record fields run past the record")
            spans.append(RecordSpan(start, record_end, base_offset + offset_delta, key, value_length < 0))
            pos = record_end
    except IndexError:
        raise CorruptRecordError("record runs past the batch") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after {view.record_count} records")
    return spans


@dataclass(frozen=True, slots=True)
class FilteredBatch:
    """What filtering one batch produced: the bytes to write (None: drop it) and counts."""

    data: bytes | None
    records_kept: int
    records_removed: int


#: ``keep(offset, key, is_tombstone)``: whether a record stays.
KeepRecord = Callable[[int, "bytes | None", bool], bool]


def filter_batch(batch: bytes | memoryview, keep: KeepRecord, *, keep_empty: bool = False) -> FilteredBatch:
    """``batch`` without the records ``keep`` refuses.

    Returns the original bytes unchanged when every record stays; ``data=None`` when none stays
    and ``keep_empty`` is false; otherwise a rewritten batch (see the module docstring). The
    decisions are made on the decoded records (the C accelerator's loop); the records' byte
    ranges are only walked for a batch that loses some.
    """
    view = RecordBatchView(batch)
    payload = view.payload()
    decisions = [keep(r.offset, r.key, r.value is None) for r in view.read_records(payload)]
    kept_count = sum(decisions)
    removed = len(decisions) - kept_count
    if not removed:
        return FilteredBatch(bytes(batch), kept_count, 0)
    if not kept_count and not keep_empty:
        return FilteredBatch(None, 0, removed)
    spans = record_spans(view, payload)
    records = b"".join(
        payload[span.start : span.end] for span, kept in zip(spans, decisions, strict=True) if kept
    )
    return FilteredBatch(rebuild_batch(view, records, kept_count), kept_count, removed)


def rebuild_batch(view: RecordBatchView, records: bytes, record_count: int) -> bytes:
    """A batch with ``view``'s header fields around ``records`` (``record_count`` encoded
    records, uncompressed), compressed with ``view``'s codec; a new length and CRC."""
    header = view.header
    attributes = header.attributes
    if not record_count:
        attributes &= ~COMPRESSION_CODEC_MASK  # nothing to compress (Kafka's empty header too)
    codec = attributes & COMPRESSION_CODEC_MASK
    body = compress(Compression(codec), records) if codec else records
    covered = CRC_COVERED_HEADER_STRUCT.pack(
        attributes,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        record_count,
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    prefix = PREFIX_STRUCT.pack(
        header.base_offset, MIN_BATCH_LENGTH + len(body), header.partition_leader_epoch, MAGIC, crc
    )
    return b"".join((prefix, covered, body))
