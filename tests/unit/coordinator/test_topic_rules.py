import pytest

from coordinator.topic_rules import (
    MAX_TOPIC_NAME_LENGTH,
    ensure_valid_new_partition_count,
    ensure_valid_partition_count,
    ensure_valid_topic_name,
    resolve_replication_factor,
)
from services.errors import InvalidPartitionsError, InvalidReplicationFactorError, InvalidTopicError


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
