"""The offline loader: topics -> Parquet partitioned by date and hour, exactly once.

The paper's Hadoop loader (section 4): "data and offsets are stored in HDFS only when the job
completes successfully", so a failed and restarted job neither duplicates nor drops messages.
Here each run loads one *batch*:

1. settle what an interrupted earlier run left (:meth:`OutputStore.recover`);
2. plan the batch: every partition of the topics from where the output's last manifest ended
   (a partition the output never loaded: its earliest offset, or with ``--start-from group``
   the consumer group's committed offset) to its latest offset now -- fixed before Spark
   starts, so retried tasks re-read exactly these records;
3. read exactly those ranges with the tributary source and write Parquet (UTC ``date=``/``hour=``
   of the record timestamp) into the batch's staging directory;
4. commit: fsync, then write the offsets manifest ``_offsets/<batch>.json`` atomically;
5. publish the staged files into the output;
6. only then advance the consumer group's committed offsets (best-effort: the manifests are the
   source of truth; see :mod:`spark_jobs.group_offsets`).

Fault injection: ``TRIBUTARY_LOADER_CRASH_AFTER=write|manifest|publish`` ends the process right
after that step (see :mod:`spark_jobs.faults`).

Run: ``python -m spark_jobs.loader --topic activity --output /data/activity`` (or spark-submit
the same module file with the same arguments).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit spark_jobs/<job>.py): find the project
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.parquet as pq

from gateway.client import TopicPartition
from spark_jobs.cluster import SERVERS_HELP, ClusterView, resolve_addresses
from spark_jobs.faults import maybe_crash_after
from spark_jobs.group_offsets import GroupOffsets
from spark_jobs.offsets import OffsetRange, Offsets, PlanningError, offsets_to_json
from spark_jobs.options import Subscription, parse_security_options
from spark_jobs.output_store import Manifest, OutputStore

log = logging.getLogger("spark_jobs.loader")

DEFAULT_GROUP = "tributary-loader"


@dataclass(frozen=True)
class LoaderConfig:
    servers: str
    topics: tuple[str, ...]
    output: Path
    group: str = DEFAULT_GROUP
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    #: Where partitions the output never loaded start: "earliest" or "group" (committed offsets).
    start_from: str = "earliest"
    #: TLS and token settings as the Spark source's options (``ssl.cafile`` ...), for the read
    #: and for the loader's own connections (planning, the group's offsets); empty: plaintext.
    security_options: tuple[tuple[str, str], ...] = ()

    @property
    def security(self) -> tuple[tuple[str, str], ...]:
        """``security_options`` parsed and checked (the SDK's settings)."""
        return parse_security_options(dict(self.security_options))


@dataclass
class LoadResult:
    """What one run did, for the report."""

    batch_id: int | None
    records: int = 0
    ranges: list[OffsetRange] = field(default_factory=list)
    by_directory: dict[str, int] = field(default_factory=dict)
    recovered: list[str] = field(default_factory=list)
    #: True: the group's offsets now match the output; False: the cluster did not take them;
    #: None: nothing loaded yet, nothing to commit.
    group_committed: bool | None = None
    total_records: int = 0

    def summary(self) -> str:
        lines = [*(f"recovery: {line}" for line in self.recovered)]
        if self.batch_id is None:
            lines.append("nothing new to load: the output is up to date")
        else:
            read = sum(r.size for r in self.ranges)
            lines.append(
                f"batch {self.batch_id}: loaded {self.records} records ({read} offsets) "
                f"into {len(self.by_directory)} date/hour directories"
            )
            lines.extend(f"  {r}" for r in self.ranges if r.size)
        lines.append(f"output holds {self.total_records} records in all")
        lines.append(describe_group_commit(self.group_committed))
        return "\n".join(lines)


def describe_group_commit(committed: bool | None) -> str:
    if committed is None:
        return "group offsets: nothing loaded yet, nothing to commit"
    if committed:
        return "group offsets committed (they match the output)"
    return "group offsets NOT committed (best-effort; the output's _offsets manifests are authoritative)"


# ---- planning ---------------------------------------------------------------------------------


def plan_batch(store: OutputStore, config: LoaderConfig) -> list[OffsetRange]:
    """Ranges of the next batch: every partition, from where the output ends to the latest offset."""
    with ClusterView(config.servers, security=config.security) as view:
        tps = view.partitions(Subscription("subscribe", topics=config.topics), must_exist=True)
        earliest, latest = view.offsets(tps, "earliest"), view.offsets(tps, "latest")
    start = starting_offsets(store, config, tps, earliest)
    ranges = []
    for tp in tps:
        if start[tp] > latest[tp]:
            raise PlanningError(
                f"{tp}: the output has loaded up to offset {start[tp]}, but the log now "
                f"ends at {latest[tp]} (truncated or re-created); load it into a new output "
                f"directory"
            )
        ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], latest[tp]))
    return ranges


