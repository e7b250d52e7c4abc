"""Option parsing of the tributary data source: Kafka's names, lower-cased strings in, clear errors out."""

import pytest

from gateway.client.structs import TopicPartition
from services.acks import Acks
from spark_jobs.offsets import Earliest, GlobalTimestamp, Latest, SpecificOffsets, SpecificTimestamps
from spark_jobs.options import OptionError, ReadOptions, WriteOptions

P = pytest.param


def batch(**options):
    return ReadOptions.parse({k.lower(): v for k, v in options.items()}, streaming=False)


def stream(**options):
    return ReadOptions.parse({k.lower(): v for k, v in options.items()}, streaming=True)


def error_of(parse, **options) -> OptionError:
    with pytest.raises(OptionError) as caught:
        parse(**options)
    return caught.value


# ---- subscriptions ------------------------------------------------------------------------------


def test_subscribe_splits_and_deduplicates_topics():
    options = batch(subscribe=" a, b ,a,")
    assert options.subscription.kind == "subscribe"
    assert options.subscription.topics == ("a", "b")


def test_subscribe_pattern_is_a_full_match():
    subscription = batch(subscribePattern="act.*").subscription
    assert subscription.matches("activity") and not subscription.matches("reactivity")


def test_assign_is_parsed_into_sorted_partitions():
    subscription = batch(assign='{"b": [1], "a": [2, 0]}').subscription
    assert subscription.assignment == (TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1))


@pytest.mark.parametrize(
    "options, named",
    [
        P({}, "subscribe", id="none"),
        P({"subscribe": "a", "assign": '{"a": [0]}'}, "assign", id="two"),
        P(
            {"subscribe": "a", "subscribePattern": "a.*", "assign": '{"a":[0]}'},
            "subscribePattern",
            id="three",
        ),
    ],
)
def test_exactly_one_subscription_option(options, named):
    error = error_of(batch, **options)
    assert error.option == named
    assert "exactly one of subscribe, subscribePattern, assign" in str(error)


@pytest.mark.parametrize(
    "value, fragment",
    [
        pytest.param("{nope", "not valid JSON", id="json"),
        pytest.param('["a"]', "topic -> partition list", id="not-object"),
        pytest.param('{"a": [0, -1]}', "non-negative integers", id="negative"),
        pytest.param('{"a": "0"}', "non-negative integers", id="not-list"),
    ],
)
def test_bad_assign_is_explained(value, fragment):
    error = error_of(batch, assign=value)
    assert error.option == "assign" and fragment in str(error)


def test_bad_pattern_and_empty_subscribe():
    assert "regular expression" in str(error_of(batch, subscribePattern="("))
    lookahead = error_of(batch, subscribePattern="(?=act)a.*")  # fine in Python's re, not RE2
    assert lookahead.option == "subscribePattern" and "invalid perl operator" in str(lookahead)
    assert "at most 1000" in str(error_of(batch, subscribePattern="a" * 1001))
    assert error_of(batch, subscribe=" , ").option == "subscribe"


# ---- offsets ----------------------------------------------------------------------------------


def test_defaults_follow_kafka_earliest_for_batch_latest_for_streaming():
    assert batch(subscribe="a").starting_bound(streaming=False) == Earliest()
    assert stream(subscribe="a").starting_bound(streaming=True) == Latest()
    assert batch(subscribe="a").ending_bound() == Latest()


def test_json_offsets_accept_minus_two_and_minus_one():
    options = batch(
        subscribe="a", startingOffsets='{"a": {"0": 5, "1": -2}}', endingOffsets='{"a": {"0": -1}}'
    )
    assert options.starting == SpecificOffsets({TopicPartition("a", 0): 5, TopicPartition("a", 1): -2})
    assert options.ending == SpecificOffsets({TopicPartition("a", 0): -1})
    assert options.starting_option == "startingOffsets"


def test_keywords_are_case_insensitive():
    assert batch(subscribe="a", startingOffsets="EARLIEST").starting == Earliest()


@pytest.mark.parametrize(
    "options, named, fragment",
    [
        P({"startingOffsets": "latest"}, "startingOffsets", "not allowed as a starting", id="latest-start"),
        P(
            {"startingOffsets": '{"a": {"0": -1}}'},
            "startingOffsets",
            "not allowed as a start",
            id="json-latest",
        ),
        P({"endingOffsets": "earliest"}, "endingOffsets", "not allowed as an ending", id="earliest-end"),
        P(
            {"endingOffsets": '{"a": {"0": -2}}'},
            "endingOffsets",
            "not allowed as an ending",
            id="json-earliest",
        ),
        P({"startingOffsets": '{"a": {"0": -3}}'}, "startingOffsets", "not a non-negative", id="minus-three"),
        P({"startingOffsets": '{"a": {"x": 1}}'}, "startingOffsets", "partition 'x'", id="partition-name"),
        P({"startingOffsets": "soon"}, "startingOffsets", "earliest, latest or JSON", id="word"),
        P(
            {"startingOffsets": "earliest", "startingTimestamp": "5"},
            "startingTimestamp",
            "conflicts",
            id="two-starts",
        ),
        P({"endingOffsets": "latest", "endingTimestamp": "5"}, "endingTimestamp", "conflicts", id="two-ends"),
        P({"startingTimestamp": "yesterday"}, "startingTimestamp", "milliseconds", id="timestamp"),
        P(
            {"startingOffsetsByTimestamp": '{"a": {"0": -2}}'},
            "startingOffsetsByTimestamp",
            "non-negative",
            id="negative-timestamp",
        ),
    ],
)
def test_invalid_batch_offsets_name_the_option(options, named, fragment):
    error = error_of(batch, subscribe="a", **options)
    assert error.option == named and fragment in str(error)


