"""Bad bytes: every failure is a CorruptRecordError, raised quickly, never another exception."""

from __future__ import annotations

import struct
import time

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.errors import CorruptRecordError
from services.records import Compression, RecordBatchBuilder, RecordBatchView, iter_batches

from .records_oracles import golden_batch, golden_record, rewrite, with_payload

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

CRC_COVERED_START = 21


def _small_batch(codec: Compression = Compression.NONE) -> bytes:
    builder = RecordBatchBuilder(compression=codec, base_offset=10)
    builder.append(b"value-0", timestamp=1000, key=b"k0", headers=[("h", b"x")])
    builder.append(None, timestamp=1001, key=b"k1")
    builder.append(b"", timestamp=999)
    return builder.build()


def _check(data: bytes, *, deep: bool = True) -> None:
    """Everything a consumer or the broker might do with untrusted bytes."""
    for view in iter_batches(data):
        view.validate(deep=deep)
        list(view)


@pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
def test_any_flipped_byte_in_crc_coverage_is_detected(codec):
    batch = _small_batch(codec)
    for position in range(CRC_COVERED_START, len(batch)):
        for mask in (0x01, 0x80, 0xFF):
            corrupted = bytearray(batch)
            corrupted[position] ^= mask
            view = RecordBatchView(corrupted)
            with pytest.raises(CorruptRecordError):
                view.validate()
            assert not view.is_valid()


def test_flipped_crc_and_magic_bytes_are_detected():
    batch = _small_batch()
    for position in range(16, CRC_COVERED_START):  # magic and crc
        corrupted = bytearray(batch)
        corrupted[position] ^= 0x01
        with pytest.raises(CorruptRecordError):
            RecordBatchView(corrupted).validate()


def test_fields_before_the_crc_are_not_covered():
    # By design (see format.py): the broker rewrites these without recomputing the CRC.
    batch = _small_batch()
    for position in list(range(8)) + list(range(12, 16)):  # baseOffset, partitionLeaderEpoch
        corrupted = bytearray(batch)
        corrupted[position] ^= 0xFF
        RecordBatchView(corrupted).validate(deep=True)


@pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
def test_truncation_at_every_position(codec):
    batch = _small_batch(codec)
    for cut in range(1, len(batch)):
        truncated = batch[:cut]
        with pytest.raises(CorruptRecordError):
            RecordBatchView(truncated)
        with pytest.raises(CorruptRecordError):
            list(iter_batches(truncated))
        assert list(iter_batches(truncated, allow_partial_tail=True)) == []
        with pytest.raises(CorruptRecordError):
            list(iter_batches(batch + truncated))
        assert len(list(iter_batches(batch + truncated, allow_partial_tail=True))) == 1


@pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
def test_records_truncated_inside_a_consistent_header(codec):
    """The header's length and CRC agree, but the record bytes stop short."""
    batch = _small_batch(codec)
    payload = batch[61:]
    for cut in range(len(payload)):
        data = with_payload(batch, payload[:cut])
        view = RecordBatchView(data)
        with pytest.raises(CorruptRecordError):
            view.validate(deep=True)
        with pytest.raises(CorruptRecordError):
            list(view)


# --- absurd lengths, each must fail fast -------------------------------------------------------


def _fails_fast(data: bytes, *, deep: bool = True) -> None:
    started = time.perf_counter()
    with pytest.raises(CorruptRecordError):
        _check(data, deep=deep)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("batch_length", [2**31 - 1, -1, -(2**31), 0, 48])
