"""The retention predicates and the shared selection routine, on plain stand-in segments."""

from __future__ import annotations

from dataclasses import dataclass

from storage_node.log.retention import (
    deletable_segments,
    log_start_offset_breached,
    retention_ms_breached,
    retention_size_breached,
)


@dataclass
class FakeSegment:
    base_offset: int
    size: int
    largest_timestamp: int


SEGMENTS = [
    FakeSegment(0, 100, 1000),
    FakeSegment(10, 100, 2000),
    FakeSegment(20, 100, 1500),
    FakeSegment(30, 100, 4000),
    FakeSegment(40, 50, 5000),
]


def _bases(segments):
    return [s.base_offset for s in segments]


def test_time_retention_deletes_the_oldest_expired_run_only():
    # Segment 20 is expired too, but segment 10 before it is not: retention never makes holes.
    should_delete = retention_ms_breached(now_ms=2500, retention_ms=999)
    assert _bases(deletable_segments(SEGMENTS, should_delete, high_watermark=100)) == [0]
    should_delete = retention_ms_breached(now_ms=10_000, retention_ms=0)
    assert _bases(deletable_segments(SEGMENTS, should_delete, high_watermark=100)) == [0, 10, 20, 30]


def test_infinite_time_retention_deletes_nothing():
    should_delete = retention_ms_breached(now_ms=10**15, retention_ms=-1)
    assert deletable_segments(SEGMENTS, should_delete, high_watermark=100) == []


def _select(should_delete, high_watermark=10**9):
    return _bases(deletable_segments(SEGMENTS, should_delete, high_watermark=high_watermark))


def test_size_retention_deletes_whole_segments_within_the_excess():
    total = sum(s.size for s in SEGMENTS)  # 450
    assert _select(retention_size_breached(total, 250)) == [0, 10]
    assert _select(retention_size_breached(total, 251)) == [0]
    assert _select(retention_size_breached(total, -1)) == []
    assert _select(retention_size_breached(total, 0)) == [0, 10, 20, 30]


def test_log_start_retention_deletes_segments_entirely_below_it():
    assert _select(log_start_offset_breached(20)) == [0, 10]
    assert _select(log_start_offset_breached(19)) == [0]
    assert _select(log_start_offset_breached(10**9)) == [0, 10, 20, 30]


def test_never_the_active_segment_nor_uncommitted_data():
    everything = lambda segment, next_segment: True  # noqa: E731
    assert _bases(deletable_segments(SEGMENTS, everything, high_watermark=10**9)) == [0, 10, 20, 30]
    assert _bases(deletable_segments(SEGMENTS, everything, high_watermark=25)) == [0, 10]
    assert deletable_segments(SEGMENTS[-1:], everything, high_watermark=10**9) == []
    assert deletable_segments([], everything, high_watermark=10**9) == []