def test_streaming_queries_have_no_end():
    error = error_of(stream, subscribe="a", endingOffsets="latest")
    assert error.option == "endingOffsets" and "streaming" in str(error)


def test_streaming_may_start_at_latest():
    assert stream(subscribe="a", startingOffsets="latest").starting == Latest()


def test_timestamps():
    assert batch(subscribe="a", startingTimestamp="1000").starting == GlobalTimestamp(1000)
    by_partition = batch(subscribe="a", startingOffsetsByTimestamp='{"a": {"1": 2000}}')
    assert by_partition.starting == SpecificTimestamps({TopicPartition("a", 1): 2000})
    assert batch(subscribe="a", endingTimestamp="3000").ending == GlobalTimestamp(3000)


# ---- everything else --------------------------------------------------------------------------


def test_scalars():
    options = batch(
        subscribe="a",
        maxOffsetsPerTrigger="100",
        minPartitions="4",
        failOnDataLoss="False",
        includeHeaders="true",
        servers="h:1, h:2",
        pollTimeoutMs="500",
    )
    assert (options.max_offsets_per_trigger, options.min_partitions) == (100, 4)
    assert options.fail_on_data_loss is False and options.include_headers is True
    assert options.servers == "h:1, h:2" and options.poll_timeout_ms == 500


def test_isolation_level_in_either_spelling():
    assert batch(subscribe="a", **{"isolation.level": "READ_COMMITTED"}).isolation_level == "read_committed"
    kafka_spelling = batch(subscribe="a", **{"kafka.isolation.level": "read_committed"})
    assert kafka_spelling.isolation_level == "read_committed"
    with pytest.raises(OptionError, match="contradicts"):
        batch(
            subscribe="a",
            **{"isolation.level": "read_committed", "kafka.isolation.level": "read_uncommitted"},
        )
    with pytest.raises(OptionError, match=r"'isolation\.level': must be read_uncommitted or read_committed"):
        batch(subscribe="a", **{"isolation.level": "serializable"})


def test_defaults():
    options = batch(subscribe="a")
    assert options.isolation_level == "read_uncommitted"
    assert options.fail_on_data_loss is True and options.include_headers is False
    assert options.max_offsets_per_trigger is None and options.min_partitions is None


@pytest.mark.parametrize(
    "options, named",
    [
        pytest.param({"minPartitions": "0"}, "minPartitions", id="zero"),
        pytest.param({"maxOffsetsPerTrigger": "many"}, "maxOffsetsPerTrigger", id="word"),
        pytest.param({"failOnDataLoss": "yes"}, "failOnDataLoss", id="bool"),
        pytest.param({"servers": "localhost"}, "servers", id="no-port"),
        pytest.param(
            {"startingOffsetsByTimestampStrategy": "closest"},
            "startingOffsetsByTimestampStrategy",
            id="strategy",
        ),
        pytest.param({"startingoffset": "earliest"}, "startingoffset", id="typo"),
    ],
)
def test_invalid_scalars_name_the_option(options, named):
    assert error_of(batch, subscribe="a", **options).option == named


def test_unknown_options_are_rejected_with_the_supported_list():
    error = error_of(batch, subscribe="a", kafkaBootstrapServers="x")
    assert "unknown option" in str(error) and "subscribePattern" in str(error)


def test_path_passed_by_spark_is_tolerated():
    assert batch(subscribe="a", path="ignored").subscription.topics == ("a",)


def test_write_options():
    options = WriteOptions.parse({"topic": "t", "compression": "LZ4", "acks": "1"})
    assert (options.topic, options.compression, options.acks) == ("t", "lz4", 1)
    assert WriteOptions.parse({}).acks is Acks.ALL
    assert WriteOptions.parse({"acks": "-1"}).acks is Acks.ALL
    with pytest.raises(OptionError, match="compression"):
        WriteOptions.parse({"compression": "brotli"})
    with pytest.raises(OptionError, match="acks"):
        WriteOptions.parse({"acks": "2"})
    with pytest.raises(OptionError, match="unknown option"):
        WriteOptions.parse({"subscribe": "t"})
