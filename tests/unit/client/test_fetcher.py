"""The consumer's fetch buffer and poll shaping: lazy decoding, positions, errors, stale results."""

import json

import pytest

from gateway.client.errors import CorruptRecordError, OffsetOutOfRangeError
from gateway.client.fetcher import PREFETCH_DEPTH, Fetcher, PartitionRecords, SendFetchHandler
from gateway.client.metadata import MetadataCache
from gateway.client.structs import ConsumerRecord, TopicPartition
from gateway.client.subscription import SubscriptionState
from gateway.client.throttle import Throttles
from services.clock import ManualClock
from services.proto import pb
from services.records import Compression, RecordBatchBuilder, set_base_offset
from services.serde import error_to_proto

T = 1_700_000_000_000
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def batch(base_offset: int, count: int, *, compression=Compression.NONE, prefix=b"v", headers=()):
    builder = RecordBatchBuilder(compression=compression)
    for i in range(count):
        builder.append(
            prefix + str(base_offset + i).encode(),
            timestamp=T + base_offset + i,
            key=b"k%d" % (base_offset + i),
            headers=headers,
        )
    data = bytearray(builder.build())
    set_base_offset(data, base_offset)
    return bytes(data)


def offsets(records):
    return [r.offset for r in records]


# ---- PartitionRecords ---------------------------------------------------------------------------


def test_records_before_the_fetch_offset_are_skipped():
    raw = batch(0, 5) + batch(5, 5)
    chunk = PartitionRecords(TP0, 3, raw)
    assert chunk.next_fetch_offset == 10
    assert offsets(chunk.take(100, 3)) == [3, 4, 5, 6, 7, 8, 9]
    assert chunk.exhausted


def test_batches_wholly_before_the_offset_are_dropped_without_decoding():
    chunk = PartitionRecords(TP0, 5, batch(0, 5) + batch(5, 2))
    assert offsets(chunk.take(10, 5)) == [5, 6]


