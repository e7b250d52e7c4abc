"""The C fast path of ``validate_producer_batches`` (``_speedups.scan_producer_batches``) against
the Python checks, which are the reference: on every payload the two backends must return the
same batches or raise the same error, and the fast path may only ever answer a payload the
reference accepts, with what the reference returns.

Payloads are generated (hypothesis): valid ones of a few batches with random records and
producer states, then mutated -- a byte changed, a header field rewritten, the CRC made right
again or not, bytes cut or added -- so that every check is reached, not only the CRC's.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.errors import CorruptRecordError, TributaryError
from services.records import Compression, RecordBatchBuilder
from storage_node.log import validation
from storage_node.log.validation import validate_producer_batches
from tests import batch_faults
from tests.unit.services.records.records_backends import require_speedups, use_backend
from tests.unit.storage_node.log_testkit import make_batch

LIMITS = {"max_message_bytes": 1 << 20, "segment_bytes": 1 << 30}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Header fields a mutation may rewrite: (offset, struct format).
HEADER_FIELDS = [
    (8, ">i"),  # batchLength
    (16, ">b"),  # magic
    (21, ">h"),  # attributes
    (23, ">i"),  # lastOffsetDelta
    (27, ">q"),  # baseTimestamp
    (35, ">q"),  # maxTimestamp
    (43, ">q"),  # producerId
    (51, ">h"),  # producerEpoch
    (53, ">i"),  # baseSequence
    (57, ">i"),  # recordCount
]
FIELD_VALUES = st.sampled_from([-5, -2, -1, 0, 1, 2, 3, 7, 48, 49, 100, 2**15 - 1, 2**31 - 1])


def outcome(payload, backend: str, monkeypatch: pytest.MonkeyPatch, limits=LIMITS):
    """What ``validate_producer_batches`` says with one backend: the batches, or the error's
    class and message -- up to the record it names: the record walk (``validate_records``) has
    a C and a Python version of its own, which refuse the same records but may word the fault
    differently when a record breaks two rules (``tests/unit/services/records`` compares them)."""
    use_backend(monkeypatch, backend)
    try:
        return validate_producer_batches(payload, **limits)
    except TributaryError as exc:
        message = str(exc)
        if isinstance(exc, CorruptRecordError) and "batch at byte" in message:
            message = message.split(": ", 1)[0]
        return (type(exc), message)


@st.composite
def records(draw):
    count = draw(st.integers(1, 6))
    small = st.binary(max_size=40)
    return [
        (
            draw(st.one_of(st.none(), small)),
            draw(st.one_of(st.none(), small)),
            tuple(draw(st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), small)), max_size=2))),
            draw(st.integers(-1, 2**41)),
        )
        for _ in range(count)
    ]


@st.composite
def payloads(draw):
    """A producer's payload: 1-3 batches, all plain or all one idempotent/transactional producer."""
    state = draw(st.sampled_from(["plain", "idempotent", "transactional"]))
    producer = (draw(st.integers(0, 2**40)), draw(st.integers(0, 2**15 - 1)))
    sequence = draw(st.integers(0, 1000))
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        builder = RecordBatchBuilder()
        batch_records = draw(records())
        for key, value, headers, timestamp in batch_records:
            builder.append(value, timestamp=timestamp, key=key, headers=headers)
        if state != "plain":
            builder.set_producer_state(
                producer[0], producer[1], sequence, is_transactional=state == "transactional"
            )
            sequence += len(batch_records)
        out += builder.build()
    return out


def recrc(payload: bytearray, at: int) -> None:
    """Make the CRC of the batch starting at ``at`` right again (for the checks behind it)."""
    (length,) = struct.unpack_from(">i", payload, at + 8)
    end = min(len(payload), at + 12 + max(length, 49))
    struct.pack_into(">I", payload, at + 17, crc32c.crc32c(bytes(payload[at + 21 : end])))


@st.composite
def mutated(draw):
    payload = bytearray(draw(payloads()))
    kind = draw(st.sampled_from(["byte", "field", "cut", "extend", "record"]))
    fix_crc = draw(st.booleans())
    if kind == "byte":
        at = draw(st.integers(0, len(payload) - 1))
        payload[at] = draw(st.integers(0, 255))
    elif kind == "field":
        offset, fmt = draw(st.sampled_from(HEADER_FIELDS))
        value = draw(FIELD_VALUES)
        low, high = {">b": (-128, 127), ">h": (-(2**15), 2**15 - 1), ">i": (-(2**31), 2**31 - 1)}.get(
            fmt, (-(2**63), 2**63 - 1)
        )
        struct.pack_into(fmt, payload, offset, max(low, min(high, value)))
    elif kind == "record":  # a byte inside the first batch's records
        at = draw(st.integers(61, min(len(payload), 61 + 200) - 1))
        payload[at] = draw(st.integers(0, 255))
    elif kind == "cut":
        del payload[draw(st.integers(0, len(payload) - 1)) :]
    else:
        payload += draw(st.binary(min_size=1, max_size=80))
    if fix_crc and len(payload) >= 61:
        recrc(payload, 0)
    return bytes(payload)


