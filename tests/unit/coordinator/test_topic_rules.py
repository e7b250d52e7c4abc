import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator import keys, topic_rules
from coordinator.main import main as coordinator_main
from coordinator.model import TopicRecord
from coordinator.placement import assign_replicas
from coordinator.topic_rules import (
    MAX_TOPIC_NAME_LENGTH,
    ensure_record_fits,
    ensure_valid_new_partition_count,
    ensure_valid_partition_count,
    ensure_valid_topic_name,
    ensure_within_cluster_limit,
    ensure_within_topic_limit,
    resolve_replication_factor,
)
from services.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    PolicyViolationError,
)


@pytest.mark.parametrize("name", ["a", "orders", "A.b_c-9", "x" * MAX_TOPIC_NAME_LENGTH, "...", "_"])
def test_legal_names(name):
    ensure_valid_topic_name(name)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param(".", '"."', id="dot"),
        pytest.param("..", '"."', id="dotdot"),
        pytest.param("x" * (MAX_TOPIC_NAME_LENGTH + 1), "249", id="too-long"),
        pytest.param("a/b", "'/'", id="slash"),
        pytest.param("with space", "' '", id="space"),
        pytest.param("caf\u00e9", "\u00e9", id="non-ascii"),
        pytest.param("a:b", "':'", id="colon"),
    ],
)
def test_illegal_names_say_why(name, fragment):
    with pytest.raises(InvalidTopicError) as info:
        ensure_valid_topic_name(name)
    assert fragment in str(info.value)
    assert info.value.reason == "INVALID_TOPIC_EXCEPTION"


@pytest.mark.parametrize("count", [0, -1, -100])
def test_partition_count_must_be_positive(count):
    with pytest.raises(InvalidPartitionsError, match="larger than 0"):
        ensure_valid_partition_count(count)


def test_replication_factor_rules():
    assert resolve_replication_factor(0, 3) == 1  # 0 = the cluster default
    assert resolve_replication_factor(3, 3) == 3
    with pytest.raises(InvalidReplicationFactorError, match="larger than available brokers: 2"):
        resolve_replication_factor(3, 2)
    with pytest.raises(InvalidReplicationFactorError, match="larger than 0"):
        resolve_replication_factor(-1, 3)
    with pytest.raises(InvalidReplicationFactorError):
        resolve_replication_factor(0, 0)  # no live node at all


def test_partitions_only_grow():
    ensure_valid_new_partition_count("t", 3, 4)
    with pytest.raises(InvalidPartitionsError, match="already has 3"):
        ensure_valid_new_partition_count("t", 3, 3)
    with pytest.raises(InvalidPartitionsError, match="not be an increase"):
        ensure_valid_new_partition_count("t", 3, 2)


def test_partition_limits():
    ensure_within_topic_limit("t", 10_000, 10_000)
    with pytest.raises(InvalidPartitionsError, match="1000000 partitions is more than the 10000") as info:
        ensure_within_topic_limit("t", 1_000_000, 10_000)
    assert "max_partitions_per_topic" in info.value.message
    ensure_within_cluster_limit("t", 100, 199_900, 200_000)
    with pytest.raises(PolicyViolationError, match="would make 200001 in the cluster") as caught:
        ensure_within_cluster_limit("t", 101, 199_900, 200_000)
    assert caught.value.reason == "POLICY_VIOLATION" and "max_partitions_per_cluster" in caught.value.message


def test_the_largest_default_topic_fits_in_one_etcd_write_and_a_wider_one_is_refused_before_placement():
    four_digit_nodes = range(1000, 1010)
    ensure_record_fits("t", 10_000, 3, four_digit_nodes, {"retention.ms": "86400000"})
    with pytest.raises(PolicyViolationError, match="lower replication factor"):
        ensure_record_fits("t", 10_000, 25, four_digit_nodes, {})


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(st.integers(0, 10**12), min_size=1, max_size=12, unique=True),
    partitions=st.integers(1, 300),
    data=st.data(),
)
def test_the_record_bound_is_never_below_the_encoded_record(nodes, partitions, data):
    factor = data.draw(st.integers(1, len(nodes)))
    configs = data.draw(
        st.dictionaries(st.sampled_from(["retention.ms", "cleanup.policy"]), st.text(max_size=8))
    )
    racks = {node: "" for node in nodes}
    assignment = assign_replicas(racks, partitions, factor, rng=random.Random(0))
    record = TopicRecord("t", "f" * 32, factor, configs, tuple(tuple(r) for r in assignment), deleting=True)
    width = max(len(str(n)) for n in nodes)
    bound = keys.topic_value_bound(partitions, factor, width, configs)
    assert (
        len(keys.encode_topic(record))
        <= bound
        <= len(keys.encode_topic(record)) + partitions * factor * width + 8
    )


@pytest.mark.parametrize("flag", ["--max-partitions-per-topic", "--max-partitions-per-cluster"])
def test_a_partition_limit_below_one_is_refused_at_start(flag, capsys):
    assert coordinator_main([flag, "0"]) == 2
    assert f"{flag} must be at least 1, not 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("configs", "reason"),
    [
        ({"compression.type": "zstd"}, "compression.type other than 'producer'"),
    ],
)
def test_settings_accepted_by_kafka_but_not_honoured_yet_are_refused(configs, reason):
    from services.topic_config import validate_topic_configs

    with pytest.raises(InvalidConfigError, match=reason):
        topic_rules.ensure_supported_configs(validate_topic_configs(configs))


def test_supported_settings_pass():
    from services.topic_config import validate_topic_configs

    topic_rules.ensure_supported_configs(
        validate_topic_configs(
            {"cleanup.policy": "delete", "compression.type": "producer", "min.insync.replicas": "2"}
        )
    )


@pytest.mark.parametrize("policy", ["compact", "delete,compact", "compact,delete"])
def test_compaction_is_accepted_now_that_the_log_cleaner_honours_it(policy):
    from services.topic_config import validate_topic_configs

    topic_rules.ensure_supported_configs(
        validate_topic_configs(
            {
                "cleanup.policy": policy,
                "min.cleanable.dirty.ratio": "0.1",
                "min.compaction.lag.ms": "0",
                "max.compaction.lag.ms": "600000",
                "delete.retention.ms": "1000",
            }
        )
    )
