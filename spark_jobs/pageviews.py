"""The streaming job: page views per page per minute, computed continuously from the activity topic.

Reads activity events (:mod:`spark_jobs.activity`) with ``spark.readStream.format("tributary")``,
counts them per page in tumbling event-time windows of the record timestamp, and writes:

* ``--output DIR``: Parquet, append mode -- a window is written once, when the watermark
  (the latest event time seen minus ``--watermark``) has passed its end, so each row is final;
* ``--console``: every trigger's updated counts (update mode), for watching it run.

The checkpoint (``--checkpoint``) holds the source's per-partition offsets and the aggregation
state, so a restarted job resumes where it stopped, without losing or double-counting events.
``--available-now`` processes what is in the topic and stops (for batch-style schedules and
tests); otherwise it runs until interrupted.

Run: ``python -m spark_jobs.pageviews --topic activity --checkpoint /tmp/pv-ck --console``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit spark_jobs/<job>.py): find the project
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_jobs.cluster import SERVERS_HELP, resolve_addresses

log = logging.getLogger("spark_jobs.pageviews")

EVENT_SCHEMA = "user string, page string, ts long"


def page_views(
    spark,
    servers: str,
    topic: str,
    *,
    window: str = "1 minute",
    watermark: str = "2 minutes",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
):
    """The streaming DataFrame ``(window_start, window_end, page, views)``."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("tributary")
        .option("servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    events = (
        reader.load()
        .select(
            F.col("timestamp").alias("event_time"),
            F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("event"),
        )
        .where(F.col("event.page").isNotNull())
    )
    return (
        events.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), F.col("event.page").alias("page"))
        .agg(F.count(F.lit(1)).alias("views"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page",
            "views",
        )
    )


def start_query(
    frame, *, checkpoint: Path, output: Path | None, available_now: bool, trigger_seconds: int = 10
):
    """Start writing ``frame`` to Parquet (append) or the console (update)."""
    writer = frame.writeStream.option("checkpointLocation", str(checkpoint)).queryName("tributary-pageviews")
    if output is not None:
        writer = writer.format("parquet").option("path", str(output)).outputMode("append")
    else:
        writer = writer.format("console").option("truncate", "false").outputMode("update")
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    )
    return writer.start()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.pageviews",
        description="Streaming page views per page per minute from the activity topic, to Parquet or the "
        "console.",
    )
    parser.add_argument("--topic", default="activity", help="activity topic (default activity)")
    parser.add_argument(
        "--checkpoint", type=Path, required=True, help="checkpoint directory (offsets and state)"
    )
    sink = parser.add_mutually_exclusive_group(required=True)
    sink.add_argument("--output", type=Path, help="write final per-window counts as Parquet here")
    sink.add_argument("--console", action="store_true", help="print updated counts every trigger")
    parser.add_argument("--window", default="1 minute", help="window length (default '1 minute')")
    parser.add_argument("--watermark", default="2 minutes", help="allowed lateness (default '2 minutes')")
    parser.add_argument("--starting-offsets", default="earliest", help="first start: earliest or latest")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch")
    parser.add_argument("--trigger-seconds", type=int, default=10, help="micro-batch interval (default 10)")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    parser.add_argument("--servers", help=SERVERS_HELP)
    parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[2])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    servers = resolve_addresses(args.servers)
    from spark_jobs.session import spark_session

    spark = spark_session("tributary-pageviews", master=args.master)
    frame = page_views(
        spark,
        servers,
        args.topic,
        window=args.window,
        watermark=args.watermark,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
    )
    query = start_query(
        frame,
        checkpoint=args.checkpoint,
        output=args.output,
        available_now=args.available_now,
        trigger_seconds=args.trigger_seconds,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
