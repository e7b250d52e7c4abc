"""Reading one offset range (the executor side of batch and streaming reads) against a fake consumer."""

import logging

import pyarrow as pa
import pytest

from gateway.client.errors import OffsetOutOfRangeError
from gateway.client.structs import ConsumerRecord, TopicPartition
from spark_jobs import range_reader
from spark_jobs.offsets import OffsetRange
from spark_jobs.range_reader import DataLossError, RangeReadSettings, ReadTimeoutError, read_range
from spark_jobs.schema import ArrowBatchBuilder

TP = TopicPartition("t", 0)


class FakeConsumer:
    """A partition whose log holds ``[log_start, log_end)``; polls return ``chunk`` records at a time."""

    def __init__(self, log_start: int, log_end: int, chunk: int = 4, **_settings) -> None:
        self.log_start, self.log_end, self.chunk = log_start, log_end, chunk
        self._position = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass

    def assign(self, tps):
        assert tps == [TP]

    def seek(self, tp, offset):
        self._position = offset

    def position(self, tp):
        return self._position

    def poll(self, timeout_ms=0):
        if self._position < self.log_start or self._position > self.log_end:
            raise OffsetOutOfRangeError(f"offset {self._position} out of range")
        until = min(self._position + self.chunk, self.log_end)
        records = [
            ConsumerRecord("t", 0, o, 1000 + o, 0, b"k", f"v{o}".encode(), (("h", b"x"),))
            for o in range(self._position, until)
        ]
        self._position = until
        return {TP: records} if records else {}

    def poll_arrow(self, timeout_ms=0, include_headers=True):
        """``poll``'s records through the row path to Arrow (the reference for the SDK's own)."""
        builder = ArrowBatchBuilder("t", 0, include_headers=include_headers)
        builder.add(self.poll(timeout_ms).get(TP, []))
        return pa.Table.from_batches([builder.flush()])

    def beginning_offsets(self, tps):
        return {TP: self.log_start}

    def end_offsets(self, tps):
        return {TP: self.log_end}


def read(monkeypatch, consumer, rng, **settings):
    monkeypatch.setattr(range_reader, "Consumer", lambda **kwargs: consumer)
    batches = list(read_range(rng, RangeReadSettings(servers="h:1", **settings)))
    return [o for batch in batches for o in batch.column("offset").to_pylist()]


def test_reads_exactly_the_range_even_when_polls_overshoot(monkeypatch):
    assert read(monkeypatch, FakeConsumer(0, 100), OffsetRange("t", 0, 3, 10)) == list(range(3, 10))


def test_columns_carry_the_record_fields(monkeypatch):
    monkeypatch.setattr(range_reader, "Consumer", lambda **kwargs: FakeConsumer(0, 10))
    settings = RangeReadSettings(servers="h:1", include_headers=True)
    batch = next(read_range(OffsetRange("t", 0, 0, 2), settings))
    row = batch.to_pylist()[1]
    assert (row["topic"], row["partition"], row["offset"], row["value"]) == ("t", 0, 1, b"v1")
    assert row["headers"] == [{"key": "h", "value": b"x"}]
    assert row["timestamp"].timestamp() == 1.001


def test_deleted_records_fail_the_task_by_default(monkeypatch):
    lost = "offsets 0 to 49 \\(50 records\\) of t-0 were deleted .* log now starts at 50"
    with pytest.raises(DataLossError, match=lost):
        read(monkeypatch, FakeConsumer(50, 100), OffsetRange("t", 0, 0, 60))


def test_deleted_records_are_skipped_with_a_warning(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="spark_jobs.source"):
        offsets = read(
            monkeypatch, FakeConsumer(50, 100), OffsetRange("t", 0, 0, 60), fail_on_data_loss=False
        )
    assert offsets == list(range(50, 60))
    assert "failOnDataLoss=false: skipping offsets 0 to 49 (50 records) of t-0" in caplog.text


def test_a_range_deleted_entirely_reads_nothing(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="spark_jobs.source"):
        offsets = read(
            monkeypatch, FakeConsumer(80, 100), OffsetRange("t", 0, 0, 60), fail_on_data_loss=False
        )
    assert offsets == []
    assert "skipping offsets 0 to 59 (60 records)" in caplog.text


def test_a_truncated_log_is_data_loss(monkeypatch):
    with pytest.raises(
        DataLossError, match=r"offsets 70 to 89 .* no longer in the log, which now ends at 40"
    ):
        read(monkeypatch, FakeConsumer(0, 40), OffsetRange("t", 0, 70, 90))


def test_records_that_never_come_time_out(monkeypatch):
    with pytest.raises(ReadTimeoutError, match="no record after offset 10 within 1 ms"):
        read(monkeypatch, FakeConsumer(0, 10), OffsetRange("t", 0, 0, 20), poll_timeout_ms=1)
