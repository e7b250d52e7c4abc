"""A read-only, zero-copy view of one RecordBatch v2 in a buffer.

The storage node needs only the header properties, :meth:`RecordBatchView.validate` and
:attr:`~RecordBatchView.buffer`; consumers iterate the view.

Validation has three depths, chosen by the caller:

* header (``validate()``): lengths, magic, CRC-32C, codec id and the record-count / offset-delta
  invariants. Cheap: one CRC pass over the batch, no decompression.
* records (``validate_records()``, after ``validate()``): decompresses within a bound and walks
  every record field by field without building anything, requiring offset deltas 0..n-1: what
  the storage node runs on a producer's batch, so nothing it stores can fail a consumer.
* deep (``validate(deep=True)``): decompresses and decodes every record into objects and checks
  that they fill the batch exactly with strictly increasing offset deltas.

Thread-safety: a view is immutable and safe to share; it does not copy ``buffer``, so the bytes
must not change underneath it, and a ``bytearray`` under a live view cannot be resized.
"""

from __future__ import annotations

from collections.abc import Iterator

import crc32c

from services.errors import CorruptRecordError

# The codec functions are looked up on the module at each call, not imported: record.py binds
# them to the C or the Python versions, and the tests switch between the two.
from services.records import record as _record
from services.records.compression import decompress
from services.records.format import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_MASK,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC,
    MAX_DECOMPRESSED_SIZE,
    MIN_BATCH_LENGTH,
    MIN_RECORD_SIZE,
    RECORD_BATCH_OVERHEAD,
    RECORDS_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    Compression,
    TimestampType,
)
from services.records.header import BatchHeader, read_batch_header
from services.records.record import Record

_MAX_CODEC = max(Compression)
_new_header = tuple.__new__
_unpack_header = HEADER_STRUCT.unpack_from


#: The compiled accelerator whatever ``TRIBUTARY_NO_EXTENSIONS`` says: ``read_consumer_records``
#: uses its combined decoder exactly when ``record.decode_records`` is its decoder.
_COMPILED = _record.load_speedups()


