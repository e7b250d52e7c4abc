"""Kafka RecordBatch v2 (magic 2): the byte layout, named offsets and constants.

This module is the single description of the on-wire and on-disk batch format; every other module
in ``services.records`` reads offsets and masks from here. Layout (all integers big-endian, as in
Kafka's ``DefaultRecordBatch``)::

    RecordBatch =>
      baseOffset           int64    offset of the first record; the broker rewrites it on append
      batchLength          int32    bytes that follow this field (partitionLeaderEpoch .. end)
      partitionLeaderEpoch int32    set by the broker on append
      magic                int8     2
      crc                  uint32   CRC-32C (Castagnoli) of attributes .. end of batch
      attributes           int16    see the bit table below
      lastOffsetDelta      int32    offset delta of the last record (also the last sequence delta)
      baseTimestamp        int64    timestamp of the first record ("firstTimestamp" in Kafka)
      maxTimestamp         int64    largest record timestamp, or the broker's append time
      producerId           int64    -1 when not idempotent
      producerEpoch        int16    -1 when not idempotent
      baseSequence         int32    -1 when not idempotent
      recordCount          int32    number of records that follow
      records              [Record] compressed as one blob when the codec bits are non-zero

    Record =>
      length               varint   bytes that follow (attributes .. headers)
      attributes           int8     unused, always 0
      timestampDelta       varlong  timestamp - baseTimestamp
      offsetDelta          varint   offset - baseOffset
      keyLength            varint   -1 for a null key
      key                  bytes
      valueLength          varint   -1 for a null value (a tombstone)
      value                bytes
      headerCount          varint
      headers              [headerKeyLength varint, headerKey utf-8,
                            headerValueLength varint (-1 = null), headerValue bytes]

    attributes bits:  0-2 compression codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)
                      3   timestamp type (0 create time, 1 log-append time)
                      4   transactional
                      5   control batch
                      6-15 unused here (Kafka uses bit 6 for the compaction delete horizon)

CRC coverage: the CRC starts at ``attributes`` and runs to the end of the batch. ``baseOffset``,
``batchLength``, ``partitionLeaderEpoch`` and ``magic`` lie *before* the CRC field, so the broker can
assign offsets and stamp the leader epoch in place without recomputing it. Changing the timestamp
type or ``maxTimestamp`` (log-append time) does require a new CRC.

Varints are zigzag-encoded base-128 (protobuf ``sint32``/``sint64``): a ``varint`` holds an int32
and takes at most 5 bytes, a ``varlong`` holds an int64 and takes at most 10.
"""

from __future__ import annotations

import struct
from enum import IntEnum

MAGIC = 2

#: One struct for the whole 61-byte header, in wire order (">" = big-endian, no padding).
HEADER_STRUCT = struct.Struct(
    ">"
    "q"  # baseOffset
    "i"  # batchLength
    "i"  # partitionLeaderEpoch
    "b"  # magic
    "I"  # crc (unsigned)
    "h"  # attributes
    "i"  # lastOffsetDelta
    "q"  # baseTimestamp
    "q"  # maxTimestamp
    "q"  # producerId
    "h"  # producerEpoch
    "i"  # baseSequence
    "i"  # recordCount
)

# Named byte offsets, derived from the struct so they cannot drift from it.
BASE_OFFSET_OFFSET = 0
BATCH_LENGTH_OFFSET = struct.calcsize(">q")
PARTITION_LEADER_EPOCH_OFFSET = struct.calcsize(">qi")
MAGIC_OFFSET = struct.calcsize(">qii")
CRC_OFFSET = struct.calcsize(">qiib")
ATTRIBUTES_OFFSET = struct.calcsize(">qiibI")
LAST_OFFSET_DELTA_OFFSET = struct.calcsize(">qiibIh")
BASE_TIMESTAMP_OFFSET = struct.calcsize(">qiibIhi")
MAX_TIMESTAMP_OFFSET = struct.calcsize(">qiibIhiq")
PRODUCER_ID_OFFSET = struct.calcsize(">qiibIhiqq")
PRODUCER_EPOCH_OFFSET = struct.calcsize(">qiibIhiqqq")
BASE_SEQUENCE_OFFSET = struct.calcsize(">qiibIhiqqqh")
RECORD_COUNT_OFFSET = struct.calcsize(">qiibIhiqqqhi")
RECORDS_OFFSET = HEADER_STRUCT.size

#: baseOffset + batchLength: the bytes not counted by batchLength.
LOG_OVERHEAD = BATCH_LENGTH_OFFSET + 4
#: A batch with no records is exactly its header.
RECORD_BATCH_OVERHEAD = RECORDS_OFFSET
#: The smallest legal value of the batchLength field.
MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD

# The pieces of the header around the CRC, for building and in-place rewriting.
PREFIX_STRUCT = struct.Struct(">qiibI")  # baseOffset .. crc
CRC_COVERED_HEADER_STRUCT = struct.Struct(">hiqqqhii")  # attributes .. recordCount
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

#: A record is at least 7 bytes: length, attributes, timestampDelta, offsetDelta, keyLength,
#: valueLength and headerCount, one byte each. Used to reject absurd record counts up front.
MIN_RECORD_SIZE = 7

#: Decompressing a batch never produces more than this many bytes; a larger output is treated as
#: a corrupt (or hostile) batch. Kafka's default max.message.bytes is ~1 MiB *compressed*; 64 MiB
#: leaves room for highly compressible batches while bounding what one bad batch can allocate.
MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Compression(IntEnum):
    """The codec id stored in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> Compression:
        """The codec for Kafka's ``compression.type`` spelling (``"none"``, ``"gzip"``, ...).

        Case-insensitive; raises ``ValueError`` for anything else.
        """
        try:
            return cls[name.upper()]
        except (KeyError, AttributeError):
            raise ValueError(
                f"unknown compression {name!r}; expected one of none, gzip, snappy, lz4, zstd"
            ) from None


class TimestampType(IntEnum):
    """Attribute bit 3: who chose the record timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1
