"""One decoded record, and the loop that decodes a batch's record bytes into them.

:func:`decode_records` is the consumer hot path, written as one flat loop on purpose. Measured
with ``bench/codec.py`` (CPython 3.11): the per-record cost is ~0.35 us of unavoidable work (two
slices and the ``Record`` tuple) plus ~0.5 us of varint parsing and checks. So the loop calls no
function per record except to build the ``Record``; one- and two-byte varints (nearly every
length, offset delta and timestamp delta) are decoded inline with table lookups, and only longer
ones and headers go through the checked helpers. Binding tables and constructors to locals, the
two-byte lookup tables (tuple indexing is specialised by CPython 3.11, shifts are not) and
``records.append`` took the loop from ~0.88 M to ~1.2 M records/s on 1000-record batches.

That is as far as Python goes, so this module and ``builder.py`` have an optional C accelerator,
``_speedups.c``, for the per-record loops (as aiokafka ships Cython ones). The Python functions
here stay the reference and the fallback: at import, :func:`decode_records` and
:func:`validate_records` are rebound to their C versions when the extension was built and the
environment variable ``TRIBUTARY_NO_EXTENSIONS`` is unset or empty. ``py_decode_records`` and
``py_validate_records`` always name the Python versions.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from services.errors import CorruptRecordError
from services.records.format import MIN_RECORD_SIZE
from services.records.varint import ZIGZAG_1, decode_varint, decode_varlong

Header = tuple[str, "bytes | None"]


class Record(NamedTuple):
    """A record as a consumer sees it: absolute offset and timestamp, key, value, headers.

    ``key`` and ``value`` are ``None`` when null (a null value is a tombstone); header values may
    be ``None`` too. For a ``LOG_APPEND_TIME`` batch ``timestamp`` is the batch's append time.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


_new_record = tuple.__new__  # skips NamedTuple's Python-level __new__ (one call per record)
_NO_HEADERS: tuple = ()

# Two-byte varint fast paths: for a first byte ``b >= 0x80`` and second byte ``c < 0x80`` the
# zigzag value is ``low[b] + sign[b] * (c << 6)``. Lengths and offset deltas are never negative
# in a valid batch, so their table maps a negative encoding (odd ``b``) to a huge negative number
# that the existing "negative length" / "not increasing" checks reject, saving the sign multiply.
# (So a two-byte, non-canonical encoding of a null value length, -1, is rejected; the canonical
# one-byte form is what every Kafka writer produces.)
_SIGNED_LOW = tuple(((b & 0x7F) >> 1) ^ -(b & 1) for b in range(0x100))
_SIGNED_SIGN = tuple(-1 if b & 1 else 1 for b in range(0x100))
# ``c << 6`` as a lookup: tuple indexing is specialised by CPython 3.11, shifts are not.
_HIGH = tuple(c << 6 for c in range(0x80))
_UNSIGNED_LOW = tuple(-(1 << 62) if b & 1 else (b & 0x7F) >> 1 for b in range(0x100))


