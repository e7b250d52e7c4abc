"""Interop with kafka-python's RecordBatch v2 implementation, both ways, for every codec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from services.records import Compression, RecordBatchBuilder, RecordBatchView
from services.records.batch import as_byte_view

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

CODECS = [pytest.param(c, id=c.name.lower()) for c in Compression]
T0 = 1_700_000_000_000

# Compressible values so that kafka-python keeps the codec (it falls back to none otherwise).
RECORDS = [
    (
        b"key-%d" % i if i % 3 else None,
        (b"value %d " % i) * (i % 7) if i % 5 else None,
        T0 + 3 * i - (i % 4),
        [("trace", b"abc"), ("\u00e9t\u00e9", None)] if i % 4 == 0 else [],
    )
    for i in range(120)
]


def _as_tuples(records) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in records]


def _expected(base_offset: int = 0) -> list[tuple]:
    return [(base_offset + i, ts, k, v, [tuple(h) for h in hs]) for i, (k, v, ts, hs) in enumerate(RECORDS)]


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_reads_our_batches(codec):
    builder = RecordBatchBuilder(compression=codec, base_offset=500)
    for key, value, timestamp, headers in RECORDS:
        builder.append(value, timestamp=timestamp, key=key, headers=headers)
    theirs = DefaultRecordBatch(builder.build())
    assert theirs.validate_crc()
    assert theirs.compression_type == codec
    assert (theirs.base_offset, theirs.last_offset_delta, theirs.records_count) == (500, 119, 120)
    assert _as_tuples(theirs) == _expected(500)


@pytest.mark.parametrize("codec", CODECS)
def test_we_read_kafka_python_batches(codec):
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (key, value, timestamp, headers) in enumerate(RECORDS):
        builder.append(offset, timestamp, key, value, headers)
    data = bytes(builder.build())
    view = RecordBatchView(data)
    view.validate(deep=True)
    assert view.compression is codec
    assert view.crc == view.compute_crc()
    assert (view.base_offset, view.last_offset_delta, view.record_count) == (0, 119, 120)
    assert (view.base_timestamp, view.max_timestamp) == (T0, max(r[2] for r in RECORDS))
    assert _as_tuples(view) == _expected()


def test_kafka_python_producer_state_round_trips():
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=77,
        producer_epoch=5,
        base_sequence=1234,
        batch_size=1 << 20,
    )
    builder.append(0, T0, b"k", b"v", [])
    view = RecordBatchView(bytes(builder.build()))
    view.validate(deep=True)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (77, 5, 1234)
    assert view.is_transactional


@settings(max_examples=100, deadline=None)
@given(
    codec=st.sampled_from(Compression),
    records=st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=30)),
            st.one_of(st.none(), st.binary(max_size=200)),
            st.integers(0, 2**45),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_random_batches_cross_both_ways(codec, records):
    ours = RecordBatchBuilder(compression=codec)
    theirs = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (key, value, timestamp) in enumerate(records):
        ours.append(value, timestamp=timestamp, key=key)
        theirs.append(offset, timestamp, key, value, [])
    expected = [(i, ts, k, v, []) for i, (k, v, ts) in enumerate(records)]
    read_by_them = DefaultRecordBatch(ours.build())
    assert read_by_them.validate_crc()
    assert _as_tuples(read_by_them) == expected
    read_by_us = RecordBatchView(as_byte_view(bytes(theirs.build())))
    read_by_us.validate(deep=True)
    assert _as_tuples(read_by_us) == expected
