"""Batch reads through the tributary source equal what was produced: whole topics, offset and
timestamp bounds, split ranges; bad options fail with a message naming the option."""

import json

import pytest

from tests.e2e.helpers import read_topic


def as_rows(df) -> set[tuple]:
    return {
        (
            r.partition,
            r.offset,
            r.key,
            r.value,
            int(r.timestamp.timestamp() * 1000),
            tuple((h.key, h.value) for h in (r.headers or ())),
        )
        for r in df.collect()
    }


def expected(produced, keep=lambda p: True) -> set[tuple]:
    return {(p.partition, p.offset, p.key, p.value, p.timestamp, p.headers) for p in produced if keep(p)}


def test_a_three_partition_topic_reads_back_exactly(spark, servers, make_topic, produce):
    topic = make_topic(3)
    produced = produce(topic, 300)
    df = read_topic(spark, servers, subscribe=topic, includeHeaders="true")
    rows = df.collect()
    assert len(rows) == 300
    assert as_rows(df) == expected(produced)
    assert {r.topic for r in rows} == {topic} and {r.timestampType for r in rows} == {0}
    assert {p.partition for p in produced} == {0, 1, 2}
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]


def test_offset_bounds_as_json(spark, servers, make_topic, produce):
    topic = make_topic(3)
    produced = produce(topic, 300)
    starting = {topic: {"1": 5, "2": -2}}
    ending = {topic: {"0": 10, "1": -1}}
    df = read_topic(
        spark,
        servers,
        subscribe=topic,
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
        includeHeaders="true",
    )
    want = expected(
        produced,
        lambda p: (
            (p.partition == 0 and p.offset < 10) or (p.partition == 1 and p.offset >= 5) or p.partition == 2
        ),
    )
    assert as_rows(df) == want


def test_timestamp_bounds(spark, servers, make_topic, produce):
    topic = make_topic(2)
    base = 1_700_000_000_000
    produced = produce(topic, 200, timestamps=[base + i * 1000 for i in range(200)])
    start, end = base + 50_000, base + 150_000
    df = read_topic(
        spark, servers, subscribe=topic, startingTimestamp=start, endingTimestamp=end, includeHeaders="true"
    )
    assert as_rows(df) == expected(produced, lambda p: start <= p.timestamp < end)

    by_partition = read_topic(
        spark,
        servers,
        subscribe=topic,
        includeHeaders="true",
        startingOffsetsByTimestamp=json.dumps({topic: {"1": start}}),
    )
    assert as_rows(by_partition) == expected(produced, lambda p: p.partition == 0 or p.timestamp >= start)


def test_min_partitions_splits_ranges_without_changing_the_rows(spark, servers, make_topic, produce):
    topic = make_topic(2)
    produced = produce(topic, 400)
    df = read_topic(spark, servers, subscribe=topic, minPartitions=7, includeHeaders="true")
    assert df.rdd.getNumPartitions() == 7
    assert as_rows(df) == expected(produced)


def test_subscribe_pattern_and_assign(spark, servers, make_topic, produce):
    topic = make_topic(2)
    produced = produce(topic, 100)
    assert read_topic(spark, servers, subscribePattern=f"{topic[:6]}.*{topic[-4:]}").count() == 100
    assigned = read_topic(spark, servers, assign=json.dumps({topic: [1]}))
    assert assigned.count() == sum(1 for p in produced if p.partition == 1)


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param(
            {"subscribe": "a", "assign": '{"a": [0]}'},
            "exactly one of subscribe, subscribePattern, assign",
            id="two-subscriptions",
        ),
        pytest.param(
            {"subscribe": "a", "startingOffsets": "latest"},
            "'startingOffsets': latest (-1) is not allowed",
            id="batch-from-latest",
        ),
        pytest.param(
            {"subscribe": "no-such-topic"},
            "subscribe: topic 'no-such-topic' does not exist",
            id="unknown-topic",
        ),
    ],
)
def test_invalid_reads_fail_naming_the_problem(spark, servers, options, message):
    with pytest.raises(Exception) as caught:
        read_topic(spark, servers, **options).collect()
    assert message in str(caught.value)


def test_read_committed_reads_committed_transactions_only_and_ends_at_the_last_stable_offset(
    spark, servers, make_topic
):
    from gateway.client import Producer

    topic = make_topic(2)
    with Producer(servers=servers, transactional_id=f"spark-e2e-{topic}") as producer:
        producer.init_transactions()
        for outcome in ("committed", "aborted", "open"):
            producer.begin_transaction()
            for i in range(20):
                producer.send(topic, f"{outcome}-{i}".encode(), partition=i % 2)
            producer.flush()
            if outcome == "committed":
                producer.commit_transaction()
            elif outcome == "aborted":
                producer.abort_transaction()
        # "open" stays open while Spark reads: its records are below the high watermark but
        # past the last stable offset.
        committed = read_topic(spark, servers, subscribe=topic, **{"isolation.level": "read_committed"})
        rows = committed.collect()
        everything = read_topic(spark, servers, subscribe=topic)
        uncommitted = {r.value.decode().split("-")[0] for r in everything.collect()}
        producer.abort_transaction()
    assert sorted(r.value.decode() for r in rows) == sorted(f"committed-{i}" for i in range(20))
    assert uncommitted == {"committed", "aborted", "open"}
    # The committed records are the first ten of each partition, at their log offsets.
    for partition in (0, 1):
        assert sorted(r.offset for r in rows if r.partition == partition) == list(range(10))
