"""Builds one RecordBatch v2, byte for byte as Kafka's ``MemoryRecordsBuilder`` lays it out.

Records are encoded as they are appended into one ``bytearray``; :meth:`RecordBatchBuilder.build`
compresses that once, packs the header and computes the CRC. Like Kafka (and unlike
kafka-python), the requested codec is always used, even when it does not shrink the payload.
"""

from __future__ import annotations

import crc32c

from services.records.compression import compress
from services.records.format import (
    CONTROL_MASK,
    CRC_COVERED_HEADER_STRUCT,
    INT16_MAX,
    INT16_MIN,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    MAGIC,
    MIN_BATCH_LENGTH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    PREFIX_STRUCT,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    Compression,
    TimestampType,
)
from services.records.record import speedups as _speedups
from services.records.varint import (
    NULL_VARINT,
    SMALL_VARINT_LIMIT,
    SMALL_VARINTS,
    encode_varint,
    encode_varlong,
)

#: The C encoder for one record (``_speedups.c``), or ``None``: record.py decides for the package.
_append_record = None if _speedups is None else _speedups.append_record

_BYTES_TYPES = (bytes, bytearray)
_SMALL_VARINT_BITS = SMALL_VARINT_LIMIT.bit_length() - 1
assert 1 << _SMALL_VARINT_BITS == SMALL_VARINT_LIMIT
_ATTRIBUTES_BYTE = b"\x00"  # record attributes: unused, always 0
_NO_HEADERS = b"\x00"  # header count 0


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} out of range [{low}, {high}]")


def _check_header_fields(
    base_offset: int, producer_id: int, producer_epoch: int, base_sequence: int, leader_epoch: int
) -> None:
    if (
        type(base_offset) is int
        and type(producer_id) is int
        and type(producer_epoch) is int
        and type(base_sequence) is int
        and type(leader_epoch) is int
        and INT64_MIN <= base_offset <= INT64_MAX
        and INT64_MIN <= producer_id <= INT64_MAX
        and INT16_MIN <= producer_epoch <= INT16_MAX
        and INT32_MIN <= base_sequence <= INT32_MAX
        and INT32_MIN <= leader_epoch <= INT32_MAX
    ):
        return
    # Slow path, only to name the offending argument.
    _check_range("base_offset", base_offset, INT64_MIN, INT64_MAX)
    _check_range("producer_id", producer_id, INT64_MIN, INT64_MAX)
    _check_range("producer_epoch", producer_epoch, INT16_MIN, INT16_MAX)
    _check_range("base_sequence", base_sequence, INT32_MIN, INT32_MAX)
    _check_range("partition_leader_epoch", leader_epoch, INT32_MIN, INT32_MAX)


def _as_bytes(name: str, data) -> bytes | bytearray:
    """Keys and values may be any bytes-like object; other buffers are copied to bytes, because
    ``len()`` of a memoryview or array counts items, not bytes."""
    if isinstance(data, _BYTES_TYPES):
        return data
    try:
        return memoryview(data).tobytes()
    except TypeError:
        raise TypeError(f"{name} must be bytes-like or None, not {type(data).__name__}") from None


def _encode_body(timestamp: int, timestamp_delta: int, offset_delta: int, key, value, headers) -> bytes:
    """One record after its length varint, for any values (the checked, slower path)."""
    _check_range("timestamp", timestamp, INT64_MIN, INT64_MAX)
    # recordCount is an int32 too, so the last offset delta is at most INT32_MAX - 1.
    if offset_delta >= INT32_MAX:
        raise ValueError(f"a batch holds at most {INT32_MAX} records")
    return b"".join(
        (
            _ATTRIBUTES_BYTE,
            encode_varlong(timestamp_delta),  # ValueError if the delta overflows int64
            encode_varint(offset_delta),
            NULL_VARINT if key is None else encode_varint(len(key)),
            key or b"",
            NULL_VARINT if value is None else encode_varint(len(value)),
            value or b"",
            _encode_headers(headers) if headers else _NO_HEADERS,
        )
    )


def _encode_headers(headers) -> bytes:
    parts: list[bytes | bytearray] = [encode_varint(len(headers))]
    for key, value in headers:
        if not isinstance(key, str):
            raise TypeError(f"header key must be str, not {type(key).__name__}")
        encoded_key = key.encode("utf-8")
        parts.append(encode_varint(len(encoded_key)))
        parts.append(encoded_key)
        if value is None:
            parts.append(NULL_VARINT)
        else:
            value = _as_bytes("header value", value)
            parts.append(encode_varint(len(value)))
            parts.append(value)
    return b"".join(parts)


