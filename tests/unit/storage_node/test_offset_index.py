from __future__ import annotations

import bisect
import random

import pytest

from storage_node.log.index import CorruptIndexError
from storage_node.log.offset_index import OffsetIndex, OffsetPosition
from tests.unit.storage_node.log_testkit import open_files_under

BASE = 45


def _random_entries(rng: random.Random, count: int) -> list[tuple[int, int]]:
    offsets = sorted(rng.sample(range(BASE, BASE + 100 * count), count))
    positions = sorted(rng.sample(range(1000 * count), count))
    return list(zip(offsets, positions))


def test_random_lookups_match_a_sorted_list_oracle(tmp_path):
    rng = random.Random(7)
    index = OffsetIndex.open(tmp_path / "x.index", BASE, 30_000 * 8)
    entries = _random_entries(rng, 2000)
    for offset, position in entries:
        index.append(offset, position)
    keys = [o for o, _ in entries]
    for _ in range(3000):
        target = rng.randint(0, BASE + 100 * 2000 + 10)
        slot = bisect.bisect_right(keys, target) - 1
        expected = OffsetPosition(*entries[slot]) if slot >= 0 else OffsetPosition(BASE, 0)
        assert index.lookup(target) == expected, target


def test_lookup_by_position_matches_oracle(tmp_path):
    rng = random.Random(8)
    index = OffsetIndex.open(tmp_path / "x.index", BASE, 1 << 20)
    entries = _random_entries(rng, 500)
    for offset, position in entries:
        index.append(offset, position)
    positions = [p for _, p in entries]
    for _ in range(1000):
        target = rng.randint(0, 500_001)
        slot = bisect.bisect_right(positions, target) - 1
        expected = OffsetPosition(*entries[slot]) if slot >= 0 else OffsetPosition(BASE, 0)
        assert index.lookup_by_position(target) == expected


def test_entries_survive_reopen_and_file_is_big_endian_pairs(tmp_path):
    path = tmp_path / "x.index"
    index = OffsetIndex.open(path, BASE, 800)
    index.append(BASE + 3, 100)
    index.append(BASE + 9, 4200)
    index.close()
    assert path.read_bytes() == bytes.fromhex("00000003000000640000000900001068")
    reopened = OffsetIndex.open(path, BASE, 800)
    reopened.sanity_check()
    assert reopened.entries == 2
    assert reopened.lookup(BASE + 10) == OffsetPosition(BASE + 9, 4200)


@pytest.mark.parametrize("offset, position", [(BASE + 5, 300), (BASE + 9, 100), (BASE + 4, 500)])
def test_append_rejects_entries_that_do_not_grow(tmp_path, offset, position):
    index = OffsetIndex.open(tmp_path / "x.index", BASE, 800)
    index.append(BASE + 5, 200)
    with pytest.raises(ValueError):
        index.append(offset, position)
    assert index.entries == 1


def test_full_index_refuses_appends(tmp_path):
    index = OffsetIndex.open(tmp_path / "x.index", BASE, 3 * 8 + 5)  # rounds down to 3 entries
    for i in range(3):
        index.append(BASE + i, i * 10)
    assert index.is_full
    with pytest.raises(ValueError):
        index.append(BASE + 10, 100)


def test_truncate_to_removes_entries_at_and_after(tmp_path):
    path = tmp_path / "x.index"
    index = OffsetIndex.open(path, 0, 800)
    for i in range(10):
        index.append(i * 10, i * 100)
    index.truncate_to(35)
    assert index.entries == 4 and index.last_entry == OffsetPosition(30, 300)
    index.truncate_to(30)
    assert index.entries == 3
    assert path.stat().st_size == 3 * 8
    index.append(31, 301)  # appends continue after truncation
    assert OffsetIndex.open(path, 0, 800).last_entry == OffsetPosition(31, 301)


def test_sanity_check_rejects_torn_and_unsorted_files(tmp_path):
    torn = tmp_path / "torn.index"
    torn.write_bytes(bytes(8) + b"\x00\x00\x00")
    with pytest.raises(CorruptIndexError):
        OffsetIndex.open(torn, 0, 800).sanity_check()
    unsorted = tmp_path / "unsorted.index"
    unsorted.write_bytes(bytes.fromhex("00000005000000100000000300000020"))
    with pytest.raises(CorruptIndexError):
        OffsetIndex.open(unsorted, 0, 800).sanity_check()
    index = OffsetIndex.open(tmp_path / "ok.index", 0, 800)
    index.append(3, 5000)
    with pytest.raises(CorruptIndexError):
        index.ensure_within(log_size=5000)


def test_an_index_holds_no_descriptor_between_appends(tmp_path):
    """Two descriptors per active segment, kept, were unbounded with tens of thousands of
    partitions; appends now open and close the file."""
    indexes = [OffsetIndex.open(tmp_path / f"{i}.index", BASE, 800) for i in range(50)]
    for index in indexes:
        index.append(BASE + 1, 10)
        index.append(BASE + 2, 20)
    assert open_files_under(tmp_path) == set()
    for index in indexes:
        index.flush()  # durable through a descriptor of its own
    (tmp_path / "0.index").unlink()
    indexes[0].append(BASE + 3, 30)
    (tmp_path / "0.index").unlink()
    indexes[0].flush()  # the file is gone: nothing to sync, no error
    assert OffsetIndex.open(tmp_path / "1.index", BASE, 800).entries == 2
