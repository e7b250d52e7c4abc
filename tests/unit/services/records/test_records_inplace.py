"""The broker's in-place header rewrites."""

from __future__ import annotations

import pytest

from services.errors import CorruptRecordError
from services.records import (
    Compression,
    RecordBatchBuilder,
    RecordBatchView,
    TimestampType,
    iter_batches,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
)

from .records_oracles import rewrite

# Every test here runs against the pure-Python codec loops and the C accelerator.
pytestmark = pytest.mark.usefixtures("codec_backend")

CODECS = [pytest.param(c, id=c.name.lower()) for c in Compression]


def _batch(codec: Compression = Compression.NONE, **kwargs) -> bytearray:
    builder = RecordBatchBuilder(compression=codec, **kwargs)
    for i in range(4):
        builder.append(b"v%d" % i, timestamp=1000 + 10 * i, key=b"k")
    return bytearray(builder.build())


@pytest.mark.parametrize("codec", CODECS)
def test_set_base_offset_keeps_the_crc(codec):
    buf = _batch(codec)
    crc = RecordBatchView(buf).crc
    set_base_offset(buf, 2**40 + 7)
    view = RecordBatchView(buf)
    assert view.crc == crc
    view.validate(deep=True)
    assert view.base_offset == 2**40 + 7
    assert [r.offset for r in view] == [2**40 + 7 + i for i in range(4)]


@pytest.mark.parametrize("codec", CODECS)
def test_set_partition_leader_epoch_keeps_the_crc(codec):
    buf = _batch(codec)
    set_partition_leader_epoch(buf, 12)
    view = RecordBatchView(buf)
    view.validate(deep=True)
    assert view.partition_leader_epoch == 12


@pytest.mark.parametrize("codec", CODECS)
def test_set_log_append_time(codec):
    buf = _batch(codec, is_transactional=True, producer_id=1, producer_epoch=0, base_sequence=0)
    before = RecordBatchView(buf)
    assert before.timestamp_type is TimestampType.CREATE_TIME
    set_log_append_time(buf, 1_700_000_000_123)
    view = RecordBatchView(buf)
    view.validate(deep=True)
    assert view.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert view.max_timestamp == 1_700_000_000_123
    assert view.base_timestamp == 1000  # the create time of the first record stays
    assert [r.timestamp for r in view] == [1_700_000_000_123] * 4
    # The other attribute bits survive.
    assert view.compression is codec and view.is_transactional


def test_set_log_append_time_twice_and_no_op():
    buf = _batch()
    set_log_append_time(buf, 5000)
    first = bytes(buf)
    set_log_append_time(buf, 5000)
    assert bytes(buf) == first
    set_log_append_time(buf, 6000)
    RecordBatchView(buf).validate()
    assert [r.timestamp for r in RecordBatchView(buf)] == [6000] * 4


def test_writers_act_on_the_first_batch_of_a_longer_writable_view():
    log = bytearray(_batch() + _batch())
    second = memoryview(log)[len(log) // 2 :]
    set_base_offset(second, 100)
    set_partition_leader_epoch(second, 3)
    set_log_append_time(second, 9999)
    first, other = iter_batches(log)
    first.validate()
    other.validate(deep=True)
    assert (first.base_offset, other.base_offset) == (0, 100)
    assert (first.partition_leader_epoch, other.partition_leader_epoch) == (-1, 3)
    assert first.timestamp_type is TimestampType.CREATE_TIME
    assert [r.timestamp for r in other] == [9999] * 4


def test_read_only_buffer_is_rejected():
    data = bytes(_batch())
    for write in (set_base_offset, set_partition_leader_epoch, set_log_append_time):
        with pytest.raises(TypeError):
            write(data, 1)
        with pytest.raises(TypeError):
            write(memoryview(data), 1)


@pytest.mark.parametrize(
    ("write", "value"),
    [(set_base_offset, 2**63), (set_partition_leader_epoch, 2**31), (set_log_append_time, -(2**63) - 1)],
)
def test_out_of_range_values(write, value):
    buf = _batch()
    with pytest.raises(ValueError):
        write(buf, value)
    RecordBatchView(buf).validate()


def test_truncated_or_foreign_batches_are_corrupt():
    buf = _batch()
    with pytest.raises(CorruptRecordError):
        set_base_offset(buf[:-1], 5)
    with pytest.raises(CorruptRecordError):
        set_log_append_time(bytearray(60), 5)
    old_magic = bytearray(rewrite(bytes(buf), ">b", 16, 1))
    with pytest.raises(CorruptRecordError, match="magic"):
        set_log_append_time(old_magic, 5)
    with pytest.raises(CorruptRecordError, match="magic"):
        set_partition_leader_epoch(old_magic, 5)


def test_set_producer_state_numbers_a_batch_and_keeps_it_valid():
    from services.records import RecordBatchBuilder, iter_batches
    from services.records.inplace import set_producer_state

    builder = RecordBatchBuilder()
    for i in range(3):
        builder.append(b"v%d" % i, timestamp=1_000 + i, key=b"k")
    data = bytearray(builder.build())
    set_producer_state(data, 7, 2, 40, transactional=True)
    (batch,) = iter_batches(bytes(data))
    batch.validate(deep=True)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 2, 40)
    assert batch.is_transactional and [r.value for r in batch.records()] == [b"v0", b"v1", b"v2"]
    set_producer_state(data, 7, 3, 0)
    (batch,) = iter_batches(bytes(data))
    batch.validate()
    assert (batch.producer_epoch, batch.base_sequence, batch.is_transactional) == (3, 0, False)
    with pytest.raises(TypeError):
        set_producer_state(bytes(data), 7, 3, 0)
