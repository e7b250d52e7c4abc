"""The audit job (the paper's section 4): producers' per-window counts checked against what was loaded.

Producers publish monitoring events -- records published per topic per time window -- to the
audit topic (:mod:`spark_jobs.audit_events`). This job reads every audit event, keeps the
largest cumulative count of each ``(producer, topic, window)`` and sums over producers: that is
what *should* be downstream. It counts what *is* downstream -- the loader's Parquet output (or
the topic itself, ``--consumed topic``) -- in the same windows of the record timestamps, and
reports per window:

* ``missing`` = expected - distinct records loaded (when positive): published, never loaded;
* ``duplicated`` = rows loaded more than once (same partition and offset), plus records beyond
  the expected count (e.g. a producer retry that wrote a record twice);
* windows with records but no audit event are listed as *unaudited* (a producer not instrumented).

Run: ``python -m spark_jobs.audit --topic activity --loaded /data/activity``. Exit status 1 when
anything is missing or duplicated.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file (spark-submit spark_jobs/<job>.py): find the project
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datetime import UTC

from spark_jobs.audit_events import AUDIT_TOPIC
from spark_jobs.cluster import SERVERS_HELP, resolve_addresses

log = logging.getLogger("spark_jobs.audit")

WindowKey = tuple[str, int]  # (topic, window_start ms)


@dataclass(frozen=True)
class Loaded:
    """Records found downstream in one window: rows, and distinct (partition, offset) among them."""

    rows: int
    distinct: int


@dataclass(frozen=True)
class WindowAudit:
    topic: str
    window_start: int
    window_ms: int
    expected: int
    loaded: int
    missing: int
    duplicated: int

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0


@dataclass
class AuditReport:
    windows: list[WindowAudit] = field(default_factory=list)
    unaudited: list[WindowAudit] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return sum(w.missing for w in self.windows)

    @property
    def duplicated(self) -> int:
        return sum(w.duplicated for w in self.windows)

    @property
    def expected(self) -> int:
        return sum(w.expected for w in self.windows)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicated == 0

    def to_json(self) -> dict:
        return {
            "windows": [asdict(w) for w in self.windows],
            "unaudited": [asdict(w) for w in self.unaudited],
            "missing": self.missing,
            "duplicated": self.duplicated,
            "expected": self.expected,
            "ok": self.ok,
        }


def reconcile(expected: dict[WindowKey, int], loaded: dict[WindowKey, Loaded], window_ms: int) -> AuditReport:
    """Compare expected counts per window with what was loaded. Pure."""
    report = AuditReport()
    for key in sorted(set(expected) | set(loaded)):
        got = loaded.get(key, Loaded(0, 0))
        if key not in expected:
            report.unaudited.append(WindowAudit(key[0], key[1], window_ms, 0, got.rows, 0, 0))
            continue
        want = expected[key]
        report.windows.append(
            WindowAudit(
                topic=key[0],
                window_start=key[1],
                window_ms=window_ms,
                expected=want,
                loaded=got.rows,
                missing=max(0, want - got.distinct),
                duplicated=(got.rows - got.distinct) + max(0, got.distinct - want),
            )
        )
    return report


# ---- the Spark part -----------------------------------------------------------------------------


def expected_counts(
    spark, servers: str, audit_topic: str, topics: tuple[str, ...]
) -> tuple[dict[WindowKey, int], int]:
    """``{(topic, window): count}`` from the audit topic, and the window size the producers used."""
    from pyspark.sql import functions as F

    schema = "producer string, topic string, window_start long, window_ms long, count long"
    events = (
        spark.read.format("tributary")
        .option("servers", servers)
        .option("subscribe", audit_topic)
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
        .select("e.*")
        .where(F.col("topic").isin(list(topics)))
    )
    latest = events.groupBy("producer", "topic", "window_start", "window_ms").agg(
        F.max("count").alias("count")
    )
    rows = latest.groupBy("topic", "window_start", "window_ms").agg(F.sum("count").alias("count")).collect()
    sizes = {r["window_ms"] for r in rows}
    if len(sizes) > 1:
        raise ValueError(f"audit events use different window sizes {sorted(sizes)}; audit them separately")
    return {(r["topic"], r["window_start"]): r["count"] for r in rows}, (sizes.pop() if sizes else 0)


def loaded_counts(frame, window_ms: int) -> dict[WindowKey, Loaded]:
    """Rows and distinct (partition, offset) per window of a DataFrame with the source's columns."""
    from pyspark.sql import functions as F

    millis = F.unix_millis(F.col("timestamp"))
    rows = (
        frame.withColumn("window_start", millis - F.pmod(millis, F.lit(window_ms)))
        .groupBy("topic", "window_start")
        .agg(F.count(F.lit(1)).alias("rows"), F.count_distinct("partition", "offset").alias("distinct"))
        .collect()
    )
    return {(r["topic"], r["window_start"]): Loaded(r["rows"], r["distinct"]) for r in rows}


