"""The sink's Arrow batches encoded as RecordBatch v2: what comes back out is what went in.

Each planned batch is decoded again with the record codec and compared with the rows of the
Arrow batch: keys, values (string or binary, nulls), headers (null values, null lists), the
partition (explicit, Kafka's murmur2 of the key, one sticky partition for keyless rows), the
topic (option or column). The C encoder and partitioner must give the Python reference's bytes
for random columns, sliced arrays included.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.partitioner import partition_for_key, py_partition_keys
from services.records import Compression, RecordBatchView
from services.records import record as record_module
from services.records.columns import py_encode_columns
from spark_jobs.sink_batches import BATCH_BYTES, RowError, plan_batches

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SPEEDUPS = record_module.load_speedups()


def decoded(planned) -> list[tuple]:
    """``(topic, partition, key, value, headers)`` of every record of the planned batches."""
    out = []
    for p in planned:
        view = RecordBatchView(p.data)
        view.validate(deep=True)
        assert view.record_count == p.count
        assert view.timestamp_type == 0 and view.compression in (Compression.NONE, Compression.LZ4)
        out += [(p.topic, p.partition, r.key, r.value, list(r.headers)) for r in view.records()]
    return out


def test_rows_come_back_with_their_partitions():
    n = 200
    keys = [None if i % 5 == 0 else f"k{i}" for i in range(n)]
    values = [None if i % 7 == 0 else b"v%d" % i for i in range(n)]
    explicit = [3 if i % 11 == 0 else None for i in range(n)]
    headers = [
        None if i % 2 else [{"key": "n", "value": b"%d" % i}, {"key": "nil", "value": None}] for i in range(n)
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(keys, pa.string()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array(explicit, pa.int32()),
            "headers": pa.array(headers, HEADERS),
        }
    )
    got = decoded(plan_batches(batch, "t", lambda topic: 4, Compression.LZ4, rng=random.Random(1)))
    sticky = {p for _, p, k, _, _ in got if k is None} - {3}
    assert len(sticky) <= 1, "keyless rows without a partition share one partition"
    sticky_partition = sticky.pop() if sticky else 3
    expected = []
    for i in range(n):
        key = None if keys[i] is None else keys[i].encode()
        if explicit[i] is not None:
            partition = explicit[i]
        elif key is not None:
            partition = partition_for_key(key, 4)
        else:
            partition = sticky_partition
        pairs = [] if headers[i] is None else [("n", b"%d" % i), ("nil", None)]
        expected.append(("t", partition, key, values[i], pairs))

    def order(row):
        return repr(row)

    assert sorted(got, key=order) == sorted(expected, key=order)


def test_keyless_rows_of_one_batch_share_one_partition():
    batch = pa.RecordBatch.from_pydict({"value": [b"v%d" % i for i in range(50)]})
    planned = list(plan_batches(batch, "t", lambda topic: 8, Compression.NONE))
    assert len({p.partition for p in planned}) == 1
    assert [v for *_, v, _ in decoded(planned)] == [b"v%d" % i for i in range(50)]


def test_the_topic_column_routes_rows_and_a_null_topic_is_the_rows_error():
    batch = pa.RecordBatch.from_pydict({"value": ["a", "b", "c"], "topic": ["x", "y", "x"]})
    got = decoded(plan_batches(batch, None, lambda topic: 1, Compression.NONE))
    assert sorted((t, v) for t, _, _, v, _ in got) == [("x", b"a"), ("x", b"c"), ("y", b"b")]
    bad = pa.RecordBatch.from_pydict({"value": ["a", "b"], "topic": ["x", None]})
    with pytest.raises(RowError, match="the topic column is null") as raised:
        list(plan_batches(bad, None, lambda topic: 1, Compression.NONE))
    assert raised.value.row == 1


def test_a_partition_that_does_not_exist_names_its_row():
    batch = pa.RecordBatch.from_pydict(
        {"value": ["a", "b", "c"], "partition": pa.array([0, None, 9], pa.int32())}
    )
    with pytest.raises(
        RowError, match="partition 9 of topic 't' does not exist \\(2 partitions\\)"
    ) as raised:
        list(plan_batches(batch, "t", lambda topic: 2, Compression.NONE))
    assert raised.value.row == 2


def test_large_inputs_are_split_into_bounded_batches():
    value = b"x" * 1000
    batch = pa.RecordBatch.from_pydict({"value": [value] * 2000})
    planned = list(plan_batches(batch, "t", lambda topic: 1, Compression.NONE))
    assert len(planned) > 1 and all(len(p.data) < 2 * BATCH_BYTES for p in planned)
    assert sum(p.count for p in planned) == 2000


def test_large_arrow_types_are_read_as_their_small_twins():
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(["k1", None], pa.large_string()),
            "value": pa.array([b"a", b"bb"], pa.large_binary()),
        }
    )
    got = decoded(plan_batches(batch, "t", lambda topic: 1, Compression.NONE))
    assert sorted((k or b"", v) for _, _, k, v, _ in got) == [(b"", b"bb"), (b"k1", b"a")]


def test_a_null_header_key_is_refused():
    batch = pa.RecordBatch.from_pydict(
        {"value": ["a"], "headers": pa.array([[{"key": None, "value": b"x"}]], HEADERS)}
    )
    with pytest.raises(ValueError, match="null key"):
        list(plan_batches(batch, "t", lambda topic: 1, Compression.NONE))


# ---- the C encoder against the reference ---------------------------------------------------------


def buffers(array):
    validity, offsets, data = array.buffers()
    return (validity if array.null_count else None, offsets, data if data is not None else b"")


def flat(array):
    return pa.concat_arrays([pa.array([], array.type), array]) if array.offset else array


blobs = st.one_of(st.none(), st.binary(max_size=30))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            blobs, blobs, st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=5), blobs), max_size=3))
        )
    ),
    st.integers(0, 5),
    st.booleans(),
    st.integers(1, 9),
)
def test_c_encoder_and_partitioner_match_the_reference(rows, cut, with_keys, partitions):
    assert SPEEDUPS is not None, "services.records._speedups is not built (see setup.py)"
    keys = flat(pa.array([r[0] for r in rows], pa.binary()).slice(min(cut, len(rows))))
    values = flat(pa.array([r[1] for r in rows], pa.binary()).slice(min(cut, len(rows))))
    headers = pa.array(
        [None if r[2] is None else [{"key": k, "value": v} for k, v in r[2]] for r in rows], HEADERS
    ).slice(min(cut, len(rows)))
    headers = flat(headers.fill_null(pa.scalar([], HEADERS)) if headers.null_count else headers)
    n = len(values)
    pairs = headers.values.flatten()
    key_buffers = buffers(keys) if with_keys else (None, None, None)
    args = (
        n,
        key_buffers,
        buffers(values),
        headers.buffers()[1],
        buffers(flat(pairs[0])),
        buffers(flat(pairs[1])),
    )
    assert SPEEDUPS.encode_columns(*args) == py_encode_columns(*args)
    assert SPEEDUPS.encode_columns(*args[:3]) == py_encode_columns(*args[:3])
    picked = pa.array(random.Random(n).choices(range(n), k=n // 2) if n else [], pa.int32()).buffers()[1]
    assert SPEEDUPS.encode_columns(*args, rows=picked) == py_encode_columns(*args, rows=picked)
    assert SPEEDUPS.partition_keys(n, key_buffers, partitions) == py_partition_keys(
        n, key_buffers, partitions
    )


def test_c_encoder_refuses_rows_outside_the_columns():
    assert SPEEDUPS is not None
    values = pa.array([b"abc", b"de"], pa.binary())
    for encode in (SPEEDUPS.encode_columns, py_encode_columns):
        with pytest.raises(ValueError, match="out of range"):
            encode(2, (None, None, None), buffers(values), rows=pa.array([1, 2], pa.int32()).buffers()[1])


def test_c_encoder_refuses_offsets_outside_the_data():
    assert SPEEDUPS is not None
    values = pa.array([b"abc", b"de"], pa.binary())
    _, offsets, data = values.buffers()
    with pytest.raises(ValueError, match="run past the data"):
        SPEEDUPS.encode_columns(2, (None, None, None), (None, offsets, data.slice(0, 3)))
    with pytest.raises(ValueError, match="too short"):
        SPEEDUPS.encode_columns(5, (None, None, None), (None, offsets, data))
    for encode in (SPEEDUPS.encode_columns, py_encode_columns):
        with pytest.raises(ValueError):
            encode(
                2,
                (None, None, None),
                (None, pa.py_buffer(b"\x00\x00\x00\x00\x05\x00\x00\x00\x01\x00\x00\x00"), data),
            )
