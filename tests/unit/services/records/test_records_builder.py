"""RecordBatchBuilder: golden bytes laid out field by field, and argument checking."""

from __future__ import annotations

import array
import gzip
import struct

import crc32c
import lz4.frame
import pytest
import snappy
import zstandard
from kafka.record.default_records import DefaultRecordBatchBuilder

from services.records import (
    RECORD_BATCH_OVERHEAD,
    Compression,
    RecordBatchBuilder,
    RecordBatchView,
    TimestampType,
)

from .records_oracles import golden_batch, golden_record

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

T0 = 1_700_000_000_000
RECORDS = [
    # (value, timestamp, key, headers)
    (b"v0", T0, b"k0", (("h", b"x"), ("n", None), ("\u00fc", b""))),
    (None, T0 + 7, b"k1", ()),  # tombstone
    (b"", T0 - 2, None, ()),  # empty value, null key, earlier timestamp
    (b"v" * 300, T0 + 100_000, b"k" * 70, ()),  # 2- and 3-byte varints
]


def build(compression=Compression.NONE, **kwargs) -> bytes:
    builder = RecordBatchBuilder(compression=compression, **kwargs)
    for delta, (value, timestamp, key, headers) in enumerate(RECORDS):
        assert builder.append(value, timestamp=timestamp, key=key, headers=headers) == delta
    return builder.build()


def golden_payload() -> bytes:
    return b"".join(
        golden_record(delta, timestamp - T0, key, value, headers)
        for delta, (value, timestamp, key, headers) in enumerate(RECORDS)
    )


def golden_header_fields(**overrides) -> dict:
    fields = dict(
        base_offset=0,
        partition_leader_epoch=-1,
        attributes=0,
        last_offset_delta=len(RECORDS) - 1,
        base_timestamp=T0,
        max_timestamp=T0 + 100_000,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=len(RECORDS),
    )
    fields.update(overrides)
    return fields


def test_uncompressed_batch_matches_golden_bytes():
    assert build() == golden_batch(golden_payload(), **golden_header_fields())


def test_uncompressed_batch_has_fixed_crc():
    # Pinned so that any change to the layout is noticed, independently of the oracle above.
    data = build()
    assert len(data) == 481
    assert struct.unpack_from(">I", data, 17)[0] == 0x4518B8AE
    assert crc32c.crc32c(data[21:]) == 0x4518B8AE


def test_every_header_field_lands_where_kafka_expects_it():
    data = build(
        base_offset=2**40,
        partition_leader_epoch=17,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=99,
        is_transactional=True,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
    )
    expected = golden_batch(
        golden_payload(),
        **golden_header_fields(
            base_offset=2**40,
            partition_leader_epoch=17,
            attributes=0x10 | 0x08,
            producer_id=4242,
            producer_epoch=3,
            base_sequence=99,
        ),
    )
    assert data == expected


def test_control_batch_attribute():
    data = build(is_control=True, is_transactional=True, producer_id=1, producer_epoch=0)
    assert struct.unpack_from(">h", data, 21)[0] == 0x30


def test_same_bytes_as_kafka_python_when_uncompressed():
    theirs = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for delta, (value, timestamp, key, headers) in enumerate(RECORDS):
        theirs.append(delta, timestamp, key, value, list(headers))
    # kafka-python writes partitionLeaderEpoch 0 where the Java producer writes -1.
    assert build(partition_leader_epoch=0) == bytes(theirs.build())


DECOMPRESSORS = {
    Compression.GZIP: gzip.decompress,
    Compression.LZ4: lz4.frame.decompress,
    Compression.ZSTD: lambda data: zstandard.ZstdDecompressor().decompress(data),
}


