"""Batch-read throughput of the tributary Spark source, beside Parquet holding the same records.

One topic is filled with N records of 200-byte values (10-byte keys), then, on local Spark:

* **tributary source** -- ``spark.read.format("tributary")`` of the whole topic, every column
  materialised (written to Spark's ``noop`` sink): planning, one task per partition range,
  executors fetching raw batches through the gateway and decoding them with the SDK;
* **parquet** -- the same records, first written to Parquet by the source, read the same way
  (every column, ``noop`` sink): what reading them from a data lake costs;
* **in-memory Arrow source** -- a Python data source whose readers yield Arrow batches of the
  same shape built in memory (no cluster, no decoding): the ceiling of PySpark's Python data
  source path on this machine, which the tributary source cannot beat;
* **tributary sink** -- the Parquet copy written back to a new topic with
  ``df.write.format("tributary")`` (key and value columns): the sink's Arrow batches encoded into
  RecordBatch v2 and produced, every record acknowledged;
* **read_range, no Spark** -- the executor's read path (:func:`spark_jobs.range_reader.read_range`)
  run for every partition one after the other in this process: the per-core ceiling the Spark
  tasks work under;
* **SDK poll** -- one ``Consumer`` assigned every partition, polling from the beginning until it
  has all N records: ``poll()`` (a ``ConsumerRecord`` per record) and ``poll_arrow()`` (one
  ``pyarrow.Table`` per poll), in this process.

Each Spark read runs ``--runs`` times; the table shows the best (the first run also pays for
Python worker start-up). The tributary read is checked: the row count must equal N.

    python bench/spark.py                       # 200,000 records, own cluster, local[2]
    python bench/spark.py --records 1000000
    python bench/spark.py --gateway 127.0.0.1:9092 --master 'local[4]'
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gateway.client import Admin, NewTopic, Producer
from spark_jobs.offsets import OffsetRange
from spark_jobs.range_reader import RangeReadSettings, read_range

VALUE_BYTES = 200
KEY_BYTES = 10


@dataclass
class Row:
    name: str
    records: int
    seconds: float
    tasks: int | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.rate * (VALUE_BYTES + KEY_BYTES) / 1e6


def fill(servers: str, topic: str, count: int) -> float:
    """Produce ``count`` records (SDK, large batches); returns the seconds it took."""
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    started = time.perf_counter()
    with Producer(
        servers=servers, linger_ms=20, batch_size=256 * 1024, max_request_size=4 * 1024 * 1024
    ) as producer:
        for i in range(count):
            producer.send(topic, value, key=b"%010d" % i)
        producer.flush()
    return time.perf_counter() - started


def timed_noop(frame) -> float:
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def best_of(runs: int, measure) -> float:
    return min(measure() for _ in range(runs))


def spark_rows(spark, servers: str, topic: str, count: int, runs: int, parquet_dir: str) -> list[Row]:
    source = spark.read.format("tributary").option("servers", servers).option("subscribe", topic)
    got = source.load().count()
    if got != count:
        raise SystemExit(f"the tributary source read {got} records of {count}")
    tasks = source.load().rdd.getNumPartitions()
    rows = [Row("tributary source -> noop", count, best_of(runs, lambda: timed_noop(source.load())), tasks)]
    started = time.perf_counter()
    source.load().write.mode("overwrite").parquet(parquet_dir)
    rows.append(Row("tributary source -> parquet files", count, time.perf_counter() - started, tasks))
    parquet = spark.read.parquet(parquet_dir)
    seconds = best_of(runs, lambda: timed_noop(spark.read.parquet(parquet_dir)))
    rows.append(Row("parquet -> noop", count, seconds, parquet.rdd.getNumPartitions()))
    rows.append(ceiling_row(spark, count, runs))
    rows.append(sink_row(spark, servers, count, parquet_dir))
    return rows


def ceiling_row(spark, count: int, runs: int) -> Row:
    """An Arrow source with nothing behind it: PySpark's own cost per record, for comparison."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_jobs.schema import read_schema

    class MemoryReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(4)]

        def read(self, partition):
            import pyarrow as pa

            from gateway.client.arrow import record_schema

            rows = count // 4 + (partition.value < count % 4)
            start = 0
            while start < rows:
                n = min(20_000, rows - start)
                yield pa.RecordBatch.from_arrays(
                    [
                        pa.repeat(pa.scalar(b"k" * KEY_BYTES, pa.binary()), n),
                        pa.repeat(pa.scalar(b"v" * VALUE_BYTES, pa.binary()), n),
                        pa.repeat(pa.scalar("memory", pa.string()), n),
                        pa.repeat(pa.scalar(partition.value, pa.int32()), n),
                        pa.array(range(start, start + n), pa.int64()),
                        pa.repeat(pa.scalar(0, pa.int64()), n).cast(pa.timestamp("us", tz="UTC")),
                        pa.repeat(pa.scalar(0, pa.int32()), n),
                    ],
                    schema=record_schema(include_headers=False),
                )
                start += n

    class MemorySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_memory_arrow"

        def schema(self):
            return read_schema(False)

        def reader(self, schema):
            return MemoryReader()

    spark.dataSource.register(MemorySource)
    frame = spark.read.format("bench_memory_arrow")
    seconds = best_of(runs, lambda: timed_noop(frame.load()))
    return Row("in-memory Arrow source -> noop (PySpark ceiling)", count, seconds, 4)


