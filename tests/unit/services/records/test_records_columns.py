"""Records decoded into Arrow buffers (``services.records.columns``): C against the reference,
both against the row decoder, and bad bytes.

For random batches -- every codec, both timestamp types, null and empty keys and values,
headers with null values and non-ASCII keys, windows -- the C ``Columns`` and the Python
``PyColumns`` must produce byte-identical buffers, and those buffers read through pyarrow must
hold exactly the records the row decoder (``py_decode_records``) gives. Corrupt batches must
raise ``CorruptRecordError`` from both (never crash the process) and leave the columns as they
were before the failed batch.
"""

from __future__ import annotations

import gc
import random
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.client.arrow import to_record_batch
from services.errors import CorruptRecordError
from services.records import (
    Compression,
    RecordBatchBuilder,
    RecordBatchView,
    TimestampType,
    set_log_append_time,
)
from services.records import record as record_module
from services.records.columns import COLUMN_BUFFERS, Columns, PyColumns

from .records_backends import require_speedups

T0 = 1_700_000_000_000
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
APPEND_TIME = 1_800_000_000_123


def c_columns_class():
    return require_speedups().Columns


blobs = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=40), st.just(b"x" * 300))
header_keys = st.sampled_from(["", "h", "trace-id", "\u00e9t\u00e9", "\u65e5\u672c"])
headers = st.lists(st.tuples(header_keys, blobs), max_size=3)
records = st.lists(
    st.tuples(blobs, st.integers(-(2**40), 2**40), blobs, headers),  # value, timestamp delta, key, headers
    min_size=1,
    max_size=30,
)
batch_specs = st.tuples(
    records,
    st.sampled_from(list(Compression)),
    st.booleans(),  # log-append time
    st.integers(0, 2**40),  # base offset
)


def build(spec) -> bytes:
    entries, codec, log_append, base_offset = spec
    builder = RecordBatchBuilder(
        compression=codec,
        base_offset=base_offset,
        timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME,
    )
    for value, delta, key, pairs in entries:
        builder.append(value, timestamp=T0 + delta, key=key, headers=pairs)
    data = bytearray(builder.build())
    if log_append:
        set_log_append_time(data, APPEND_TIME)
    return bytes(data)


def fill(columns, batches: list[bytes], first_offset=None, max_records=None) -> list[int]:
    return [
        RecordBatchView(data).read_columns(columns, first_offset=first_offset, max_records=max_records)
        for data in batches
    ]


def row_path(batches: list[bytes], first_offset=None, max_records=None, *, include_headers=True) -> list:
    """The rows the row decoder gives, shaped as pyarrow's ``to_pylist`` shows a record batch."""
    rows = []
    for data in batches:
        view = RecordBatchView(data)
        log_append = view.timestamp_type is TimestampType.LOG_APPEND_TIME
        decoded = record_module.py_decode_records(
            view.payload(),
            view.record_count,
            view.base_offset,
            view.base_timestamp,
            view.max_timestamp if log_append else None,
            view.last_offset_delta,
            first_offset,
            max_records,
        )
        for r in decoded:
            row: dict[str, object] = {
                "key": r.key,
                "value": r.value,
                "topic": "t",
                "partition": 7,
                "offset": r.offset,
                "timestamp": r.timestamp,
                "timestampType": int(log_append),
            }
            if include_headers:
                row["headers"] = [{"key": k, "value": v} for k, v in r.headers]
            rows.append(row)
    return rows