def test_absurd_batch_length(batch_length):
    _fails_fast(rewrite(_small_batch(), ">i", 8, batch_length, fix_crc=False))


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(b"\xfe\xff\xff\xff\x0f" + b"\x00" * 10, id="record-length-int32-max"),
        pytest.param(b"\xff\xff\xff\xff\x0f" + b"\x00" * 10, id="record-length-int32-min"),
        pytest.param(b"\x80\x80\x80\x80\x80\x80\x01" + b"\x00" * 10, id="record-length-overlong"),
        pytest.param(b"\x0c\x00\x00\x00\xfe\xff\xff\xff\x07\x00\x00\x00", id="key-length-huge"),
        pytest.param(b"\x0c\x00\x00\x00\x02\x00\xfe\xff\xff\xff\x07\x00", id="value-length-huge"),
        pytest.param(b"\x0c\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00", id="key-length-negative"),
        pytest.param(b"\x0e\x00\x00\x00\x00\x00\xfe\xff\xff\xff\x07\x00\x00\x00", id="header-count-huge"),
        pytest.param(b"\x0e\x00\x00\x00\x00\x00\x01\xfe\xff\xff\xff\x07\x00\x00", id="header-key-huge"),
        pytest.param(b"\x0a\x00\x00\x00\x00\x00\x02\x00\xfe\xff\xff\x07", id="header-value-huge"),
        pytest.param(b"\x0e\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x00", id="timestamp-overlong"),
    ],
)
def test_absurd_lengths_inside_records(record):
    _fails_fast(golden_batch(record + b"\x00" * 20, record_count=1))


@pytest.mark.parametrize("codec", [pytest.param(c, id=c.name.lower()) for c in Compression])
def test_absurd_record_count(codec):
    batch = _small_batch(codec)
    for count in (2**31 - 1, 1_000_000, 4):
        _fails_fast(rewrite(rewrite(batch, ">i", 23, 2**31 - 2), ">i", 57, count))


def test_decompression_bomb_is_refused():
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"\x00" * (65 * 1024 * 1024))
    data = golden_batch(bomb, attributes=int(Compression.ZSTD), record_count=1)
    view = RecordBatchView(data)
    view.validate()  # a 10 KB batch with a valid CRC ...
    with pytest.raises(CorruptRecordError, match="exceeds"):
        view.validate(deep=True)  # ... that would decompress to 65 MiB


# --- fuzz --------------------------------------------------------------------------------------

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_arbitrary_bytes(data):
    for call in (
        lambda: RecordBatchView(data).validate(deep=True),
        lambda: list(RecordBatchView(data)),
        lambda: list(iter_batches(data)),
        lambda: list(iter_batches(data, allow_partial_tail=True)),
    ):
        try:
            call()
        except CorruptRecordError:
            pass


@FUZZ
@given(payload=st.binary(max_size=300), attributes=st.integers(0, 0x3F), count=st.integers(-2, 40))
def test_fuzz_payload_behind_a_valid_header(payload, attributes, count):
    """Random record bytes under a header whose length and CRC are right: only the records can fail."""
    data = golden_batch(payload, attributes=attributes, record_count=count, last_offset_delta=max(count, 0))
    try:
        _check(data)
    except CorruptRecordError:
        pass


@FUZZ
@given(
    codec=st.sampled_from(Compression),
    mutations=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_fuzz_mutated_valid_batches(codec, mutations):
    """Flip bytes in a real batch's records (compressed or not) and fix the CRC up."""
    batch = _small_batch(codec)
    payload = bytearray(batch[61:])
    for position, mask in mutations:
        payload[position % len(payload)] ^= mask
    try:
        _check(with_payload(batch, bytes(payload)))
    except CorruptRecordError:
        pass


@FUZZ
@given(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=12)), max_size=6))
def test_fuzz_structured_records(fields):
    """Records built from random varints and bytes: deeper than random bytes usually get."""
    payload = b"".join(golden_record(i, delta, None, blob) for i, (delta, blob) in enumerate(fields))
    payload += b"".join(struct.pack(">i", delta) for delta, _ in fields)
    try:
        _check(golden_batch(payload, record_count=len(fields), last_offset_delta=max(len(fields) - 1, 0)))
    except CorruptRecordError:
        pass
