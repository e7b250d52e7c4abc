"""Oracles for the RecordBatch v2 tests.

Everything here is written independently of ``services.records`` (plain ``struct``, a hand-rolled
zigzag varint and ``crc32c``), so tests can compare the codec against bytes laid out field by field
from the Kafka schema rather than against itself.

Test modules import it relatively (``from .records_oracles import ...``), which works under the
project's ``--import-mode=importlib``.
"""

from __future__ import annotations

import struct
import warnings

import crc32c

with warnings.catch_warnings():
    # kafka-python (the interop oracle) trips importlib.resources deprecation warnings on import,
    # ~200 of them; not ours to fix. Imported here first (conftest loads this module) so the
    # test modules' own ``from kafka...`` imports hit the module cache quietly.
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.codec
    import kafka.record.default_records  # noqa: F401


def zigzag(n: int) -> bytes:
    """Kafka's zigzag varint, written the long way."""
    raw = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if raw < 0x80:
            out.append(raw)
            return bytes(out)
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7


def nullable(data: bytes | None) -> bytes:
    return zigzag(-1) if data is None else zigzag(len(data)) + data


def golden_record(offset_delta: int, timestamp_delta: int, key, value, headers=()) -> bytes:
    """One record, field by field: length, attributes, timestampDelta, offsetDelta, key, value, headers."""
    body = b"\x00" + zigzag(timestamp_delta) + zigzag(offset_delta) + nullable(key) + nullable(value)
    body += zigzag(len(headers))
    for header_key, header_value in headers:
        encoded = header_key.encode("utf-8")
        body += zigzag(len(encoded)) + encoded + nullable(header_value)
    return zigzag(len(body)) + body


def golden_batch(
    payload: bytes,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    magic: int = 2,
    attributes: int = 0,
    last_offset_delta: int = 0,
    base_timestamp: int = 0,
    max_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    record_count: int = 1,
    crc: int | None = None,
    batch_length: int | None = None,
) -> bytes:
    """A batch header around ``payload`` (already compressed if ``attributes`` says so).

    The CRC is CRC-32C over attributes .. end unless given; ``batch_length`` likewise.
    """
    covered = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        )
        + payload
    )
    if crc is None:
        crc = crc32c.crc32c(covered)
    if batch_length is None:
        batch_length = 4 + 1 + 4 + len(covered)  # partitionLeaderEpoch + magic + crc + covered
    return struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, magic, crc) + covered


def rewrite(batch: bytes, fmt: str, offset: int, value: int, *, fix_crc: bool = True) -> bytes:
    """``batch`` with one header field replaced, and the CRC recomputed unless told otherwise."""
    out = bytearray(batch)
    struct.pack_into(fmt, out, offset, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def with_payload(batch: bytes, payload: bytes, **overrides) -> bytes:
    """``batch``'s header fields around a different payload (length and CRC recomputed)."""
    fields = struct.unpack_from(">qiibIhiqqqhii", batch)
    names = [
        "base_offset",
        "batch_length",
        "partition_leader_epoch",
        "magic",
        "crc",
        "attributes",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "record_count",
    ]
    kwargs = dict(zip(names, fields))
    del kwargs["crc"], kwargs["batch_length"]
    kwargs.update(overrides)
    return golden_batch(payload, **kwargs)
