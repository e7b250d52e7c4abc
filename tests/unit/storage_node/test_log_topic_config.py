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
    ],
)
def test_bad_names_and_values_name_the_culprit(configs, fragment):
    with pytest.raises(InvalidConfigError, match=fragment.replace(".", r"\.")):
        validate_topic_configs(configs)


def test_log_config_overlays_layers_and_round_trips():
    cfg = LogConfig.from_dict({"retention.ms": "100"}, {"retention.ms": 200, "cleanup.policy": "compact"})
    assert cfg.retention_ms == 200 and not cfg.delete_enabled and not cfg.log_append_time
    assert LogConfig.from_dict(cfg.to_dict()) == cfg
    assert set(cfg.to_dict()) == set(topic_config.TOPIC_CONFIGS)
