"""RecordBatchView: header properties, validation levels, and reading golden batches."""

from __future__ import annotations

import gzip
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from kafka.record.default_records import DefaultRecordBatch

from services.errors import CorruptRecordError
from services.records import (
    LOG_OVERHEAD,
    MAGIC,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Compression,
    Record,
    RecordBatchBuilder,
    RecordBatchView,
    TimestampType,
    read_batch_header,
)

from .records_oracles import golden_batch, golden_record, rewrite, with_payload

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

T0 = 1_700_000_000_000


def test_constants():
    assert (MAGIC, LOG_OVERHEAD, RECORD_BATCH_OVERHEAD) == (2, 12, 61)


def test_header_properties(three_record_batch):
    view = RecordBatchView(three_record_batch)
    assert view.base_offset == 100
    assert view.batch_length == len(three_record_batch) - 12
    assert view.size_in_bytes == len(three_record_batch)
    assert view.partition_leader_epoch == -1
    assert view.magic == 2
    assert view.crc == struct.unpack_from(">I", three_record_batch, 17)[0] == view.compute_crc()
    assert view.attributes == 0
    assert view.compression is Compression.NONE
    assert view.timestamp_type is TimestampType.CREATE_TIME
    assert not view.is_transactional and not view.is_control
    assert view.last_offset_delta == 2
    assert (view.last_offset, view.next_offset) == (102, 103)
    assert (view.base_timestamp, view.max_timestamp) == (T0, T0 + 5)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (-1, -1, -1)
    assert view.record_count == 3
    assert bytes(view.buffer) == three_record_batch
    assert view.header == read_batch_header(three_record_batch)
    assert isinstance(view.header, BatchHeader)
    assert view.header.next_offset == 103 and view.header.size_in_bytes == len(three_record_batch)
    assert view.is_valid()


def test_records_have_absolute_offsets_and_timestamps(three_record_batch):
    view = RecordBatchView(three_record_batch)
    view.validate(deep=True)
    assert list(view) == [
        Record(100, T0, b"k0", b"v0", (("h", b"x"), ("n", None))),
        Record(101, T0 + 5, None, None, ()),
        Record(102, T0 - 3, b"", b"", ()),
    ]
    assert list(view.records()) == list(view)
    assert all(type(r.key) in (bytes, type(None)) and type(r.value) in (bytes, type(None)) for r in view)


def test_log_append_time_replaces_every_timestamp(three_record_batch):
    data = rewrite(three_record_batch, ">h", 21, 0x08)  # attributes: LOG_APPEND_TIME
    view = RecordBatchView(data)
    assert view.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in view] == [T0 + 5] * 3


def test_view_is_zero_copy_and_ignores_trailing_bytes(three_record_batch):
    buffer = bytearray(three_record_batch + b"next batch starts here")
    view = RecordBatchView(buffer)
    assert view.buffer.obj is buffer
    assert view.size_in_bytes == len(three_record_batch)
    view.validate(deep=True)
    assert len(list(view)) == 3


def test_accepts_memoryview_of_other_formats(three_record_batch):
    padded = three_record_batch + b"\x00" * (-len(three_record_batch) % 4)
    view = RecordBatchView(memoryview(padded).cast("I"))
    view.validate(deep=True)


def test_empty_batch_is_valid():
    data = golden_batch(b"", record_count=0, last_offset_delta=0, base_timestamp=-1, max_timestamp=-1)
    view = RecordBatchView(data)
    view.validate(deep=True)
    assert list(view) == []
    assert view.size_in_bytes == RECORD_BATCH_OVERHEAD


def test_gaps_in_offsets_are_allowed_as_after_compaction():
    payload = golden_record(0, 0, b"a", b"1") + golden_record(7, 0, b"b", b"2")
    data = golden_batch(payload, last_offset_delta=9, record_count=2, base_offset=50)
    view = RecordBatchView(data)
    view.validate(deep=True)
    assert [r.offset for r in view] == [50, 57]
    assert view.next_offset == 60


# --- reading golden compressed batches, compressed by the libraries directly --------------------

PAYLOAD = b"".join(golden_record(i, i, b"key%d" % i, b"value %d " % i * 20) for i in range(40))


def _xerial(data: bytes) -> bytes:
    block = snappy.compress(data)
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block


GOLDEN_COMPRESSED = [
    pytest.param(Compression.NONE, PAYLOAD, id="none"),
    pytest.param(Compression.GZIP, gzip.compress(PAYLOAD, mtime=0), id="gzip"),
    pytest.param(Compression.SNAPPY, _xerial(PAYLOAD), id="snappy-xerial"),
    pytest.param(Compression.SNAPPY, snappy.compress(PAYLOAD), id="snappy-raw"),
    pytest.param(
        Compression.LZ4, lz4.frame.compress(PAYLOAD, block_linked=False, store_size=False), id="lz4"
    ),
    pytest.param(
        Compression.ZSTD, zstandard.ZstdCompressor(write_content_size=False).compress(PAYLOAD), id="zstd"
    ),
]


