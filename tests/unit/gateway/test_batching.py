import random

import pytest

from gateway.server.batching import (
    ProduceCommand,
    RecordIn,
    assign_partitions,
    build_batches,
    ensure_valid_command,
    estimate_record_size,
    group_by_partition,
    plan_raw,
    plan_typed,
)
from services import errors
from services.partitioner import StickyPartitioner, partition_for_key
from services.records import Compression, RecordBatchBuilder, iter_batches

NOW = 1_700_000_000_000


def _decode(data: bytes):
    records: list = []
    for batch in iter_batches(data):
        batch.validate(deep=True)
        records.extend(batch.records())
    return records


# ---- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, error",
    [
        pytest.param(
            ProduceCommand(topic="", records=[RecordIn(None, b"v")]),
            errors.InvalidTopicError,
            id="empty-topic",
        ),
        pytest.param(
            ProduceCommand(topic="t", records=[RecordIn(None, b"v")], batches=[(0, b"x")]),
            errors.InvalidRequestError,
            id="records-and-batches",
        ),
        pytest.param(
            ProduceCommand(topic="t", records=[RecordIn(None, b"v", partition=-1)]),
            errors.InvalidRequestError,
            id="negative-record-partition",
        ),
        pytest.param(
            ProduceCommand(topic="t", batches=[(-2, b"x")]),
            errors.InvalidRequestError,
            id="negative-batch-partition",
        ),
        pytest.param(
            ProduceCommand(topic="t", batches=[(1, b"x"), (1, b"y")]),
            errors.InvalidRequestError,
            id="duplicate-batch-partition",
        ),
        pytest.param(
            ProduceCommand(topic="t", records=[RecordIn(None, b"v")], timeout_ms=-1),
            errors.InvalidRequestError,
            id="negative-timeout",
        ),
    ],
)
def test_invalid_commands_are_rejected_with_kafka_reasons(command, error):
    with pytest.raises(error) as info:
        ensure_valid_command(command)
    assert info.value.grpc_code.name == "INVALID_ARGUMENT"


def test_valid_command_passes():
    ensure_valid_command(ProduceCommand(topic="t", records=[RecordIn(b"k", b"v", partition=3)]))
    ensure_valid_command(ProduceCommand(topic="t", batches=[(0, b"x"), (1, b"y")]))


# ---- partition choice -----------------------------------------------------------------------


def test_explicit_partition_wins_over_key():
    records = [RecordIn(b"key", b"v", partition=5), RecordIn(b"key", b"v")]
    assignment = assign_partitions("t", records, 8, StickyPartitioner(random.Random(1)))
    assert assignment == [5, partition_for_key(b"key", 8)]


def test_keys_use_kafka_murmur2_partitions():
    keys = [f"key-{i}".encode() for i in range(200)]
    records = [RecordIn(k, b"v") for k in keys]
    assignment = assign_partitions("t", records, 8, StickyPartitioner())
    assert assignment == [partition_for_key(k, 8) for k in keys]
    assert len(set(assignment)) == 8  # 200 keys spread over every partition


def test_null_keys_stick_to_one_partition_per_request_and_move_on():
    sticky = StickyPartitioner(random.Random(7))
    records = [RecordIn(None, b"v")] * 20
    first = assign_partitions("t", records, 4, sticky)
    second = assign_partitions("t", records, 4, sticky)
    assert len(set(first)) == 1 and len(set(second)) == 1
    assert first[0] != second[0]  # a new batch goes to another partition


def test_sticky_state_is_per_topic():
    sticky = StickyPartitioner(random.Random(3))
    a = assign_partitions("a", [RecordIn(None, b"v")], 16, sticky)
    b = assign_partitions("b", [RecordIn(None, b"v")], 16, sticky)
    a2 = assign_partitions("a", [RecordIn(None, b"v")], 16, sticky)
    assert a2 != a  # topic a moved on after its own batch, topic b did not disturb it
    assert 0 <= b[0] < 16


def test_group_by_partition_keeps_request_order_within_partition():
    assert group_by_partition([2, 0, 2, 1, 0]) == {0: [1, 4], 1: [3], 2: [0, 2]}
    assert list(group_by_partition([3, 1, 2])) == [1, 2, 3]


