"""The offline loader is exactly-once: killed after writing output but before committing, and run
again, the output holds every produced record once; the group's offsets follow the output."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from gateway.client import TopicPartition
from spark_jobs.faults import CRASH_EXIT_CODE, LOADER_CRASH_ENV
from spark_jobs.group_offsets import GroupOffsets
from spark_jobs.loader import LoaderConfig, run_loader
from spark_jobs.output_store import OutputStore
from spark_jobs.session import PROJECT_ROOT


def run_loader_process(
    servers: str, topic: str, output: Path, group: str, crash_after: str
) -> subprocess.CompletedProcess:
    env = {**os.environ, LOADER_CRASH_ENV: crash_after, "PYTHONPATH": PROJECT_ROOT}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_jobs.loader",
            "--servers",
            servers,
            "--topic",
            topic,
            "--output",
            str(output),
            "--group",
            group,
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def published_records(output: Path) -> list[tuple]:
    table = pq.read_table(output)  # what any Parquet reader sees: _offsets and _staging are skipped
    return sorted(
        zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("value").to_pylist(),
        )
    )


def test_killed_loader_rerun_loads_every_record_once(spark, servers, make_topic, produce, tmp_path, caplog):
    topic, output, group = make_topic(3), tmp_path / "activity", f"loader-{tmp_path.name}"
    store = OutputStore(output)
    produced = produce(topic, 300)

    crashed = run_loader_process(servers, topic, output, group, crash_after="write")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
    assert store.staged_files(0), "the killed run had written no output"
    assert store.manifests() == [] and store.published_files() == []

    produced += produce(topic, 100, start=300)
    crashed = run_loader_process(servers, topic, output, group, crash_after="manifest")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
    assert [m.records for m in store.manifests()] == [400] and store.published_files() == []

    produced += produce(topic, 50, start=400)
    config = LoaderConfig(servers=servers, topics=(topic,), output=output, group=group)
    with caplog.at_level(logging.WARNING, logger="spark_jobs.group_offsets"):
        result = run_loader(spark, config)
    assert any("publish finished" in line for line in result.recovered)
    assert (result.batch_id, result.records, result.total_records) == (1, 50, 450)

    assert published_records(output) == sorted((p.partition, p.offset, p.value) for p in produced)
    assert not store.staged_batches()

    again = run_loader(spark, config)
    assert again.batch_id is None and again.total_records == 450

    latest = {
        TopicPartition(topic, p): 1 + max(r.offset for r in produced if r.partition == p) for p in range(3)
    }
    with GroupOffsets(servers, group) as offsets:
        committed = offsets.fetch(latest)
    if result.group_committed:
        assert committed == latest
    else:  # the cluster does not serve group offsets: best-effort, said clearly
        assert "offsets NOT committed" in caplog.text
