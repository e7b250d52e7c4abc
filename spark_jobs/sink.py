"""Writing DataFrames to topics: ``df.write.format("tributary")`` and ``df.writeStream``.

Input columns, as Spark's Kafka sink takes them: ``value`` (binary or string, required; null is a
tombstone), ``key`` (binary or string), ``topic`` (string; the ``topic`` option overrides it),
``partition`` (int; else Kafka's murmur2 of the key, else sticky), ``headers``
(array<struct<key string, value binary>>). Other columns are ignored. Save mode: append (a topic
is an append-only log; overwrite is refused, and Spark refuses its default ErrorIfExists for
Python data sources with a message naming append).

Spark hands each task Arrow batches; their columns are encoded straight into RecordBatch v2
(:mod:`spark_jobs.sink_batches`, in C with the accelerator: no Python object per row) and sent
whole through one SDK ``Producer`` (``send_batch``), which the task flushes before it reports
success, so a successful job has every record acknowledged (``acks``, default all). Delivery is
at-least-once, like Kafka's sink: a failed task may have written part of its rows before it
failed, and Spark's retry writes them again (and so may the producer's own retries: pre-encoded
batches carry no idempotent sequence numbers); ``abort`` logs how much the finished tasks wrote.

A failed task raises :class:`WriteTaskError`, whose message names the task (partition id and
attempt), how many of its records failed, and the first reasons with the rows they came from.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from gateway.client import Producer
from services.records import Compression
from spark_jobs.options import WriteOptions, sdk_settings
from spark_jobs.schema import HEADER_TYPE
from spark_jobs.sink_batches import RowError, plan_batches

log = logging.getLogger("spark_jobs.sink")

#: Failures quoted in a task's error message (the count covers all of them).
QUOTED_FAILURES = 3
_BYTES_OR_STRING = (BinaryType(), StringType())


class WriteSchemaError(ValueError):
    """The DataFrame cannot be written: a required column is missing or a column has the wrong type."""


class WriteTaskError(RuntimeError):
    """A write task could not deliver all of its records."""


def ensure_appending(overwrite: bool) -> None:
    """A topic is an append-only log: there is nothing to overwrite (Kafka's sink refuses too)."""
    if overwrite:
        raise WriteSchemaError(
            "a topic cannot be overwritten, only appended to: use mode('append') "
            "(or outputMode('append') for streams)"
        )


def ensure_writable(schema: StructType, options: WriteOptions) -> None:
    """Check the input columns against the sink's contract before any task starts."""
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise WriteSchemaError(
            f"the tributary sink needs a 'value' column (binary or string); "
            f"the DataFrame has {', '.join(types) or 'no columns'}"
        )
    _ensure_type(types, "value", _BYTES_OR_STRING, "binary or string")
    _ensure_type(types, "key", _BYTES_OR_STRING, "binary or string")
    _ensure_type(types, "topic", (StringType(),), "string")
    _ensure_type(types, "partition", (IntegerType(),), "int")
    _ensure_type(types, "headers", (ArrayType(HEADER_TYPE),), "array<struct<key:string,value:binary>>")
    if options.topic is None and "topic" not in types:
        raise WriteSchemaError("no topic to write to: set the 'topic' option or add a 'topic' column")


def _ensure_type(types: dict, column: str, allowed: tuple, described: str) -> None:
    if column in types and not any(_same_type(types[column], t) for t in allowed):
        raise WriteSchemaError(f"column '{column}' must be {described}, not {types[column].simpleString()}")


def _same_type(actual, expected) -> bool:
    # Struct fields differ in nullability depending on how the DataFrame was built; compare shapes.
    return actual.simpleString() == expected.simpleString()


@dataclass
class WriteResult(WriterCommitMessage):
    """What one successful task wrote."""

    task: int
    attempt: int
    records: int
    by_topic: dict[str, int] = field(default_factory=dict)


class _Failures:
    """Delivery failures of one task, collected from the caller and the producer's I/O thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.quoted: list[str] = []

    def add(self, where: str, error: BaseException) -> None:
        with self._lock:
            self.count += 1
            if len(self.quoted) < QUOTED_FAILURES:
                self.quoted.append(f"{where}: {type(error).__name__}: {error}")

    def __bool__(self) -> bool:
        return self.count > 0


class _ProducingWriter:
    """The part shared by batch and streaming writers: one producer per task."""

    def __init__(self, options: WriteOptions, servers: str, schema: StructType) -> None:
        self.options = options
        self.servers = servers
        self.columns = schema.fieldNames()

    def write(self, iterator) -> WriteResult:
        context = TaskContext.get()
        task, attempt = (context.partitionId(), context.attemptNumber()) if context else (-1, 0)
        failures, by_topic = _Failures(), Counter[str]()
        with Producer(
            servers=self.servers,
            acks=self.options.acks,
            compression=self.options.compression,
            max_block_ms=30_000,
            client_id="tributary-spark",
            **sdk_settings(self.options.security),
        ) as producer:
            self._send_all(producer, iterator, failures, by_topic)
            producer.flush()
        records = sum(by_topic.values())
        if failures:
            raise WriteTaskError(
                f"tributary write task {task} (attempt {attempt}) failed: {failures.count} "
                f"of {records} records not written; " + "; ".join(failures.quoted)
            )
        return WriteResult(task, attempt, records, dict(by_topic))

    def _send_all(self, producer: Producer, iterator, failures: _Failures, by_topic: Counter) -> None:
        counts: dict[str, int] = {}

        def partition_count(topic: str) -> int:
            if topic not in counts:
                counts[topic] = len(producer.partitions_for(topic))
            return counts[topic]

        codec = Compression.from_name(self.options.compression)
        row = 0
        for batch in iterator:
            try:
                for planned in plan_batches(batch, self.options.topic, partition_count, codec):
                    where = (
                        f"{planned.count} rows of {planned.topic}-{planned.partition} "
                        f"from row {row + planned.first_row}"
                    )
                    future = producer.send_batch(planned.topic, planned.partition, planned.data)
                    future.add_errback(failures.add, where)
                    by_topic[planned.topic] += planned.count
            except RowError as exc:
                failures.add(f"row {row + exc.row}", exc)
                return
            except Exception as exc:  # noqa: BLE001 -- reported with its batch, then the task fails
                failures.add(f"rows {row} to {row + batch.num_rows - 1}", exc)
                return
            row += batch.num_rows
            if failures:  # an asynchronous failure: stop sending more
                return

    @staticmethod
    def _summary(messages: list) -> tuple[int, int]:
        done = [m for m in messages if isinstance(m, WriteResult)]
        return len(done), sum(m.records for m in done)


class TributaryWriter(_ProducingWriter, DataSourceArrowWriter):
    """``df.write.format("tributary")``."""

    def commit(self, messages: list) -> None:
        tasks, records = self._summary(messages)
        log.info("tributary write committed: %d records from %d tasks", records, tasks)

    def abort(self, messages: list) -> None:
        tasks, records = self._summary(messages)
        failed = sum(1 for m in messages if not isinstance(m, WriteResult))
        log.warning(
            "tributary write aborted: %d tasks failed; %d finished tasks had written %d records, "
            "which stay in the log (the sink is at-least-once)",
            failed,
            tasks,
            records,
        )


class TributaryStreamWriter(_ProducingWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("tributary")``: each micro-batch written at least once."""

    def commit(self, messages: list, batchId: int) -> None:
        tasks, records = self._summary(messages)
        log.info(
            "tributary stream write: batch %d committed, %d records from %d tasks", batchId, records, tasks
        )

    def abort(self, messages: list, batchId: int) -> None:
        tasks, records = self._summary(messages)
        log.warning(
            "tributary stream write: batch %d aborted; %d finished tasks had written %d records "
            "(at-least-once: the retried batch writes them again)",
            batchId,
            tasks,
            records,
        )
