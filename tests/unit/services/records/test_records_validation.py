"""validate_records: the broker's check of every record of a producer's batch."""

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.errors import CorruptRecordError
from services.records import Compression, RecordBatchBuilder, RecordBatchView, record

from .records_oracles import golden_batch, golden_record, nullable, zigzag

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

RECORD_COUNT_OFFSET = 57
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21


def _batch(values, compression=Compression.NONE):
    builder = RecordBatchBuilder(compression=compression)
    for i, value in enumerate(values):
        builder.append(value, timestamp=1000 + i, key=b"k%d" % i, headers=(("h", b"v"),))
    return bytearray(builder.build())


def _recrc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(bytes(batch[ATTRIBUTES_OFFSET:])))
    return batch


def _view(payload: bytes, count: int, compression=Compression.NONE) -> RecordBatchView:
    from services.records.compression import compress

    return RecordBatchView(
        golden_batch(
            compress(compression, payload),
            attributes=int(compression),
            last_offset_delta=max(count - 1, 0),
            record_count=count,
        )
    )


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name.lower())
def test_well_formed_batches_pass(compression):
    view = RecordBatchView(bytes(_batch([b"a", None, b"x" * 300], compression)))
    view.validate()
    view.validate_records()


@pytest.mark.parametrize("claimed", [0, 1, 2, 4])
def test_record_count_disagreeing_with_bytes_is_corrupt(claimed):
    batch = _batch([b"a", b"b", b"c"])
    struct.pack_into(">i", batch, RECORD_COUNT_OFFSET, claimed)
    struct.pack_into(">i", batch, 23, max(claimed - 1, 0))  # keep lastOffsetDelta consistent
    view = RecordBatchView(bytes(_recrc(batch)))
    view.validate()  # the header alone looks fine
    with pytest.raises(CorruptRecordError):
        view.validate_records()


def test_record_length_overrunning_the_payload_is_corrupt():
    batch = _batch([b"abc"])
    batch[61] = 0x7E  # first record's length prefix: 63 bytes, more than there are
    view = RecordBatchView(bytes(_recrc(batch)))
    with pytest.raises(CorruptRecordError):
        view.validate_records()


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name.lower())
@pytest.mark.parametrize(
    "bad",
    [
        # The reproductions: each one's framing is right, so a length walk passed it.
        golden_record(0, 0, b"k", b"v")[:3] + zigzag(50) + golden_record(0, 0, b"k", b"v")[4:],
        golden_record(0, 0, b"k", b"v")[:-1] + zigzag(10**6),
        golden_record(0, 0, b"k0", b"v") + golden_record(0, 0, b"k1", b"v"),
    ],
    ids=["key-past-record", "a-million-headers", "duplicate-offset-delta"],
)
def test_records_whose_framing_is_right_are_still_refused(compression, bad):
    count = 2 if bad.count(b"k") == 2 else 1
    view = _view(bad, count, compression)
    view.validate()
    with pytest.raises(CorruptRecordError):
        view.validate_records()
    with pytest.raises(CorruptRecordError):
        list(view.records())  # what every consumer met before: the reason for the check


def test_compressed_batches_are_refused_past_the_bound_before_it_is_allocated():
    payload = b"".join(golden_record(i, 0, None, b"\x00" * 1000) for i in range(2000))
    view = _view(payload, 2000, Compression.ZSTD)
    view.validate_records()  # 2 MB decompressed: within the default bound
    with pytest.raises(CorruptRecordError, match="exceeds 1000000 bytes"):
        view.validate_records(max_decompressed_size=1_000_000)


@given(st.lists(st.binary(max_size=300) | st.none(), min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_valid_batches_pass_and_decode(values):
    view = RecordBatchView(bytes(_batch(values)))
    view.validate_records()
    assert [r.value for r in view.records()] == values


@given(st.binary(max_size=200), st.integers(-1, 30))
@settings(max_examples=300, deadline=None)
def test_garbage_raises_only_corrupt(data, count):
    try:
        record.validate_records(data, count)
    except CorruptRecordError:
        pass


def test_a_null_value_length_in_two_bytes_is_refused_as_the_decoder_refuses_it():
    body = b"\x00" + zigzag(0) + zigzag(0) + nullable(None) + b"\x81\x00" + zigzag(0)
    data = zigzag(len(body)) + body
    with pytest.raises(CorruptRecordError):
        record.validate_records(data, 1)
    with pytest.raises(CorruptRecordError):
        record.decode_records(data, 1, 0, 0, None, 0)