@pytest.mark.parametrize(("codec", "blob"), GOLDEN_COMPRESSED)
def test_reads_golden_batch(codec, blob):
    data = golden_batch(
        blob,
        attributes=int(codec),
        last_offset_delta=39,
        record_count=40,
        base_timestamp=T0,
        max_timestamp=T0 + 39,
        base_offset=1000,
    )
    view = RecordBatchView(data)
    view.validate(deep=True)
    assert view.compression is codec
    records = list(view)
    assert [r.offset for r in records] == list(range(1000, 1040))
    assert [r.timestamp for r in records] == [T0 + i for i in range(40)]
    assert records[7] == Record(1007, T0 + 7, b"key7", b"value 7 " * 20, ())


# --- header-level validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "offset", "value", "message"),
    [
        pytest.param(">b", 16, 1, "magic", id="magic-1"),
        pytest.param(">b", 16, 3, "magic", id="magic-3"),
        pytest.param(">h", 21, 5, "codec", id="codec-5"),
        pytest.param(">h", 21, 7, "codec", id="codec-7"),
        pytest.param(">i", 57, -1, "negative record count", id="count-negative"),
        pytest.param(">i", 23, -1, "negative last offset delta", id="delta-negative"),
        pytest.param(">i", 57, 4, "distinct offsets", id="count-above-delta"),
        pytest.param(">i", 57, 2**31 - 1, "distinct offsets", id="count-huge"),
    ],
)
def test_header_checks_with_a_valid_crc(three_record_batch, fmt, offset, value, message):
    data = rewrite(three_record_batch, fmt, offset, value)
    view = RecordBatchView(data)
    with pytest.raises(CorruptRecordError, match=message):
        view.validate()
    assert not view.is_valid()
    with pytest.raises(CorruptRecordError):
        list(view)


def test_record_count_that_cannot_fit_is_caught_at_header_level(three_record_batch):
    data = rewrite(rewrite(three_record_batch, ">i", 23, 2**31 - 2), ">i", 57, 2**31 - 1)
    with pytest.raises(CorruptRecordError, match="cannot fit"):
        RecordBatchView(data).validate()


def test_crc_mismatch(three_record_batch):
    data = rewrite(three_record_batch, ">I", 17, 0xDEADBEEF, fix_crc=False)
    view = RecordBatchView(data)
    with pytest.raises(CorruptRecordError, match="crc"):
        view.validate()
    assert view.compute_crc() != view.crc
    # records() does not check the CRC: that is validate()'s job.
    assert len(list(view)) == 3


def test_invalid_codec_property_raises(three_record_batch):
    view = RecordBatchView(rewrite(three_record_batch, ">h", 21, 6))
    with pytest.raises(CorruptRecordError):
        view.compression  # noqa: B018


# --- deep validation ---------------------------------------------------------------------------


def _deep_fails(batch: bytes, payload: bytes, message: str, **overrides) -> None:
    data = with_payload(batch, payload, **overrides)
    view = RecordBatchView(data)
    view.validate()  # the header is fine ...
    with pytest.raises(CorruptRecordError, match=message):
        view.validate(deep=True)  # ... the records are not
    with pytest.raises(CorruptRecordError, match=message):
        list(view)


def test_deep_fewer_records_than_counted(three_record_batch):
    payload = golden_record(0, 0, b"k", b"v1234567890") + golden_record(1, 0, b"k", b"v")
    _deep_fails(three_record_batch, payload, "past the end")


def test_deep_bytes_left_over(three_record_batch):
    payload = b"".join(golden_record(i, 0, b"k", b"v") for i in range(3)) + b"\x00"
    _deep_fails(three_record_batch, payload, "left after")


@pytest.mark.parametrize("deltas", [(0, 2, 1), (0, 1, 1), (1, 1, 2), (-1, 0, 1)], ids=str)
def test_deep_offsets_must_strictly_increase(three_record_batch, deltas):
    payload = b"".join(golden_record(delta, 0, None, b"v") for delta in deltas)
    _deep_fails(three_record_batch, payload, "does not increase")


def test_deep_offset_beyond_last_offset_delta(three_record_batch):
    payload = b"".join(golden_record(delta, 0, None, b"v") for delta in (0, 1, 5))
    _deep_fails(three_record_batch, payload, "exceeds lastOffsetDelta")


def test_deep_record_length_disagrees_with_fields(three_record_batch):
    record = bytearray(golden_record(0, 0, b"k", b"v"))
    record[0] += 2  # claims two more bytes than its fields take
    payload = bytes(record) + golden_record(1, 0, b"k", b"v") + golden_record(2, 0, b"k", b"v")
    _deep_fails(three_record_batch, payload, "record body")


