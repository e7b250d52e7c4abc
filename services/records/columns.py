"""Records of RecordBatch v2 batches decoded straight into Arrow buffers (columns, not objects).

A :class:`Columns` accumulates the records of any number of batches -- one ``append`` per batch,
with :func:`~services.records.record.decode_records`' arguments, checks and window -- and
``take()`` hands everything over as raw Arrow buffers, ready for ``pyarrow.Array.from_buffers``
(:mod:`gateway.client.arrow` assembles them; this package does not import pyarrow):

====================  ===================================================================
buffer                contents
====================  ===================================================================
``offset``            int64 per record
``timestamp``         int64 per record, milliseconds (the batch's append time for
                      ``LOG_APPEND_TIME``)
``timestamp_type``    int32 per record: 0 create time, 1 log-append time
``key_offsets``       int32 per record + 1, starting at 0; ``key_data`` the bytes;
``key_data``          ``key_validity`` one bit per record (LSB first), clear for a null key
``key_validity``
``value_*``           the same for values (a null value is a tombstone)
``header_offsets``    int32 per record + 1: where each record's headers start in the header
                      columns (only with ``include_headers``)
``hkey_*``            header keys (UTF-8, never null): offsets and data
``hvalue_*``          header values: offsets, data, validity
====================  ===================================================================

``take()`` returns ``(rows, buffers, (key_nulls, value_nulls, header_value_nulls))`` and starts
over. A failed ``append`` (:class:`~services.errors.CorruptRecordError` for bad bytes) leaves
the columns as they were before it, so the records of earlier batches can still be handed out.

:class:`PyColumns` is the reference, built on the row decoder (``py_decode_records``); the C
accelerator's ``Columns`` (``_speedups.c``) must give the same buffers for every input and fail
on the same inputs. :data:`Columns` is the C class when the accelerator is in use (see
:func:`~services.records.record.speedups_enabled`), else :class:`PyColumns`.
"""

from __future__ import annotations

from array import array

from services.errors import CorruptRecordError
from services.records import record as _record
from services.records.format import RECORD_BATCH_OVERHEAD

#: The names of ``take()``'s buffers, in order (the last six only with ``include_headers``).
COLUMN_BUFFERS = (
    "offset",
    "timestamp",
    "timestamp_type",
    "key_offsets",
    "key_data",
    "key_validity",
    "value_offsets",
    "value_data",
    "value_validity",
    "header_offsets",
    "hkey_offsets",
    "hkey_data",
    "hvalue_offsets",
    "hvalue_data",
    "hvalue_validity",
)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_BIG_ENDIAN = array("H", [1]).tobytes() == b"\x00\x01"

Taken = tuple[int, tuple[bytes, ...], tuple[int, int, int]]


class _Binary:
    """One Arrow binary column being built: end offsets, data and a validity bit per item."""

    __slots__ = ("data", "nulls", "offsets", "valid")

    def __init__(self) -> None:
        self.offsets = array("i", [0])
        self.data = bytearray()
        self.valid: list[bool] = []
        self.nulls = 0

    def add(self, item: bytes | None) -> None:
        if item is None:
            self.valid.append(False)
            self.nulls += 1
        else:
            if len(self.data) + len(item) > _INT32_MAX:
                raise OverflowError("an Arrow batch holds at most 2 GiB of keys, values or header data")
            self.data += item
            self.valid.append(True)
        self.offsets.append(len(self.data))

    def buffers(self) -> tuple[bytes, bytes, bytes]:
        return _le(self.offsets), bytes(self.data), _bitmap(self.valid)


