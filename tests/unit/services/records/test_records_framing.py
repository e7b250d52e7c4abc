"""validate_framing: the broker's cheap record-count check."""

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.errors import CorruptRecordError
from services.records import Compression, RecordBatchBuilder, RecordBatchView, record

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


@pytest.mark.parametrize("compression", list(Compression), ids=lambda c: c.name.lower())
def test_well_formed_batches_pass(compression):
    view = RecordBatchView(bytes(_batch([b"a", None, b"x" * 300], compression)))
    view.validate()
    view.validate_framing()


@pytest.mark.parametrize("claimed", [0, 1, 2, 4])
def test_record_count_disagreeing_with_bytes_is_corrupt(claimed):
    batch = _batch([b"a", b"b", b"c"])
    struct.pack_into(">i", batch, RECORD_COUNT_OFFSET, claimed)
    struct.pack_into(">i", batch, 23, max(claimed - 1, 0))  # keep lastOffsetDelta consistent
    view = RecordBatchView(bytes(_recrc(batch)))
    view.validate()  # the header alone looks fine
    with pytest.raises(CorruptRecordError):
        view.validate_framing()


def test_record_length_overrunning_the_payload_is_corrupt():
    batch = _batch([b"abc"])
    batch[61] = 0x7E  # first record's length prefix: 63 bytes, more than there are
    view = RecordBatchView(bytes(_recrc(batch)))
    with pytest.raises(CorruptRecordError):
        view.validate_framing()


@given(st.lists(st.binary(max_size=300) | st.none(), min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_count_matches_the_decoder(values):
    view = RecordBatchView(bytes(_batch(values)))
    assert record.count_framed_records(view.buffer[61:]) == len(list(view.records())) == len(values)


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
def test_garbage_raises_only_corrupt(data):
    try:
        record.count_framed_records(data)
    except CorruptRecordError:
        pass
