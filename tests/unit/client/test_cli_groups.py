"""``tributary groups`` and ``consume --group`` without a cluster: parsing and output formats."""

import json

import pytest

from gateway.cli import output
from gateway.cli.main import build_parser, main
from gateway.client.structs import (
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetAndMetadata,
    PartitionLag,
    TopicPartition,
)

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


def parse(*argv):
    return build_parser().parse_args(list(argv))


def description(members=True) -> GroupDescription:
    member = MemberDescription("m-1", None, "cli", "/127.0.0.1", ("orders",), None, (T0, T1), (T0,))
    return GroupDescription(
        group_id="loader",
        state="PreparingRebalance",
        generation=3,
        assignor="cooperative-sticky",
        members=(member,) if members else (),
        partitions=(
            PartitionLag("orders", 0, 10, 15, 5, "m-1"),
            PartitionLag("orders", 1, None, 7, 7, None),
            PartitionLag("orders", 2, 4, None, None, None, "LEADER_NOT_AVAILABLE"),
        ),
    )


def test_groups_commands_parse():
    assert parse("groups", "list").action == "list"
    args = parse("groups", "describe", "loader", "--format", "json")
    assert (args.group, args.format) == ("loader", "json")
    args = parse(
        "groups", "reset-offsets", "loader", "--topic", "a", "--topic", "b", "--to-offset", "5", "--dry-run"
    )
    assert (args.topic, args.to_offset, args.dry_run, args.to_earliest) == (["a", "b"], 5, True, False)
    assert (
        parse("groups", "reset-offsets", "g", "--topic", "a", "--to-timestamp", "1700000000000").to_timestamp
        == 1_700_000_000_000
    )
    assert parse("groups", "delete", "loader").group == "loader"
    assert parse("consume", "orders", "--group", "loader").group == "loader"


@pytest.mark.parametrize(
    "argv",
    [
        ["groups", "reset-offsets", "g", "--topic", "a"],  # no --to-*
        ["groups", "reset-offsets", "g", "--topic", "a", "--to-earliest", "--to-latest"],  # two of them
        ["groups", "reset-offsets", "g", "--topic", "a", "--to-offset", "-1"],
        ["groups", "describe"],
    ],
)
def test_bad_groups_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2


def test_consume_group_does_not_take_partition_options(capsys):
    assert main(["consume", "orders", "--group", "g", "--partition", "1", "--gateway", "127.0.0.1:1"]) == 2
    assert "--group" in capsys.readouterr().err


def test_reset_without_topics_is_refused(capsys):
    assert main(["groups", "reset-offsets", "g", "--to-earliest", "--gateway", "127.0.0.1:1"]) == 2
    assert "--topic" in capsys.readouterr().err


def test_describe_group_text():
    text = output.describe_group(description())
    lines = text.splitlines()
    assert lines[0].split("\t") == [
        "Group: loader",
        "State: PreparingRebalance",
        "Generation: 3",
        "Assignor: cooperative-sticky",
        "Members: 1",
    ]
    member = next(line for line in lines if line.startswith("m-1"))
    assert member.split() == ["m-1", "-", "cli", "/127.0.0.1", "orders-0,orders-1", "orders-0"]
    rows = [line.split() for line in lines if line.startswith("orders")]
    assert rows == [
        ["orders", "0", "10", "15", "5", "m-1"],
        ["orders", "1", "-", "7", "7", "-"],
        ["orders", "2", "4", "LEADER_NOT_AVAILABLE", "-", "-"],
    ]


def test_describe_group_without_members():
    assert "Consumer group 'loader' has no active members." in output.describe_group(
        description(members=False)
    )


def test_describe_group_json():
    described = json.loads(output.group_json(description()))
    assert described["generation"] == 3 and described["state"] == "PreparingRebalance"
    assert described["members"][0]["assignment"] == [
        {"topic": "orders", "partition": 0},
        {"topic": "orders", "partition": 1},
    ]
    assert described["partitions"][1] == {
        "topic": "orders",
        "partition": 1,
        "committed_offset": None,
        "log_end_offset": 7,
        "lag": 7,
        "owner": None,
        "error": None,
    }


def test_groups_list_formats():
    listings = [GroupListing("a", "Stable", 2), GroupListing("b", "Empty", 0)]
    assert output.groups_table(listings).splitlines()[1].split() == ["a", "Stable", "2"]
    assert json.loads(output.groups_json(listings))[1] == {
        "group_id": "b",
        "state": "Empty",
        "member_count": 0,
    }


def test_reset_table_and_clamping():
    table = output.reset_table("g", {T1: OffsetAndMetadata(3), T0: OffsetAndMetadata(0)})
    assert [line.split() for line in table.splitlines()[1:]] == [
        ["g", "orders", "0", "0"],
        ["g", "orders", "1", "3"],
    ]
    clamped = output.clamp_offsets(5, earliest={T0: 0, T1: 6}, latest={T0: 3, T1: 9})
    assert clamped == {T0: 3, T1: 6}
