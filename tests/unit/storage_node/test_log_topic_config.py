from __future__ import annotations

import pytest

from services import topic_config
from services.errors import InvalidConfigError
from services.topic_config import resolve_topic_configs, validate_topic_configs
from storage_node.log.config import LogConfig


def test_defaults_are_kafkas():
    resolved = resolve_topic_configs()
    assert resolved["segment.bytes"] == 1 << 30
    assert resolved["segment.ms"] == 7 * 24 * 3600 * 1000
    assert resolved["retention.ms"] == 7 * 24 * 3600 * 1000
    assert resolved["retention.bytes"] == -1
    assert resolved["index.interval.bytes"] == 4096
    assert resolved["max.message.bytes"] == 1048588
    assert resolved["cleanup.policy"] == ("delete",)
    assert resolved["message.timestamp.type"] == "CreateTime"
    assert resolved["unclean.leader.election.enable"] is False


def test_string_values_are_typed():
    typed = validate_topic_configs(
        {
            "retention.ms": "-1",
            "cleanup.policy": "delete, compact",
            "unclean.leader.election.enable": "TRUE",
            "message.timestamp.type": "LogAppendTime",
            "compression.type": "zstd",
            "segment.bytes": 14,
        }
    )
    assert typed == {
        "retention.ms": -1,
        "cleanup.policy": ("compact", "delete"),
        "unclean.leader.election.enable": True,
        "message.timestamp.type": "LogAppendTime",
        "compression.type": "zstd",
        "segment.bytes": 14,
    }


@pytest.mark.parametrize(
    "configs, fragment",
    [
        ({"retention.msx": "1"}, "retention.msx"),
        ({"segment.bytes": "13"}, "segment.bytes"),
        ({"segment.bytes": str(2**31)}, "segment.bytes"),
        ({"retention.ms": "-2"}, "retention.ms"),
        ({"retention.ms": "1h"}, "1h"),
        ({"flush.messages": True}, "flush.messages"),
        ({"cleanup.policy": "delete,forever"}, "cleanup.policy"),
        ({"message.timestamp.type": "createtime"}, "message.timestamp.type"),
        ({"compression.type": "brotli"}, "compression.type"),
        ({"unclean.leader.election.enable": "yes"}, "unclean.leader.election.enable"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio"),
        ({"min.cleanable.dirty.ratio": "-0.1"}, "min.cleanable.dirty.ratio"),
        ({"min.cleanable.dirty.ratio": "nan"}, "min.cleanable.dirty.ratio"),
        ({"min.cleanable.dirty.ratio": "half"}, "half"),
        ({"min.compaction.lag.ms": "-1"}, "min.compaction.lag.ms"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
        ({"delete.retention.ms": "-1"}, "delete.retention.ms"),
        ({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, "min.compaction.lag.ms"),
    ],
)
def test_bad_names_and_values_name_the_culprit(configs, fragment):
    with pytest.raises(InvalidConfigError, match=fragment.replace(".", r"\.")):
        validate_topic_configs(configs)


def test_compaction_configs_are_typed_and_reach_the_log_config():
    cfg = LogConfig.from_dict(
        {
            "cleanup.policy": "compact,delete",
            "min.cleanable.dirty.ratio": "0.25",
            "min.compaction.lag.ms": "1000",
            "max.compaction.lag.ms": "60000",
            "delete.retention.ms": "5000",
            "segment.ms": "600000",
        }
    )
    assert cfg.compact_enabled and cfg.delete_enabled
    assert (cfg.min_cleanable_dirty_ratio, cfg.min_compaction_lag_ms) == (0.25, 1000)
    assert (cfg.max_compaction_lag_ms, cfg.delete_retention_ms) == (60000, 5000)
    assert cfg.max_segment_ms == 60000  # the active segment rolls in time for max.compaction.lag.ms
    assert (
        LogConfig.from_dict({"segment.ms": "600000", "max.compaction.lag.ms": "60000"}).max_segment_ms
        == 600000
    )
    assert LogConfig.from_dict(cfg.to_dict()) == cfg


def test_compaction_lags_out_of_order_across_layers_are_refused():
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms"):
        LogConfig.from_dict({"max.compaction.lag.ms": "100"}, {"min.compaction.lag.ms": "200"})


def test_log_config_overlays_layers_and_round_trips():
    cfg = LogConfig.from_dict({"retention.ms": "100"}, {"retention.ms": 200, "cleanup.policy": "compact"})
    assert cfg.retention_ms == 200 and not cfg.delete_enabled and not cfg.log_append_time
    assert LogConfig.from_dict(cfg.to_dict()) == cfg
    assert set(cfg.to_dict()) == set(topic_config.TOPIC_CONFIGS)


#: Kafka's type of each integer config: LONG (int64) or INT (int32).
_LONG_CONFIGS = (
    "segment.ms",
    "retention.ms",
    "retention.bytes",
    "flush.messages",
    "flush.ms",
    "file.delete.delay.ms",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "delete.retention.ms",
)
_INT_CONFIGS = (
    "segment.bytes",
    "segment.index.bytes",
    "index.interval.bytes",
    "max.message.bytes",
    "min.insync.replicas",
)


def test_every_integer_config_is_typed_and_bounded_at_both_ends():
    integer_configs = {
        name
        for name, d in topic_config.TOPIC_CONFIGS.items()
        if isinstance(d.default, int) and not isinstance(d.default, bool)
    }
    assert integer_configs == set(_LONG_CONFIGS) | set(_INT_CONFIGS)
    for name in _LONG_CONFIGS:
        definition = topic_config.TOPIC_CONFIGS[name]
        assert definition.min >= topic_config.LONG_MIN and definition.max == topic_config.LONG_MAX
    for name in _INT_CONFIGS:
        definition = topic_config.TOPIC_CONFIGS[name]
        assert definition.min >= topic_config.INT_MIN and definition.max == topic_config.INT_MAX


@pytest.mark.parametrize("name", _LONG_CONFIGS)
def test_long_configs_refuse_values_beyond_64_bits_naming_the_range(name):
    """Issue item 8: retention.ms=2^64 (and beyond) was accepted."""
    definition = topic_config.TOPIC_CONFIGS[name]
    assert validate_topic_configs({name: str(2**63 - 1)}) == {name: 2**63 - 1}
    for raw in (str(2**63), str(2**64), "9" * 40, 2**64, str(-(2**63) - 1)):
        with pytest.raises(InvalidConfigError) as info:
            validate_topic_configs({name: raw})
        assert info.value.message.endswith(
            f"for configuration {name}: value must be between {definition.min} and {2**63 - 1}"
        )


@pytest.mark.parametrize("name", _INT_CONFIGS)
def test_int_configs_refuse_values_beyond_32_bits_naming_the_range(name):
    definition = topic_config.TOPIC_CONFIGS[name]
    assert validate_topic_configs({name: str(2**31 - 1)}) == {name: 2**31 - 1}
    with pytest.raises(
        InvalidConfigError, match=rf"{name}: value must be between {definition.min} and {2**31 - 1}$"
    ):
        validate_topic_configs({name: str(2**31)})


def test_a_huge_value_is_not_echoed_back_whole():
    with pytest.raises(InvalidConfigError) as info:
        validate_topic_configs({"retention.ms": "9" * 100_000})
    assert len(info.value.message) < 300 and "retention.ms" in info.value.message
