from __future__ import annotations

import os
import random

import pytest

from services.records import set_base_offset
from storage_node.log.index import CorruptIndexError
from tests.unit.storage_node.log_testkit import batches_in, config, fill_segment, make_batch, open_segment

BASE = 40


@pytest.fixture
def segment(tmp_path, clock):
    seg = open_segment(tmp_path, BASE, clock, config(index_interval_bytes=300))
    yield seg
    seg.close()


def test_append_tracks_offsets_size_and_largest_timestamp(segment):
    placed = fill_segment(segment, 5, records_per_batch=3, timestamp=500)
    assert segment.next_offset == BASE + 15
    assert segment.size == sum(size for _, _, size in placed)
    assert segment.max_timestamp_so_far == 504 and segment.largest_timestamp == 504
    assert [p for _, p, _ in placed] == sorted(p for _, p, _ in placed)
    with pytest.raises(ValueError):
        segment.append(make_batch(1), BASE + 3, BASE + 3, 0)  # offsets going back


def test_read_returns_whole_batches_starting_at_the_batch_holding_the_offset(segment):
    placed = fill_segment(segment, 40, records_per_batch=3)
    batch_size = placed[0][2]
    rng = random.Random(1)
    for _ in range(200):
        offset = rng.randint(BASE, BASE + 119)
        max_bytes = rng.randint(1, 20 * batch_size)
        file_slice = segment.read(offset, max_bytes)
        batches = batches_in(file_slice.read_bytes())  # raises if a batch were cut
        assert batches[0].base_offset <= offset <= batches[0].last_offset
        assert file_slice.length <= max(max_bytes, batch_size)
        # As many whole batches as fit (they are all the same size here), at least one.
        expected = min(max(max_bytes // batch_size, 1), (BASE + 120 - batches[0].base_offset) // 3)
        assert len(batches) == expected


def test_first_batch_is_returned_whole_even_when_larger_than_max_bytes(segment):
    fill_segment(segment, 2, records_per_batch=1)
    big = bytearray(make_batch(50, value_size=200))
    set_base_offset(big, BASE + 2)
    segment.append(big, BASE + 2, BASE + 51, 10)
    file_slice = segment.read(BASE + 30, max_bytes=10)
    assert file_slice.length == len(big)
    assert batches_in(file_slice.read_bytes())[0].base_offset == BASE + 2


def test_read_respects_max_position_and_end_of_segment(segment):
    placed = fill_segment(segment, 10, records_per_batch=2)
    max_position = placed[4][1]  # the start of the fifth batch
    file_slice = segment.read(BASE, 1 << 20, max_position=max_position)
    assert file_slice.length == max_position
    assert segment.read(placed[4][0], 1 << 20, max_position=max_position) is None
    assert segment.read(BASE + 20, 100) is None


def test_translate_offset_matches_an_oracle(segment):
    rng = random.Random(5)
    placed = fill_segment(segment, 300, records_per_batch=5, rng=rng)
    assert segment.offset_index.entries > 10  # the index is in play
    ends = [(base, position) for base, position, _ in placed]
    for _ in range(500):
        offset = rng.randint(BASE, segment.next_offset - 1)
        expected = max((p for base, p in ends if base <= offset))
        assert segment.translate_offset(offset).position == expected


def test_find_offset_for_timestamp_matches_an_oracle(tmp_path, clock):
    segment = open_segment(tmp_path, 0, clock, config(index_interval_bytes=200))
    rng = random.Random(11)
    records: list[tuple[int, int]] = []  # (offset, timestamp)
    offset = 0
    for _ in range(200):
        count = rng.randint(1, 4)
        timestamps = [rng.randint(1000, 5000) for _ in range(count)]
        data = bytearray(make_batch(count, timestamps=timestamps))
        set_base_offset(data, offset)
        segment.append(data, offset, offset + count - 1, max(timestamps))
        records += [(offset + i, ts) for i, ts in enumerate(timestamps)]
        offset += count
    for target in [rng.randint(900, 5100) for _ in range(300)]:
        expected = next(((o, ts) for o, ts in records if ts >= target), None)
        assert segment.find_offset_for_timestamp(target) == expected, target
    segment.close()


def test_recover_rebuilds_indexes_identical_to_the_appended_ones(segment):
    fill_segment(segment, 200, rng=random.Random(2))
    segment.on_become_inactive()
    offset_index_bytes = segment.offset_index.path.read_bytes()
    time_index_bytes = segment.time_index.path.read_bytes()
    assert segment.recover() == 0
    assert segment.offset_index.path.read_bytes() == offset_index_bytes
    assert segment.time_index.path.read_bytes() == time_index_bytes


def test_recover_truncates_garbage_appended_to_the_log(segment):
    fill_segment(segment, 20)
    size, next_offset = segment.size, segment.next_offset
    with open(segment.log.path, "ab") as f:
        f.write(os.urandom(300))
    assert segment.recover() == 300
    assert segment.size == size == segment.log.path.stat().st_size
    assert segment.next_offset == next_offset


def _expected_survivors(placed, position):
    return [base for base, start, size in placed if start + size <= position]


def _surviving_bases(segment):
    return [batch.base_offset for batch in batches_in(segment.log.read(0, segment.size))]


@pytest.mark.parametrize("seed", range(20))
def test_garbage_from_a_random_position_keeps_exactly_the_batches_before_it(tmp_path, clock, seed):
    """Kafka's testRecoveryWithCorruptMessage: nonsense from a random point to the end."""
    rng = random.Random(seed)
    segment = open_segment(tmp_path, BASE, clock, config(index_interval_bytes=100))
    placed = fill_segment(segment, 50, rng=rng)
    position = rng.randrange(0, segment.size)
    with open(segment.log.path, "r+b") as f:
        f.seek(position)
        f.write(rng.randbytes(segment.size - position))
    first_bad = next(i for i, (_, start, size) in enumerate(placed) if start + size > position)
    original_size = segment.size
    assert segment.recover() == original_size - placed[first_bad][1]
    assert _surviving_bases(segment) == _expected_survivors(placed, position)
    assert segment.size == placed[first_bad][1]
    assert segment.next_offset == placed[first_bad][0]
    for base, start, _ in placed[:first_bad]:
        assert segment.translate_offset(base).position == start
    segment.close()


@pytest.mark.parametrize("seed", range(20))
def test_one_flipped_byte_anywhere_checked_drops_that_batch_and_all_after(tmp_path, clock, seed):
    """Every header byte but the partition leader epoch (which Kafka leaves outside the CRC so
    the broker can stamp it) is covered by the length, magic, CRC or dense-offset checks."""
    rng = random.Random(100 + seed)
    segment = open_segment(tmp_path, BASE, clock, config(index_interval_bytes=100))
    placed = fill_segment(segment, 30, rng=rng)
    epoch_bytes = {start + i for _, start, _ in placed for i in range(12, 16)}
    position = rng.choice([p for p in range(segment.size) if p not in epoch_bytes])
    data = bytearray(segment.log.path.read_bytes())
    data[position] ^= 1 << rng.randrange(8)
    segment.log.path.write_bytes(data)
    original_size = segment.size
    truncated = segment.recover()
    first_bad = next(i for i, (_, start, size) in enumerate(placed) if start + size > position)
    assert truncated == original_size - placed[first_bad][1]
    assert _surviving_bases(segment) == [base for base, _, _ in placed[:first_bad]]
    segment.close()


def test_truncation_at_every_byte_of_the_last_batch(tmp_path, clock):
    segment = open_segment(tmp_path / "src", 0, clock)
    placed = fill_segment(segment, 5, records_per_batch=2)
    segment.close()
    last_base, last_start, last_size = placed[-1]
    original = (tmp_path / "src" / "00000000000000000000.log").read_bytes()
    for cut in range(last_start, last_start + last_size):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / "00000000000000000000.log").write_bytes(original[:cut])
        copy = open_segment(directory, 0, clock)
        assert copy.recover() == cut - last_start
        assert copy.next_offset == last_base
        assert _surviving_bases(copy) == [b for b, _, _ in placed[:-1]]
        copy.close()


def test_sanity_check_detects_missing_and_corrupt_indexes(tmp_path, clock):
    cfg = config(index_interval_bytes=100)
    segment = open_segment(tmp_path, 0, clock, cfg)
    fill_segment(segment, 30)
    segment.on_become_inactive()
    segment.close()
    open_segment(tmp_path, 0, clock, cfg).sanity_check()

    index_path = tmp_path / "00000000000000000000.index"
    good = index_path.read_bytes()
    index_path.write_bytes(good[:-8] + (3).to_bytes(4, "big") + good[-4:])  # wrong offset, right position
    with pytest.raises(CorruptIndexError):
        open_segment(tmp_path, 0, clock, cfg).sanity_check()
    index_path.write_bytes(good[:-8] + good[-8:-4] + (7).to_bytes(4, "big"))  # not a batch start
    with pytest.raises(CorruptIndexError):
        open_segment(tmp_path, 0, clock, cfg).sanity_check()
    index_path.unlink()
    with pytest.raises(CorruptIndexError):
        open_segment(tmp_path, 0, clock, cfg).sanity_check()


def test_truncate_to_drops_the_batch_holding_the_offset_and_everything_after(segment):
    placed = fill_segment(segment, 30, records_per_batch=3)
    removed = segment.truncate_to(placed[10][0] + 1)
    assert removed == sum(size for _, _, size in placed[10:])
    assert segment.next_offset == placed[10][0]
    assert segment.offset_index.last_entry.position < segment.size
    fill_segment(segment, 2)  # appends continue densely
    assert segment.next_offset == placed[10][0] + 6


def test_delete_renames_then_removes_every_file(tmp_path, clock):
    segment = open_segment(tmp_path, 7, clock)
    fill_segment(segment, 3)
    held = segment.read(7, 1 << 20)
    segment.delete()
    assert list(tmp_path.iterdir()) == []
    assert len(batches_in(held.read_bytes())) == 3  # an in-flight read still completes


@pytest.mark.parametrize("index_bytes", [10 * 1024 * 1024, 60])  # 60: the time index fills up
def test_a_reopened_segment_recomputes_its_end_exactly(tmp_path, clock, index_bytes):
    cfg = config(index_interval_bytes=150, segment_index_bytes=index_bytes)
    rng = random.Random(21)
    segment = open_segment(tmp_path, 0, clock, cfg)
    placed = fill_segment(segment, 120, rng=rng)
    expected = (segment.next_offset, segment.max_timestamp_so_far, segment.size)
    true_max = max(batch.max_timestamp for batch in batches_in(segment.log.read(0, segment.size)))
    assert expected[1] == true_max
    segment.close()
    reopened = open_segment(tmp_path, 0, clock, cfg)
    reopened.sanity_check()
    assert (reopened.next_offset, reopened.max_timestamp_so_far, reopened.size) == expected
    cut = placed[60][0]
    reopened.truncate_to(cut)
    kept = batches_in(reopened.log.read(0, reopened.size))
    assert reopened.next_offset == cut
    assert reopened.max_timestamp_so_far == max(b.max_timestamp for b in kept)
    reopened.close()
