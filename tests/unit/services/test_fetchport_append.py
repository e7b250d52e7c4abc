from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import errors
from services.acks import Acks
from services.append_result import AppendResult
from services.fetchport import append, protocol

partition_appends = st.builds(
    append.PartitionAppend,
    topic=st.text(min_size=1, max_size=40).filter(lambda t: len(t.encode()) <= append.MAX_TOPIC_BYTES),
    partition=st.integers(0, 2**31 - 1),
    records=st.binary(max_size=64),
    leader_epoch=st.integers(-1, 2**31 - 1),
)


def _body(frame: bytes) -> bytes:
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    return frame[4:]


@given(
    correlation_id=st.integers(0, 2**31 - 1),
    acks=st.sampled_from(list(Acks)),
    timeout_ms=st.integers(0, 2**31 - 1),
    partitions=st.lists(partition_appends, max_size=6, unique_by=lambda p: (p.topic, p.partition)),
    trace=st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20).filter(lambda t: ":" not in t and "\n" not in t),
            st.text(max_size=60).filter(lambda t: "\n" not in t),
        ),
        max_size=2,
    ),
)
@settings(max_examples=200, deadline=None)
def test_request_round_trip(correlation_id, acks, timeout_ms, partitions, trace):
    request = append.AppendRequest(correlation_id, acks, timeout_ms, tuple(partitions), tuple(trace))
    frame = append.encode_request(request)
    body = _body(frame)
    assert append.request_version(body) == append.APPEND_VERSION
    decoded = append.decode_request_body(body)
    assert decoded.correlation_id == correlation_id
    assert decoded.acks is acks
    assert decoded.timeout_ms == timeout_ms
    assert decoded.trace_context == tuple(trace)
    assert [(p.topic, p.partition, bytes(p.records), p.leader_epoch) for p in decoded.partitions] == [
        (p.topic, p.partition, p.records, p.leader_epoch) for p in partitions
    ]


def test_records_are_views_into_the_frame_not_copies():
    body = bytearray(
        _body(
            append.encode_request(
                append.AppendRequest(7, Acks.ALL, 5, (append.PartitionAppend("t", 0, b"abcdef"),))
            )
        )
    )
    decoded = append.decode_request_body(body)
    records = decoded.partitions[0].records
    assert isinstance(records, memoryview)
    body[-6:] = b"XYZXYZ"
    assert bytes(records) == b"XYZXYZ"


def test_encode_request_parts_do_not_copy_the_records():
    records = memoryview(bytearray(b"r" * 100))
    parts = append.encode_request_parts(
        append.AppendRequest(1, Acks.LEADER, 0, (append.PartitionAppend("t", 3, records),))
    )
    assert any(part is records for part in parts)


def test_probe_is_an_append_of_no_partitions():
    decoded = append.decode_request_body(_body(append.probe(5)))
    assert decoded.correlation_id == 5 and decoded.partitions == ()


results = st.builds(
    AppendResult,
    topic=st.text(min_size=1, max_size=30),
    partition=st.integers(0, 2**31 - 1),
    base_offset=st.integers(-1, 2**62),
    last_offset=st.integers(-1, 2**62),
    log_append_time=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**62),
    record_count=st.integers(0, 2**31 - 1),
    error=st.one_of(
        st.none(),
        st.sampled_from(
            [
                errors.NotLeaderOrFollowerError("moved"),
                errors.FencedLeaderEpochError("epoch 3 is not 4"),
                errors.CorruptRecordError("bad crc"),
                errors.RecordTooLargeError(""),
                errors.NotEnoughReplicasError("isr [1]"),
            ]
        ),
    ),
)


@given(correlation_id=st.integers(0, 2**31 - 1), answers=st.lists(results, max_size=6))
@settings(max_examples=200, deadline=None)
def test_response_round_trip(correlation_id, answers):
    decoded = append.decode_response_body(_body(append.encode_response(correlation_id, answers)))
    assert decoded.correlation_id == correlation_id
    assert decoded.error is None
    assert len(decoded.results) == len(answers)
    for got, sent in zip(decoded.results, answers, strict=True):
        assert (got.topic, got.partition, got.base_offset, got.last_offset) == (
            sent.topic,
            sent.partition,
            sent.base_offset,
            sent.last_offset,
        )
        assert (got.log_append_time, got.log_start_offset, got.record_count) == (
            sent.log_append_time,
            sent.log_start_offset,
            sent.record_count,
        )
        if sent.error is None:
            assert got.error is None
        else:
            assert type(got.error) is type(sent.error)
            assert got.error.message == sent.error.message
            assert got.error.retriable == sent.error.retriable


