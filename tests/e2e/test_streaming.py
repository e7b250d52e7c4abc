"""Streaming reads resume from the checkpoint without loss or duplicates, across runs, rate limits
and partitions added while the query is stopped."""

import pyarrow.parquet as pq

from gateway.client import NewPartitions


def run_available_now(spark, servers, topic, output, checkpoint, **options):
    reader = (
        spark.readStream.format("tributary")
        .option("servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        reader = reader.option(name, str(value))
    query = (
        reader.load()
        .select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress]


def loaded(output) -> list[tuple]:
    table = pq.read_table(output)
    return sorted(
        zip(
            table.column("partition").to_pylist(),
            table.column("offset").to_pylist(),
            table.column("value").to_pylist(),
        )
    )


def test_available_now_twice_with_new_data_and_a_new_partition(
    spark, servers, admin, make_topic, produce, tmp_path
):
    topic = make_topic(3)
    first = produce(topic, 250)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    batches = run_available_now(spark, servers, topic, output, checkpoint, maxOffsetsPerTrigger=100)
    assert batches == [100, 100, 50]
    assert loaded(output) == sorted((p.partition, p.offset, p.value) for p in first)

    second = produce(topic, 120, start=250)
    admin.create_partitions({topic: NewPartitions(4)})
    third = produce(topic, 30, start=370, partition=3)  # only in the partition added while stopped
    batches = run_available_now(spark, servers, topic, output, checkpoint, maxOffsetsPerTrigger=100)
    assert sum(batches) == 150 and max(batches) <= 100

    rows = loaded(output)
    assert len(rows) == len({(p, o) for p, o, _ in rows}), "a record was read twice"
    assert rows == sorted((p.partition, p.offset, p.value) for p in first + second + third)


def test_a_run_with_nothing_new_reads_nothing(spark, servers, make_topic, produce, tmp_path):
    topic = make_topic(1)
    produce(topic, 20)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    assert sum(run_available_now(spark, servers, topic, output, checkpoint)) == 20
    assert sum(run_available_now(spark, servers, topic, output, checkpoint)) == 0
    assert len(loaded(output)) == 20
