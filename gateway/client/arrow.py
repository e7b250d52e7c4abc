"""Fetched records as Arrow data: the schema, and record batches assembled from decoded buffers.

``Consumer.poll_arrow()`` decodes fetched RecordBatch v2 bytes straight into Arrow buffers
(:mod:`services.records.columns`, in C with the accelerator) and this module wraps those buffers
as ``pyarrow`` arrays without copying them again. Needs ``pyarrow`` (``pip install
'tributary[arrow]'``); nothing else in the SDK imports this module.

The columns are Spark's Kafka source's, so a poll's table is what ``spark.read.format("tributary")``
gives for the same records:

=================  ==========================================================================
``key``            binary, null for a null key
``value``          binary, null for a null value (a tombstone)
``topic``          string
``partition``      int32
``offset``         int64
``timestamp``      timestamp (microseconds, UTC): the record's create time, or the broker's
                   append time for a ``LOG_APPEND_TIME`` topic
``timestampType``  int32: 0 create time, 1 log-append time
``headers``        list<struct<key: string, value: binary>> in the order sent (with headers)
=================  ==========================================================================
"""

from __future__ import annotations

import pyarrow as pa

from services.records.columns import Taken

#: Spark's TimestampType travels in Arrow as microseconds with the UTC zone.
ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")
ARROW_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_HEADERS = pa.list_(ARROW_HEADER)
_MS = pa.timestamp("ms", tz="UTC")


def record_schema(include_headers: bool = True) -> pa.Schema:
    """The Arrow schema of polled records (Spark's Kafka source schema)."""
    fields = [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", ARROW_TIMESTAMP),
        ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", ARROW_HEADERS))
    return pa.schema(fields)


def _binary(kind: pa.DataType, rows: int, offsets: bytes, data: bytes, validity: bytes | None, nulls: int):
    py = pa.py_buffer
    return pa.Array.from_buffers(
        kind,
        rows,
        [py(validity) if nulls else None, py(offsets), py(data)],
        null_count=nulls,
    )


def to_record_batch(taken: Taken, topic: str, partition: int, *, include_headers: bool) -> pa.RecordBatch:
    """``Columns.take()``'s buffers of one partition's records as a record batch of
    :func:`record_schema`. Raises ``pyarrow.ArrowInvalid`` for a timestamp that microseconds
    cannot hold (beyond the year 294,000)."""
    rows, buffers, (key_nulls, value_nulls, hvalue_nulls) = taken
    py = pa.py_buffer
    columns = [
        _binary(pa.binary(), rows, buffers[3], buffers[4], buffers[5], key_nulls),
        _binary(pa.binary(), rows, buffers[6], buffers[7], buffers[8], value_nulls),
        pa.repeat(pa.scalar(topic, pa.string()), rows),
        pa.repeat(pa.scalar(partition, pa.int32()), rows),
        pa.Array.from_buffers(pa.int64(), rows, [None, py(buffers[0])]),
        pa.Array.from_buffers(_MS, rows, [None, py(buffers[1])]).cast(ARROW_TIMESTAMP),
        pa.Array.from_buffers(pa.int32(), rows, [None, py(buffers[2])]),
    ]
    if include_headers:
        count = len(buffers[10]) // 4 - 1
        pairs = pa.StructArray.from_arrays(
            [
                _binary(pa.string(), count, buffers[10], buffers[11], None, 0),
                _binary(pa.binary(), count, buffers[12], buffers[13], buffers[14], hvalue_nulls),
            ],
            fields=list(ARROW_HEADER),
        )
        columns.append(pa.Array.from_buffers(ARROW_HEADERS, rows, [None, py(buffers[9])], children=[pairs]))
    return pa.RecordBatch.from_arrays(columns, schema=record_schema(include_headers))


def to_table(batches: list[pa.RecordBatch], *, include_headers: bool) -> pa.Table:
    """Record batches of :func:`record_schema` as one table (no rows for no batches)."""
    return pa.Table.from_batches(batches, schema=record_schema(include_headers))