def arrow_rows(taken, *, include_headers=True) -> list:
    batch = to_record_batch(taken, "t", 7, include_headers=include_headers)
    batch.validate(full=True)
    millis = batch.column("timestamp").cast(pa.int64()).to_pylist()
    rows = batch.to_pylist()
    for row, us in zip(rows, millis, strict=True):
        assert us % 1000 == 0
        row["timestamp"] = us // 1000
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch_specs, min_size=1, max_size=4), st.booleans())
def test_c_and_python_columns_match_the_row_decoder(specs, include_headers):
    batches = [build(spec) for spec in specs]
    c, py = c_columns_class()(include_headers=include_headers), PyColumns(include_headers=include_headers)
    assert fill(c, batches) == fill(py, batches)
    assert len(c) == len(py) and c.last_offset == py.last_offset
    c_taken, py_taken = c.take(), py.take()
    assert c_taken == py_taken
    assert len(c_taken[1]) == (len(COLUMN_BUFFERS) if include_headers else 9)
    expected = row_path(batches, include_headers=include_headers)
    assert arrow_rows(c_taken, include_headers=include_headers) == expected
    assert len(c) == 0 and c.last_offset is None  # take() starts over
    assert c.take() == py.take()


@settings(max_examples=100, deadline=None)
@given(batch_specs, st.integers(0, 40), st.one_of(st.none(), st.integers(1, 40)))
def test_windows_match_the_row_decoder(spec, skip, max_records):
    data = build(spec)
    first_offset = spec[3] + skip
    c, py = c_columns_class()(include_headers=True), PyColumns(include_headers=True)
    assert fill(c, [data], first_offset, max_records) == fill(py, [data], first_offset, max_records)
    taken = c.take()
    assert taken == py.take()
    assert arrow_rows(taken) == row_path([data], first_offset, max_records)


def test_many_headers_fill_long_bitmaps_alike():
    # Thousands of header values per batch: the header validity bitmap grows far past its first
    # allocation, record by record, and must stay within it.
    entries = [
        (b"v", i, b"k", [("a", None if i % 3 else b"x"), ("b", b"y"), ("c", None)]) for i in range(3000)
    ]
    data = build((entries, Compression.NONE, False, 0))
    c, py = c_columns_class()(include_headers=True), PyColumns(include_headers=True)
    for _ in range(3):
        fill(c, [data])
        fill(py, [data])
    taken = c.take()
    assert taken == py.take()
    assert taken[2] == (0, 0, 3 * (3000 + 2000))
    assert arrow_rows(taken) == row_path([data]) * 3


def test_the_class_in_use_follows_the_accelerator():
    expected = PyColumns if record_module.speedups is None else c_columns_class()
    assert Columns is expected


def test_uncompressed_batches_are_read_in_place_from_any_buffer():
    data = build(([(b"v", 1, b"k", [("h", None)])] * 5, Compression.NONE, False, 10))
    payload = memoryview(b"junk" + data[61:] + b"junk")[4:-4]
    for cls in (c_columns_class(), PyColumns):
        whole, sliced = cls(include_headers=True), cls(include_headers=True)
        RecordBatchView(data).read_columns(whole)
        RecordBatchView(data).read_columns(sliced, payload)
        assert whole.take() == sliced.take()


# --- bad bytes -----------------------------------------------------------------------------------


def _outcome(columns, view: RecordBatchView, payload: bytes):
    try:
        return "ok", view.read_columns(columns, payload)
    except (CorruptRecordError, OverflowError) as exc:
        return "raised", type(exc)


def _good_batch(rng: random.Random) -> bytes:
    entries = [
        (
            rng.choice([None, b"", rng.randbytes(rng.randint(1, 30))]),
            rng.randint(-1000, 1000),
            rng.choice([None, b"k", rng.randbytes(3)]),
            [("h", rng.choice([None, b"x"]))] * rng.randint(0, 2),
        )
        for _ in range(rng.randint(1, 12))
    ]
    return build((entries, Compression.NONE, rng.random() < 0.5, rng.randint(0, 1000)))


