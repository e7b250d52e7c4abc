"""Writing DataFrames to topics (batch and streaming) and reading them back; failed tasks say why."""

from collections import Counter

import pytest

from tests.e2e.helpers import read_topic

HEADERS = "array<struct<key:string,value:binary>>"


def write_to(df, servers: str, topic: str, mode: str) -> None:
    df.write.format("tributary").option("servers", servers).option("topic", topic).mode(mode).save()


def test_write_then_read_back(spark, servers, make_topic):
    topic = make_topic(2)
    rows = [(f"k{i}", f"v{i}", i % 2, [("n", str(i).encode())], "ignored-topic-column") for i in range(100)]
    schema = f"key string, value string, partition int, headers {HEADERS}, topic string"
    df = spark.createDataFrame(rows, schema)
    df.write.format("tributary").option("servers", servers).option("topic", topic).mode("append").save()

    back = read_topic(spark, servers, subscribe=topic, includeHeaders="true").collect()
    got = sorted((r.key, r.value, r.partition, [(h.key, h.value) for h in r.headers]) for r in back)
    assert got == sorted((k.encode(), v.encode(), p, h) for k, v, p, h, _ in rows)


def test_the_topic_column_routes_rows_without_the_option(spark, servers, make_topic):
    first, second = make_topic(1), make_topic(1)
    df = spark.createDataFrame(
        [(first if i % 3 else second, f"v{i}".encode()) for i in range(30)], "topic string, value binary"
    )
    df.write.format("tributary").option("servers", servers).mode("append").save()
    assert read_topic(spark, servers, subscribe=first).count() == 20
    assert read_topic(spark, servers, subscribe=second).count() == 10


def test_a_failed_write_names_the_task_and_the_reason(spark, servers, make_topic):
    topic = make_topic(2)
    df = spark.createDataFrame([("fine", 0), ("bad", 9)], "value string, partition int").repartition(1)
    with pytest.raises(Exception) as caught:
        df.write.format("tributary").option("servers", servers).option("topic", topic).mode("append").save()
    message = str(caught.value)
    assert "tributary write task 0 (attempt 0) failed" in message
    assert f"partition 9 of topic '{topic}' does not exist (2 partitions)" in message


def test_a_dataframe_without_value_is_refused_before_any_task(spark, servers, make_topic):
    df = spark.createDataFrame([("k",)], "key string")
    with pytest.raises(Exception, match="needs a 'value' column"):
        write_to(df, servers, make_topic(1), "append")


def test_a_topic_cannot_be_overwritten(spark, servers, make_topic):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="cannot be overwritten, only appended to"):
        write_to(df, servers, make_topic(1), "overwrite")


def test_write_stream_copies_a_topic(spark, servers, make_topic, produce, tmp_path):
    source, target = make_topic(2), make_topic(3)
    produced = produce(source, 150)
    query = (
        spark.readStream.format("tributary")
        .option("servers", servers)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
        .select("key", "value", "headers")
        .writeStream.format("tributary")
        .option("servers", servers)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    copied = read_topic(spark, servers, subscribe=target, includeHeaders="true").collect()
    assert Counter((r.key, r.value, tuple((h.key, h.value) for h in r.headers)) for r in copied) == Counter(
        (p.key, p.value, p.headers) for p in produced
    )