class PyColumns:
    """The reference :class:`Columns`: each batch decoded to ``Record`` tuples by the reference
    row decoder, then written out column by column."""

    def __init__(self, *, include_headers: bool = False) -> None:
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self._offsets = array("q")
        self._timestamps = array("q")
        self._types = array("i")
        self._keys = _Binary()
        self._values = _Binary()
        self._header_offsets = array("i", [0])
        self._hkeys = _Binary()
        self._hvalues = _Binary()

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def last_offset(self) -> int | None:
        """The offset of the last record appended since the last ``take``, or ``None``."""
        return self._offsets[-1] if self._offsets else None

    def append(
        self,
        data,
        count: int,
        base_offset: int,
        base_timestamp: int,
        log_append_time: int | None,
        last_offset_delta: int,
        first_offset: int | None = None,
        max_records: int | None = None,
    ) -> int:
        """Decode one batch's records into the columns; how many were added (see the module)."""
        records = _record.py_decode_records(
            bytes(data),
            count,
            base_offset,
            base_timestamp,
            log_append_time,
            last_offset_delta,
            first_offset,
            max_records,
        )
        for r in records:
            if not _INT64_MIN <= r.offset <= _INT64_MAX:
                raise CorruptRecordError("record offset out of range")
            if not _INT64_MIN <= r.timestamp <= _INT64_MAX:
                raise CorruptRecordError("record timestamp out of range")
        # Built aside and merged only when the whole batch decoded: a failure changes nothing.
        staged = PyColumns(include_headers=self.include_headers)
        staged._fill(records, 0 if log_append_time is None else 1)
        self._merge(staged)
        return len(records)

    def _fill(self, records: list, timestamp_type: int) -> None:
        for r in records:
            self._offsets.append(r.offset)
            self._timestamps.append(r.timestamp)
            self._types.append(timestamp_type)
            self._keys.add(r.key)
            self._values.add(r.value)
            if self.include_headers:
                for key, value in r.headers:
                    self._hkeys.add(key.encode("utf-8"))
                    self._hvalues.add(value)
                self._header_offsets.append(len(self._hkeys.valid))

    def _merge(self, other: PyColumns) -> None:
        self._offsets.extend(other._offsets)
        self._timestamps.extend(other._timestamps)
        self._types.extend(other._types)
        header_base = len(self._hkeys.valid)
        for mine, theirs in ((self._keys, other._keys), (self._values, other._values)):
            _extend_binary(mine, theirs)
        if self.include_headers:
            _extend_binary(self._hkeys, other._hkeys)
            _extend_binary(self._hvalues, other._hvalues)
            self._header_offsets.extend(header_base + o for o in other._header_offsets[1:])

    def take(self) -> Taken:
        """Everything appended since the last ``take``, as Arrow buffers; then start over."""
        buffers = [
            _le(self._offsets),
            _le(self._timestamps),
            _le(self._types),
            *self._keys.buffers(),
            *self._values.buffers(),
        ]
        if self.include_headers:
            buffers += [_le(self._header_offsets), *self._hkeys.buffers()[:2], *self._hvalues.buffers()]
        taken = (
            len(self._offsets),
            tuple(buffers),
            (self._keys.nulls, self._values.nulls, self._hvalues.nulls),
        )
        self._reset()
        return taken


def _extend_binary(mine: _Binary, theirs: _Binary) -> None:
    base = len(mine.data)
    if base + len(theirs.data) > _INT32_MAX:
        raise OverflowError("an Arrow batch holds at most 2 GiB of keys, values or header data")
    mine.data += theirs.data
    mine.offsets.extend(base + o for o in theirs.offsets[1:])
    mine.valid += theirs.valid
    mine.nulls += theirs.nulls


