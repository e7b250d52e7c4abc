"""The sink's Arrow batches as RecordBatch v2 bytes per topic partition, without a row object.

Spark hands each write task Arrow record batches; :func:`plan_batches` turns one into encoded
batches ready for ``Producer.send_batch``:

* the topic of each row: the ``topic`` option, else the ``topic`` column (a null one is the row's
  error);
* the partition: the ``partition`` column when not null (it must exist), else Kafka's default --
  ``toPositive(murmur2(key)) % partitions`` for a keyed row, and for rows without a key one
  partition picked at random per Arrow batch and topic (the sticky partitioner's choice, per
  batch rather than per producer batch);
* the records: keys, values and headers read from the Arrow buffers and encoded in one call
  (:func:`services.records.columns.encode_columns`, in C with the accelerator), every record
  stamped with the time it was encoded (create time, as Kafka's producer stamps a record sent
  without a timestamp), compressed with the sink's codec, at most :data:`BATCH_BYTES` of keys,
  values and headers per batch.

Pure data handling: no I/O; a bad row raises :class:`RowError` naming it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from services.partitioner import partition_keys
from services.records import Compression, RecordBatchBuilder
from services.records.columns import encode_columns

#: Keys, values and headers per encoded batch, before compression: well under the producer's
#: default ``max_request_size`` (1 MiB) so a batch is never refused for its size.
BATCH_BYTES = 512 * 1024
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class RowError(ValueError):
    """A row cannot be written; ``row`` is its index in the Arrow batch."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(message)
        self.row = row


@dataclass(frozen=True)
class PlannedBatch:
    """Encoded records of one topic partition, from rows ``rows`` of the Arrow batch."""

    topic: str
    partition: int
    data: bytes
    count: int
    first_row: int


def _binary(column: pa.Array) -> pa.Array:
    """A string or binary column as binary with offset 0 (what the encoder reads: int32 offsets,
    so Arrow's large variants are cast down, and anything else is refused)."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        column = column.cast(pa.binary())
    elif not pa.types.is_binary(kind):
        raise TypeError(f"expected a binary or string column, not {kind}")
    if column.offset:
        column = pa.concat_arrays([pa.array([], pa.binary()), column])
    return column


def _buffers(column: pa.Array | None) -> tuple:
    if column is None:
        return (None, None, None)
    validity, offsets, data = column.buffers()
    return (validity if column.null_count else None, offsets, data if data is not None else b"")


def plan_batches(
    batch: pa.RecordBatch,
    topic_option: str | None,
    partition_count: Callable[[str], int],
    compression: Compression,
    *,
    rng: random.Random | None = None,
) -> Iterator[PlannedBatch]:
    """The encoded batches of ``batch``'s rows (see the module); raises :class:`RowError`."""
    n = batch.num_rows
    if not n:
        return
    names = batch.schema.names
    columns = _Columns(batch, names)
    rng = rng or random.Random()
    if topic_option is not None:
        yield from _plan_topic(columns, batch, names, topic_option, partition_count, compression, rng, None)
        return
    topics = batch.column("topic")
    if topics.null_count:
        first = pc.index(pc.is_null(topics), True).as_py()
        raise RowError(first, "the topic column is null and no 'topic' option is set")
    for topic in pc.unique(topics).to_pylist():
        rows = pc.indices_nonzero(pc.equal(topics, topic)).cast(pa.int32())
        yield from _plan_topic(columns, batch, names, topic, partition_count, compression, rng, rows)


class _Columns:
    """The batch's key, value and header buffers, as the encoder reads them (offset 0)."""

    def __init__(self, batch: pa.RecordBatch, names: list[str]) -> None:
        self.keys = _binary(batch.column("key")) if "key" in names else None
        self.values = _binary(batch.column("value"))
        self.header_args: tuple[Any, Any, Any] = (None, None, None)
        self.row_bytes = self.values.nbytes + (self.keys.nbytes if self.keys is not None else 0)
        if "headers" in names:
            headers = batch.column("headers")
            if headers.type != _HEADERS:  # large lists or strings, or other field nullability
                headers = headers.cast(_HEADERS)
            if headers.null_count:
                headers = pc.fill_null(headers, pa.scalar([], _HEADERS))
            if headers.offset:
                headers = pa.concat_arrays([pa.array([], headers.type), headers])
            pairs = headers.values.flatten()  # key and value children, the struct's nulls applied
            self.header_args = (
                headers.buffers()[1],
                _buffers(_binary(pairs[0])),
                _buffers(_binary(pairs[1])),
            )
            self.row_bytes += headers.nbytes
        self.row_bytes = self.row_bytes // max(batch.num_rows, 1) + 8


def _plan_topic(
    columns: _Columns,
    batch: pa.RecordBatch,
    names: list[str],
    topic: str,
    partition_count: Callable[[str], int],
    compression: Compression,
    rng: random.Random,
    rows: pa.Array | None,
) -> Iterator[PlannedBatch]:
    count = partition_count(topic)
    n = batch.num_rows
    if columns.keys is not None:
        hashed = partition_keys(n, _buffers(columns.keys), count)
        partitions = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(hashed)])
    else:
        partitions = pa.nulls(n, pa.int32()).fill_null(-1)
    if "partition" in names:
        chosen = batch.column("partition")
        if rows is not None:
            chosen = chosen.take(rows)
        if chosen.null_count < len(chosen):
            bad = pc.or_(pc.less(chosen, 0), pc.greater_equal(chosen, count))
            if pc.any(bad).as_py():
                at = pc.index(pc.fill_null(bad, False), True).as_py()
                raise RowError(
                    _original(rows, at),
                    f"partition {chosen[at].as_py()} of topic {topic!r} does not exist ({count} partitions)",
                )
    else:
        chosen = None
    if rows is not None:
        partitions = partitions.take(rows)
    if chosen is not None and chosen.null_count < len(chosen):
        partitions = pc.if_else(pc.is_null(chosen), partitions, chosen)
    partitions = pc.if_else(pc.equal(partitions, -1), pa.scalar(rng.randrange(count), pa.int32()), partitions)
    # One stable sort groups the rows by partition; each partition's rows are then encoded
    # straight from the batch's buffers, in their order (no per-partition copy of the columns).
    order = pc.sort_indices(partitions)
    grouped = partitions.take(order)
    row_numbers = (order if rows is None else rows.take(order)).cast(pa.int32())
    step = max(1, BATCH_BYTES // columns.row_bytes)
    start = 0
    for run in pc.value_counts(grouped).to_pylist():
        partition, size = run["values"], run["counts"]
        for first in range(start, start + size, step):
            chosen_rows = row_numbers.slice(first, min(step, start + size - first))
            yield PlannedBatch(
                topic,
                partition,
                _encode(columns, chosen_rows, compression),
                len(chosen_rows),
                chosen_rows[0].as_py(),
            )
        start += size


def _original(rows: pa.Array | None, at: int) -> int:
    return at if rows is None else rows[at].as_py()


def _encode(columns: _Columns, rows: pa.Array, compression: Compression) -> bytes:
    selection = rows.buffers()[1].slice(4 * rows.offset, 4 * len(rows))
    records = encode_columns(
        len(columns.values),
        _buffers(columns.keys),
        _buffers(columns.values),
        *columns.header_args,
        rows=selection,
    )
    builder = RecordBatchBuilder(compression=compression)
    builder.extend_encoded(records, len(rows), time.time_ns() // 1_000_000)
    return builder.build()
