import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import errors
from services.fetchport import protocol


def _body(frame: bytes) -> bytes:
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    return frame[4:]


@given(
    correlation_id=st.integers(-(2**31), 2**31 - 1),
    topic=st.text(min_size=1, max_size=100),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(-(2**63), 2**63 - 1),
    max_bytes=st.integers(0, 2**31 - 1),
    min_bytes=st.integers(0, 2**31 - 1),
    max_wait_ms=st.integers(0, 2**31 - 1),
)
@settings(max_examples=200, deadline=None)
def test_request_round_trip(correlation_id, topic, partition, offset, max_bytes, min_bytes, max_wait_ms):
    request = protocol.FetchRequest(
        correlation_id, topic, partition, offset, max_bytes, min_bytes, max_wait_ms
    )
    assert protocol.decode_request_body(_body(protocol.encode_request(request))) == request


def test_request_golden_bytes():
    frame = protocol.encode_request(protocol.FetchRequest(7, "ab", 3, 42, 1024, 1, 500))
    expected_body = struct.pack(">hiiiiqih", 0, 7, 500, 1, 1024, 42, 3, 2) + b"ab"
    assert frame == struct.pack(">i", len(expected_body)) + expected_body


@pytest.mark.parametrize("cut", range(31))
def test_truncated_request_is_invalid(cut):
    body = _body(protocol.encode_request(protocol.FetchRequest(1, "topic", 0, 0, 100)))
    with pytest.raises(errors.InvalidRequestError):
        protocol.decode_request_body(body[:cut])


def test_wrong_version_and_negative_fields():
    body = bytearray(_body(protocol.encode_request(protocol.FetchRequest(1, "t", 0, 0, 100))))
    body[0:2] = struct.pack(">h", 9)
    with pytest.raises(errors.UnsupportedVersionError):
        protocol.decode_request_body(bytes(body))
    with pytest.raises(errors.InvalidRequestError):
        protocol.decode_request_body(
            _body(protocol.encode_request(protocol.FetchRequest(1, "t", -1, 0, 100)))
        )


def test_non_utf8_topic():
    body = bytearray(_body(protocol.encode_request(protocol.FetchRequest(1, "tt", 0, 0, 100))))
    body[-2:] = b"\xff\xfe"
    with pytest.raises(errors.InvalidRequestError, match="UTF-8"):
        protocol.decode_request_body(bytes(body))


@pytest.mark.parametrize("size", [0, -5, protocol.MAX_REQUEST_FRAME + 1, 2**31 - 1])
def test_frame_size_bounds(size):
    with pytest.raises(errors.InvalidRequestError):
        protocol.check_request_size(size)


@given(garbage=st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_garbage_request_body_raises_only_taxonomy_errors(garbage):
    try:
        protocol.decode_request_body(garbage)
    except errors.TributaryError:
        pass


@pytest.mark.parametrize("error", [None, errors.OffsetOutOfRangeError("offset 9 > log end 5")])
def test_response_header_round_trip(error):
    frame = (
        protocol.encode_response_header(
            11, high_watermark=5, log_start_offset=1, log_end_offset=5, records_length=3, error=error
        )
        + b"xyz"
    )
    (size,) = struct.unpack(">i", frame[:4])
    assert size == len(frame) - 4
    prefix = protocol.response_prefix_length(frame[4 : 4 + protocol.RESPONSE_FIXED_SIZE])
    header = protocol.decode_response_header(frame[4 : 4 + prefix], size)
    assert (header.correlation_id, header.high_watermark, header.log_start_offset, header.log_end_offset) == (
        11,
        5,
        1,
        5,
    )
    assert header.records_length == 3
    assert frame[4 + prefix :] == b"xyz"
    if error is None:
        assert header.error() is None
    else:
        assert isinstance(header.error(), errors.OffsetOutOfRangeError)
        assert header.error().message == "offset 9 > log end 5"


def test_response_with_inconsistent_records_length_is_rejected():
    frame = protocol.encode_response_header(1, records_length=10)
    prefix = protocol.response_prefix_length(frame[4 : 4 + protocol.RESPONSE_FIXED_SIZE])
    with pytest.raises(errors.CorruptRecordError):
        protocol.decode_response_header(frame[4 : 4 + prefix], 5)
