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
    """A string or binary column as binary with offset 0 (what the encoder reads)."""
    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
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
    if not batch.num_rows:
        return
    names = batch.schema.names
    if topic_option is not None:
        groups: list[tuple[str, pa.Array | None]] = [(topic_option, None)]
    else:
        topics = batch.column("topic")
        if topics.null_count:
            first = pc.index(pc.is_null(topics), True).as_py()
            raise RowError(first, "the topic column is null and no 'topic' option is set")
        groups = [(t, pc.indices_nonzero(pc.equal(topics, t))) for t in pc.unique(topics).to_pylist()]
    rng = rng or random.Random()
    for topic, indices in groups:
        rows = batch if indices is None or len(indices) == batch.num_rows else batch.take(indices)
        yield from _plan_topic(rows, names, topic, partition_count(topic), compression, rng, indices)


def _plan_topic(
    rows: pa.RecordBatch,
    names: list[str],
    topic: str,
    count: int,
    compression: Compression,
    rng: random.Random,
    indices: pa.Array | None,
) -> Iterator[PlannedBatch]:
    n = rows.num_rows
    keys = _binary(rows.column("key")) if "key" in names else None
    if keys is not None:
        hashed = partition_keys(n, _buffers(keys), count)
        partitions = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(hashed)])
    else:
        partitions = pa.array([-1] * n, pa.int32())
    if "partition" in names:
        chosen = rows.column("partition")
        if chosen.null_count < n:
            bad = pc.or_(pc.less(chosen, 0), pc.greater_equal(chosen, count))
            if pc.any(bad).as_py():
                at = pc.index(pc.fill_null(bad, False), True).as_py()
                raise RowError(
                    _original(indices, at),
                    f"partition {chosen[at].as_py()} of topic {topic!r} does not exist ({count} partitions)",
                )
            partitions = pc.if_else(pc.is_null(chosen), partitions, chosen)
    partitions = pc.if_else(pc.equal(partitions, -1), pa.scalar(rng.randrange(count), pa.int32()), partitions)
    for partition in pc.unique(partitions).to_pylist():
        where = pc.indices_nonzero(pc.equal(partitions, partition))
        piece = rows if len(where) == n else rows.take(where)
        first = _original(indices, where[0].as_py())
        yield from _encode(piece, names, topic, partition, compression, first)


def _original(indices: pa.Array | None, at: int) -> int:
    return at if indices is None else indices[at].as_py()


def _encode(
    rows: pa.RecordBatch, names: list[str], topic: str, partition: int, compression: Compression, first: int
) -> Iterator[PlannedBatch]:
    n = rows.num_rows
    keys = _binary(rows.column("key")) if "key" in names else None
    values = _binary(rows.column("value"))
    headers = rows.column("headers") if "headers" in names else None
    size = values.nbytes + (keys.nbytes if keys is not None else 0)
    if headers is not None:
        size += headers.nbytes
    per_row = max(1, size // n + 8)
    step = max(1, BATCH_BYTES // per_row)
    for start in range(0, n, step):
        chunk = rows.slice(start, step) if step < n else rows
        yield PlannedBatch(topic, partition, _encode_chunk(chunk, names, compression), chunk.num_rows, first)


def _encode_chunk(rows: pa.RecordBatch, names: list[str], compression: Compression) -> bytes:
    n = rows.num_rows
    keys = _binary(rows.column("key")) if "key" in names else None
    values = _binary(rows.column("value"))
    header_args: tuple = ()
    if "headers" in names:
        headers = rows.column("headers")
        if headers.null_count:
            headers = pc.fill_null(headers, pa.scalar([], _HEADERS))
        if headers.offset:
            headers = pa.concat_arrays([pa.array([], headers.type), headers])
        pairs = headers.values.flatten()  # key and value children, the struct's nulls applied
        header_args = (
            headers.buffers()[1],
            _buffers(_binary(pairs[0])),
            _buffers(_binary(pairs[1])),
        )
    records = encode_columns(n, _buffers(keys), _buffers(values), *header_args)
    builder = RecordBatchBuilder(compression=compression)
    builder.extend_encoded(records, n, time.time_ns() // 1_000_000)
    return builder.build()
