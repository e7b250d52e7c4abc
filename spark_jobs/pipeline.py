"""The main job: produce activity events with audit events, load them, audit them, print a report.

Given a running cluster (``tributary cluster up``; servers from ``$TRIBUTARY_GATEWAY`` or the
local cluster's ``cluster.json``)::

    python -m spark_jobs.pipeline --records 20000

1. creates the activity topic and the audit topic if missing;
2. produces N activity events (:mod:`spark_jobs.activity`) through an
   :class:`~spark_jobs.audit_events.AuditingProducer`, which publishes per-window counts;
3. runs the offline loader (:mod:`spark_jobs.loader`) on local Spark: the topic -> Parquet by
   date/hour under ``<data dir>/warehouse/<topic>``, exactly once;
4. runs the audit (:mod:`spark_jobs.audit`) of the audit events against the loaded Parquet;
5. prints the report; exits 1 if anything was lost or duplicated.

Running it again adds N more events and loads only those; the audit covers everything loaded.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit spark_jobs/<job>.py): find the project
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.client import Admin, NewTopic, Producer
from gateway.client.errors import TopicAlreadyExistsError
from gateway.client.servers import default_data_dir
from spark_jobs.activity import activity_events
from spark_jobs.audit import AuditReport, format_report, run_audit
from spark_jobs.audit_events import AUDIT_TOPIC, AuditingProducer
from spark_jobs.cluster import SERVERS_HELP, resolve_addresses
from spark_jobs.loader import LoaderConfig, LoadResult, describe_group_commit, run_loader

log = logging.getLogger("spark_jobs.pipeline")


@dataclass(frozen=True)
class PipelineConfig:
    servers: str
    records: int
    topic: str
    partitions: int
    output: Path
    span_minutes: int = 30
    window_minutes: int = 5
    audit_topic: str = AUDIT_TOPIC


def ensure_topics(config: PipelineConfig) -> int:
    """Create the activity and audit topics if missing; returns the activity topic's partition count."""
    with Admin(servers=config.servers) as admin:
        for topic in (NewTopic(config.topic, config.partitions), NewTopic(config.audit_topic, 1)):
            try:
                admin.create_topics([topic])
            except TopicAlreadyExistsError:
                pass
        return len(admin.describe_topics([config.topic])[0].partitions)


def produce_activity(config: PipelineConfig) -> int:
    """Produce the events with auditing; returns how many audit windows they span."""
    end_ms = int(time.time() * 1000)
    producer = Producer(servers=config.servers, linger_ms=10, compression="lz4")
    window_ms = config.window_minutes * 60_000
    with AuditingProducer(producer, audit_topic=config.audit_topic, window_ms=window_ms) as audited:
        for event in activity_events(
            config.records, end_ms=end_ms, span_ms=config.span_minutes * 60_000, seed=end_ms
        ):
            audited.send(config.topic, event.value, key=event.key, timestamp=event.timestamp)
        audited.flush(timeout=120)
        return len(audited.counter.events(audited.producer_id, end_ms))


def run_pipeline(spark, config: PipelineConfig) -> tuple[int, LoadResult, AuditReport]:
    """Steps 1-4 of the module docstring."""
    partitions = ensure_topics(config)
    windows = produce_activity(config)
    print(
        f"produced  {config.records} activity events to '{config.topic}' ({partitions} partitions), "
        f"with audit events for {windows} windows of {config.window_minutes} min",
        flush=True,
    )
    loader = LoaderConfig(servers=config.servers, topics=(config.topic,), output=config.output)
    loaded = run_loader(spark, loader)
    report = run_audit(
        spark, config.servers, (config.topic,), loaded=config.output, audit_topic=config.audit_topic
    )
    return partitions, loaded, report


def format_summary(config: PipelineConfig, loaded: LoadResult, report: AuditReport) -> str:
    batch = (
        "nothing new" if loaded.batch_id is None else f"{loaded.records} records in batch {loaded.batch_id}"
    )
    verdict = (
        "OK -- every audited record was loaded exactly once"
        if report.ok
        else f"LOSS/DUPLICATES FOUND -- missing {report.missing}, duplicated {report.duplicated}"
    )
    return "\n".join(
        [
            f"loaded    {batch} -> {config.output} ({len(loaded.by_directory)} date/hour directories; "
            f"{loaded.total_records} records in the output in all)",
            f"          {describe_group_commit(loaded.group_committed)}",
            f"audited   {len(report.windows)} windows: expected {report.expected}, missing {report.missing}, "
            f"duplicated {report.duplicated}",
            f"result    {verdict}",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.pipeline",
        description="Produce activity events (with audit events), load them to Parquet with the offline "
        "loader, audit the load, and print a report. Needs a running cluster.",
    )
    parser.add_argument(
        "--records", type=int, default=20_000, help="activity events to produce (default 20000)"
    )
    parser.add_argument("--topic", default="activity", help="activity topic (default activity)")
    parser.add_argument(
        "--partitions", type=int, default=3, help="partitions if the topic is created (default 3)"
    )
    parser.add_argument("--output", type=Path, help="loader output (default <data dir>/warehouse/<topic>)")
    parser.add_argument(
        "--span-minutes", type=int, default=30, help="events are spread over the last N minutes (default 30)"
    )
    parser.add_argument("--window-minutes", type=int, default=5, help="audit window (default 5)")
    parser.add_argument("--servers", help=SERVERS_HELP)
    parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[2])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.records < 1:
        raise SystemExit("--records must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    output = (args.output or default_data_dir() / "warehouse" / args.topic).resolve()
    config = PipelineConfig(
        servers=resolve_addresses(args.servers),
        records=args.records,
        topic=args.topic,
        partitions=args.partitions,
        output=output,
        span_minutes=args.span_minutes,
        window_minutes=args.window_minutes,
    )
    from spark_jobs.session import spark_session

    spark = spark_session("tributary-pipeline", master=args.master)
    try:
        _, loaded, report = run_pipeline(spark, config)
    finally:
        spark.stop()
    print(format_report(report, max_rows=12, totals=False))
    print(format_summary(config, loaded, report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
