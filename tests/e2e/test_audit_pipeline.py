"""The audit finds records lost between producers and the loaded output; the main job reports a clean run."""

import time
import uuid

from gateway.client import NewTopic, Producer
from spark_jobs.activity import activity_events
from spark_jobs.audit import run_audit
from spark_jobs.audit_events import AuditingProducer
from spark_jobs.loader import LoaderConfig, run_loader
from spark_jobs.pipeline import PipelineConfig, format_summary, run_pipeline

WINDOW_MS = 60_000


def test_the_audit_finds_an_injected_loss(spark, servers, admin, make_topic, delete_records, tmp_path):
    topic, audit_topic = make_topic(2), f"audit-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(audit_topic, 1)])
    # Whole windows: an unaligned span starts with a sliver of a window, whose few records may all
    # land on partition 1, and the loss of partition 0's first 40 then starts one window later.
    end_ms = int(time.time() * 1000) // WINDOW_MS * WINDOW_MS
    producer = AuditingProducer(Producer(servers=servers), audit_topic=audit_topic, window_ms=WINDOW_MS)
    with producer:
        for event in activity_events(600, end_ms=end_ms, span_ms=5 * WINDOW_MS):
            producer.send(topic, event.value, key=event.key, timestamp=event.timestamp)
    # The loss: 40 records of partition 0 vanish before the loader gets to them; it skips them.
    delete_records(topic, 0, 40)
    output = tmp_path / "loaded"
    run_loader(spark, LoaderConfig(servers=servers, topics=(topic,), output=output, fail_on_data_loss=False))

    report = run_audit(spark, servers, (topic,), loaded=output, audit_topic=audit_topic)
    assert report.expected == 600
    assert (report.missing, report.duplicated) == (40, 0)
    assert not report.ok
    lossy = [w for w in report.windows if w.missing]
    assert lossy and lossy[0].window_start == min(w.window_start for w in report.windows)  # the oldest went


def test_the_main_job_loads_and_audits_a_clean_run(spark, servers, tmp_path):
    config = PipelineConfig(
        servers=servers,
        records=2_000,
        topic=f"activity-{uuid.uuid4().hex[:6]}",
        partitions=3,
        output=tmp_path / "warehouse",
        audit_topic=f"audit-{uuid.uuid4().hex[:6]}",
    )
    partitions, loaded, report = run_pipeline(spark, config)
    assert partitions == 3 and loaded.records == 2_000
    assert report.ok and report.expected == 2_000 and len(report.windows) >= 6
    assert "OK -- every audited record was loaded exactly once" in format_summary(config, loaded, report)
