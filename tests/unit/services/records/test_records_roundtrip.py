"""Property: whatever the builder accepts, the view reads back exactly, for every codec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.records import (
    Compression,
    Record,
    RecordBatchBuilder,
    RecordBatchView,
    TimestampType,
    iter_batches,
)

from .records_oracles import golden_record

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

# Timestamps are bounded so that every delta between two of them fits an int64 (as in Kafka).
timestamps = st.one_of(st.integers(-1, 2**41), st.integers(-(2**61), 2**61))
nullable_bytes = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=60, max_size=300))
headers = st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=20))), max_size=4)
records = st.lists(
    st.fixed_dictionaries(
        {"value": nullable_bytes, "key": nullable_bytes, "timestamp": timestamps, "headers": headers}
    ),
    min_size=1,
    max_size=30,
)


@st.composite
def producer_states(draw):
    """(producer_id, producer_epoch, base_sequence, is_transactional, is_control), Kafka-legal."""
    if draw(st.booleans()):
        return (-1, -1, -1, False, draw(st.booleans()))
    producer_id = draw(st.integers(0, 2**63 - 1))
    epoch = draw(st.integers(0, 2**15 - 1))
    is_control = draw(st.booleans())
    sequence = draw(st.integers(-1 if is_control else 0, 2**31 - 1))
    return (producer_id, epoch, sequence, draw(st.booleans()), is_control)


@settings(max_examples=150, deadline=None)
@given(
    records=records,
    compression=st.sampled_from(Compression),
    producer=producer_states(),
    base_offset=st.integers(0, 2**62),
    leader_epoch=st.integers(-1, 2**31 - 1),
    timestamp_type=st.sampled_from(TimestampType),
)
def test_build_then_read_back(records, compression, producer, base_offset, leader_epoch, timestamp_type):
    producer_id, epoch, sequence, is_transactional, is_control = producer
    builder = RecordBatchBuilder(
        compression=compression,
        base_offset=base_offset,
        timestamp_type=timestamp_type,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=is_transactional,
        is_control=is_control,
        partition_leader_epoch=leader_epoch,
    )
    for delta, r in enumerate(records):
        value, timestamp, key = r["value"], r["timestamp"], r["key"]
        offset_delta = builder.append(value, timestamp=timestamp, key=key, headers=r["headers"])
        assert offset_delta == delta
    data = builder.build()

    view = RecordBatchView(data)
    view.validate(deep=True)
    max_timestamp = max(r["timestamp"] for r in records)
    assert view.size_in_bytes == len(data)
    assert view.compression is compression
    assert view.timestamp_type is timestamp_type
    assert (view.is_transactional, view.is_control) == (is_transactional, is_control)
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (producer_id, epoch, sequence)
    assert view.partition_leader_epoch == leader_epoch
    assert view.base_offset == base_offset
    assert view.last_offset_delta == len(records) - 1
    assert view.record_count == len(records)
    assert view.base_timestamp == records[0]["timestamp"]
    assert view.max_timestamp == max_timestamp
    expected = [
        Record(
            base_offset + delta,
            max_timestamp if timestamp_type == TimestampType.LOG_APPEND_TIME else r["timestamp"],
            r["key"],
            r["value"],
            tuple(r["headers"]),
        )
        for delta, r in enumerate(records)
    ]
    assert list(view) == expected
    assert [list(batch) for batch in iter_batches(data + data)] == [expected, expected]


@settings(max_examples=150, deadline=None)
@given(records=records)
def test_uncompressed_records_are_laid_out_field_by_field(records):
    builder = RecordBatchBuilder()
    for r in records:
        builder.append(r["value"], timestamp=r["timestamp"], key=r["key"], headers=r["headers"])
    base = records[0]["timestamp"]
    expected = b"".join(
        golden_record(delta, r["timestamp"] - base, r["key"], r["value"], r["headers"])
        for delta, r in enumerate(records)
    )
    assert builder.build()[61:] == expected