def test_take_stops_at_max_records_and_resumes():
    chunk = PartitionRecords(TP0, 0, batch(0, 4, compression=Compression.GZIP) + batch(4, 4))
    first = chunk.take(3, 0)
    second = chunk.take(3, 3)
    third = chunk.take(3, 6)
    assert [offsets(first), offsets(second), offsets(third)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert chunk.exhausted


def test_a_whole_batch_handed_out_is_the_callers_to_change():
    # take() hands a batch's decoded list over as it is (no copy): what the caller does with it
    # must not reach the chunk.
    chunk = PartitionRecords(TP0, 0, batch(0, 3) + batch(3, 3))
    first = chunk.take(3, 0)
    first.extend(first)
    first.clear()
    assert offsets(chunk.take(10, 3)) == [3, 4, 5]
    assert chunk.exhausted


def test_a_window_inside_a_batch_then_the_rest_of_it_and_the_next():
    chunk = PartitionRecords(TP0, 2, batch(0, 5) + batch(5, 3))
    assert offsets(chunk.take(2, 2)) == [2, 3]
    assert offsets(chunk.take(10, 4)) == [4, 5, 6, 7]
    assert chunk.exhausted


def test_consumer_records_carry_every_field():
    chunk = PartitionRecords(TP0, 0, batch(0, 1, headers=[("h", b"1"), ("n", None)]))
    (record,) = chunk.take(1, 0)
    assert isinstance(record, ConsumerRecord)
    assert record == ConsumerRecord("t", 0, 0, T, 0, b"k0", b"v0", (("h", b"1"), ("n", None)))
    assert record.topic_partition == TP0


def test_deserializers_apply_to_non_null_keys_and_values():
    builder = RecordBatchBuilder()
    builder.append(json.dumps({"a": 1}).encode(), timestamp=T, key=b"key")
    builder.append(None, timestamp=T, key=None)
    chunk = PartitionRecords(TP0, 0, builder.build())
    records = chunk.take(10, 0, key_deserializer=bytes.decode, value_deserializer=json.loads)
    assert [(r.key, r.value) for r in records] == [("key", {"a": 1}), (None, None)]


def test_a_partial_tail_is_left_for_the_next_fetch():
    raw = batch(0, 3) + batch(3, 3)[:-10]
    chunk = PartitionRecords(TP0, 0, raw)
    assert chunk.next_fetch_offset == 3
    assert offsets(chunk.take(10, 0)) == [0, 1, 2]


def test_a_corrupt_batch_ends_the_chunk_after_the_good_records():
    bad = bytearray(batch(3, 3))
    bad[-1] ^= 0xFF
    chunk = PartitionRecords(TP0, 0, batch(0, 3) + bytes(bad))
    assert chunk.next_fetch_offset == 3
    assert offsets(chunk.take(10, 0)) == [0, 1, 2]
    assert isinstance(chunk.error, CorruptRecordError)
    assert chunk.error.reason == "CORRUPT_MESSAGE"


def test_crc_check_can_be_turned_off():
    bad = bytearray(batch(0, 3))
    bad[-2] ^= 0x01  # the last value's last byte: "v2" becomes "v3"; the structure stays valid
    chunk = PartitionRecords(TP0, 0, bytes(bad), check_crcs=False)
    assert chunk.error is None
    assert [r.value for r in chunk.take(10, 0)] == [b"v0", b"v1", b"v3"]
    assert isinstance(PartitionRecords(TP0, 0, bytes(bad)).error, CorruptRecordError)


# ---- Fetcher: buffering and poll shaping ----------------------------------------------------------


class _Client:
    """What the fetcher uses of GatewayClient when no I/O happens."""

    def __init__(self):
        self.clock = ManualClock()
        self.metadata = MetadataCache()
        self.request_timeout_ms = 30_000
        self.fetch_throttles = Throttles("fetch")


def fetcher(reset="earliest", positions=None):
    subscription = SubscriptionState(reset)
    subscription.assign_from_user(list(positions or {TP0: 0, TP1: 0}))
    for tp, position in (positions or {TP0: 0, TP1: 0}).items():
        if position is not None:
            subscription.seek(tp, position)
    return Fetcher(_Client(), subscription), subscription


def result(tp, raw=b"", *, error=None, high_watermark=100):
    message = pb.FetchPartitionResult(
        topic=tp.topic,
        partition=tp.partition,
        record_batches=raw,
        high_watermark=high_watermark,
        log_start_offset=0,
    )
    if error is not None:
        message.error.CopyFrom(error_to_proto(error))
    return message


def answer(f, tp, offset, partition_result):
    """The fetcher gets ``partition_result`` as the answer to a fetch of ``tp`` from ``offset``."""
    handler = SendFetchHandler(f, {tp: offset})
    request = handler.create_request()
    assert request.raw_batches and request.partitions[0].offset == offset
    handler.handle_response(pb.FetchResponse(partitions=[partition_result]))


def test_drain_shapes_records_by_partition_and_advances_positions():
    f, sub = fetcher()
    answer(f, TP0, 0, result(TP0, batch(0, 3)))
    answer(f, TP1, 0, result(TP1, batch(0, 2)))
    polled = f.drain(100)
    assert set(polled) == {TP0, TP1}
    assert offsets(polled[TP0]) == [0, 1, 2] and offsets(polled[TP1]) == [0, 1]
    assert sub.position(TP0) == 3 and sub.position(TP1) == 2
    assert sub.high_watermark(TP0) == 100
    assert f.drain(100) == {}


def test_max_records_spans_partitions_and_the_rest_stays_buffered():
    f, _sub = fetcher()
    answer(f, TP0, 0, result(TP0, batch(0, 4)))
    answer(f, TP1, 0, result(TP1, batch(0, 4)))
    first = f.drain(5)
    assert sum(len(r) for r in first.values()) == 5
    second = f.drain(5)
    assert sum(len(r) for r in second.values()) == 3
    for tp in (TP0, TP1):
        got = offsets(first.get(tp, [])) + offsets(second.get(tp, []))
        assert got == [0, 1, 2, 3], "per-partition order across polls"


def test_the_next_fetch_starts_after_buffered_chunks_up_to_the_prefetch_depth():
    f, _sub = fetcher()
    answer(f, TP0, 0, result(TP0, batch(0, 3)))
    assert f.next_fetch_offset(TP0) == 3, "the next chunk is fetched while this one is consumed"
    assert TP0 in f.fetch_candidates(now=0)
    for n in range(1, PREFETCH_DEPTH):
        answer(f, TP0, 3 * n, result(TP0, batch(3 * n, 3)))
    assert TP0 not in f.fetch_candidates(now=0)
    f.drain(3)
    assert TP0 in f.fetch_candidates(now=0)


def test_results_for_an_old_position_are_dropped():
    f, sub = fetcher()
    sub.seek(TP0, 50)  # the application seeked while a fetch from 0 was in flight
    answer(f, TP0, 0, result(TP0, batch(0, 3)))
    assert f.drain(10) == {}
    answer(f, TP0, 50, result(TP0, batch(50, 2)))
    assert offsets(f.drain(10)[TP0]) == [50, 51]


def test_paused_partitions_keep_their_records_until_resumed():
    f, sub = fetcher()
    answer(f, TP0, 0, result(TP0, batch(0, 2)))
    sub.pause(TP0)
    assert f.drain(10) == {}
    assert TP0 not in f.fetch_candidates(now=0)
    sub.resume(TP0)
    assert offsets(f.drain(10)[TP0]) == [0, 1]


def test_records_of_a_paused_partition_leave_a_poll_waiting():
    f, sub = fetcher()
    answer(f, TP0, 0, result(TP0, batch(0, 2)))
    assert f.data_ready.is_set()
    sub.pause(TP0)
    assert f.drain(10) == {}
    assert not f.data_ready.is_set(), "a poll waits for records it may return, not spins"
    answer(f, TP1, 0, result(TP1, batch(0, 1)))
    assert f.data_ready.is_set()
    assert offsets(f.drain(10)[TP1]) == [0]
    assert not f.data_ready.is_set()
    sub.resume(TP0)
    f.partitions_resumed()
    assert f.data_ready.is_set()
    assert offsets(f.drain(10)[TP0]) == [0, 1]


def test_out_of_range_with_reset_none_is_raised_from_poll():
    f, _sub = fetcher(reset="none")
    answer(f, TP0, 0, result(TP0, error=OffsetOutOfRangeError("log starts at 10")))
    with pytest.raises(OffsetOutOfRangeError, match="auto_offset_reset is 'none'"):
        f.drain(10)
    assert f.drain(10) == {}, "raised once; the partition is fetched again afterwards"


def test_out_of_range_with_reset_earliest_resets_quietly():
    f, sub = fetcher(reset="earliest")
    answer(f, TP0, 0, result(TP0, error=OffsetOutOfRangeError()))
    assert f.drain(10) == {}
    assert sub.partitions_awaiting_reset() == {TP0: ("earliest", 2)}


def test_records_come_before_a_pending_error():
    f, _sub = fetcher(reset="none")
    answer(f, TP1, 0, result(TP1, batch(0, 2)))
    answer(f, TP0, 0, result(TP0, error=OffsetOutOfRangeError()))
    assert offsets(f.drain(10)[TP1]) == [0, 1]
    with pytest.raises(OffsetOutOfRangeError):
        f.drain(10)


def test_a_corrupt_batch_is_raised_after_the_records_before_it():
    bad = bytearray(batch(2, 2))
    bad[-1] ^= 0xFF
    f, sub = fetcher()
    answer(f, TP0, 0, result(TP0, batch(0, 2) + bytes(bad)))
    assert offsets(f.drain(10)[TP0]) == [0, 1]
    with pytest.raises(CorruptRecordError):
        f.drain(10)
    assert sub.position(TP0) == 2, "the consumer stays at the corrupt batch until it seeks past it"


def test_a_failed_fetch_call_backs_off_quietly():
    from gateway.client.errors import NetworkError

    f, _sub = fetcher()
    SendFetchHandler(f, {TP0: 0, TP1: 0}).handle_error(NetworkError("gateway gone"))
    assert f.drain(10) == {}, "retriable: not the application's problem"
    assert f.fetch_candidates(now=f.client.clock.monotonic()) == {}
    f.client.clock.advance(f.retry_backoff_ms)
    assert f.fetch_candidates(now=f.client.clock.monotonic()) == {TP0: 0, TP1: 0}


def test_a_rejected_fetch_is_raised():
    from gateway.client.errors import InvalidRequestError

    f, _sub = fetcher()
    SendFetchHandler(f, {TP0: 0}).handle_error(InvalidRequestError("bad request"))
    with pytest.raises(InvalidRequestError):
        f.drain(10)


def poisoned(base_offset: int, count: int) -> bytes:
    """A batch an older storage node stored: its CRC is right, its records are not (the header
    says one record fewer than there are)."""
    import struct

    import crc32c

    bad = bytearray(batch(base_offset, count))
    struct.pack_into(">i", bad, 57, count - 1)
    struct.pack_into(">I", bad, 17, crc32c.crc32c(bytes(bad[21:])))
    return bytes(bad)


@pytest.mark.parametrize("check_crcs", [True, False])
def test_an_unreadable_batch_is_named_by_its_own_offsets_and_can_be_skipped(check_crcs):
    # The case: good records 0-10, a bad batch at 11-16, a good one after. The error used
    # to name 17 -- the end of the fetched chunk -- instead of 11.
    f, sub = fetcher(positions={TP0: 0})
    f.check_crcs = check_crcs
    answer(f, TP0, 0, result(TP0, batch(0, 11) + poisoned(11, 6) + batch(17, 2)))
    assert offsets(f.drain(100)[TP0]) == list(range(11))
    with pytest.raises(CorruptRecordError) as info:
        f.drain(100)
    error = info.value
    assert (error.topic, error.partition, error.offset, error.next_offset) == ("t", 0, 11, 17)
    assert "offsets 11..16 of t-0" in error.message and "continue from offset 17" in error.message
    assert sub.position(TP0) == 11
    # Fetched again from 11 (no seek), it is raised again: nothing is skipped silently.
    answer(f, TP0, 11, result(TP0, poisoned(11, 6) + batch(17, 2)))
    with pytest.raises(CorruptRecordError):
        f.drain(100)
    # Skipping is the application's explicit choice, as in Kafka: seek to next_offset.
    sub.seek(TP0, error.next_offset)
    f.discard(TP0)
    answer(f, TP0, 17, result(TP0, batch(17, 2)))
    assert offsets(f.drain(100)[TP0]) == [17, 18]


def test_a_crc_failure_names_the_batch_too():
    bad = bytearray(batch(5, 3))
    bad[-1] ^= 0xFF
    chunk = PartitionRecords(TP1, 0, batch(0, 5) + bytes(bad))
    assert (chunk.error.partition, chunk.error.offset, chunk.error.next_offset) == (1, 5, 8)


def test_a_damaged_batch_length_names_where_the_chunk_stops():
    bad = bytearray(batch(5, 3))
    bad[8:12] = (3).to_bytes(4, "big")  # below the minimum batch length
    chunk = PartitionRecords(TP0, 0, batch(0, 5) + bytes(bad))
    assert (chunk.error.offset, chunk.error.next_offset) == (5, None)
    assert offsets(chunk.take(10, 0)) == [0, 1, 2, 3, 4]


def test_isolation_levels_are_kafkas_two():
    assert Fetcher(
        _Client(), SubscriptionState("earliest"), isolation_level="read_committed"
    ).isolation_level == (pb.ISOLATION_LEVEL_READ_COMMITTED)
    with pytest.raises(ValueError, match="isolation_level must be one of read_uncommitted, read_committed"):
        Fetcher(_Client(), SubscriptionState("earliest"), isolation_level="serializable")


def test_read_committed_records_drop_aborted_transactions_and_markers():
    from services.records.aborted import AbortedTransactionFilter
    from services.records.control import marker_batch

    def txn(values, pid, base):
        builder = RecordBatchBuilder(
            producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True
        )
        for v in values:
            builder.append(v, timestamp=1)
        data = bytearray(builder.build())
        set_base_offset(data, base)
        return bytes(data)

    def marker(pid, base, commit):
        data = bytearray(
            marker_batch(producer_id=pid, producer_epoch=0, commit=commit, coordinator_epoch=0, timestamp=1)
        )
        set_base_offset(data, base)
        return bytes(data)

    # producer 1 commits [0, 1]; producer 2 aborts [2]; producer 1's second transaction commits [5]
    raw = txn([b"a", b"b"], 1, 0) + txn([b"x"], 2, 2) + marker(1, 3, True) + marker(2, 4, False)
    raw += txn([b"c"], 1, 5) + marker(1, 6, True)
    tp = TopicPartition("t", 0)
    committed = PartitionRecords(tp, 0, raw, aborted=AbortedTransactionFilter([(2, 2)]))
    assert [r.value for r in committed.take(100, 0)] == [b"a", b"b", b"c"]
    assert committed.next_fetch_offset == 7
    uncommitted = PartitionRecords(tp, 0, raw)
    assert [r.value for r in uncommitted.take(100, 0)] == [b"a", b"b", b"x", b"c"]


def test_raw_fetch_partitions_are_reused_while_their_offset_holds():
    f, _sub = fetcher()
    first = SendFetchHandler(f, {TP0: 0, TP1: 5}).create_raw_request().partitions
    again = SendFetchHandler(f, {TP0: 0, TP1: 7}).create_raw_request().partitions
    assert [(p.topic, p.partition, p.fetch_offset) for p in again] == [("t", 0, 0), ("t", 1, 7)]
    assert again[0] is first[0], "same offset: the same tuple"
    assert again[1] is not first[1] and first[1].fetch_offset == 5
    assert all(p.max_bytes == f.max_partition_fetch_bytes for p in again)
    f.discard(TP0)  # a seek or an unassignment forgets it
    assert TP0 not in f.raw_fetch_partitions and TP1 in f.raw_fetch_partitions


def test_fetch_candidates_skip_partitions_in_error_or_backoff_and_full_ones():
    f, sub = fetcher(positions={TP0: 0, TP1: 0, TopicPartition("t", 2): 4})
    assert f.fetch_candidates(now=0) == {TP0: 0, TP1: 0, TopicPartition("t", 2): 4}
    f._errors[TP1] = OffsetOutOfRangeError("kept for poll")
    f._backoff([TopicPartition("t", 2)])
    for n in range(PREFETCH_DEPTH):
        answer(f, TP0, 3 * n, result(TP0, batch(3 * n, 3)))
    assert f.fetch_candidates(now=f.client.clock.monotonic()) == {}
    sub.pause(TP0)
    del f._errors[TP1]
    assert f.fetch_candidates(now=f.client.clock.monotonic() + 1.0) == {TP1: 0, TopicPartition("t", 2): 4}