def as_byte_view(buffer) -> memoryview:
    """``buffer`` as a flat memoryview of unsigned bytes, without copying."""
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class RecordBatchView:
    """The first batch in ``buffer`` (bytes, bytearray or memoryview; it may be longer).

    Construction checks only what is needed to know where the batch ends: the header is present,
    ``batch_length`` is at least the 49-byte minimum, and the buffer holds the whole batch.
    Otherwise it raises :class:`~services.errors.CorruptRecordError`. Call :meth:`validate` before
    trusting anything else.
    """

    __slots__ = ("_header", "_structure_checked", "_view")

    def __init__(self, buffer) -> None:
        view = memoryview(buffer)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        available = len(view)
        if available < RECORD_BATCH_OVERHEAD:
            read_batch_header(view)  # raises with the standard message
        header = _new_header(BatchHeader, _unpack_header(view))
        batch_length = header.batch_length
        if batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"batch length {batch_length} is below the minimum {MIN_BATCH_LENGTH}")
        size = batch_length + LOG_OVERHEAD
        if size > available:
            raise CorruptRecordError(f"batch of {size} bytes is truncated to {available} bytes in the buffer")
        self._view = view[:size] if size != available else view
        self._header = header
        self._structure_checked = False

    # --- header fields ---------------------------------------------------------------------

    @property
    def header(self) -> BatchHeader:
        """All header fields as one NamedTuple."""
        return self._header

    @property
    def buffer(self) -> memoryview:
        """Exactly this batch's bytes (a view into the caller's buffer, not a copy)."""
        return self._view

    @property
    def base_offset(self) -> int:
        return self._header.base_offset

    @property
    def batch_length(self) -> int:
        return self._header.batch_length

    @property
    def size_in_bytes(self) -> int:
        """``batch_length`` + 12: the whole batch."""
        return self._header.batch_length + LOG_OVERHEAD

    @property
    def partition_leader_epoch(self) -> int:
        return self._header.partition_leader_epoch

    @property
    def magic(self) -> int:
        return self._header.magic

    @property
    def crc(self) -> int:
        """The stored CRC-32C (see :meth:`compute_crc` for the actual one)."""
        return self._header.crc

    @property
    def attributes(self) -> int:
        return self._header.attributes

    @property
    def compression(self) -> Compression:
        """The codec; raises :class:`CorruptRecordError` for an unknown id (5-7)."""
        codec = self._header.attributes & COMPRESSION_CODEC_MASK
        if codec > _MAX_CODEC:
            raise CorruptRecordError(f"unknown compression codec id {codec}")
        return Compression(codec)

    @property
    def timestamp_type(self) -> TimestampType:
        if self._header.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self._header.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self._header.attributes & CONTROL_MASK)

    @property
    def last_offset_delta(self) -> int:
        return self._header.last_offset_delta

    @property
    def last_offset(self) -> int:
        return self._header.base_offset + self._header.last_offset_delta

    @property
    def next_offset(self) -> int:
        """The offset after this batch: ``last_offset + 1``."""
        return self._header.base_offset + self._header.last_offset_delta + 1

    @property
    def base_timestamp(self) -> int:
        """The first record's create time (Kafka's ``firstTimestamp``)."""
        return self._header.base_timestamp

    @property
    def max_timestamp(self) -> int:
        """The largest create time, or the broker's append time for ``LOG_APPEND_TIME``."""
        return self._header.max_timestamp

    @property
    def producer_id(self) -> int:
        return self._header.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._header.producer_epoch

    @property
    def base_sequence(self) -> int:
        return self._header.base_sequence

    @property
    def record_count(self) -> int:
        return self._header.record_count

    # --- validation ------------------------------------------------------------------------

    def compute_crc(self) -> int:
        """CRC-32C of attributes .. end of batch, the value ``crc`` should hold."""
        return crc32c.crc32c(self._view[ATTRIBUTES_OFFSET:])

    def is_valid(self) -> bool:
        """Whether header-level :meth:`validate` passes (no exception)."""
        try:
            self.validate()
        except CorruptRecordError:
            return False
        return True

    def validate(self, deep: bool = False) -> None:
        """Raise :class:`CorruptRecordError` unless the batch is well-formed.

        Header level: magic is 2; the CRC matches; the codec id is known; ``record_count >= 0``;
        ``last_offset_delta >= 0``; ``record_count <= last_offset_delta + 1``; and, uncompressed,
        the records could fit in the batch (7 bytes each at least).

        ``deep=True`` also decodes every record (decompressing, bounded by
        ``MAX_DECOMPRESSED_SIZE``): exactly ``record_count`` records must fill the payload, offset
        deltas must strictly increase and end at or below ``last_offset_delta``, header keys must
        be UTF-8.
        """
        header = self._header
        # Magic first: what the CRC covers depends on it.
        if header.magic != MAGIC:
            raise CorruptRecordError(f"unsupported magic {header.magic}, expected {MAGIC}")
        actual_crc = crc32c.crc32c(self._view[ATTRIBUTES_OFFSET:])
        if actual_crc != header.crc:
            raise CorruptRecordError(
                f"batch at base offset {header.base_offset} is corrupt "
                f"(stored crc {header.crc:#010x}, computed {actual_crc:#010x})"
            )
        self._ensure_valid_structure()
        if deep:
            self.read_records()

    def validate_records(self, max_decompressed_size: int = MAX_DECOMPRESSED_SIZE) -> None:
        """Check every record as a broker must before storing a producer's batch (Kafka's
        ``LogValidator``): exactly ``record_count`` well-formed records fill the payload, with
        offset deltas 0 .. ``record_count - 1`` in order (see
        :func:`services.records.record.validate_records` for each check).

        Call it after :meth:`validate`. A compressed payload is decompressed first, refused as
        soon as its output would pass ``max_decompressed_size`` (nothing beyond the bound is
        allocated). Raises :class:`CorruptRecordError`.
        """
        self._ensure_valid_structure()
        header = self._header
        codec = header.attributes & COMPRESSION_CODEC_MASK
        payload = self._view[RECORDS_OFFSET:]
        # The C walk reads the memoryview in place; the Python one wants bytes (indexing bytes is
        # ~2x faster there, and copying 16 KiB costs far less than that).
        data: bytes | memoryview
        if codec:
            data = decompress(codec, payload, max_decompressed_size)
        else:
            data = payload if _record.speedups_enabled() else payload.tobytes()
        _record.validate_records(data, header.record_count)

    def _ensure_valid_structure(self) -> None:
        """The header checks that need no CRC: what decoding relies on. Done once per view."""
        if self._structure_checked:
            return
        _, _, _, magic, _, attributes, last_offset_delta, _, _, _, _, _, count = self._header
        if magic != MAGIC:
            raise CorruptRecordError(f"unsupported magic {magic}, expected {MAGIC}")
        codec = attributes & COMPRESSION_CODEC_MASK
        if codec > _MAX_CODEC:
            raise CorruptRecordError(f"unknown compression codec id {codec}")
        if count < 0:
            raise CorruptRecordError(f"negative record count {count}")
        if last_offset_delta < 0:
            raise CorruptRecordError(f"negative last offset delta {last_offset_delta}")
        if count > last_offset_delta + 1:
            raise CorruptRecordError(
                f"{count} records cannot have distinct offsets within last offset delta {last_offset_delta}"
            )
        payload = len(self._view) - RECORDS_OFFSET
        if codec == Compression.NONE and count * MIN_RECORD_SIZE > payload:
            raise CorruptRecordError(f"{count} records cannot fit in {payload} bytes")
        self._structure_checked = True

    # --- records ---------------------------------------------------------------------------

    def records(self) -> Iterator[Record]:
        """The records with absolute offsets and timestamps.

        Decodes (and decompresses) the whole batch before the first record is returned, so a
        corrupt batch raises :class:`CorruptRecordError` before yielding anything. Does not check
        the CRC: call :meth:`validate` first when the bytes come from outside.
        """
        return iter(self.read_records())

    def __iter__(self) -> Iterator[Record]:
        return iter(self.read_records())

    def payload(self) -> bytes:
        """The records' bytes: decompressed (within ``MAX_DECOMPRESSED_SIZE``), or copied out of
        an uncompressed batch. For callers that account for decoded sizes before
        :meth:`read_records`; raises :class:`CorruptRecordError`."""
        self._ensure_valid_structure()
        codec = self._header.attributes & COMPRESSION_CODEC_MASK
        payload = self._view[RECORDS_OFFSET:]
        return decompress(codec, payload, MAX_DECOMPRESSED_SIZE) if codec else payload.tobytes()

    def read_records(
        self,
        payload: bytes | None = None,
        *,
        first_offset: int | None = None,
        max_records: int | None = None,
    ) -> list[Record]:
        """A window of the records: those at or above ``first_offset``, at most ``max_records``.

        For readers that must bound what one call builds (a fetch answer over a batch of
        millions of records): records below the window are checked but never built, and
        decoding stops once the window is full, so the records after it are not read (their
        faults show to the call that reaches them). ``payload`` is :meth:`payload`'s result when
        the caller already has it. Like :meth:`records`, this does not check the CRC.
        """
        self._ensure_valid_structure()
        return _record.decode_records(
            self.payload() if payload is None else payload,
            *self._decoder_header(),
            first_offset,
            max_records,
        )

    def _decoder_header(self) -> tuple[int, int, int, int | None, int]:
        """What every record decoder takes from the header, in its argument order: the record
        count, base offset, base timestamp, the log-append time (None for create time) and the
        last offset delta. The structure must have been checked."""
        header = self._header
        return (
            header.record_count,
            header.base_offset,
            header.base_timestamp,
            header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None,
            header.last_offset_delta,
        )

    def read_consumer_records(
        self, consumer_type: type, topic: str, partition: int, *, first_offset: int | None = None
    ) -> list:
        """:meth:`read_records`' records at or above ``first_offset`` as ``consumer_type`` tuples
        ``(topic, partition, offset, timestamp, timestamp_type, key, value, headers)``: what a
        consumer hands out, built in one pass (in C with the accelerator, without the collector
        walking the intermediate ``Record``s). The same checks and errors as :meth:`read_records`."""
        self._ensure_valid_structure()
        header = self._header
        attributes = header.attributes
        speedups = _COMPILED
        in_c = speedups is not None and _record.decode_records is speedups.decode_records
        # The C decoder reads any buffer: an uncompressed batch is read in place, not copied.
        in_place = in_c and not attributes & COMPRESSION_CODEC_MASK
        arguments = (
            self._view[RECORDS_OFFSET:] if in_place else self.payload(),
            *self._decoder_header(),
            first_offset,
        )
        timestamp_type = 1 if attributes & TIMESTAMP_TYPE_MASK else 0  # TimestampType, without the enum
        if in_c:
            assert speedups is not None
            return speedups.decode_consumer_records(
                *arguments, consumer_type, topic, partition, timestamp_type
            )
        records = _record.decode_records(*arguments)  # type: ignore[arg-type] # any buffer
        _record.py_as_consumer_records(records, consumer_type, topic, partition, timestamp_type)
        return records

    def read_columns(
        self,
        columns,
        payload: bytes | memoryview | None = None,
        *,
        first_offset: int | None = None,
        max_records: int | None = None,
    ) -> int:
        """:meth:`read_records`' window of records appended to ``columns`` (a
        :class:`services.records.columns.Columns`) as Arrow buffers instead of built as
        ``Record`` objects; how many were appended. On :class:`CorruptRecordError` nothing of
        this batch is in ``columns``. Like :meth:`records`, this does not check the CRC."""
        self._ensure_valid_structure()
        header = self._header
        attributes = header.attributes
        if payload is None:
            codec = attributes & COMPRESSION_CODEC_MASK
            # Uncompressed records are read in place (the C decoder takes the memoryview).
            payload = self.payload() if codec else self._view[RECORDS_OFFSET:]
        return columns.append(
            payload,
            *self._decoder_header(),
            first_offset,
            max_records,
        )

    def __repr__(self) -> str:
        h = self._header
        return (
            f"RecordBatchView(base_offset={h.base_offset}, last_offset_delta={h.last_offset_delta}, "
            f"record_count={h.record_count}, size_in_bytes={self.size_in_bytes}, "
            f"attributes={h.attributes:#06x}, crc={h.crc:#010x})"
        )
