"""The ``tributary`` PySpark data source: batch and streaming reads, batch and streaming writes.

::

    from spark_jobs import register
    register(spark)
    df = (spark.read.format("tributary").option("subscribe", "activity")
          .option("startingOffsets", "earliest").load())

Options are documented in :mod:`spark_jobs.options`, the columns in :mod:`spark_jobs.schema`,
the writer in :mod:`spark_jobs.sink`.

Where the code runs: Spark calls ``reader()``/``partitions()``/``latestOffset()`` in Python
worker processes beside the driver (planning), and ``read()`` in executor tasks. Planning asks
the cluster for partitions and offsets and fixes every task's offset range; the ranges, the
options and the resolved gateway addresses are all a task gets (pickled), so a retried task reads
exactly the same records. Connections are opened inside the call that needs them.

Streaming offsets are Kafka-style JSON ``{"topic": {"partition": next offset}}`` in the
checkpoint: a restarted query resumes at exactly the checkpointed offsets, without loss or
duplicates. Partitions that appear while a query runs are read from their earliest offset.
"""

from __future__ import annotations

import logging

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from services.offset_spec import EARLIEST, LATEST
from spark_jobs.cluster import ClusterView, resolve_addresses, resolve_offsets
from spark_jobs.offsets import (
    OffsetRange,
    Offsets,
    offsets_from_json,
    offsets_to_json,
    plan_batch,
    plan_stream_end,
    plan_stream_ranges,
)
from spark_jobs.options import OptionError, ReadOptions, WriteOptions
from spark_jobs.range_reader import DataLossError, RangeReadSettings, read_range
from spark_jobs.schema import read_schema

log = logging.getLogger("spark_jobs.source")


