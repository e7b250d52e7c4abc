from __future__ import annotations

import bisect
import random

import pytest

from storage_node.log.index import CorruptIndexError
from storage_node.log.time_index import TimeIndex, TimestampOffset

BASE = 100


def test_random_lookups_match_a_sorted_list_oracle(tmp_path):
    rng = random.Random(3)
    index = TimeIndex.open(tmp_path / "x.timeindex", BASE, 5000 * 12)
    oracle: list[tuple[int, int]] = []
    ts, offset = 1_000, BASE
    for _ in range(3000):
        ts += rng.randint(-3, 5)  # timestamps go back and forth; the index keeps only growth
        offset += rng.randint(0, 4)
        index.maybe_append(ts, offset)
        if not oracle or ts > oracle[-1][0]:
            oracle.append((ts, offset))
    assert index.entries == len(oracle)
    keys = [t for t, _ in oracle]
    for _ in range(3000):
        target = rng.randint(900, ts + 10)
        slot = bisect.bisect_right(keys, target) - 1
        expected = TimestampOffset(*oracle[slot]) if slot >= 0 else TimestampOffset(-1, BASE)
        assert index.lookup(target) == expected


def test_maybe_append_rejects_offsets_going_back(tmp_path):
    index = TimeIndex.open(tmp_path / "x.timeindex", BASE, 1200)
    index.maybe_append(10, BASE + 5)
    with pytest.raises(ValueError):
        index.maybe_append(20, BASE + 4)


def test_last_slot_is_reserved_for_the_roll_entry(tmp_path):
    index = TimeIndex.open(tmp_path / "x.timeindex", BASE, 3 * 12)
    index.maybe_append(1, BASE)
    index.maybe_append(2, BASE + 1)
    assert index.is_full
    with pytest.raises(ValueError):
        index.maybe_append(3, BASE + 2)
    index.maybe_append(3, BASE + 2, skip_full_check=True)
    assert index.last_entry == TimestampOffset(3, BASE + 2)


def test_file_format_reopen_and_truncate(tmp_path):
    path = tmp_path / "x.timeindex"
    index = TimeIndex.open(path, BASE, 1200)
    index.maybe_append(0x0102, BASE + 1)
    index.maybe_append(0x0203, BASE + 7)
    index.close()
    assert path.read_bytes() == bytes.fromhex("000000000000010200000001000000000000020300000007")
    reopened = TimeIndex.open(path, BASE, 1200)
    reopened.sanity_check()
    reopened.truncate_to(BASE + 7)
    assert reopened.entries == 1 and path.stat().st_size == 12


def test_sanity_checks(tmp_path):
    torn = tmp_path / "torn.timeindex"
    torn.write_bytes(bytes(13))
    with pytest.raises(CorruptIndexError):
        TimeIndex.open(torn, 0, 1200).sanity_check()
    index = TimeIndex.open(tmp_path / "x.timeindex", BASE, 1200)
    index.maybe_append(5, BASE + 9)
    with pytest.raises(CorruptIndexError):
        index.ensure_within(next_offset=BASE + 9)
    index.ensure_within(next_offset=BASE + 10)
