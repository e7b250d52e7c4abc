"""Zigzag varints: round trips, Kafka's bounds, and malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.util import decode_varint as kafka_decode_varint
from kafka.record.util import encode_varint as kafka_encode_varint

from services.errors import CorruptRecordError
from services.records.varint import (
    SMALL_VARINTS,
    ZIGZAG_1,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
    size_of_varint,
)

from .records_oracles import zigzag

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-64, b"\x7f"),
        (63, b"\x7e"),
        (64, b"\x80\x01"),
        (200, b"\x90\x03"),
        (8191, b"\xfe\x7f"),
        (8192, b"\x80\x80\x01"),
        (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
        (-(2**31), b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_known_encodings(value, encoded):
    assert encode_varint(value) == encoded
    assert decode_varint(encoded) == (value, len(encoded))


@settings(max_examples=200, deadline=None)
@given(INT32)
def test_varint_round_trip_matches_kafka_python(value):
    encoded = encode_varint(value)
    oracle = bytearray()
    kafka_encode_varint(value, oracle.append)
    assert encoded == bytes(oracle) == zigzag(value)
    assert decode_varint(encoded) == (value, len(encoded))
    assert size_of_varint(value) == len(encoded)


@settings(max_examples=200, deadline=None)
@given(INT64, st.binary(max_size=4))
def test_varlong_round_trip_with_trailing_bytes(value, trailing):
    encoded = encode_varlong(value)
    assert encoded == zigzag(value)
    assert decode_varlong(encoded + trailing) == (value, len(encoded))
    assert kafka_decode_varint(bytearray(encoded + trailing), 0) == (value, len(encoded))


def test_decode_at_position_and_end():
    buf = b"\xff" + encode_varint(300) + b"\x00"
    assert decode_varint(buf, 1) == (300, 3)
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_varint(buf, 1, 2)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1])
def test_encode_varint_rejects_out_of_range(value):
    with pytest.raises(ValueError):
        encode_varint(value)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_encode_varlong_rejects_out_of_range(value):
    with pytest.raises(ValueError):
        encode_varlong(value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated"),
        (b"\x80", "truncated"),
        (b"\xff\xff\xff\xff", "truncated"),
        (b"\x80\x80\x80\x80\x80\x00", "longer than 5"),  # overlong for an int32
        (b"\xff\xff\xff\xff\x1f", "out of range"),  # fifth byte carries bit 32
    ],
)
def test_decode_varint_rejects_malformed(data, message):
    with pytest.raises(CorruptRecordError, match=message):
        decode_varint(data)


def test_decode_varlong_rejects_overlong_and_out_of_range():
    with pytest.raises(CorruptRecordError, match="longer than 10"):
        decode_varlong(b"\x80" * 10 + b"\x00")
    with pytest.raises(CorruptRecordError, match="out of range"):
        decode_varlong(b"\xff" * 9 + b"\x03")
    assert decode_varlong(b"\xff" * 9 + b"\x01") == (-(2**63), 10)


def test_fast_tables_agree_with_the_decoder():
    for b, value in enumerate(ZIGZAG_1):
        assert decode_varint(bytes([b])) == (value, 1)
    for n in (0, 1, 63, 64, 4095, len(SMALL_VARINTS) - 1):
        assert SMALL_VARINTS[n] == zigzag(n)
