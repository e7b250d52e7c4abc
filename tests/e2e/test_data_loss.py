"""failOnDataLoss: records deleted before a query read them fail it clearly, or are skipped with a warning.

The executors' warning is read back from ``spark.tvf.python_worker_logs()`` for batch reads;
Spark does not collect worker logs of streaming Python data source reads, so the streaming test
checks what was skipped, and the warning of the shared read path is checked in
``tests/unit/spark_jobs/test_range_reader.py``.
"""

import json

import pyarrow.parquet as pq
import pytest

from tests.e2e.helpers import read_topic, worker_log_lines


def start_stream(spark, servers, topic, output, checkpoint, fail_on_data_loss: bool):
    return (
        spark.readStream.format("tributary")
        .option("servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", str(fail_on_data_loss).lower())
        .load()
        .select("partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_records_deleted_before_a_stream_read_them(
    spark, servers, make_topic, produce, delete_records, tmp_path
):
    topic = make_topic(1)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    produce(topic, 100)
    query = start_stream(spark, servers, topic, output, checkpoint, fail_on_data_loss=True)
    query.awaitTermination(120)
    assert query.exception() is None

    produce(topic, 100, start=100)
    assert delete_records(topic, 0, 150) == 150  # offsets 100..149 go before the stream saw them

    failing = start_stream(spark, servers, topic, output, checkpoint, fail_on_data_loss=True)
    with pytest.raises(Exception) as caught:
        failing.awaitTermination(120)
    assert (
        f"data loss: offsets 100 to 149 (50 records) of {topic}-0 were deleted (retention or "
        f"delete-records) before they were read; the log now starts at 150"
    ) in str(caught.value)
    assert "Set failOnDataLoss=false" in str(caught.value)

    skipping = start_stream(spark, servers, topic, output, checkpoint, fail_on_data_loss=False)
    skipping.awaitTermination(120)
    assert skipping.exception() is None
    offsets = sorted(pq.read_table(output).column("offset").to_pylist())
    assert offsets == list(range(100)) + list(range(150, 200))


def test_a_batch_asking_for_deleted_offsets(spark, servers, make_topic, produce, delete_records):
    topic = make_topic(1)
    produce(topic, 60)
    delete_records(topic, 0, 20)
    start = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match=f"offsets 0 to 19 \\(20 records\\) of {topic}-0 were deleted"):
        read_topic(spark, servers, subscribe=topic, startingOffsets=start).collect()
    rows = read_topic(
        spark, servers, subscribe=topic, startingOffsets=start, failOnDataLoss="false"
    ).collect()
    assert sorted(r.offset for r in rows) == list(range(20, 60))
    warnings = worker_log_lines(spark, f"skipping offsets 0 to 19 (20 records) of {topic}-0")
    assert warnings and warnings[0].startswith("failOnDataLoss=false: skipping")