def decode_records(  # noqa: C901 -- one flat loop on purpose: see the module docstring
    data: bytes,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
    last_offset_delta: int,
    first_offset: int | None = None,
    max_records: int | None = None,
) -> list[Record]:
    """Decode exactly ``count`` records that must fill ``data`` exactly.

    ``log_append_time`` replaces every record's timestamp when not ``None``. Raises
    :class:`CorruptRecordError` if a length runs past its record or the data, a varint is
    malformed, offset deltas are not strictly increasing or exceed ``last_offset_delta``, a header
    key is not UTF-8, or bytes are left over. Work is bounded by ``len(data)``.

    A window, for readers that must bound what one call materialises (a fetch answer): records
    below ``first_offset`` are checked but not returned, and decoding stops as soon as
    ``max_records`` (at least 1) records are in the list -- the rest of the batch is then not
    read, so its faults show only to a call that reaches them.
    """
    end = len(data)
    if count * MIN_RECORD_SIZE > end:
        raise CorruptRecordError(f"record count {count} cannot fit in {end} bytes of records")
    if max_records is not None and max_records < 1:
        raise ValueError(f"max_records must be at least 1, not {max_records}")
    # Deltas below first_delta are skipped; limit is never reached when there is no window.
    first_delta = -1 if first_offset is None else first_offset - base_offset
    limit = -1 if max_records is None else max_records
    records: list[Record] = []
    # NOTE: locals, not globals, inside the loop: each global lookup is a measurable cost here.
    # (``records.append(...)`` stays a method call: CPython 3.11 specialises exactly that form.)
    new_record = _new_record
    record_type = Record
    no_headers = _NO_HEADERS
    zigzag = ZIGZAG_1
    unsigned_low = _UNSIGNED_LOW
    signed_low = _SIGNED_LOW
    signed_sign = _SIGNED_SIGN
    high = _HIGH
    create_time = log_append_time is None
    previous_delta = -1
    pos = 0
    try:
        for _ in range(count):
            # length: varint
            b = data[pos]
            if b < 0x80:
                length = zigzag[b]
                pos += 1
            elif (c := data[pos + 1]) < 0x80:
                length = unsigned_low[b] + high[c]
                pos += 2
            else:
                length, pos = decode_varint(data, pos, end)
            # A length that is too small, too large or negative is caught by the end-of-record
            # check below (or an IndexError), so it is not checked here.
            record_end = pos + length
            # attributes: int8, unused; timestampDelta: varlong (may be negative)
            b = data[pos + 1]
            if b < 0x80:
                timestamp_delta = zigzag[b]
                pos += 2
            elif (c := data[pos + 2]) < 0x80:
                timestamp_delta = signed_low[b] + signed_sign[b] * high[c]
                pos += 3
            else:
                timestamp_delta, pos = decode_varlong(data, pos + 1, record_end)
            # offsetDelta: varint
            b = data[pos]
            if b < 0x80:
                offset_delta = zigzag[b]
                pos += 1
            elif (c := data[pos + 1]) < 0x80:
                offset_delta = unsigned_low[b] + high[c]
                pos += 2
            else:
                offset_delta, pos = decode_varint(data, pos, record_end)
            if offset_delta <= previous_delta:
                raise CorruptRecordError(
                    f"offset delta {offset_delta} does not increase (previous {previous_delta})"
                )
            previous_delta = offset_delta
            # key: varint length (-1 = null), bytes
            b = data[pos]
            if b < 0x80:
                size = zigzag[b]
                pos += 1
            else:
                size, pos = decode_varint(data, pos, record_end)
            if size >= 0:
                key = data[pos : pos + size]
                pos += size
            elif size == -1:
                key = None
            else:
                raise CorruptRecordError(f"negative key length {size}")
            # value: varint length (-1 = null), bytes
            b = data[pos]
            if b < 0x80:
                size = zigzag[b]
                pos += 1
            elif (c := data[pos + 1]) < 0x80:
                size = unsigned_low[b] + high[c]
                pos += 2
            else:
                size, pos = decode_varint(data, pos, record_end)
            if size >= 0:
                value = data[pos : pos + size]
                pos += size
            elif size == -1:
                value = None
            else:
                raise CorruptRecordError(f"negative value length {size}")
            # headers: varint count, then pairs
            if not data[pos]:
                headers = no_headers
                pos += 1
            else:
                headers, pos = _decode_headers(data, pos, record_end)
            # Slices above do not fail when a length overshoots; this check catches every case.
            if pos != record_end:
                raise CorruptRecordError(
                    f"record body is {length} bytes but its fields take {length + pos - record_end}"
                )
            if offset_delta < first_delta:
                continue
            records.append(
                new_record(
                    record_type,
                    (
                        base_offset + offset_delta,
                        base_timestamp + timestamp_delta if create_time else log_append_time,
                        key,
                        value,
                        headers,
                    ),
                )
            )
            if len(records) == limit:
                return records
    except IndexError:
        raise CorruptRecordError("record runs past the end of the batch") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after {count} records")
    if previous_delta > last_offset_delta:
        raise CorruptRecordError(f"offset delta {previous_delta} exceeds lastOffsetDelta {last_offset_delta}")
    return records


def _decode_headers(data: bytes, pos: int, record_end: int) -> tuple[tuple[Header, ...], int]:
    count, pos = decode_varint(data, pos, record_end)
    # Each header takes at least two bytes (two zero lengths).
    if count < 0 or 2 * count > record_end - pos:
        raise CorruptRecordError(f"header count {count} out of bounds")
    headers: list[Header] = []
    for _ in range(count):
        size, pos = decode_varint(data, pos, record_end)
        if size < 0 or size > record_end - pos:
            raise CorruptRecordError(f"header key length {size} out of bounds")
        try:
            key = data[pos : pos + size].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"header key is not UTF-8: {exc}") from None
        pos += size
        size, pos = decode_varint(data, pos, record_end)
        if size >= 0:
            if size > record_end - pos:
                raise CorruptRecordError(f"header value length {size} out of bounds")
            value = data[pos : pos + size]
            pos += size
        elif size == -1:
            value = None
        else:
            raise CorruptRecordError(f"negative header value length {size}")
        headers.append((key, value))
    return tuple(headers), pos


