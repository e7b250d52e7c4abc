from __future__ import annotations

from pathlib import Path

import pytest

from storage_node.log import files


def test_segment_file_names_are_zero_padded_and_parse_back():
    directory = Path("/d")
    assert files.log_file(directory, 42).name == "00000000000000000042.log"
    assert files.offset_index_file(directory, 42).name == "00000000000000000042.index"
    assert files.time_index_file(directory, 2**63 - 1, ".swap").name == "09223372036854775807.timeindex.swap"
    assert files.offset_from_file_name("00000000000000000042.log.deleted") == 42
    assert files.parse_segment_file_name("00000000000000000042.index.deleted") == (42, ".index", ".deleted")
    assert files.parse_segment_file_name("00000000000000000042.log") == (42, ".log", "")
    for name in (
        "42.log",
        "00000000000000000042.txt",
        "recovery-point-offset-checkpoint",
        "00000000000000000042.log.bogus",
    ):
        assert files.parse_segment_file_name(name) is None
    with pytest.raises(ValueError):
        files.filename_prefix_from_offset(-1)


@pytest.mark.parametrize("topic, partition", [("orders", 0), ("my-topic", 12), ("a.b_c-d", 7), ("x-1", 2)])
def test_partition_dir_names_round_trip(topic, partition):
    assert files.parse_partition_dir_name(files.partition_dir_name(topic, partition)) == (topic, partition)


def test_non_partition_dirs_are_not_parsed():
    for name in ("lost+found", "orders", "orders-", "orders-3.abcd-delete", "-3", ".."):
        assert files.parse_partition_dir_name(name) is None
    for topic in ("", "a/b", "..", "sp ace"):
        with pytest.raises(ValueError):
            files.partition_dir_name(topic, 0)