class RangePartition(InputPartition):
    """One Spark input partition: one offset range of one topic partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(tuple(rng))
        self.range = rng


def _ensure_schema(schema: StructType, options: ReadOptions) -> None:
    expected = read_schema(options.include_headers)
    if schema is not None and schema != expected:
        raise OptionError(
            "schema",
            f"the tributary source has a fixed schema ({expected.simpleString()}); do not pass .schema(...)",
        )


def _settings(options: ReadOptions, servers: str) -> RangeReadSettings:
    return RangeReadSettings(
        servers=servers,
        fail_on_data_loss=options.fail_on_data_loss,
        include_headers=options.include_headers,
        poll_timeout_ms=options.poll_timeout_ms,
        isolation_level=options.isolation_level,
        security=options.security,
    )


class TributaryDataSource(DataSource):
    """``format("tributary")``: read (batch, stream) and write (batch, stream) topics."""

    @classmethod
    def name(cls) -> str:
        return "tributary"

    def schema(self) -> StructType:
        # Only includeHeaders shapes the schema; the rest is checked when a reader is made
        # (writes call this too, with writer options).
        value = str(self.options.get("includeheaders", "false")).strip().lower()
        return read_schema(value == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        options = ReadOptions.parse(self.options, streaming=False)
        _ensure_schema(schema, options)
        return TributaryBatchReader(options, resolve_addresses(options.servers))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = ReadOptions.parse(self.options, streaming=True)
        _ensure_schema(schema, options)
        return TributaryStreamReader(options, resolve_addresses(options.servers))

    def writer(self, schema: StructType, overwrite: bool):
        from spark_jobs.sink import TributaryWriter, ensure_appending, ensure_writable

        ensure_appending(overwrite)
        options = WriteOptions.parse(self.options)
        ensure_writable(schema, options)
        return TributaryWriter(options, resolve_addresses(options.servers), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from spark_jobs.sink import TributaryStreamWriter, ensure_appending, ensure_writable

        ensure_appending(overwrite)
        options = WriteOptions.parse(self.options)
        ensure_writable(schema, options)
        return TributaryStreamWriter(options, resolve_addresses(options.servers), schema)


# ---- batch -------------------------------------------------------------------------------------


class TributaryBatchReader(DataSourceReader):
    """A batch read: offsets resolved once in ``partitions()``, then one task per range."""

    def __init__(self, options: ReadOptions, servers: str) -> None:
        self.options = options
        self.servers = servers

    def partitions(self) -> list[RangePartition]:
        ranges = self.plan()
        log.info(
            "tributary batch read planned %d ranges, %d records", len(ranges), sum(r.size for r in ranges)
        )
        return [RangePartition(r) for r in ranges]

    def plan(self) -> list[OffsetRange]:
        """The offset ranges this read covers, resolved against the cluster now."""
        o = self.options
        with ClusterView(
            self.servers, isolation_level=self.options.isolation_level, security=self.options.security
        ) as view:
            tps = view.partitions(o.subscription, must_exist=True)
            earliest, latest = view.offsets(tps, "earliest"), view.offsets(tps, "latest")
            start = resolve_offsets(
                view,
                o.starting_bound(streaming=False),
                tps,
                default=EARLIEST,
                option=o.starting_option,
                earliest=earliest,
                latest=latest,
                no_match=o.timestamp_strategy,
            )
            end = resolve_offsets(
                view,
                o.ending_bound(),
                tps,
                default=LATEST,
                option=o.ending_option,
                earliest=earliest,
                latest=latest,
            )
        return plan_batch(start, end, latest, min_partitions=o.min_partitions)

    def read(self, partition: InputPartition):
        assert isinstance(partition, RangePartition), "this reader plans RangePartitions only"
        return read_range(partition.range, _settings(self.options, self.servers))


# ---- streaming ---------------------------------------------------------------------------------


class TributaryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: micro-batches between checkpointed per-partition offsets.

    Spark keeps one instance in a planner process for the whole query and asks it for offsets
    every trigger (every few milliseconds when idle), so it keeps one cluster connection open
    (``stop()`` closes it). The connection is never pickled: tasks get the options and offsets only.
    """

    def __init__(self, options: ReadOptions, servers: str) -> None:
        self.options = options
        self.servers = servers
        #: Trigger.AvailableNow: the latest offsets when the query started; never read past them.
        self.target: Offsets | None = None
        self._view: ClusterView | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_view": None}

    def _cluster(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(
                self.servers, isolation_level=self.options.isolation_level, security=self.options.security
            )
        return self._view

    def _partitions(self):
        return self._cluster().partitions(self.options.subscription, must_exist=False)

    def initialOffset(self) -> dict:
        o, view = self.options, self._cluster()
        tps = self._partitions()
        earliest, latest = view.offsets(tps, "earliest"), view.offsets(tps, "latest")
        start = resolve_offsets(
            view,
            o.starting_bound(streaming=True),
            tps,
            default=LATEST,
            option=o.starting_option,
            earliest=earliest,
            latest=latest,
            no_match=o.timestamp_strategy,
        )
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._cluster().offsets(self._partitions(), "latest")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        view = self._cluster()
        tps = self._partitions()
        earliest, latest = view.offsets(tps, "earliest"), view.offsets(tps, "latest")
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        step = plan_stream_end(
            offsets_from_json(start),
            tps,
            earliest=earliest,
            latest=latest,
            target=self.target,
            max_rows=max_rows,
        )
        for loss in step.losses:
            self._report_loss(loss)
        return offsets_to_json(step.end)

    def _report_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"data loss: {message}. Set failOnDataLoss=false to go on without them.")
        log.warning("failOnDataLoss=false: %s", message)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._cluster().offsets(self._partitions(), "latest"))

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        ranges = plan_stream_ranges(
            offsets_from_json(start), offsets_from_json(end), min_partitions=self.options.min_partitions
        )
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition):
        assert isinstance(partition, RangePartition), "this reader plans RangePartitions only"
        return read_range(partition.range, _settings(self.options, self.servers))

    def commit(self, end: dict) -> None:
        """Nothing to do: the checkpoint holds the offsets (like Spark's Kafka source)."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
