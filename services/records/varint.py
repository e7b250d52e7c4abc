"""Zigzag base-128 varints, as Kafka's ``ByteUtils`` writes them (protobuf ``sint32``/``sint64``).

A *varint* carries an int32 in at most 5 bytes, a *varlong* an int64 in at most 10. Encoding
rejects out-of-range values with ``ValueError`` (a caller bug); decoding rejects overlong, truncated
or out-of-range input with :class:`~services.errors.CorruptRecordError` (bad data). Decoders never
read past ``end`` and never loop more than 10 times.

The tables below serve the record hot loops in ``record.py`` and ``builder.py``: most lengths,
offset deltas and timestamp deltas in a batch fit in one or two varint bytes, and a tuple lookup is
several times cheaper than a call to :func:`encode_varint`.
"""

from __future__ import annotations

from services.errors import CorruptRecordError
from services.records.format import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

#: ``ZIGZAG_1[b]`` is the value of the one-byte varint ``b`` (``b < 0x80``).
ZIGZAG_1: tuple[int, ...] = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))


def _encode_unsigned(raw: int) -> bytes:
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


#: ``SMALL_VARINTS[n]`` is the encoding of ``n`` for ``0 <= n < SMALL_VARINT_LIMIT``: every
#: non-negative value that fits in one or two bytes. About 350 KiB, built once at import (~2 ms).
SMALL_VARINT_LIMIT = 8192
SMALL_VARINTS: tuple[bytes, ...] = tuple(_encode_unsigned(n << 1) for n in range(SMALL_VARINT_LIMIT))
#: A null key, value or header value is written as length -1.
NULL_VARINT = b"\x01"


def encode_varint(value: int) -> bytes:
    """The zigzag varint encoding of an int32 (1 to 5 bytes)."""
    if 0 <= value < SMALL_VARINT_LIMIT:
        return SMALL_VARINTS[value]
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint out of int32 range: {value}")
    return _encode_unsigned((value << 1) ^ (value >> 31))


def encode_varlong(value: int) -> bytes:
    """The zigzag varlong encoding of an int64 (1 to 10 bytes)."""
    if 0 <= value < SMALL_VARINT_LIMIT:
        return SMALL_VARINTS[value]
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong out of int64 range: {value}")
    return _encode_unsigned((value << 1) ^ (value >> 63))


def size_of_varint(value: int) -> int:
    """Bytes :func:`encode_varint` / :func:`encode_varlong` would write for ``value``."""
    raw = (value << 1) ^ (value >> 63)
    size = 1
    while raw > 0x7F:
        raw >>= 7
        size += 1
    return size


def _decode(buf, pos: int, end: int, max_bytes: int, value_bits: int, kind: str) -> tuple[int, int]:
    start = pos
    raw = 0
    shift = 0
    while True:
        if pos - start == max_bytes:
            raise CorruptRecordError(f"{kind} longer than {max_bytes} bytes at byte {start}")
        if pos >= end:
            raise CorruptRecordError(f"truncated {kind} at byte {start}")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            if raw >> value_bits:
                # The last byte carried bits beyond 32 (varint) or 64 (varlong).
                raise CorruptRecordError(f"{kind} out of range at byte {start}")
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def decode_varint(buf, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """Decode an int32 varint at ``buf[pos]``; return ``(value, next_pos)``.

    ``buf`` is any indexable of ints (bytes, bytearray, memoryview). Reads nothing at or beyond
    ``end`` (default ``len(buf)``).
    """
    return _decode(buf, pos, len(buf) if end is None else end, 5, 32, "varint")


def decode_varlong(buf, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """Decode an int64 varlong at ``buf[pos]``; return ``(value, next_pos)``."""
    return _decode(buf, pos, len(buf) if end is None else end, 10, 64, "varlong")
