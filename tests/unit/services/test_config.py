import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.config import ConfigError, add_config_arguments, config_from_args, load_config


@dataclass
class Example:
    node_id: int = 0
    log_dirs: list[Path] = field(default_factory=lambda: [Path("data")])
    flush_before_ack: bool = False
    topic_defaults: dict[str, str] = field(default_factory=dict)
    ready_file: Path | None = None
    ratio: float = 0.5


def test_defaults():
    cfg = load_config(Example)
    assert cfg == Example()


def test_precedence_file_then_env_then_flags(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text('"node.id" = 3\n"log.dirs" = ["/a", "/b"]\nflush_before_ack = true\n')
    env = {"TRIB_NODE_ID": "4", "TRIB_RATIO": "0.25", "OTHER": "x"}
    cfg = load_config(
        Example, file=toml, env=env, env_prefix="TRIB", overrides={"node_id": "5", "ratio": None}
    )
    assert cfg.node_id == 5
    assert cfg.log_dirs == [Path("/a"), Path("/b")]
    assert cfg.flush_before_ack is True
    assert cfg.ratio == 0.25


def test_json_file_and_dict_values(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"topic-defaults": {"retention.ms": 1000}}))
    cfg = load_config(Example, file=path, env={}, overrides={"log_dirs": "/x,/y"})
    assert cfg.topic_defaults == {"retention.ms": "1000"}
    assert cfg.log_dirs == [Path("/x"), Path("/y")]


def test_string_dict_and_optional():
    cfg = load_config(
        Example,
        env={},
        overrides={"topic_defaults": "retention.ms=5,segment.bytes=100", "ready_file": "r.json"},
    )
    assert cfg.topic_defaults == {"retention.ms": "5", "segment.bytes": "100"}
    assert cfg.ready_file == Path("r.json")


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"node_id": "seven"}, "node_id"),
        ({"flush_before_ack": "maybe"}, "flush_before_ack"),
        ({"topic_defaults": "novalue"}, "topic_defaults"),
        ({"bogus": "1"}, "unknown setting"),
    ],
)
def test_bad_values_name_the_key(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(Example, env={}, overrides=overrides)


def test_unknown_key_in_file_is_an_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("nodeid = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'nodeid'"):
        load_config(Example, file=path, env={})


def test_unreadable_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(Example, file=path, env={})


def test_flags_from_dataclass():
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, Example)
    args = parser.parse_args(["--node-id", "9", "--log-dirs", "/d1,/d2"])
    cfg = config_from_args(Example, args, env_prefix="NOPE_NOT_SET")
    assert cfg.node_id == 9 and cfg.log_dirs == [Path("/d1"), Path("/d2")]
