import struct

import crc32c
import pytest

from gateway.server.fetch_assembly import (
    RECORD_FRAMING_BYTES,
    DecodeBudget,
    PartitionData,
    decode_typed,
    record_cost,
    take_batches,
)
from services import errors
from services.records import Compression, Record, RecordBatchBuilder, TimestampType


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


def decode(chunks, fetch_offset=0, *, max_records=1 << 20, max_bytes=1 << 30, budget=None):
    budget = budget or DecodeBudget(max_records=max_records, max_bytes=max_bytes)
    return decode_typed(chunks, topic="t", partition=3, fetch_offset=fetch_offset, budget=budget)


def offsets_of(decoded) -> list[int]:
    return [r.offset for _, records in decoded.batches for r in records]


def test_decode_typed_skips_records_below_the_fetch_offset():
    decoded = decode([log_of(B0, B1)], fetch_offset=3)
    assert offsets_of(decoded) == list(range(3, 10))
    assert (decoded.next_offset, decoded.error) == (10, None)
    assert all(ts_type == TimestampType.CREATE_TIME for ts_type, _ in decoded.batches)
    first = decoded.batches[0][1][0]
    assert (first.key, first.timestamp, first.value) == (b"k3", 1003, bytes([3]) * 10)


@pytest.mark.parametrize(
    "compression",
    [Compression.GZIP, Compression.ZSTD, Compression.LZ4, Compression.SNAPPY],
    ids=lambda c: c.name.lower(),
)
def test_decode_typed_decompresses(compression):
    data = batch(0, 20, 100, compression)
    assert offsets_of(decode([data])) == list(range(20))


def test_decode_typed_across_chunks():
    assert offsets_of(decode([B0, log_of(B1, B2)])) == list(range(15))


# --- a batch that cannot be read (stored by an older version) --------------------------------


def corrupt(data: bytes) -> bytes:
    bad = bytearray(data)
    bad[-1] ^= 0xFF  # fails the CRC
    return bytes(bad)


def poisoned(base_offset: int) -> bytes:
    """A batch whose CRC is right and whose header count does not match its records: what the
    old framing check let in for every reproduction of the issue."""
    bad = bytearray(batch(base_offset, 6))
    struct.pack_into(">i", bad, 57, 5)  # record count 5 for 6 records
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))
    return bytes(bad)


@pytest.mark.parametrize("bad", [corrupt(batch(5, 6)), poisoned(5)], ids=["crc", "records"])
def test_the_records_before_a_bad_batch_are_returned_and_the_next_fetch_gets_the_error(bad):
    log = log_of(B0, bad, batch(11, 3))  # 0-4 good, 5-10 bad, 11-13 good
    first = decode([log], fetch_offset=0)
    assert (offsets_of(first), first.next_offset, first.error) == (list(range(5)), 5, None)
    second = decode([log_of(bad, batch(11, 3))], fetch_offset=first.next_offset)
    assert (second.batches, second.next_offset) == ([], 5)
    error = second.error
    assert isinstance(error, errors.CorruptRecordError)
    assert (error.topic, error.partition, error.offset, error.next_offset) == ("t", 3, 5, 11)
    assert "offsets 5..10 of t-3" in error.message and "continue from offset 11" in error.message
    skipped = decode([batch(11, 3)], fetch_offset=error.next_offset)
    assert offsets_of(skipped) == [11, 12, 13]


def test_a_fetch_starting_inside_a_bad_batch_names_the_batch():
    error = decode([poisoned(5)], fetch_offset=8).error
    assert (error.offset, error.next_offset) == (5, 11)


# --- the decode budget ---------------------------------------------------------------------


def test_a_record_bound_cuts_inside_a_batch_and_the_next_fetch_goes_on_from_there():
    big = batch(0, 50)
    offsets, fetch_offset = [], 0
    while fetch_offset < 50:
        decoded = decode([big], fetch_offset, max_records=7)
        got = offsets_of(decoded)
        assert 0 < len(got) <= 7 and decoded.next_offset == got[-1] + 1
        offsets += got
        fetch_offset = decoded.next_offset
    assert offsets == list(range(50))


def test_the_budget_is_shared_by_the_answers_partitions():
    budget = DecodeBudget(max_records=8, max_bytes=1 << 30)
    first = decode([LOG], budget=budget)
    second = decode([LOG], budget=budget)
    assert offsets_of(first) == list(range(8)) and first.next_offset == 8
    assert (offsets_of(second), second.next_offset) == ([], 0)  # full: next time
    assert (budget.records, budget.records_left) == (8, 0)


def test_a_byte_bound_stops_at_a_batch_boundary_but_the_first_batch_always_gets_a_record():
    payload = len(B0) - 61
    decoded = decode([LOG], max_bytes=payload + 5 * RECORD_FRAMING_BYTES + 10)
    assert (offsets_of(decoded), decoded.next_offset) == (list(range(5)), 5)
    tiny = decode([LOG], max_bytes=1)
    assert (offsets_of(tiny), tiny.next_offset) == ([0], 1)  # progress whatever the bound


def test_the_first_batch_is_cut_by_bytes_when_it_decompresses_beyond_the_bound():
    # 200 records of 10 KiB of zeros: a few KiB compressed, 2 MiB decompressed.
    big = batch(0, 200, 10_240, Compression.ZSTD)
    assert len(big) < 64 << 10
    offsets, fetch_offset = [], 0
    while fetch_offset < 200:
        budget = DecodeBudget(max_records=1 << 20, max_bytes=256 << 10)
        decoded = decode([big], fetch_offset, budget=budget)
        got = offsets_of(decoded)
        assert len(got) > 0 and decoded.next_offset == got[-1] + 1
        answer = sum(record_cost(r) for _, records in decoded.batches for r in records)
        assert answer <= 256 << 10 and budget.payload_bytes == answer
        offsets += got
        fetch_offset = decoded.next_offset
    assert offsets == list(range(200))


def test_the_cost_estimate_covers_the_protobuf_answer():
    from gateway.server import serde
    from gateway.server.fetch import FetchedPartition

    records = [
        Record(offset=2**40 + i, timestamp=1_700_000_000_000 + i, key=b"k" * 8, value=b"v" * i, headers=h)
        for i, h in enumerate([(), (("a", b"1"),), (("a", None), ("bb", b"22"), ("c", b""))] * 50)
    ]
    result = FetchedPartition("topic", 7, None, 10, 0, 11, [(TimestampType.CREATE_TIME, records)])
    encoded = serde.fetch_response_to_proto([result]).partitions[0].records
    assert sum(r.ByteSize() + 3 for r in encoded) <= sum(record_cost(r) for r in records)


def test_the_issues_three_million_record_batch_is_decoded_in_bounded_windows():
    from tests.batch_faults import huge_zstd_batch

    huge = huge_zstd_batch(300_000)
    decoded = decode([huge], 0, max_records=100_000)
    assert (len(offsets_of(decoded)), decoded.next_offset) == (100_000, 100_000)
    tail = decode([huge], 299_990, max_records=100_000)
    assert offsets_of(tail) == list(range(299_990, 300_000)) and tail.next_offset == 300_000


def test_budget_bounds_must_be_positive():
    with pytest.raises(ValueError):
        DecodeBudget(max_records=0, max_bytes=1)