class RecordBatchBuilder:
    """Accumulates records for one batch, then :meth:`build` returns the batch bytes.

    All arguments are keyword-only and default to what a non-idempotent producer writes
    (``base_offset`` 0, no producer id/epoch/sequence, leader epoch -1). Out-of-range arguments
    raise ``ValueError``; wrong types raise ``TypeError``. As in Kafka, a transactional batch needs
    a producer id, and a producer id needs an epoch and (unless a control batch) a base sequence.

    With ``LOG_APPEND_TIME`` the header's max timestamp is still the largest appended timestamp;
    brokers stamp the append time with :func:`~services.records.inplace.set_log_append_time`.

    Not thread-safe.
    """

    __slots__ = (
        "_attributes",
        "_base_offset",
        "_base_sequence",
        "_base_timestamp",
        "_compression",
        "_count",
        "_max_timestamp",
        "_partition_leader_epoch",
        "_producer_epoch",
        "_producer_id",
        "_records",
    )

    def __init__(
        self,
        *,
        compression: Compression = Compression.NONE,
        base_offset: int = 0,
        timestamp_type: TimestampType = TimestampType.CREATE_TIME,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        is_transactional: bool = False,
        is_control: bool = False,
        partition_leader_epoch: int = -1,
    ) -> None:
        # A builder per batch is on the producer hot path: the enum calls and range checks are
        # skipped when the arguments are already the right type and plainly in range.
        if type(compression) is not Compression:
            compression = Compression(compression)
        if type(timestamp_type) is not TimestampType:
            timestamp_type = TimestampType(timestamp_type)
        _check_header_fields(base_offset, producer_id, producer_epoch, base_sequence, partition_leader_epoch)
        self._compression = compression
        # Kafka's MemoryRecordsBuilder rules for idempotent and transactional batches.
        if is_transactional and producer_id == NO_PRODUCER_ID:
            raise ValueError("a transactional batch needs a producer id")
        if producer_id != NO_PRODUCER_ID:
            if producer_epoch == NO_PRODUCER_EPOCH:
                raise ValueError("a batch with a producer id needs a producer epoch")
            if base_sequence < 0 and not is_control:
                raise ValueError("a batch with a producer id needs a base sequence")
        self._base_offset = base_offset
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._partition_leader_epoch = partition_leader_epoch
        self._attributes = (
            int(compression)
            | (TIMESTAMP_TYPE_MASK if timestamp_type == TimestampType.LOG_APPEND_TIME else 0)
            | (TRANSACTIONAL_MASK if is_transactional else 0)
            | (CONTROL_MASK if is_control else 0)
        )
        self._records = bytearray()
        self._count = 0
        self._base_timestamp = 0
        self._max_timestamp = 0

    @property
    def record_count(self) -> int:
        """Records appended so far."""
        return self._count

    def size_in_bytes(self) -> int:
        """The batch size if built now, before compression (an upper bound for most payloads)."""
        return RECORD_BATCH_OVERHEAD + len(self._records)

    def append(self, value, *, timestamp: int, key=None, headers=()) -> int:
        """Append one record and return its offset delta (0, 1, 2, ...).

        ``value`` and ``key`` are bytes-like or ``None``; ``headers`` is a sequence of
        ``(str, bytes | None)`` pairs; ``timestamp`` is epoch milliseconds. The first record's
        timestamp becomes the batch's base timestamp; later ones may be smaller.
        """
        count = self._count
        if not count or type(timestamp) is not int:
            self._maybe_start(timestamp)
        # NOTE: with the C accelerator, the common case (int timestamps in range, bytes-like key
        # and value, tuple or list headers) is encoded straight onto the bytearray. For anything
        # else it writes nothing and returns False, and the Python below encodes the record or
        # raises, so every argument check stays in one place.
        if _append_record is not None and _append_record(
            self._records, timestamp, self._base_timestamp, count, key, value, headers
        ):
            if timestamp > self._max_timestamp:
                self._max_timestamp = timestamp
            self._count = count + 1
            return count
        timestamp_delta = timestamp - self._base_timestamp
        if key is not None and type(key) is not bytes:
            key = _as_bytes("key", key)
        if value is not None and type(value) is not bytes:
            value = _as_bytes("value", value)
        # NOTE: the producer hot path. When every varint is small (non-negative and below
        # SMALL_VARINT_LIMIT) each is one tuple lookup; a lookup past the table raises IndexError
        # and the record is encoded again by the general path. A negative timestamp delta would
        # index from the end, so it is routed to the general path explicitly.
        body = None
        if not timestamp_delta >> _SMALL_VARINT_BITS:
            small = SMALL_VARINTS
            try:
                body = b"".join(
                    (
                        _ATTRIBUTES_BYTE,
                        small[timestamp_delta],
                        small[count],
                        NULL_VARINT if key is None else small[len(key)],
                        key or b"",
                        NULL_VARINT if value is None else small[len(value)],
                        value or b"",
                        _encode_headers(headers) if headers else _NO_HEADERS,
                    )
                )
                length = small[len(body)]
            except IndexError:
                body = None
        if body is None:
            body = _encode_body(timestamp, timestamp_delta, count, key, value, headers)
            length = encode_varint(len(body))
        if timestamp > self._max_timestamp:
            if timestamp > INT64_MAX:
                raise ValueError(f"timestamp {timestamp} out of int64 range")
            self._max_timestamp = timestamp
        records = self._records
        records += length
        records += body
        self._count = count + 1
        return count

    def append_sized(self, value, timestamp: int, key=None, headers=()) -> int:
        """:meth:`append`, returning :meth:`size_in_bytes` afterwards instead of the offset delta
        (the delta is :attr:`record_count` before the call). For the producer's accumulator,
        which checks a batch's size after every record: one call instead of two."""
        count = self._count
        if (
            count
            and _append_record is not None
            and type(timestamp) is int
            and _append_record(self._records, timestamp, self._base_timestamp, count, key, value, headers)
        ):
            if timestamp > self._max_timestamp:
                self._max_timestamp = timestamp
            self._count = count + 1
        else:
            self.append(value, timestamp=timestamp, key=key, headers=headers)
        return RECORD_BATCH_OVERHEAD + len(self._records)

    def extend_encoded(self, records: bytes, count: int, timestamp: int) -> None:
        """Take ``count`` records already encoded (``services.records.columns.encode_columns``:
        offset deltas 0 .. count - 1, timestamp deltas 0) into an empty builder, all with
        ``timestamp``. The bytes are trusted as the encoder's; the broker validates every record."""
        if self._count:
            raise ValueError("extend_encoded needs an empty builder")
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        self._maybe_start(timestamp)
        self._records = bytearray(records)
        self._count = count

    def set_producer_state(
        self, producer_id: int, producer_epoch: int, base_sequence: int, *, is_transactional: bool = False
    ) -> None:
        """Number the batch for an idempotent producer before it is built: the same header fields
        :func:`~services.records.inplace.set_producer_state` writes into built bytes (with the
        same ranges), without a second pass over the records for the CRC."""
        _check_range("producer_id", producer_id, NO_PRODUCER_ID, INT64_MAX)
        _check_range("producer_epoch", producer_epoch, NO_PRODUCER_EPOCH, INT16_MAX)
        _check_range("base_sequence", base_sequence, -1, INT32_MAX)
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        if is_transactional:
            self._attributes |= TRANSACTIONAL_MASK
        else:
            self._attributes &= ~TRANSACTIONAL_MASK

    def _maybe_start(self, timestamp) -> None:
        """Check a timestamp off the fast path; the first one becomes the base timestamp."""
        _check_range("timestamp", timestamp, INT64_MIN, INT64_MAX)
        if not self._count:
            self._base_timestamp = self._max_timestamp = timestamp

    def build(self) -> bytes:
        """The batch: header, CRC and (compressed) records. Raises ``ValueError`` if empty.

        The builder is left unchanged: building again, or appending more and building, works.
        """
        count = self._count
        if not count:
            raise ValueError("cannot build an empty record batch")
        codec = self._compression
        # Uncompressed, the bytearray goes straight into the final join: one copy, not two.
        payload = compress(codec, self._records) if codec else self._records
        if len(payload) > INT32_MAX - MIN_BATCH_LENGTH:
            raise ValueError(f"batch payload of {len(payload)} bytes exceeds the int32 batch length")
        covered = CRC_COVERED_HEADER_STRUCT.pack(
            self._attributes,
            count - 1,  # lastOffsetDelta: offset deltas are 0 .. count - 1
            self._base_timestamp,
            self._max_timestamp,
            self._producer_id,
            self._producer_epoch,
            self._base_sequence,
            count,
        )
        crc = crc32c.crc32c(payload, crc32c.crc32c(covered))
        prefix = PREFIX_STRUCT.pack(
            self._base_offset,
            MIN_BATCH_LENGTH + len(payload),
            self._partition_leader_epoch,
            MAGIC,
            crc,
        )
        return b"".join((prefix, covered, payload))
