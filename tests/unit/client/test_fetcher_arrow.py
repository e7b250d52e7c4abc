"""The consumer's Arrow path (``take_columns`` / ``drain_columns``) against its row path.

A fetched chunk handed out through ``PartitionRecords.take_columns`` -- in C and with the Python
reference -- must give exactly the records ``take`` gives, in the same polls, for random chunks:
every codec, both timestamp types, null keys and values, headers, control batches, fetch
offsets inside a batch and windows of any size, also when the two calls alternate. Corrupt
batches end the chunk the same way on both paths.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client.arrow import to_record_batch, to_table
from gateway.client.errors import CorruptRecordError
from gateway.client.fetcher import PartitionRecords
from gateway.client.structs import TopicPartition
from services.records import (
    Compression,
    RecordBatchBuilder,
    TimestampType,
    set_base_offset,
    set_log_append_time,
)
from services.records import record as record_module
from services.records.aborted import AbortedTransactionFilter
from services.records.columns import PyColumns
from services.records.control import marker_batch

from .test_fetcher import answer, batch, fetcher, result

TP = TopicPartition("t", 3)
T0 = 1_700_000_000_000
SPEEDUPS = record_module.load_speedups()
COLUMNS = {"python": PyColumns, "c": None if SPEEDUPS is None else SPEEDUPS.Columns}


@pytest.fixture(params=sorted(COLUMNS))
def columns_class(request):
    cls = COLUMNS[request.param]
    assert cls is not None, "services.records._speedups is not built (see setup.py)"
    return cls


def as_rows(records) -> list[dict]:
    """``ConsumerRecord``s shaped as ``to_pylist`` shows a batch (timestamps in ms)."""
    return [
        {
            "key": r.key,
            "value": r.value,
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "timestampType": r.timestamp_type,
            "headers": [{"key": k, "value": v} for k, v in r.headers],
        }
        for r in records
    ]


def arrow_rows(columns) -> list[dict]:
    batch = to_record_batch(columns.take(), TP.topic, TP.partition, include_headers=True)
    batch.validate(full=True)
    rows = batch.to_pylist()
    for row, us in zip(rows, batch.column("timestamp").cast(pa.int64()).to_pylist(), strict=True):
        row["timestamp"] = us // 1000
    return rows


blobs = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=20))
entries = st.lists(
    st.tuples(blobs, blobs, st.lists(st.tuples(st.sampled_from(["h", "\u00e9"]), blobs), max_size=2)),
    min_size=1,
    max_size=12,
)
batch_kinds = st.tuples(entries, st.sampled_from(list(Compression)), st.booleans(), st.booleans())


def build_chunk(kinds) -> bytes:
    """Batches back to back from offset 0; ``control`` ones are commit markers."""
    raw, offset = b"", 0
    for records, codec, log_append, control in kinds:
        if control:
            data = bytearray(
                marker_batch(producer_id=1, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp=5)
            )
            count = 1
        else:
            builder = RecordBatchBuilder(
                compression=codec,
                timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME,
            )
            for i, (key, value, pairs) in enumerate(records):
                builder.append(value, timestamp=T0 + 7 * i, key=key, headers=pairs)
            data = bytearray(builder.build())
            if log_append:
                set_log_append_time(data, T0 + 999)
            count = len(records)
        set_base_offset(data, offset)
        raw += bytes(data)
        offset += count
    return raw


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(batch_kinds, min_size=1, max_size=5),
    st.integers(0, 20),
    st.lists(st.tuples(st.integers(1, 15), st.booleans()), min_size=1, max_size=20),
)
def test_take_columns_gives_what_take_gives(columns_class, kinds, fetch_offset, polls):
    raw = build_chunk(kinds)
    rows_chunk = PartitionRecords(TP, fetch_offset, raw)
    mixed_chunk = PartitionRecords(TP, fetch_offset, raw)
    rows_position = mixed_position = fetch_offset
    for max_records, as_arrow in polls:
        expected = as_rows(rows_chunk.take(max_records, rows_position))
        if expected:
            rows_position = expected[-1]["offset"] + 1
        if as_arrow:  # the mixed chunk alternates between the two calls
            columns = columns_class(include_headers=True)
            assert mixed_chunk.take_columns(columns, max_records, mixed_position) == len(expected)
            got = arrow_rows(columns)
        else:
            got = as_rows(mixed_chunk.take(max_records, mixed_position))
        assert got == expected
        if got:
            mixed_position = got[-1]["offset"] + 1
    assert mixed_chunk.exhausted == rows_chunk.exhausted
    assert mixed_chunk.next_fetch_offset == rows_chunk.next_fetch_offset


def test_read_committed_drops_aborted_transactions(columns_class):
    def txn(values, pid, base):
        builder = RecordBatchBuilder(
            producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True
        )
        for v in values:
            builder.append(v, timestamp=1)
        data = bytearray(builder.build())
        set_base_offset(data, base)
        return bytes(data)

    def marker(pid, base, commit):
        data = bytearray(
            marker_batch(producer_id=pid, producer_epoch=0, commit=commit, coordinator_epoch=0, timestamp=1)
        )
        set_base_offset(data, base)
        return bytes(data)

    raw = txn([b"a", b"b"], 1, 0) + txn([b"x"], 2, 2) + marker(1, 3, True) + marker(2, 4, False)
    chunk = PartitionRecords(TP, 0, raw, aborted=AbortedTransactionFilter([(2, 2)]))
    columns = columns_class(include_headers=True)
    assert chunk.take_columns(columns, 100, 0) == 2
    assert [r["value"] for r in arrow_rows(columns)] == [b"a", b"b"]
    assert chunk.exhausted and chunk.next_fetch_offset == 5


def test_a_batch_that_fails_to_decode_ends_the_chunk_after_the_good_records(columns_class):
    bad = bytearray(batch(3, 3))
    bad[-1] = 0x02  # the last record claims a header it does not have (CRC unchecked)
    rows_chunk = PartitionRecords(TP, 0, batch(0, 3) + bytes(bad), check_crcs=False)
    arrow_chunk = PartitionRecords(TP, 0, batch(0, 3) + bytes(bad), check_crcs=False)
    expected = as_rows(rows_chunk.take(100, 0))
    columns = columns_class(include_headers=True)
    assert arrow_chunk.take_columns(columns, 100, 0) == 3
    assert arrow_rows(columns) == expected
    for chunk in (rows_chunk, arrow_chunk):
        assert isinstance(chunk.error, CorruptRecordError)
        assert (chunk.error.offset, chunk.error.next_offset) == (3, 6)
        assert chunk.exhausted and chunk.next_fetch_offset == 3


# ---- Fetcher.drain_columns ------------------------------------------------------------------------


def test_drain_columns_shapes_by_partition_and_advances_positions(columns_class):
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    f, sub = fetcher()
    answer(f, tp0, 0, result(tp0, batch(0, 4)))
    answer(f, tp1, 0, result(tp1, batch(0, 4)))
    first = f.drain_columns(5, None, lambda: columns_class(include_headers=False))
    assert sum(len(c) for c in first.values()) == 5
    second = f.drain_columns(5, None, lambda: columns_class(include_headers=False))
    assert sum(len(c) for c in second.values()) == 3
    for tp in (tp0, tp1):
        batches = [
            to_record_batch(polled[tp].take(), tp.topic, tp.partition, include_headers=False)
            for polled in (first, second)
            if tp in polled
        ]
        table = to_table(batches, include_headers=False)
        assert table.column("offset").to_pylist() == [0, 1, 2, 3]
        assert table.column("value").to_pylist() == [b"v0", b"v1", b"v2", b"v3"]
        assert sub.position(tp) == 4
    assert f.drain_columns(5, None, lambda: columns_class(include_headers=False)) == {}


def test_drain_columns_raises_a_pending_error_once_nothing_is_left(columns_class):
    bad = bytearray(batch(2, 2))
    bad[-1] ^= 0xFF  # a bad CRC: the chunk ends before this batch
    f, sub = fetcher(positions={TP: 0})
    answer(f, TP, 0, result(TP, batch(0, 2) + bytes(bad)))
    polled = f.drain_columns(10, None, lambda: columns_class(include_headers=True))
    assert len(polled[TP]) == 2 and sub.position(TP) == 2
    with pytest.raises(CorruptRecordError) as raised:
        f.drain_columns(10, None, lambda: columns_class(include_headers=True))
    assert (raised.value.offset, raised.value.next_offset) == (2, 4)
