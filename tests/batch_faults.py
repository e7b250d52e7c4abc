"""The hardening issue's malformed batches, built field by field, for unit and integration tests.

Each function returns one whole RecordBatch v2 (base offset 0, a valid CRC) that is wrong in one
way: the reproductions of the poison pills an old storage node stored (framing right, a record
inside wrong), the header states nothing here honours (transactional, idempotent, control), a
compressed payload past the decompression bound, and the issue's valid but huge batch (millions of
records in a small zstd payload). Written with ``struct`` and ``crc32c`` apart from the codec, so a
codec bug cannot hide in both the input and the check.
"""

from __future__ import annotations

import struct
import time

import crc32c
import zstandard

#: Attribute bits (services/records/format.py).
ZSTD = 0x04
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20


def zigzag(n: int) -> bytes:
    raw = (n << 1) ^ (n >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def nullable(data: bytes | None) -> bytes:
    return zigzag(-1) if data is None else zigzag(len(data)) + data


def record_body(
    offset_delta: int, key: bytes | None = b"k", value: bytes | None = b"v", headers: bytes = b"\x00"
) -> bytes:
    """attributes .. headers of one record; ``headers`` is the raw header count and headers."""
    return b"\x00" + zigzag(0) + zigzag(offset_delta) + nullable(key) + nullable(value) + headers


def framed(body: bytes) -> bytes:
    """A record: its body behind the right length prefix (what a framing-only check trusts)."""
    return zigzag(len(body)) + body


def batch(
    records: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    timestamp: int | None = None,
) -> bytes:
    """A batch around ``records`` (already compressed when ``attributes`` names a codec)."""
    ts = int(time.time() * 1000) if timestamp is None else timestamp
    lod = count - 1 if last_offset_delta is None else last_offset_delta
    covered = (
        struct.pack(">hiqqqhii", attributes, lod, ts, ts, producer_id, producer_epoch, base_sequence, count)
        + records
    )
    prefix = struct.pack(">qiib", base_offset, len(covered) + 9, -1, 2)
    return prefix + struct.pack(">I", crc32c.crc32c(covered)) + covered


def good(count: int = 3, **header) -> bytes:
    return batch(
        b"".join(framed(record_body(i, b"k%d" % i, b"value-%d" % i)) for i in range(count)), count, **header
    )


# --- item 3: records an old node stored because their framing was right ----------------------


def key_past_record() -> bytes:
    """The key length says 40 bytes; the record (and its length prefix) holds 3."""
    body = b"\x00" + zigzag(0) + zigzag(0) + zigzag(40) + b"key" + nullable(b"v") + b"\x00"
    return batch(framed(body), 1)


def million_headers() -> bytes:
    """A header count of 10**6 in a 9-byte record."""
    return batch(framed(record_body(0, headers=zigzag(10**6))), 1)


def duplicate_offset_deltas() -> bytes:
    """Two records, both at offset delta 0, in a batch that says offsets 0..1."""
    return batch(framed(record_body(0)) + framed(record_body(0)), 2)


def decompression_bomb(decompressed: int = 80 << 20) -> bytes:
    """A zstd payload of a few KiB that decompresses past the 64 MiB bound."""
    payload = zstandard.ZstdCompressor(level=3).compress(b"\x00" * decompressed)
    return batch(payload, 1, attributes=ZSTD)


POISON_PILLS = {
    "key-past-record": key_past_record,
    "million-headers": million_headers,
    "duplicate-offset-deltas": duplicate_offset_deltas,
}


# --- item 8: header states a producer may not send --------------------------------------------


def transactional_without_producer_id() -> bytes:
    return good(attributes=TRANSACTIONAL)


def transactional() -> bytes:
    return good(attributes=TRANSACTIONAL, producer_id=7, producer_epoch=0, base_sequence=0)


def control() -> bytes:
    return good(1, attributes=CONTROL)


def idempotent() -> bytes:
    return good(producer_id=7, producer_epoch=0, base_sequence=0)


def producer_id_without_epoch() -> bytes:
    return good(producer_id=7, producer_epoch=-1, base_sequence=0)


def producer_id_without_sequence() -> bytes:
    return good(producer_id=7, producer_epoch=0, base_sequence=-1)


def negative_producer_id() -> bytes:
    return good(producer_id=-5)


def log_append_time_from_producer() -> bytes:
    return good(attributes=LOG_APPEND_TIME)


HEADER_FAULTS = {
    "transactional-without-producer-id": transactional_without_producer_id,
    "control": control,
    "producer-id-without-epoch": producer_id_without_epoch,
    "producer-id-without-sequence": producer_id_without_sequence,
    "negative-producer-id": negative_producer_id,
}


# --- item 4: a valid batch that is small on the wire and huge decoded -----------------------


def huge_zstd_batch(count: int = 3_000_000) -> bytes:
    """``count`` records with null keys and empty values in one zstd batch (3 million: ~2 MB
    compressed, ~30 MB decompressed: the issue's reproduction)."""
    tail = b"\x01\x00\x00"  # key null, value empty, no headers
    parts = []
    for i in range(count):
        body = b"\x00\x00" + zigzag(i) + tail
        parts.append(zigzag(len(body)) + body)
    payload = zstandard.ZstdCompressor(level=3).compress(b"".join(parts))
    return batch(payload, count, attributes=ZSTD)