def _le(values: array) -> bytes:
    """An array's items as little-endian bytes (Arrow's byte order)."""
    if _BIG_ENDIAN:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _bitmap(valid: list[bool]) -> bytes:
    """Arrow's validity bitmap: bit ``i % 8`` of byte ``i // 8`` set when item ``i`` is valid."""
    out = bytearray((len(valid) + 7) // 8)
    for i, ok in enumerate(valid):
        if ok:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


# ---- encoding: Arrow columns into records (the Spark sink) -------------------------------------

#: An Arrow binary column's buffers: (validity or None, int32 offsets or None if absent, data).
BinaryBuffers = tuple


def binary_items(column: BinaryBuffers, count: int) -> list[bytes | None]:
    """The items of a binary column given as buffers (the reference reads them one by one)."""
    validity, offsets, data = column
    if offsets is None:
        return [None] * count
    ends = array("i")
    ends.frombytes(bytes(memoryview(offsets))[: 4 * (count + 1)])
    if _BIG_ENDIAN:
        ends.byteswap()
    raw = bytes(memoryview(data))
    bits = bytes(memoryview(validity)) if validity is not None else None
    if len(ends) < count + 1 or any(ends[i + 1] < ends[i] for i in range(count)) or ends[count] > len(raw):
        raise ValueError("offsets out of bounds")
    return [
        None if bits is not None and not bits[i >> 3] & (1 << (i & 7)) else raw[ends[i] : ends[i + 1]]
        for i in range(count)
    ]


def py_encode_columns(
    count: int,
    keys: BinaryBuffers,
    values: BinaryBuffers,
    header_offsets=None,
    header_keys: BinaryBuffers | None = None,
    header_values: BinaryBuffers | None = None,
    rows=None,
) -> bytes:
    """The records part of a batch for rows of Arrow columns of ``count`` rows: offset deltas
    0, 1, ..., every timestamp delta 0; ``rows`` (int32 row numbers) picks the rows and their
    order, else all (see the C ``encode_columns``). The reference: the rows read out of the
    buffers and encoded by the Python builder."""
    from services.records.builder import RecordBatchBuilder

    key_items, value_items = binary_items(keys, count), binary_items(values, count)
    rows_headers: list[list] = [[] for _ in range(count)]
    if header_offsets is not None:
        starts = array("i")
        starts.frombytes(bytes(memoryview(header_offsets))[: 4 * (count + 1)])
        if _BIG_ENDIAN:
            starts.byteswap()
        total = starts[count]
        hkeys = binary_items(header_keys, total) if header_keys is not None else [None] * total
        hvalues = binary_items(header_values, total) if header_values is not None else [None] * total
        if any(k is None for k in hkeys):
            raise ValueError("a header has a null key")
        for i in range(count):
            rows_headers[i] = [
                (hkeys[h].decode("utf-8"), hvalues[h])  # type: ignore[union-attr]
                for h in range(starts[i], starts[i + 1])
            ]
    order = range(count)
    if rows is not None:
        order = array("i")  # type: ignore[assignment]
        order.frombytes(bytes(memoryview(rows)))  # type: ignore[attr-defined]
        if _BIG_ENDIAN:
            order.byteswap()  # type: ignore[attr-defined]
        if any(not 0 <= r < count for r in order):
            raise ValueError(f"a row is out of range for {count} rows")
    builder = RecordBatchBuilder()
    with _python_appends():
        for r in order:
            builder.append(value_items[r], timestamp=0, key=key_items[r], headers=rows_headers[r])
    return builder.build()[RECORD_BATCH_OVERHEAD:] if len(order) else b""


class _python_appends:
    """Within the block the builder encodes in Python (the reference must not use the C code)."""

    def __enter__(self) -> None:
        from services.records import builder

        self._saved = builder._append_record
        builder._append_record = None

    def __exit__(self, *exc_info) -> None:
        from services.records import builder

        builder._append_record = self._saved


def load_columns_class() -> type | None:
    """The C ``Columns`` class, or ``None`` without the accelerator (ignores the environment)."""
    speedups = _record.load_speedups()
    return None if speedups is None else speedups.Columns


#: The class this process uses: C with the accelerator, else the Python reference.
Columns: type = PyColumns if _record.speedups is None else _record.speedups.Columns
#: The encoder this process uses (C with the accelerator).
encode_columns = py_encode_columns if _record.speedups is None else _record.speedups.encode_columns