def validate_records(data, count: int) -> None:
    """Check that exactly ``count`` well-formed records fill ``data``, with offset deltas
    ``0 .. count - 1`` in order: what a broker checks before it stores a producer's batch
    (Kafka's ``LogValidator`` for magic 2), so that no consumer ever meets a record it cannot read.

    Every record is walked field by field without building anything: its length is a
    well-formed varint within the data and exactly covers its fields; the timestamp delta is a
    well-formed varlong; the offset delta equals the record's index; key, value and header lengths
    are -1 (null; never for a header key) or fit in the record; the header count is at most what
    the record's bytes could hold; header keys are UTF-8. What this accepts,
    :func:`decode_records` decodes (the tests check it). Raises :class:`CorruptRecordError` naming
    the record and the fault. Work is bounded by ``len(data)``; ``data`` is any indexable of
    bytes (bytes, bytearray, memoryview).
    """
    end = len(data)
    if count < 0 or count * MIN_RECORD_SIZE > end:
        raise CorruptRecordError(f"record count {count} cannot fit in {end} bytes of records")
    min_body = MIN_RECORD_SIZE - 1  # a record without its own length prefix
    pos = 0
    for index in range(count):
        if pos >= end:
            raise CorruptRecordError(f"the batch says {count} records but its bytes hold {index}")
        length, pos = decode_varint(data, pos, end)
        if length < min_body or length > end - pos:
            raise CorruptRecordError(f"record {index} has length {length} with {end - pos} bytes left")
        record_end = pos + length
        _, pos = decode_varlong(data, pos + 1, record_end)  # after the attributes byte
        offset_delta, pos = decode_varint(data, pos, record_end)
        if offset_delta != index:
            raise CorruptRecordError(
                f"record {index} has offset delta {offset_delta}; a producer's records must have "
                f"offset deltas 0..{count - 1} in order"
            )
        pos = _skip_bytes(data, pos, record_end, index, "key")
        if pos + 1 < record_end and data[pos] == 0x81 and data[pos + 1] == 0x00:
            # A null value length written in two bytes: decode_records's two-byte fast path reads
            # only non-negative lengths (every Kafka writer uses the one-byte form).
            raise CorruptRecordError(f"record {index} has a null value length in two bytes")
        pos = _skip_bytes(data, pos, record_end, index, "value")
        pos = _skip_headers(data, pos, record_end, index)
        if pos != record_end:
            raise CorruptRecordError(
                f"record {index} is {length} bytes but its fields take {length + pos - record_end}"
            )
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after {count} records")


def _skip_bytes(data, pos: int, record_end: int, index: int, what: str) -> int:
    """Past a nullable length-prefixed field (key, value, header value) within the record."""
    size, pos = decode_varint(data, pos, record_end)
    if size < -1 or size > record_end - pos:
        raise CorruptRecordError(
            f"record {index} has {what} length {size} with {record_end - pos} bytes left"
        )
    return pos + size if size > 0 else pos


def _skip_headers(data, pos: int, record_end: int, index: int) -> int:
    count, pos = decode_varint(data, pos, record_end)
    # Each header takes at least two bytes (two zero lengths).
    if count < 0 or 2 * count > record_end - pos:
        raise CorruptRecordError(
            f"record {index} has header count {count} with {record_end - pos} bytes left"
        )
    for _ in range(count):
        size, pos = decode_varint(data, pos, record_end)
        if size < 0 or size > record_end - pos:
            raise CorruptRecordError(
                f"record {index} has header key length {size} with {record_end - pos} bytes left"
            )
        try:
            str(data[pos : pos + size], "utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"record {index} has a header key that is not UTF-8: {exc}") from None
        pos = _skip_bytes(data, pos + size, record_end, index, "header value")
    return pos


# --- the optional C accelerator ------------------------------------------------------------------

#: The pure-Python implementations: the reference the C versions are tested against.
py_decode_records = decode_records
py_validate_records = validate_records


def py_scan_producer_batches(data, max_message_bytes: int, segment_bytes: int) -> None:
    """Pure Python has no fast path: ``storage_node.log.validation.validate_producer_batches``
    (the reference) checks every payload itself. The C version answers the common payloads
    (uncompressed batches that pass) in one call, and None for the others."""
    return None


scan_producer_batches = py_scan_producer_batches


def py_as_consumer_records(
    records: list, consumer_type: type, topic: str, partition: int, timestamp_type: int
) -> None:
    """Replace each ``Record`` of the list ``records``, in place, by a ``consumer_type`` tuple
    ``(topic, partition, offset, timestamp, timestamp_type, key, value, headers)`` (a Kafka
    ``ConsumerRecord``'s fields): the reference for the accelerator's ``as_consumer_records``."""
    records[:] = [
        _new_record(consumer_type, (topic, partition, r[0], r[1], timestamp_type, r[2], r[3], r[4]))
        for r in records
    ]


def load_speedups():
    """The compiled ``services.records._speedups`` module, initialised, or ``None`` if it was not
    built. Ignores ``TRIBUTARY_NO_EXTENSIONS``: the dispatch below and the tests decide."""
    try:
        from services.records import _speedups
    except ImportError:
        return None
    _speedups.init(Record, CorruptRecordError)
    return _speedups


#: The accelerator this process uses, or ``None`` for pure Python.
speedups = None if os.environ.get("TRIBUTARY_NO_EXTENSIONS") else load_speedups()
if speedups is not None:
    decode_records = speedups.decode_records
    validate_records = speedups.validate_records
    scan_producer_batches = speedups.scan_producer_batches


def speedups_enabled() -> bool:
    """Whether the record codec runs its per-record loops in C (``services.records._speedups``).

    False when the extension was not compiled (the install warns) or when the environment
    variable ``TRIBUTARY_NO_EXTENSIONS`` is set to a non-empty value; the results are the same
    either way, only slower.
    """
    return decode_records is not py_decode_records
