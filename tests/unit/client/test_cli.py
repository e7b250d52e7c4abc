"""The CLI without a cluster: argument parsing, output formats, and its one-line failures."""

import io
import json

import pytest

from gateway.cli import output
from gateway.cli.main import build_parser, main
from gateway.client.structs import ConsumerRecord, PartitionMetadata, TopicDescription


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_cluster_up_flags():
    args = parse("cluster", "up", "--data-dir", "/tmp/x", "--storage-nodes", "3", "--coordinators", "2")
    assert (args.command, args.action, args.data_dir, args.storage_nodes, args.coordinators) == (
        "cluster",
        "up",
        "/tmp/x",
        3,
        2,
    )
    assert parse("cluster", "up").storage_nodes is None, "unset = keep the data dir's previous count"


def test_topics_create_flags():
    args = parse(
        "topics",
        "create",
        "events",
        "--partitions",
        "8",
        "--replication-factor",
        "2",
        "--config",
        "retention.ms=1000",
        "--config",
        "segment.bytes=1048576",
        "--gateway",
        "h:1",
    )
    assert (args.name, args.partitions, args.replication_factor, args.gateway) == ("events", 8, 2, "h:1")
    assert args.config == ["retention.ms=1000", "segment.bytes=1048576"]


def test_partitions_are_required_and_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        parse("topics", "create", "events")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        parse("topics", "create", "events", "--partitions", "0")


def test_consume_flags():
    args = parse(
        "consume", "t", "--offset", "5", "--partition", "2", "--max-messages", "10", "--format", "json"
    )
    assert (args.offset, args.partition, args.max_messages, args.format) == ("5", 2, 10, "json")
    assert parse("consume", "t", "--from-beginning").from_beginning
    assert parse("consume", "t", "--from-timestamp", "1700000000000").from_timestamp == 1700000000000
    with pytest.raises(SystemExit):
        parse("consume", "t", "--format", "xml")
    assert parse("consume", "t").isolation_level == "read_uncommitted"
    assert parse("consume", "t", "--isolation-level", "read_committed").isolation_level == "read_committed"
    with pytest.raises(SystemExit):
        parse("consume", "t", "--isolation-level", "serializable")


def test_produce_flags():
    args = parse("produce", "t", "--key-separator", ":", "--header", "a=1", "--header", "b=2")
    assert (args.key_separator, args.header, args.acks, args.compression) == (
        ":",
        ["a=1", "b=2"],
        "all",
        "none",
    )


def test_demo_defaults():
    args = parse("demo")
    assert (args.records, args.topic) == (10_000, "activity")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["consume", "t", "--offset", "5"], "--offset needs --partition"),
        (["consume", "t", "--from-beginning", "--from-timestamp", "5"], "choose one of"),
        (["consume", "t", "--offset", "x", "--partition", "0"], "--offset must be"),
    ],
)
def test_bad_consume_combinations_fail_in_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("TRIBUTARY_GATEWAY", "127.0.0.1:1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_no_cluster_is_one_helpful_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRIBUTARY_GATEWAY", raising=False)
    monkeypatch.setenv("TRIBUTARY_DATA_DIR", str(tmp_path))
    assert main(["topics", "list"]) == 1
    err = capsys.readouterr().err
    assert "tributary cluster up" in err and err.count("\n") == 1