def test_deep_header_key_must_be_utf8(three_record_batch):
    bad = golden_record(0, 0, b"k", b"v", (("\u00fc", b"x"),)).replace("\u00fc".encode(), b"\xff\xfe")
    payload = bad + golden_record(1, 0, b"k", b"v") + golden_record(2, 0, b"k", b"v")
    _deep_fails(three_record_batch, payload, "UTF-8")


def test_deep_compressed_payload_that_does_not_decompress(three_record_batch):
    data = with_payload(three_record_batch, b"not gzip at all", attributes=1)
    with pytest.raises(CorruptRecordError, match="gzip"):
        RecordBatchView(data).validate(deep=True)


# --- construction ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_length", [-1, 0, 48, -(2**31)])
def test_batch_length_below_minimum(three_record_batch, batch_length):
    data = rewrite(three_record_batch, ">i", 8, batch_length, fix_crc=False)
    with pytest.raises(CorruptRecordError, match="below the minimum"):
        RecordBatchView(data)


@pytest.mark.parametrize("batch_length", [2**31 - 1, 1000])
def test_batch_length_beyond_buffer(three_record_batch, batch_length):
    data = rewrite(three_record_batch, ">i", 8, batch_length, fix_crc=False)
    with pytest.raises(CorruptRecordError, match="truncated"):
        RecordBatchView(data)


def test_buffer_shorter_than_header():
    with pytest.raises(CorruptRecordError, match="header"):
        RecordBatchView(b"\x00" * 60)
    with pytest.raises(CorruptRecordError, match="header"):
        read_batch_header(b"\x00" * 100, 50)


def test_repr_mentions_offsets(three_record_batch):
    assert "base_offset=100" in repr(RecordBatchView(three_record_batch))


# --- pinned batches, one per codec: fixed bytes and CRCs, read back ----------------------------
# Built once by RecordBatchBuilder (base offset 42, producer 7/1/3, two records, the second a
# tombstone). Compressed output depends on library versions, so compressed codecs are pinned in
# the read direction only; the uncompressed one is also rebuilt byte for byte.

PINNED = {
    Compression.NONE: (
        0x683CD4A3,
        (
            "000000000000002a00000057ffffffff02683cd4a30000000000010000018bcfe568000000018bcfe568fa"
            "00000000000000070001000000030000000238000000026b2268656c6c6f2068656c6c6f2068656c6c6f"
            "02026802311000f40302026b0100"
        ),
    ),
    Compression.GZIP: (
        0x8500EF3B,
        (
            "000000000000002a00000062ffffffff028500ef3b0001000000010000018bcfe568000000018bcfe568fa"
            "0000000000000007000100000003000000021f8b0800000000000003b360606060ca56ca48cdc9c9574022"
            "999832980c0518be3033316533320000fdbf7ce626000000"
        ),
    ),
    Compression.SNAPPY: (
        0x913305B6,
        (
            "000000000000002a00000065ffffffff02913305b60002000000010000018bcfe568000000018bcfe568fa"
            "00000000000000070001000000030000000282534e4150505900000000010000000100000020263038000000"
            "026b2268656c6c6f201d063402026802311000f40302026b0100"
        ),
    ),
    Compression.LZ4: (
        0x2EF2BC88,
        (
            "000000000000002a0000005fffffffff022ef2bc880003000000010000018bcfe568000000018bcfe568fa"
            "00000000000000070001000000030000000204224d186040821f000000d738000000026b2268656c6c6f20"
            "0600e002026802311000f40302026b010000000000"
        ),
    ),
    Compression.ZSTD: (
        0x7B0459A7,
        (
            "000000000000002a0000005bffffffff027b0459a70004000000010000018bcfe568000000018bcfe568fa"
            "00000000000000070001000000030000000228b52ffd20260d0100d838000000026b2268656c6c6f200202"
            "6802311000f40302026b0100010031ca17"
        ),
    ),
}


@pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
def test_pinned_batch(codec):
    crc, hex_bytes = PINNED[codec]
    data = bytes.fromhex(hex_bytes)
    view = RecordBatchView(data)
    view.validate(deep=True)
    assert view.crc == crc == view.compute_crc()
    assert view.compression is codec
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (7, 1, 3)
    assert list(view) == [
        Record(42, T0, b"k", b"hello hello hello", (("h", b"1"),)),
        Record(43, T0 + 250, b"k", None, ()),
    ]
    assert DefaultRecordBatch(data).validate_crc()


def test_pinned_uncompressed_batch_is_rebuilt_byte_for_byte():
    builder = RecordBatchBuilder(base_offset=42, producer_id=7, producer_epoch=1, base_sequence=3)
    builder.append(b"hello hello hello", timestamp=T0, key=b"k", headers=[("h", b"1")])
    builder.append(None, timestamp=T0 + 250, key=b"k")
    assert builder.build().hex() == PINNED[Compression.NONE][1]