def test_error_response_round_trip_and_connection_error():
    error = errors.InvalidRequestError("frame size 2147483647 outside 1..134217728")
    body = _body(append.encode_error_response(-1, error))
    decoded = append.decode_response_body(body)
    assert decoded.correlation_id == -1 and decoded.results == ()
    assert isinstance(decoded.error, errors.InvalidRequestError)
    assert append.response_correlation_id(body) == -1
    refused = append.connection_error(body)
    assert isinstance(refused, errors.InvalidRequestError) and refused.message == error.message


def test_an_older_nodes_version_0_refusal_reads_as_unsupported_version():
    """A node without appends answers the probe with a fetch v0 error frame; the client must see
    UNSUPPORTED_VERSION to fall back to gRPC."""
    old = protocol.encode_response_header(-1, error=errors.UnsupportedVersionError("fetch request version 2"))
    body = _body(old)
    assert append.response_correlation_id(body) == -1
    assert isinstance(append.connection_error(body), errors.UnsupportedVersionError)


def _request_body(**overrides) -> bytearray:
    request = append.AppendRequest(3, Acks.LEADER, 100, (append.PartitionAppend("topic", 0, b"x" * 10),))
    return bytearray(_body(append.encode_request(request)))


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda b: b[:5], errors.InvalidRequestError),  # shorter than the header
        (lambda b: b"\x00\x07" + b[2:], errors.UnsupportedVersionError),  # unknown version
        (lambda b: b[:2] + b"\xff\xff\xff\xff" + b[6:], errors.InvalidRequestError),  # negative id
        (lambda b: b[:6] + b"\x05" + b[7:], errors.InvalidRequestError),  # acks 5
        (lambda b: b[:7] + b"\xff\xff\xff\xff" + b[11:], errors.InvalidRequestError),  # negative timeout
        (lambda b: b[:11] + b"\x7f\xff" + b[13:], errors.InvalidRequestError),  # trace past the end
        (lambda b: b[:11] + b"\xff\xff" + b[13:], errors.InvalidRequestError),  # negative trace
        (lambda b: b[:11] + b"\x00\x02ab" + b[13:], errors.InvalidRequestError),  # trace not name:value
        (lambda b: b[:13] + b"\x7f\xff\xff\xff" + b[17:], errors.InvalidRequestError),  # huge count
        (lambda b: b[:13] + b"\xff\xff\xff\xff" + b[17:], errors.InvalidRequestError),  # negative count
        (lambda b: b[:17] + b"\x7f\xff" + b[19:], errors.InvalidRequestError),  # topic length
        (lambda b: b[:17] + b"\x00\x00" + b[19:], errors.InvalidRequestError),  # empty topic
        (lambda b: b[:19] + b"\xff\xfe\xfd\xfc\xfb" + b[24:], errors.InvalidRequestError),  # not UTF-8
        (lambda b: b[:24] + b"\xff\xff\xff\xff" + b[28:], errors.InvalidRequestError),  # negative partition
        (lambda b: b[:28] + b"\xff\xff\xff\xfe" + b[32:], errors.InvalidRequestError),  # epoch -2
        (lambda b: b[:32] + b"\x7f\xff\xff\xff" + b[36:], errors.InvalidRequestError),  # records past end
        (lambda b: b[:32] + b"\xff\xff\xff\xff" + b[36:], errors.InvalidRequestError),  # negative records
        (lambda b: b[:-1], errors.InvalidRequestError),  # truncated records
        (lambda b: b + b"junk", errors.InvalidRequestError),  # trailing bytes
    ],
)
def test_malformed_requests_are_refused_with_a_reason(mutate, error):
    with pytest.raises(error):
        append.decode_request_body(bytes(mutate(_request_body())))


def test_a_partition_named_twice_is_refused():
    request = append.AppendRequest(
        1, Acks.LEADER, 0, (append.PartitionAppend("t", 0, b"a"), append.PartitionAppend("t", 0, b"b"))
    )
    with pytest.raises(errors.InvalidRequestError, match="twice"):
        append.decode_request_body(_body(append.encode_request(request)))


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_garbage_never_raises_anything_but_the_taxonomy(garbage):
    try:
        append.decode_request_body(garbage)
    except errors.TributaryError:
        pass
    try:
        append.decode_response_body(garbage)
    except errors.TributaryError:
        pass
    append.connection_error(garbage)


def test_encoding_refuses_what_the_frame_cannot_say():
    with pytest.raises(ValueError):
        append.encode_request(append.AppendRequest(-1, Acks.LEADER, 0, ()))
    with pytest.raises(ValueError):
        append.encode_request(append.AppendRequest(1, Acks.LEADER, 0, (append.PartitionAppend("", 0, b""),)))