def test_unreachable_gateway_is_one_helpful_line(capsys):
    assert main(["topics", "list", "--gateway", "127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach a gateway at 127.0.0.1:9" in err and "cluster up" in err and err.count("\n") == 1


def test_status_without_a_cluster(tmp_path, capsys):
    assert main(["cluster", "status", "--data-dir", str(tmp_path)]) == 1
    assert "no cluster is running" in capsys.readouterr().err


# ---- output formats -------------------------------------------------------------------------------


RECORD = ConsumerRecord(
    "t", 1, 42, 1700000000000, 0, b"user-1", b'{"page":"/"}', (("src", b"cli"), ("n", None))
)


def test_json_record_line():
    line = output.record_json(RECORD)
    assert "\n" not in line
    assert json.loads(line) == {
        "topic": "t",
        "partition": 1,
        "offset": 42,
        "timestamp": 1700000000000,
        "key": "user-1",
        "value": '{"page":"/"}',
        "headers": [["src", "cli"], ["n", None]],
    }


def test_json_keeps_binary_and_null_values():
    record = RECORD._replace(key=None, value=b"\xff\x00")
    decoded = json.loads(output.record_json(record))
    assert decoded["key"] is None and decoded["value"] == {"base64": "/wA="}


def test_text_record():
    assert output.record_text(RECORD) == '{"page":"/"}'
    assert output.record_text(RECORD, print_key=True) == 'user-1\t{"page":"/"}'
    assert output.record_text(RECORD._replace(key=None, value=None), print_key=True) == "null\tnull"


def test_parse_line_with_and_without_key():
    assert output.parse_line("k:v:w\n", ":") == (b"k", b"v:w")
    assert output.parse_line("plain\n", None) == (None, b"plain")
    with pytest.raises(ValueError, match="no key separator"):
        output.parse_line("nokey\n", ":")


def test_parse_pairs():
    assert output.parse_pairs(["a=1", "b=x=y"], "--header") == [("a", "1"), ("b", "x=y")]
    with pytest.raises(ValueError, match="--config must be key=value"):
        output.parse_pairs(["novalue"], "--config")


def test_table_aligns_columns():
    text = output.table(("A", "LONGER"), [[1, "x"], ["wide-cell", None]])
    lines = text.splitlines()
    assert lines[0] == "A          LONGER"
    assert lines[1] == "1          x"
    assert lines[2] == "wide-cell"


def test_describe_topic():
    partitions = (
        PartitionMetadata("t", 0, 1, 0, (1,), (1,), "online"),
        PartitionMetadata("t", 1, -1, 0, (2,), (), "offline", "LEADER_NOT_AVAILABLE"),
    )
    text = output.describe_topic(TopicDescription("t", partitions, 1, {"retention.ms": "1000"}))
    assert (
        text.splitlines()[0]
        == "Topic: t\tPartitionCount: 2\tReplicationFactor: 1\tConfigs: retention.ms=1000"
    )
    assert "none" in text.splitlines()[3] and "offline (LEADER_NOT_AVAILABLE)" in text


def test_describe_topic_with_the_cleaners_progress():
    from gateway.cli.cleaner_progress import CleanerProgress

    partitions = (
        PartitionMetadata("t", 0, 1, 0, (1,), (1,), "online"),
        PartitionMetadata("t", 1, 1, 0, (1,), (1,), "online"),
    )
    description = TopicDescription("t", partitions, 1, {"cleanup.policy": "compact,delete"})
    assert output.is_compacted(description)
    assert not output.is_compacted(TopicDescription("t", partitions, 1, {}))
    text = output.describe_topic(description, {("t", 0): CleanerProgress(0.25, 4500, 9000, 300, 100)})
    lines = text.splitlines()
    assert lines[1].split()[-1] == "CLEANER"
    assert lines[2].endswith("dirty 25% (compacted below 4500)")
    assert lines[3].endswith("-")  # its leader did not answer


def test_offsets_table():
    text = output.offsets_table("t", {0: 0, 1: 5}, {0: 10, 1: 5})
    assert text.splitlines()[1].split() == ["t", "0", "0", "10", "10"]
    assert text.splitlines()[2].split() == ["t", "1", "5", "5", "0"]


def test_progress_lines_on_a_pipe():
    stream = io.StringIO()
    progress = output.Progress(stream, interval=0)
    progress.update("sent 1")
    progress.step("done")
    assert stream.getvalue() == "sent 1\ndone\n"


def test_status_summarises_each_topic_in_one_row():
    partitions = (
        PartitionMetadata("t", 0, 1, 0, (1, 2), (1, 2), "online"),
        PartitionMetadata("t", 1, 2, 0, (2, 1), (2,), "online"),
        PartitionMetadata("t", 2, -1, 0, (1, 2), (), "offline", "LEADER_NOT_AVAILABLE"),
    )
    rows = output.topic_summary_rows([TopicDescription("t", partitions, 2, {})])
    assert rows == [["t", 3, 2, 1, 2]]
    assert build_parser().parse_args(["cluster", "status", "--partitions"]).partitions
