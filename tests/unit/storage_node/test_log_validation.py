"""validate_producer_batches: every record of every batch, and the header rules for clients.

The inputs are the hardening issue's reproductions (``tests/batch_faults.py``): batches whose
framing is right but a record is not, which an older node stored and every consumer then failed
on, and header states nothing here honours. Each must be refused with its reason, naming the
batch and (for record faults) the record, and with nothing written.
"""

from __future__ import annotations

import pytest

from services.errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError
from services.records import Compression
from storage_node.log.validation import validate_producer_batches
from tests import batch_faults
from tests.unit.storage_node.log_testkit import make_batch, open_log, snapshot_dir

LIMITS = {"max_message_bytes": 1 << 20, "segment_bytes": 1 << 30}


@pytest.fixture(params=["python", "c"])
def codec_backend(request, monkeypatch):
    from tests.unit.services.records.records_backends import use_backend

    use_backend(monkeypatch, request.param)


@pytest.mark.usefixtures("codec_backend")
@pytest.mark.parametrize(
    "build, match",
    [
        (batch_faults.key_past_record, "record 0 has key length 40 with 6 bytes left"),
        (batch_faults.million_headers, "record 0 has header count 1000000"),
        (batch_faults.duplicate_offset_deltas, "record 1 has offset delta 0"),
    ],
    ids=list(batch_faults.POISON_PILLS),
)
def test_poison_pills_are_refused_naming_batch_and_record(build, match):
    good = make_batch(2)
    with pytest.raises(CorruptRecordError, match=match) as info:
        validate_producer_batches(good + build(), **LIMITS)
    assert info.value.message.startswith(f"batch at byte {len(good)}: ")


@pytest.mark.usefixtures("codec_backend")
def test_a_compressed_batch_past_the_decompression_bound_is_refused():
    with pytest.raises(CorruptRecordError, match="decompressed batch exceeds 67108864 bytes"):
        validate_producer_batches(batch_faults.decompression_bomb(), **LIMITS)


@pytest.mark.usefixtures("codec_backend")
@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name.lower())
def test_well_formed_batches_of_every_codec_pass(compression):
    payload = make_batch(5, compression=compression) + make_batch(1)
    assert [b.record_count for b in validate_producer_batches(payload, **LIMITS)] == [5, 1]


@pytest.mark.parametrize(
    "build, match",
    [
        (batch_faults.transactional_without_producer_id, "transactional and has no producer id"),
        (batch_faults.control, "control batch; only the broker writes those"),
        (batch_faults.producer_id_without_epoch, "invalid producer epoch -1"),
        (batch_faults.producer_id_without_sequence, "invalid base sequence -1"),
        (batch_faults.negative_producer_id, "producer id -5; -1 means none"),
    ],
    ids=list(batch_faults.HEADER_FAULTS),
)
def test_header_states_a_producer_may_not_send_are_invalid_records(build, match):
    with pytest.raises(InvalidRecordError, match=match):
        validate_producer_batches(build(), **LIMITS)


@pytest.mark.parametrize(
    "build", [batch_faults.idempotent, batch_faults.transactional], ids=["idempotent", "transactional"]
)
def test_an_idempotent_or_transactional_batch_passes_and_carries_its_producer(build):
    (validated,) = validate_producer_batches(build(), **LIMITS)
    facts = validated.facts
    assert (facts.producer_id, facts.producer_epoch, facts.base_sequence) == (7, 0, 0)
    assert facts.is_transactional == (build is batch_faults.transactional)
    with pytest.raises(InvalidRecordError, match="must all come from that one producer"):
        validate_producer_batches(make_batch(1) + build(), **LIMITS)


def test_log_append_time_set_by_a_producer_is_an_invalid_timestamp():
    with pytest.raises(InvalidTimestampError, match="marked LogAppendTime"):
        validate_producer_batches(batch_faults.log_append_time_from_producer(), **LIMITS)


def test_the_field_by_field_good_batch_passes():
    # The builders above differ from it in one field each: this is what makes them fail.
    (validated,) = validate_producer_batches(batch_faults.good(3), **LIMITS)
    assert (validated.record_count, validated.last_offset_delta) == (3, 2)


@pytest.mark.parametrize("build", [*batch_faults.POISON_PILLS.values(), *batch_faults.HEADER_FAULTS.values()])
def test_a_refused_payload_writes_nothing(tmp_path, clock, build):
    partition_log = open_log(tmp_path / "t-0", clock)
    partition_log.append(make_batch(2))
    before = snapshot_dir(tmp_path / "t-0")
    with pytest.raises((CorruptRecordError, InvalidRecordError)):
        partition_log.append(make_batch(1) + build())
    assert snapshot_dir(tmp_path / "t-0") == before
    assert partition_log.append(make_batch(1)).first_offset == 2