def _mutated(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.5 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif roll < 0.75 and data:
            del data[rng.randrange(len(data)) :]
        else:
            data[rng.randrange(len(data) + 1) : 0] = rng.randbytes(rng.randint(1, 5))
    return bytes(data)


def test_corrupt_batches_fail_alike_and_leave_the_columns_as_they_were():
    rng = random.Random(17)
    c_class = c_columns_class()
    failures = 0
    for _ in range(1500):
        good, bad = _good_batch(rng), _good_batch(rng)
        view = RecordBatchView(bad)
        payload = _mutated(rng, bad[61:])
        c, py = c_class(include_headers=True), PyColumns(include_headers=True)
        fill(c, [good])
        fill(py, [good])
        outcome = _outcome(c, view, payload)
        assert outcome == _outcome(py, view, payload), payload.hex()
        if outcome[0] == "raised":
            failures += 1
            only_good = c_class(include_headers=True)
            fill(only_good, [good])
            assert c.take() == py.take() == only_good.take()
        else:
            assert c.take() == py.take()
    assert failures > 500  # most mutations break a batch: the error paths were exercised


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(-2, 40), st.booleans())
def test_arbitrary_bytes_fail_alike(data, count, log_append):
    c, py = c_columns_class()(include_headers=True), PyColumns(include_headers=True)
    args = (data, count, 5, T0, APPEND_TIME if log_append else None, max(count - 1, 0))
    outcomes = []
    for columns in (c, py):
        try:
            outcomes.append(("ok", columns.append(*args), columns.take()))
        except CorruptRecordError:
            outcomes.append(("raised", len(columns)))
    assert outcomes[0] == outcomes[1]


def test_a_header_key_that_is_not_utf8_is_refused():
    data = build(([(b"v", 0, b"k", [("ab", b"x")])], Compression.NONE, False, 0))
    payload = data[61:].replace(b"ab", b"\xff\xfe")
    view = RecordBatchView(data)
    for cls in (c_columns_class(), PyColumns):
        with pytest.raises(CorruptRecordError, match="header key is not UTF-8"):
            view.read_columns(cls(include_headers=True), payload)


def test_bad_arguments_are_type_errors():
    c = c_columns_class()(include_headers=False)
    with pytest.raises(TypeError):
        c.append(b"", "1", 0, 0, None, 0)
    with pytest.raises(TypeError):
        c.append(b"", 0, 0, 0, None)
    with pytest.raises(TypeError):
        c_columns_class()(True)  # include_headers is keyword-only, as PyColumns'


def _allocated_blocks_growth(call, rounds: int = 300) -> int:
    for _ in range(20):
        call()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(rounds):
        call()
    gc.collect()
    return sys.getallocatedblocks() - before


def _refused(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_the_c_paths_leak_nothing_on_success_or_error():
    c = require_speedups()
    good = build(([(b"v", 1, b"k", [("h", None), ("\u00e9", b"x")])] * 20, Compression.NONE, False, 10))
    view = RecordBatchView(good)
    payload = good[61:]
    bad = payload[:-1]
    values = pa.array([b"a", None, b"ccc"], pa.binary())
    keys = pa.array([b"k", b"", None], pa.binary())
    hdr = pa.array([[{"key": "h", "value": b"x"}], [], None], HEADERS_TYPE).fill_null(
        pa.scalar([], HEADERS_TYPE)
    )
    pairs = hdr.values.flatten()

    def buffers(array):
        validity, offsets, data = array.buffers()
        return (validity if array.null_count else None, offsets, data)

    def decode_and_take(data):
        columns = c.Columns(include_headers=True)
        try:
            view.read_columns(columns, data)
            view.read_columns(columns, data, first_offset=15, max_records=3)
        except CorruptRecordError:
            pass
        return columns.take()

    calls = [
        lambda: decode_and_take(payload),
        lambda: decode_and_take(bad),
        lambda: c.Columns(include_headers=False).append(payload, 20, 10, T0, None, 19),
        lambda: c.encode_columns(3, buffers(keys), buffers(values)),
        lambda: c.encode_columns(
            3, buffers(keys), buffers(values), hdr.buffers()[1], buffers(pairs[0]), buffers(pairs[1])
        ),
        lambda: _refused(lambda: c.encode_columns(9, buffers(keys), buffers(values))),
        lambda: c.partition_keys(3, buffers(keys), 4),
    ]
    for call in calls:
        assert _allocated_blocks_growth(call) < 100, call
