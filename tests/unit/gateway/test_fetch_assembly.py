import pytest

from gateway.fetch_assembly import PartitionData, decode_typed, take_batches
from services import errors
from services.records import Compression, RecordBatchBuilder, TimestampType


def batch(base_offset: int, count: int, value_size: int = 10, compression=Compression.NONE) -> bytes:
    builder = RecordBatchBuilder(base_offset=base_offset, compression=compression)
    for i in range(count):
        builder.append(
            bytes([i % 256]) * value_size,
            timestamp=1000 + base_offset + i,
            key=f"k{base_offset + i}".encode(),
        )
    return builder.build()


def log_of(*batches: bytes) -> bytes:
    return b"".join(batches)


B0, B1, B2 = batch(0, 5), batch(5, 5), batch(10, 5)  # offsets 0-4, 5-9, 10-14
SIZE = len(B0)
LOG = log_of(B0, B1, B2)


def take(
    data=LOG,
    *,
    fetch_offset=0,
    hw=15,
    partition_room=1 << 20,
    total_room=1 << 20,
    partition_empty=True,
    response_empty=True,
):
    return take_batches(
        data,
        fetch_offset=fetch_offset,
        high_watermark=hw,
        partition_room=partition_room,
        total_room=total_room,
        partition_empty=partition_empty,
        response_empty=response_empty,
    )


def test_everything_fits():
    taken = take()
    assert (taken.length, taken.next_offset, taken.error) == (len(LOG), 15, None)


def test_partition_budget_counts_whole_batches():
    assert take(partition_room=2 * SIZE + 1).length == 2 * SIZE
    assert take(partition_room=2 * SIZE + 1).next_offset == 10


def test_first_batch_is_whole_even_when_larger_than_the_partition_budget():
    taken = take(partition_room=10)
    assert (taken.length, taken.next_offset) == (SIZE, 5)


def test_no_oversized_first_batch_when_the_partition_already_has_data():
    taken = take(partition_room=10, partition_empty=False)
    assert (taken.length, taken.next_offset) == (0, 0)


def test_total_budget_lets_only_the_responses_first_batch_exceed_it():
    assert take(total_room=10, response_empty=True).length == SIZE
    assert take(total_room=10, response_empty=False).length == 0
    assert take(total_room=SIZE + 5, response_empty=False).length == SIZE


def test_only_batches_below_the_high_watermark():
    assert take(hw=10).length == 2 * SIZE
    assert take(hw=9).length == SIZE  # batch 5-9 is not wholly committed
    assert take(hw=0).length == 0


def test_partial_tail_is_dropped():
    taken = take(LOG[: 2 * SIZE + 20])
    assert (taken.length, taken.next_offset) == (2 * SIZE, 10)


def test_next_offset_never_moves_back():
    # A fetch at offset 7 gets the batch holding it (5-9) first.
    taken = take(log_of(B1, B2), fetch_offset=7)
    assert taken.next_offset == 15


def test_corrupt_length_before_anything_is_an_error():
    bad = bytearray(B0)
    bad[8:12] = (3).to_bytes(4, "big")  # batch length below the minimum
    taken = take(bytes(bad))
    assert taken.length == 0 and isinstance(taken.error, errors.CorruptRecordError)


def test_corrupt_length_after_good_batches_ends_the_take_quietly():
    bad = bytearray(B1)
    bad[8:12] = (3).to_bytes(4, "big")
    taken = take(B0 + bytes(bad))
    assert (taken.length, taken.next_offset, taken.error) == (SIZE, 5, None)


def test_partition_data_keeps_untrimmed_chunks_without_copying():
    part = PartitionData("t", 0, fetch_offset=0, max_bytes=1 << 20)
    part.add(LOG, take(LOG))
    assert part.raw() is LOG
    part2 = PartitionData("t", 0, fetch_offset=0, max_bytes=1 << 20)
    part2.add(LOG, take(LOG, hw=5))
    assert part2.raw() == B0 and part2.next_offset == 5 and part2.size == SIZE


def test_decode_typed_skips_records_below_the_fetch_offset():
    decoded = decode_typed([log_of(B0, B1)], fetch_offset=3)
    offsets = [r.offset for _, records in decoded for r in records]
    assert offsets == list(range(3, 10))
    assert all(ts_type == TimestampType.CREATE_TIME for ts_type, _ in decoded)
    first = decoded[0][1][0]
    assert (first.key, first.timestamp, first.value) == (b"k3", 1003, bytes([3]) * 10)


@pytest.mark.parametrize(
    "compression",
    [Compression.GZIP, Compression.ZSTD, Compression.LZ4, Compression.SNAPPY],
    ids=lambda c: c.name.lower(),
)
def test_decode_typed_decompresses(compression):
    data = batch(0, 20, 100, compression)
    decoded = decode_typed([data], fetch_offset=0)
    assert [r.offset for r in decoded[0][1]] == list(range(20))


def test_decode_typed_checks_the_crc():
    bad = bytearray(B0)
    bad[-1] ^= 0xFF
    with pytest.raises(errors.CorruptRecordError):
        decode_typed([bytes(bad)], fetch_offset=0)


def test_decode_typed_across_chunks():
    decoded = decode_typed([B0, log_of(B1, B2)], fetch_offset=0)
    assert [r.offset for _, records in decoded for r in records] == list(range(15))