def _unxerial(data: bytes) -> bytes:
    assert data[:8] == b"\x82SNAPPY\x00"
    out, pos = [], 16
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        out.append(snappy.uncompress(data[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    return b"".join(out)


DECOMPRESSORS[Compression.SNAPPY] = _unxerial


@pytest.mark.parametrize(
    "codec", [pytest.param(c, id=c.name.lower()) for c in Compression if c != Compression.NONE]
)
def test_compressed_batch_is_golden_header_around_compressed_golden_records(codec):
    data = build(codec)
    payload = data[RECORD_BATCH_OVERHEAD:]
    # The compressed blob decodes, with an independent decompressor, to the golden record bytes ...
    assert DECOMPRESSORS[codec](payload) == golden_payload()
    # ... and the header around it is the golden header with the codec bits set.
    assert data == golden_batch(payload, **golden_header_fields(attributes=int(codec)))


@pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
def test_codec_is_used_even_when_it_does_not_help(codec):
    builder = RecordBatchBuilder(compression=codec)
    builder.append(b"\x8f", timestamp=0)
    assert RecordBatchView(builder.build()).compression == codec


def test_build_is_repeatable_and_appending_continues():
    builder = RecordBatchBuilder()
    builder.append(b"a", timestamp=5)
    first = builder.build()
    assert builder.build() == first
    builder.append(b"b", timestamp=6)
    view = RecordBatchView(builder.build())
    assert [r.value for r in view] == [b"a", b"b"]


def test_empty_builder_cannot_build():
    with pytest.raises(ValueError, match="empty"):
        RecordBatchBuilder().build()


def test_record_count_and_size_estimate():
    builder = RecordBatchBuilder()
    assert builder.record_count == 0
    assert builder.size_in_bytes() == RECORD_BATCH_OVERHEAD
    for value, timestamp, key, headers in RECORDS:
        builder.append(value, timestamp=timestamp, key=key, headers=headers)
    assert builder.record_count == len(RECORDS)
    assert builder.size_in_bytes() == len(builder.build())
    compressed = RecordBatchBuilder(compression=Compression.GZIP)
    for value, timestamp, key, headers in RECORDS:
        compressed.append(value, timestamp=timestamp, key=key, headers=headers)
    assert compressed.size_in_bytes() >= len(compressed.build())


def test_bytes_like_keys_and_values():
    builder = RecordBatchBuilder()
    builder.append(bytearray(b"value"), timestamp=1, key=memoryview(b"key"), headers=[("h", bytearray(b"x"))])
    builder.append(memoryview(b"\x01\x02\x03\x04").cast("I"), timestamp=1)
    builder.append(array.array("H", [1, 2]), timestamp=1, key=bytearray())
    records = list(RecordBatchView(builder.build()))
    assert records[0].key == b"key" and records[0].value == b"value"
    assert records[0].headers == (("h", b"x"),)
    assert records[1].value == b"\x01\x02\x03\x04"
    assert records[2].value == array.array("H", [1, 2]).tobytes() and records[2].key == b""


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (dict(base_offset=2**63), ValueError),
        (dict(producer_epoch=2**15), ValueError),
        (dict(base_sequence=-(2**31) - 1), ValueError),
        (dict(partition_leader_epoch=2**31), ValueError),
        (dict(compression=9), ValueError),
        (dict(timestamp_type=2), ValueError),
        (dict(base_offset="0"), TypeError),
        (dict(is_transactional=True), ValueError),  # transactional needs a producer id
        (dict(producer_id=5), ValueError),  # a producer id needs an epoch
        (dict(producer_id=5, producer_epoch=0), ValueError),  # ... and a base sequence
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        RecordBatchBuilder(**kwargs)


def test_control_batch_needs_no_sequence():
    RecordBatchBuilder(producer_id=5, producer_epoch=0, is_control=True, is_transactional=True)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda b: b.append("text", timestamp=0), TypeError),
        (lambda b: b.append(b"v", timestamp=0, key="text"), TypeError),
        (lambda b: b.append(b"v", timestamp=1.5), TypeError),
        (lambda b: b.append(b"v", timestamp=2**63), ValueError),
        (lambda b: b.append(b"v", timestamp=0, headers=[(b"k", b"v")]), TypeError),
        (lambda b: b.append(b"v", timestamp=0, headers=[("k", "v")]), TypeError),
    ],
)
def test_bad_appends_leave_the_builder_unchanged(call, error):
    builder = RecordBatchBuilder()
    builder.append(b"first", timestamp=10)
    before = builder.build()
    with pytest.raises(error):
        call(builder)
    assert builder.record_count == 1
    assert builder.build() == before


def test_timestamp_delta_overflow_is_rejected():
    builder = RecordBatchBuilder()
    builder.append(b"a", timestamp=-(2**63))
    with pytest.raises(ValueError):
        builder.append(b"b", timestamp=2**63 - 1)
    assert builder.record_count == 1


def test_large_batches_take_the_general_path():
    builder = RecordBatchBuilder()
    for i in range(9000):  # offset deltas beyond the 2-byte fast path
        builder.append(b"", timestamp=i * 3)
    records = list(RecordBatchView(builder.build()))
    assert [r.offset for r in records] == list(range(9000))
    assert records[-1].timestamp == 8999 * 3


def test_append_sized_writes_what_append_writes_and_returns_the_size():
    records = [
        (b"v0", T0, b"k0", (("h", b"x"),)),
        (None, T0 + 5, None, ()),
        (memoryview(b"view"), T0 - 3, bytearray(b"k2"), [("n", None)]),
        (b"big" * 100, T0 + 1, None, ()),
    ]
    by_append, by_size = RecordBatchBuilder(), RecordBatchBuilder()
    for value, timestamp, key, headers in records:
        by_append.append(value, timestamp=timestamp, key=key, headers=headers)
        size = by_size.append_sized(value, timestamp, key, headers)
        assert size == by_size.size_in_bytes() == by_append.size_in_bytes()
    assert by_size.record_count == len(records)
    assert by_size.build() == by_append.build()


def test_append_sized_checks_its_arguments_like_append():
    builder = RecordBatchBuilder()
    builder.append_sized(b"v", T0)
    with pytest.raises(TypeError):
        builder.append_sized(b"v", "later")
    with pytest.raises(ValueError):
        builder.append_sized(b"v", 2**63)
    with pytest.raises(TypeError):
        builder.append_sized(12, T0)
    assert builder.record_count == 1, "a refused record leaves the batch as it was"


@pytest.mark.parametrize("transactional", [False, True])
def test_producer_state_set_before_build_matches_numbering_the_built_bytes(transactional):
    from services.records.inplace import set_producer_state

    numbered_after, numbered_before = RecordBatchBuilder(), RecordBatchBuilder()
    for builder in (numbered_after, numbered_before):
        builder.append(b"v0", timestamp=T0, key=b"k")
        builder.append(b"v1", timestamp=T0 + 3)
    built = bytearray(numbered_after.build())
    set_producer_state(built, 7, 2, 40, transactional=transactional)
    numbered_before.set_producer_state(7, 2, 40, is_transactional=transactional)
    assert numbered_before.build() == bytes(built)
    view = RecordBatchView(numbered_before.build())
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (7, 2, 40)
    assert view.is_transactional is transactional and view.is_valid()


def test_producer_state_out_of_range_is_refused_and_changes_nothing():
    builder = RecordBatchBuilder()
    builder.append(b"v", timestamp=T0)
    before = builder.build()
    with pytest.raises(ValueError, match="producer_epoch"):
        builder.set_producer_state(7, 2**15, 0)
    with pytest.raises(TypeError):
        builder.set_producer_state("7", 0, 0)
    assert builder.build() == before