def starting_offsets(
    store: OutputStore, config: LoaderConfig, tps: list[TopicPartition], earliest: Offsets
) -> Offsets:
    """Per partition: where the output's manifests end; else the earliest offset (or, with
    ``start_from="group"``, the group's committed offset when it has one).

    The output is the source of truth: a group's offsets may mirror another output directory,
    so a new output reads them only when asked to.
    """
    loaded = store.committed_offsets()
    unknown = [tp for tp in tps if tp not in loaded]
    group: dict[TopicPartition, int] = {}
    if unknown and config.start_from == "group":
        with GroupOffsets(config.servers, config.group, security=config.security) as offsets:
            group = offsets.fetch(unknown) or {}
    return {tp: loaded.get(tp, group.get(tp, earliest[tp])) for tp in tps}


# ---- the Spark part -----------------------------------------------------------------------------


def stage(spark, config: LoaderConfig, ranges: list[OffsetRange], path: Path) -> None:
    """Read exactly ``ranges`` and write them as Parquet by UTC date/hour under ``path``."""
    from pyspark.sql import functions as F

    assignment: dict[str, list[int]] = {}
    for r in ranges:
        assignment.setdefault(r.topic, []).append(r.partition)
    starting = offsets_to_json({r.topic_partition: r.from_offset for r in ranges})
    ending = offsets_to_json({r.topic_partition: r.until_offset for r in ranges})
    reader = (
        spark.read.format("tributary")
        .option("servers", config.servers)
        .option("assign", json.dumps(assignment))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("failOnDataLoss", str(config.fail_on_data_loss).lower())
        .option("includeHeaders", "true")
    )
    if config.min_partitions:
        reader = reader.option("minPartitions", str(config.min_partitions))
    for name, value in config.security_options:
        reader = reader.option(name, value)
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # date=/hour= are UTC whatever the cluster's zone
    frame = (
        reader.load()
        .withColumn("date", F.date_format("timestamp", "yyyy-MM-dd"))
        .withColumn("hour", F.date_format("timestamp", "HH"))
    )
    frame.write.mode("overwrite").partitionBy("date", "hour").parquet(str(path))


def row_counts(store: OutputStore, batch_id: int) -> dict[str, int]:
    """Rows per staged file, from the Parquet footers (no second read of the data)."""
    staging = store.staging_dir(batch_id)
    return {
        relative: pq.read_metadata(staging / relative).num_rows for relative in store.staged_files(batch_id)
    }


# ---- one run ------------------------------------------------------------------------------------


def run_loader(spark, config: LoaderConfig) -> LoadResult:
    """Load the next batch of ``config.topics`` into ``config.output`` (see the module docstring)."""
    store = OutputStore(config.output)
    result = LoadResult(batch_id=None, recovered=store.recover())
    ranges = plan_batch(store, config)
    if any(r.size for r in ranges):
        manifest = load_batch(spark, config, store, ranges)
        result.batch_id, result.records, result.ranges = manifest.batch_id, manifest.records, list(ranges)
        result.by_directory = manifest.by_directory
    result.group_committed = commit_group(store, config)
    result.total_records = sum(m.records for m in store.manifests())
    return result