@SETTINGS
@given(payload=payloads())
def test_valid_payloads_take_the_fast_path_and_match_the_reference(payload):
    speedups = require_speedups()
    scanned = speedups.scan_producer_batches(payload, LIMITS["max_message_bytes"], LIMITS["segment_bytes"])
    assert scanned is not None
    with pytest.MonkeyPatch.context() as monkeypatch:
        reference = outcome(payload, "python", monkeypatch)
        fast = outcome(payload, "c", monkeypatch)
    assert isinstance(reference, list)
    assert fast == reference


@SETTINGS
@given(payload=mutated())
def test_mutated_payloads_get_the_same_answer_from_both_backends(payload):
    speedups = require_speedups()
    with pytest.MonkeyPatch.context() as monkeypatch:
        reference = outcome(payload, "python", monkeypatch)
        fast = outcome(payload, "c", monkeypatch)
    assert fast == reference
    scanned = speedups.scan_producer_batches(payload, LIMITS["max_message_bytes"], LIMITS["segment_bytes"])
    if scanned is not None:  # the fast path answered: only ever what the reference accepts
        assert isinstance(reference, list)
        assert [(b.position, b.size) for b in reference] == [(s[0], s[1]) for s in scanned]


@pytest.mark.parametrize(
    "build",
    [*batch_faults.POISON_PILLS.values(), *batch_faults.HEADER_FAULTS.values()],
    ids=[*batch_faults.POISON_PILLS, *batch_faults.HEADER_FAULTS],
)
def test_every_known_fault_is_left_to_the_reference_and_refused_alike(build, monkeypatch):
    payload = make_batch(2) + build()
    scanned = require_speedups().scan_producer_batches(payload, 1 << 30, 1 << 30)
    assert scanned is None
    reference = outcome(
        payload, "python", monkeypatch, {"max_message_bytes": 1 << 30, "segment_bytes": 1 << 30}
    )
    fast = outcome(payload, "c", monkeypatch, {"max_message_bytes": 1 << 30, "segment_bytes": 1 << 30})
    assert isinstance(reference, tuple)
    assert fast == reference


def test_mixed_producers_and_size_limits_are_left_to_the_reference(monkeypatch):
    speedups = require_speedups()
    mixed = make_batch(1) + batch_faults.idempotent()
    assert speedups.scan_producer_batches(mixed, 1 << 20, 1 << 30) is None
    assert outcome(mixed, "c", monkeypatch) == outcome(mixed, "python", monkeypatch)
    batch = make_batch(3)
    assert speedups.scan_producer_batches(batch, len(batch), len(batch)) is not None
    for limits in (
        {"max_message_bytes": len(batch) - 1, "segment_bytes": 1 << 30},
        {
            "max_message_bytes": 1 << 20,
            "segment_bytes": len(batch) - 1,
        },
    ):
        assert speedups.scan_producer_batches(batch, **limits) is None
        refused = outcome(batch, "c", monkeypatch, limits)
        assert refused == outcome(batch, "python", monkeypatch, limits)
        assert "larger than" in refused[1]
    assert speedups.scan_producer_batches(b"", 1 << 20, 1 << 30) is None


@pytest.mark.parametrize("compression", [c for c in Compression if c is not Compression.NONE])
def test_a_compressed_batch_is_left_to_the_reference_which_accepts_it(compression, monkeypatch):
    payload = make_batch(4, compression=compression)
    assert require_speedups().scan_producer_batches(payload, 1 << 20, 1 << 30) is None
    accepted = outcome(payload, "c", monkeypatch)
    assert isinstance(accepted, list) and accepted == outcome(payload, "python", monkeypatch)


def test_the_fast_path_is_what_the_default_backend_runs(monkeypatch):
    # Not a timing test: the payload's answer comes from scan_producer_batches, not the Python loop.
    use_backend(monkeypatch, "c")

    def refuse(*args):
        raise AssertionError("the Python checks ran for a payload the fast path answers")

    monkeypatch.setattr(validation, "_validate_in_python", refuse)
    (validated,) = validate_producer_batches(make_batch(3), **LIMITS)
    assert validated.record_count == 3


@SETTINGS
@given(data=st.binary(max_size=300), skip=st.integers(0, 7))
def test_the_c_crc32c_is_crc32c(data, skip):
    # Both ways the extension computes it: the CPU's crc32 instruction where it has one (8 bytes
    # a step from an 8-byte boundary: ``skip`` starts the bytes off it) and the table.
    speedups = require_speedups()
    view = memoryview(bytes(skip) + data)[skip:]
    assert speedups.crc32c(view) == crc32c.crc32c(data)
    assert speedups._crc32c_by_table(view) == crc32c.crc32c(data)


def test_the_c_crc32c_of_a_batch_sized_buffer_is_crc32c():
    data = bytes(range(256)) * 41 + b"tail"  # a 50-record batch's size, not a multiple of 8
    assert require_speedups().crc32c(data) == crc32c.crc32c(data)
    assert require_speedups()._crc32c_by_table(data) == crc32c.crc32c(data)


def test_a_buffer_the_fast_path_cannot_read_flat_is_left_to_the_reference(monkeypatch):
    payload = make_batch(2) + make_batch(1)
    strided = memoryview(bytes(len(payload) * 2))[::2]  # not contiguous
    assert require_speedups().scan_producer_batches(strided, 1 << 20, 1 << 30) is None
    assert require_speedups().scan_producer_batches(object(), 1 << 20, 1 << 30) is None
    assert outcome(payload, "c", monkeypatch) == outcome(payload, "python", monkeypatch)
