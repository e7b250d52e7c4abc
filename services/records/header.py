"""The 61-byte batch header as a value, read with one ``struct`` call.

For hot paths that need a few header fields of many batches (the storage node's append and
recovery scans) without building a :class:`~services.records.batch.RecordBatchView`.
"""

from __future__ import annotations

from typing import NamedTuple

from services.errors import CorruptRecordError
from services.records.format import HEADER_STRUCT, LOG_OVERHEAD, RECORD_BATCH_OVERHEAD


class BatchHeader(NamedTuple):
    """Every header field, in wire order. Nothing here is validated (see ``RecordBatchView``)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_in_bytes(self) -> int:
        """The whole batch, ``batch_length`` plus the 12 bytes before it counts."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


_new_header = tuple.__new__
_unpack_header = HEADER_STRUCT.unpack_from


def read_batch_header(buffer, offset: int = 0) -> BatchHeader:
    """Unpack the header of the batch starting at ``buffer[offset]``; no copy, no checks.

    Raises :class:`CorruptRecordError` only if fewer than 61 bytes are available; the fields
    themselves (length, magic, CRC) are the caller's to check.
    """
    if offset < 0 or len(buffer) - offset < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"{len(buffer) - offset} bytes at position {offset} cannot hold a "
            f"{RECORD_BATCH_OVERHEAD}-byte batch header"
        )
    return _new_header(BatchHeader, _unpack_header(buffer, offset))