def load_batch(spark, config: LoaderConfig, store: OutputStore, ranges: list[OffsetRange]) -> Manifest:
    """Stage, commit and publish one batch."""
    batch_id = store.next_batch_id()
    stage(spark, config, ranges, store.staging_dir(batch_id))
    maybe_crash_after("write")
    manifest = store.commit(batch_id, ranges, row_counts(store, batch_id), now_ms=int(time.time() * 1000))
    maybe_crash_after("manifest")
    store.publish(manifest)
    maybe_crash_after("publish")
    return manifest


def commit_group(store: OutputStore, config: LoaderConfig) -> bool | None:
    """Advance the group's offsets to what the output durably holds (best-effort; None: nothing yet)."""
    offsets = {tp: o for tp, o in store.committed_offsets().items() if tp.topic in config.topics}
    last = store.last_manifest()
    if not offsets or last is None:
        return None
    with GroupOffsets(config.servers, config.group, security=config.security) as group:
        return group.commit(offsets, metadata=f"tributary-loader batch {last.batch_id} -> {config.output}")


# ---- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.loader",
        description="Load topics into Parquet partitioned by date/hour, exactly once: each run loads what "
        "arrived since the last one; offsets are written with the data (_offsets/ manifests) "
        "and the consumer group's offsets advance only after the output is durable.",
    )
    parser.add_argument(
        "--topic", action="append", required=True, help="topic to load (repeat or comma-separate for several)"
    )
    parser.add_argument("--output", required=True, type=Path, help="output directory (local path)")
    parser.add_argument(
        "--group", default=DEFAULT_GROUP, help=f"consumer group to commit to (default {DEFAULT_GROUP})"
    )
    parser.add_argument("--servers", help=SERVERS_HELP)
    parser.add_argument(
        "--no-fail-on-data-loss",
        action="store_true",
        help="skip records deleted before they were loaded (logged) instead of failing",
    )
    parser.add_argument("--min-partitions", type=int, help="split large ranges into at least this many tasks")
    parser.add_argument(
        "--start-from",
        choices=("earliest", "group"),
        default="earliest",
        help="where partitions this output never loaded start: their earliest offset "
        "(default) or the group's committed offset",
    )
    parser.add_argument(
        "--ssl-cafile", help="TLS to the gateways: the CA file that signed their certificates"
    )
    parser.add_argument("--ssl-certfile", help="TLS client certificate (with --ssl-keyfile)")
    parser.add_argument("--ssl-keyfile", help="TLS client key")
    parser.add_argument(
        "--token-file", help="a bearer token (OAUTHBEARER over TLS), read each time one is needed"
    )
    parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[2])")
    return parser


def security_options_from_args(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The TLS and token flags as the Spark source's option names (see :class:`LoaderConfig`)."""
    given = {
        "ssl.cafile": args.ssl_cafile,
        "ssl.certfile": args.ssl_certfile,
        "ssl.keyfile": args.ssl_keyfile,
        "sasl.oauthbearer.token.file": args.token_file,
    }
    if args.token_file:
        given["sasl.mechanism"] = "OAUTHBEARER"
    return tuple(sorted((name, str(value)) for name, value in given.items() if value))


def config_from_args(args: argparse.Namespace) -> LoaderConfig:
    topics = tuple(dict.fromkeys(t.strip() for arg in args.topic for t in arg.split(",") if t.strip()))
    return LoaderConfig(
        servers=resolve_addresses(args.servers),
        topics=topics,
        output=args.output.resolve(),
        group=args.group,
        fail_on_data_loss=not args.no_fail_on_data_loss,
        min_partitions=args.min_partitions,
        start_from=args.start_from,
        security_options=security_options_from_args(args),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = config_from_args(args)
    from spark_jobs.session import spark_session

    spark = spark_session("tributary-loader", master=args.master)
    try:
        print(run_loader(spark, config).summary())
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