def sink_row(spark, servers: str, count: int, parquet_dir: str) -> Row:
    """The Parquet copy's key and value written to a new topic through the tributary sink."""
    topic = f"bench-spark-sink-{uuid.uuid4().hex[:8]}"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(topic, 4)])
    frame = spark.read.parquet(parquet_dir).select("key", "value")
    tasks = frame.rdd.getNumPartitions()
    started = time.perf_counter()
    frame.write.format("tributary").option("servers", servers).option("topic", topic).mode("append").save()
    seconds = time.perf_counter() - started
    with Admin(servers=servers) as admin:
        ends = admin.list_offsets({(topic, p): "latest" for p in range(4)})
    written = sum(e.offset for e in ends.values())
    if written != count:
        raise SystemExit(f"the tributary sink wrote {written} records of {count}")
    return Row("parquet -> tributary sink", count, seconds, tasks)


def sdk_poll_rows(servers: str, topic: str, partitions: int, count: int) -> list[Row]:
    """One consumer reading the whole topic with ``poll`` and, when the SDK has it, ``poll_arrow``."""
    from gateway.client import Consumer, TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    rows = []
    for name in ("poll", "poll_arrow"):
        with Consumer(
            servers=servers, max_poll_records=20_000, max_partition_fetch_bytes=4 * 1024 * 1024
        ) as consumer:
            method = getattr(consumer, name, None)
            if method is None:
                continue
            consumer.assign(tps)
            consumer.seek_to_beginning()
            read = 0
            started = time.perf_counter()
            while read < count:
                polled = method(timeout_ms=1000)
                read += polled.num_rows if name == "poll_arrow" else sum(map(len, polled.values()))
            seconds = time.perf_counter() - started
        if read != count:
            raise SystemExit(f"the SDK's {name}() read {read} records of {count}")
        rows.append(Row(f"SDK {name}() (1 consumer, no Spark)", count, seconds, 1))
    return rows


def read_range_row(servers: str, topic: str, partitions: int, count: int) -> Row:
    with Admin(servers=servers) as admin:
        ends = admin.list_offsets({(topic, p): "latest" for p in range(partitions)})
    settings = RangeReadSettings(servers=servers)
    started = time.perf_counter()
    read = sum(
        batch.num_rows
        for p in range(partitions)
        for batch in read_range(OffsetRange(topic, p, 0, ends[(topic, p)].offset), settings)
    )
    if read != count:
        raise SystemExit(f"read_range read {read} records of {count}")
    return Row("read_range, no Spark (1 process, sequential)", count, time.perf_counter() - started, 1)


def run(servers: str, args) -> list[Row]:
    from spark_jobs.session import spark_session

    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(topic, args.partitions)])
    progress(f"filling {topic} ({args.partitions} partitions) with {args.records:,} records ...")
    seconds = fill(servers, topic, args.records)
    progress(f"filled in {seconds:.1f}s ({args.records / seconds:,.0f} records/s)")
    spark = spark_session("tributary-bench", master=args.master)
    try:
        with tempfile.TemporaryDirectory(prefix="tributary-bench-parquet-") as parquet_dir:
            rows = spark_rows(spark, servers, topic, args.records, args.runs, parquet_dir + "/data")
    finally:
        spark.stop()
    rows.append(read_range_row(servers, topic, args.partitions, args.records))
    rows.extend(sdk_poll_rows(servers, topic, args.partitions, args.records))
    return rows


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def print_table(rows: list[Row], master: str) -> None:
    header = (
        f"{'read (' + master + ')':50} {'records':>10} {'tasks':>5} {'seconds':>8} {'records/s':>10} "
        f"{'MB/s':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.name:50} {row.records:>10,} {row.tasks or '-':>5} {row.seconds:>8.2f} "
            f"{row.rate:>10,.0f} {row.mb_per_s:>7.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000, help="records in the topic (default 200000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the topic (default 4)")
    parser.add_argument(
        "--runs", type=int, default=2, help="runs of each Spark read; the best is shown (default 2)"
    )
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--gateway", help="use this cluster (host:port) instead of starting a local one")
    parser.add_argument("--storage-nodes", type=int, default=2, help="storage nodes of the local cluster")
    args = parser.parse_args(argv)
    if args.records < 1 or args.runs < 1:
        parser.error("--records and --runs must be at least 1")
    print(
        f"{args.records:,} records of {VALUE_BYTES}-byte values; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    load_at_start = os.getloadavg()[0]
    if args.gateway:
        rows = run(args.gateway, args)
    else:
        from launcher.local_cluster import LocalCluster, LocalClusterSpec

        with tempfile.TemporaryDirectory(prefix="tributary-bench-spark-") as directory:
            progress("starting a local cluster ...")
            with LocalCluster(directory, LocalClusterSpec(storage_nodes=args.storage_nodes)) as cluster:
                rows = run(cluster.gateway, args)
    print_table(rows, args.master)
    print(f"load average (1 min): {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
