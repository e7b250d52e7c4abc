"""In-place header rewrites for the broker, which must never re-encode a batch.

Each function changes the first batch in a writable buffer (``bytearray`` or writable
``memoryview``); a read-only buffer raises ``TypeError``. The batch must lie whole in the buffer,
else :class:`~services.errors.CorruptRecordError`; an out-of-range argument raises ``ValueError``.

``baseOffset`` and ``partitionLeaderEpoch`` precede the CRC field, outside its coverage, so
setting them keeps the CRC valid. The timestamp type and ``maxTimestamp`` are covered, so
:func:`set_log_append_time` recomputes it (Kafka's ``DefaultRecordBatch.setMaxTimestamp``).
"""

from __future__ import annotations

import crc32c

from services.errors import CorruptRecordError
from services.records.batch import RecordBatchView, as_byte_view
from services.records.format import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_SEQUENCE_OFFSET,
    CRC_OFFSET,
    INT16,
    INT32,
    INT32_MAX,
    INT32_MIN,
    INT64,
    INT64_MAX,
    INT64_MIN,
    MAGIC,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    UINT32,
)


def _writable_batch(buf) -> tuple[memoryview, RecordBatchView]:
    view = as_byte_view(buf)
    if view.readonly:
        raise TypeError("in-place batch writes need a writable buffer (bytearray or memoryview)")
    batch = RecordBatchView(view)
    return batch.buffer, batch


def _ensure_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} {value} out of range [{low}, {high}]")


def set_base_offset(buf, base_offset: int) -> None:
    """Write ``baseOffset`` (the broker's offset assignment). The CRC stays valid."""
    _ensure_range("base_offset", base_offset, INT64_MIN, INT64_MAX)
    view, _ = _writable_batch(buf)
    INT64.pack_into(view, BASE_OFFSET_OFFSET, base_offset)


def set_partition_leader_epoch(buf, epoch: int) -> None:
    """Write ``partitionLeaderEpoch``. The CRC stays valid."""
    _ensure_range("epoch", epoch, INT32_MIN, INT32_MAX)
    view, batch = _writable_batch(buf)
    _ensure_magic(batch)
    INT32.pack_into(view, PARTITION_LEADER_EPOCH_OFFSET, epoch)


def stamp_validated_batch(buf, position: int, base_offset: int, epoch: int) -> None:
    """Write ``baseOffset`` and ``partitionLeaderEpoch`` of the batch at ``position`` of a writable
    buffer the caller has already validated (the broker's append path: one payload, many
    batches). No view and no header re-check per batch; ranges are still checked. CRC stays valid."""
    _ensure_range("base_offset", base_offset, INT64_MIN, INT64_MAX)
    _ensure_range("epoch", epoch, INT32_MIN, INT32_MAX)
    INT64.pack_into(buf, position + BASE_OFFSET_OFFSET, base_offset)
    INT32.pack_into(buf, position + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf, timestamp_ms: int) -> None:
    """Mark the batch ``LOG_APPEND_TIME`` with ``maxTimestamp = timestamp_ms``; recompute the CRC.

    Readers then report ``timestamp_ms`` as every record's timestamp. The other attribute bits
    (codec, transactional, control, unused) are kept as they are. As in Kafka, a batch that
    already carries this append time is left untouched.
    """
    _ensure_range("timestamp_ms", timestamp_ms, INT64_MIN, INT64_MAX)
    view, batch = _writable_batch(buf)
    _ensure_magic(batch)
    if batch.attributes & TIMESTAMP_TYPE_MASK and batch.max_timestamp == timestamp_ms:
        return
    INT16.pack_into(view, ATTRIBUTES_OFFSET, batch.attributes | TIMESTAMP_TYPE_MASK)
    INT64.pack_into(view, MAX_TIMESTAMP_OFFSET, timestamp_ms)
    UINT32.pack_into(view, CRC_OFFSET, crc32c.crc32c(view[ATTRIBUTES_OFFSET:]))


def set_producer_state(
    buf, producer_id: int, producer_epoch: int, base_sequence: int, *, transactional: bool = False
) -> None:
    """Write the producer id, epoch and base sequence (and the transactional bit) of a producer's
    batch; recompute the CRC. An idempotent producer numbers a batch when it is first sent, and
    renumbers it when its epoch is bumped (KIP-360), without re-encoding the records."""
    _ensure_range("producer_id", producer_id, -1, INT64_MAX)
    _ensure_range("producer_epoch", producer_epoch, -1, 2**15 - 1)
    _ensure_range("base_sequence", base_sequence, -1, INT32_MAX)
    view, batch = _writable_batch(buf)
    _ensure_magic(batch)
    attributes = (
        batch.attributes | TRANSACTIONAL_MASK if transactional else batch.attributes & ~TRANSACTIONAL_MASK
    )
    INT16.pack_into(view, ATTRIBUTES_OFFSET, attributes)
    INT64.pack_into(view, PRODUCER_ID_OFFSET, producer_id)
    INT16.pack_into(view, PRODUCER_EPOCH_OFFSET, producer_epoch)
    INT32.pack_into(view, BASE_SEQUENCE_OFFSET, base_sequence)
    UINT32.pack_into(view, CRC_OFFSET, crc32c.crc32c(view[ATTRIBUTES_OFFSET:]))


def _ensure_magic(batch: RecordBatchView) -> None:
    # These fields only exist at these positions in magic 2; writing them into an older message
    # format would corrupt it.
    if batch.magic != MAGIC:
        raise CorruptRecordError(f"unsupported magic {batch.magic}, expected {MAGIC}")
