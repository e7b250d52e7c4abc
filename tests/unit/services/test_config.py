import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.config import (
    ConfigError,
    ServiceConfig,
    add_config_arguments,
    config_from_args,
    field_docs,
    load_config,
)


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


@dataclass
class Documented(ServiceConfig):
    #: Stable id of this example
    #: (two lines join).
    node_id: int = 0
    undocumented: str = ""
    # a plain comment is not a doc
    plain: int = 1
    #: 100% of the ratio.
    ratio: float = 0.5


def test_field_docs_are_the_hash_colon_comments():
    docs = field_docs(Documented)
    assert docs["node_id"] == "Stable id of this example (two lines join)."
    assert docs["ratio"] == "100% of the ratio."
    assert "undocumented" not in docs and "plain" not in docs
    assert docs["log_level"].startswith("Log level")  # inherited from ServiceConfig


def test_help_shows_docs_own_fields_first():
    parser = argparse.ArgumentParser(prog="example")
    add_config_arguments(parser, Documented)
    text = " ".join(parser.format_help().split())
    assert "Stable id of this example (two lines join). (default: 0)" in text
    assert "100% of the ratio. (default: 0.5)" in text  # a % survives argparse's formatting
    assert text.index("--node-id") < text.index("--ratio") < text.index("--ready-file")
    assert text.index("--ready-file") < text.index("--log-file")


def test_flags_without_source_still_work():
    namespace: dict = {}
    exec(  # a class whose source inspect cannot find: no docs, same flags
        "from dataclasses import dataclass\n@dataclass\nclass NoSource:\n    #: lost\n    size: int = 1\n",
        namespace,
    )
    cls = namespace["NoSource"]
    assert field_docs(cls) == {}
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, cls)
    assert parser.parse_args(["--size", "3"]).size == "3"
