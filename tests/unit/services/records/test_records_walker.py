"""iter_batches: zero-copy walking of concatenated batches."""

from __future__ import annotations

import pytest

from services.errors import CorruptRecordError
from services.records import Compression, RecordBatchBuilder, iter_batches

from .records_oracles import rewrite

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")


def _batch(base_offset: int, count: int, codec: Compression = Compression.NONE) -> bytes:
    builder = RecordBatchBuilder(compression=codec, base_offset=base_offset)
    for i in range(count):
        builder.append(b"v%d" % (base_offset + i), timestamp=base_offset + i)
    return builder.build()


BATCHES = [_batch(0, 3), _batch(3, 1, Compression.GZIP), _batch(4, 5, Compression.SNAPPY), _batch(9, 2)]
LOG = b"".join(BATCHES)


def test_walks_every_batch_in_order():
    views = list(iter_batches(LOG))
    assert [bytes(v.buffer) for v in views] == BATCHES
    assert [v.base_offset for v in views] == [0, 3, 4, 9]
    assert [r.offset for v in views for r in v] == list(range(11))
    for view in views:
        view.validate(deep=True)


def test_does_not_copy():
    buffer = bytearray(LOG)
    views = list(iter_batches(buffer))
    assert all(v.buffer.obj is buffer for v in views)
    del views  # release the exports so the bytearray may be resized again
    buffer.extend(b"")


def test_accepts_memoryview_slices():
    view = memoryview(LOG)[len(BATCHES[0]) :]
    assert [v.base_offset for v in iter_batches(view)] == [3, 4, 9]


def test_empty_buffer_yields_nothing():
    assert list(iter_batches(b"")) == []
    assert list(iter_batches(b"", allow_partial_tail=True)) == []


@pytest.mark.parametrize("tail", [1, 11, 12, 60, 61, len(BATCHES[3]) - 1])
def test_partial_tail(tail):
    data = LOG[: len(LOG) - len(BATCHES[3]) + tail]
    with pytest.raises(CorruptRecordError, match="truncated batch at byte"):
        list(iter_batches(data))
    assert [v.base_offset for v in iter_batches(data, allow_partial_tail=True)] == [0, 3, 4]


def test_partial_tail_as_a_fetch_response_ends():
    # A fetch capped at max_bytes typically ends mid-batch.
    for cap in range(len(LOG)):
        complete = list(iter_batches(LOG[:cap], allow_partial_tail=True))
        assert sum(v.size_in_bytes for v in complete) <= cap
        assert [bytes(v.buffer) for v in complete] == BATCHES[: len(complete)]


@pytest.mark.parametrize("batch_length", [-5, 0, 48])
def test_bad_length_in_the_middle_is_corrupt_even_with_partial_tail_allowed(batch_length):
    second = rewrite(BATCHES[1], ">i", 8, batch_length, fix_crc=False)
    data = BATCHES[0] + second + BATCHES[2]
    walker = iter_batches(data, allow_partial_tail=True)
    assert next(walker).base_offset == 0
    with pytest.raises(CorruptRecordError, match="below the minimum"):
        next(walker)


def test_crc_is_left_to_the_caller():
    corrupted = bytearray(LOG)
    corrupted[len(BATCHES[0]) + 40] ^= 0xFF  # inside batch 2's CRC coverage
    views = list(iter_batches(corrupted))
    assert [v.is_valid() for v in views] == [True, False, True, True]