def consumed_frame(spark, servers: str, topics: tuple[str, ...], loaded: Path | None):
    """What was consumed: the loader's Parquet output, or (without ``loaded``) the topics themselves."""
    from pyspark.sql import functions as F

    if loaded is not None:
        return spark.read.parquet(str(loaded)).where(F.col("topic").isin(list(topics)))
    return (
        spark.read.format("tributary").option("servers", servers).option("subscribe", ",".join(topics)).load()
    )


def run_audit(
    spark, servers: str, topics: tuple[str, ...], *, loaded: Path | None, audit_topic: str = AUDIT_TOPIC
) -> AuditReport:
    expected, window_ms = expected_counts(spark, servers, audit_topic, topics)
    if not window_ms:
        return AuditReport()
    consumed = loaded_counts(consumed_frame(spark, servers, topics, loaded), window_ms)
    return reconcile(expected, consumed, window_ms)


# ---- report ------------------------------------------------------------------------------------


def format_report(report: AuditReport, *, max_rows: int = 40, totals: bool = True) -> str:
    """A table of the audited windows (problem windows first when there are many)."""
    from datetime import datetime

    def when(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")

    windows = sorted(report.windows, key=lambda w: (w.ok, w.topic, w.window_start))[:max_rows]
    lines = [
        f"{'TOPIC':<20} {'WINDOW (UTC)':<17} {'EXPECTED':>9} {'LOADED':>9} {'MISSING':>8} {'DUPLICATED':>10}"
    ]
    for w in sorted(windows, key=lambda w: (w.topic, w.window_start)):
        lines.append(
            f"{w.topic:<20} {when(w.window_start):<17} {w.expected:>9} {w.loaded:>9} "
            f"{w.missing:>8} {w.duplicated:>10}"
        )
    if len(report.windows) > max_rows:
        lines.append(f"... {len(report.windows) - max_rows} more windows, all OK")
    if totals:
        lines.append(
            f"audited {len(report.windows)} windows: expected {report.expected}, "
            f"missing {report.missing}, duplicated {report.duplicated}"
        )
    if report.unaudited:
        lines.append(
            f"{len(report.unaudited)} windows have records but no audit events "
            f"({sum(w.loaded for w in report.unaudited)} records from producers without auditing)"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.audit",
        description="Check producers' audit counts (per topic per time window) against what was "
        "consumed, and report missing and duplicated records per window.",
    )
    parser.add_argument("--topic", action="append", required=True, help="audited topic (repeat for several)")
    parser.add_argument(
        "--loaded", type=Path, help="the loader's output directory (default: read the topic itself)"
    )
    parser.add_argument(
        "--audit-topic", default=AUDIT_TOPIC, help=f"topic of the audit events (default {AUDIT_TOPIC})"
    )
    parser.add_argument("--servers", help=SERVERS_HELP)
    parser.add_argument("--report", type=Path, help="also write the report as JSON here")
    parser.add_argument("--master", help="Spark master (default: $SPARK_MASTER or local[2])")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    topics = tuple(dict.fromkeys(t.strip() for arg in args.topic for t in arg.split(",") if t.strip()))
    servers = resolve_addresses(args.servers)
    from spark_jobs.session import spark_session

    spark = spark_session("tributary-audit", master=args.master)
    try:
        report = run_audit(spark, servers, topics, loaded=args.loaded, audit_topic=args.audit_topic)
    finally:
        spark.stop()
    print(format_report(report))
    if args.report:
        args.report.write_text(json.dumps(report.to_json(), indent=1))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