# ---- batch building -------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name.lower())
def test_batches_round_trip_records_with_compression(compression):
    records = [
        RecordIn(b"k1", b"v1", (("h", b"x"), ("null", None)), 1234),
        RecordIn(None, b"v2"),
        RecordIn(b"k3", None, (), 99),
    ]
    data = build_batches(records, [0, 1, 2], compression=compression, now_ms=NOW, max_batch_bytes=1 << 20)
    batches = list(iter_batches(data))
    assert len(batches) == 1 and batches[0].compression == compression
    decoded = _decode(data)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in decoded] == [
        (0, b"k1", b"v1", (("h", b"x"), ("null", None)), 1234),
        (1, None, b"v2", (), NOW),  # no timestamp: the gateway's clock
        (2, b"k3", None, (), 99),
    ]


def test_batches_follow_the_given_index_order():
    records = [RecordIn(None, str(i).encode()) for i in range(5)]
    decoded = _decode(
        build_batches(records, [4, 1, 3], compression=Compression.NONE, now_ms=NOW, max_batch_bytes=1 << 20)
    )
    assert [r.value for r in decoded] == [b"4", b"1", b"3"]
    assert [r.offset for r in decoded] == [0, 1, 2]


def test_batches_split_at_the_byte_limit():
    records = [RecordIn(None, bytes(200)) for _ in range(50)]
    limit = 1000
    data = build_batches(records, range(50), compression=Compression.NONE, now_ms=NOW, max_batch_bytes=limit)
    batches = list(iter_batches(data))
    assert len(batches) > 10
    assert all(b.size_in_bytes <= limit for b in batches)
    assert sum(b.record_count for b in batches) == 50
    assert [r.value for r in _decode(data)] == [bytes(200)] * 50


def test_a_record_larger_than_the_limit_gets_its_own_batch():
    records = [RecordIn(None, b"a"), RecordIn(None, bytes(5000)), RecordIn(None, b"b")]
    data = build_batches(records, [0, 1, 2], compression=Compression.NONE, now_ms=NOW, max_batch_bytes=1000)
    assert [b.record_count for b in iter_batches(data)] == [1, 1, 1]


def test_estimate_is_an_upper_bound():
    for record in [RecordIn(b"k" * 300, b"v" * 70_000, (("hé", b"x" * 200),), 2**62), RecordIn(None, None)]:
        builder = RecordBatchBuilder()
        builder.append(record.value, key=record.key, headers=record.headers, timestamp=record.timestamp or 0)
        assert builder.size_in_bytes() - 61 <= estimate_record_size(record)


def test_unencodable_record_is_invalid_record():
    records = [RecordIn(None, b"v", headers=((b"not-a-str", b"x"),))]
    with pytest.raises(errors.InvalidRecordError):
        build_batches(records, [0], compression=Compression.NONE, now_ms=NOW, max_batch_bytes=1 << 20)


# ---- plans ----------------------------------------------------------------------------------


def test_plan_typed_builds_one_payload_per_partition_and_flags_unknown_ones():
    records = [
        RecordIn(None, b"a", partition=0),
        RecordIn(None, b"b", partition=9),
        RecordIn(None, b"c", partition=1),
        RecordIn(None, b"d", partition=0),
    ]
    command = ProduceCommand(topic="t", records=records, compression=Compression.GZIP)
    assignment, payloads, unknown = plan_typed(
        command, 4, StickyPartitioner(), now_ms=NOW, max_batch_bytes=1 << 20
    )
    assert assignment == [0, 9, 1, 0]
    assert unknown == [9]
    assert sorted(payloads) == [0, 1]
    assert payloads[0].record_indexes == [0, 3]
    assert [r.value for r in _decode(payloads[0].data)] == [b"a", b"d"]
    assert [b.compression for b in iter_batches(payloads[1].data)] == [Compression.GZIP]


def test_plan_raw_passes_bytes_through_untouched():
    blob = b"opaque-bytes: the gateway never looks inside"
    payloads, unknown = plan_raw(ProduceCommand(topic="t", batches=[(3, blob), (0, b"x"), (7, b"y")]), 4)
    assert unknown == [7]
    assert payloads[3].data is blob
    assert list(payloads) == [0, 3]
