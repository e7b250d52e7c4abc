"""Offset-range planning: resolving bounds, batch ranges, minPartitions splits, maxOffsetsPerTrigger."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.client.structs import TopicPartition
from spark_jobs.offsets import (
    EARLIEST,
    LATEST,
    Earliest,
    GlobalTimestamp,
    Latest,
    OffsetRange,
    PlanningError,
    SpecificOffsets,
    SpecificTimestamps,
    offsets_from_json,
    offsets_to_json,
    plan_batch,
    plan_stream_end,
    plan_stream_ranges,
    rate_limit,
    resolve_bound,
    split_for_min_partitions,
    timestamps_needed,
)

A0, A1, A2 = (TopicPartition("a", p) for p in range(3))
TPS = [A0, A1, A2]
EARLY = {A0: 10, A1: 0, A2: 5}
LATE = {A0: 100, A1: 50, A2: 5}


def resolve(bound, *, default=EARLIEST, by_timestamp=None, no_match="latest"):
    return resolve_bound(
        bound,
        TPS,
        earliest=EARLY,
        latest=LATE,
        by_timestamp=by_timestamp or {},
        default=default,
        option="startingOffsets",
        no_match=no_match,
    )


# ---- resolving bounds -------------------------------------------------------------------------


def test_earliest_and_latest():
    assert resolve(Earliest()) == EARLY
    assert resolve(Latest()) == LATE


def test_specific_offsets_with_sentinels_and_defaults():
    bound = SpecificOffsets({A0: 42, A1: LATEST})
    assert resolve(bound, default=EARLIEST) == {A0: 42, A1: 50, A2: 5}
    assert resolve(SpecificOffsets({A2: EARLIEST}), default=LATEST) == {A0: 100, A1: 50, A2: 5}


def test_timestamps_resolve_through_the_lookups():
    bound = GlobalTimestamp(1000)
    assert timestamps_needed(bound, TPS) == {A0: 1000, A1: 1000, A2: 1000}
    assert resolve(bound, by_timestamp={A0: 20, A1: 7, A2: None}) == {A0: 20, A1: 7, A2: 5}


def test_timestamp_without_a_record_fails_with_the_error_strategy():
    with pytest.raises(PlanningError, match="a-2 has no record at or after"):
        resolve(GlobalTimestamp(1000), by_timestamp={A0: 20, A1: 7, A2: None}, no_match="error")


def test_specific_timestamps_only_for_listed_partitions():
    bound = SpecificTimestamps({A1: 500})
    assert timestamps_needed(bound, TPS) == {A1: 500}
    assert resolve(bound, default=EARLIEST, by_timestamp={A1: 30}) == {A0: 10, A1: 30, A2: 5}


# ---- batch ------------------------------------------------------------------------------------


def test_batch_ranges_skip_empty_partitions():
    assert plan_batch(EARLY, LATE, LATE) == [OffsetRange("a", 0, 10, 100), OffsetRange("a", 1, 0, 50)]


@pytest.mark.parametrize(
    "start, end, fragment",
    [
        pytest.param({A0: 101}, {A0: 101}, "startingOffsets: offset 101 of a-0 is beyond", id="start-beyond"),
        pytest.param({A0: 0}, {A0: 101}, "endingOffsets: offset 101 of a-0 is beyond", id="end-beyond"),
        pytest.param(
            {A0: 60}, {A0: 50}, "starting offset 60 is after the ending offset 50", id="start-after-end"
        ),
    ],
)
def test_unreadable_batches_are_explained(start, end, fragment):
    with pytest.raises(PlanningError, match=fragment):
        plan_batch(start, end, LATE)


def test_a_start_below_the_log_start_is_left_to_the_reader():
    # Retention may delete records between planning and reading: failOnDataLoss is the reader's call.
    assert plan_batch({A0: 0}, {A0: 100}, LATE) == [OffsetRange("a", 0, 0, 100)]


# ---- minPartitions ----------------------------------------------------------------------------


def test_min_partitions_splits_in_proportion_to_size():
    ranges = [OffsetRange("a", 0, 0, 300), OffsetRange("a", 1, 0, 100)]
    pieces = split_for_min_partitions(ranges, 4)
    assert pieces == [
        OffsetRange("a", 0, 0, 100),
        OffsetRange("a", 0, 100, 200),
        OffsetRange("a", 0, 200, 300),
        OffsetRange("a", 1, 0, 100),
    ]


def test_min_partitions_reaches_the_count_where_per_range_rounding_falls_short():
    # Spark's Kafka source rounds each range on its own: sizes 294/353/353 with 7 give 2+2+2 = 6.
    ranges = [OffsetRange("a", 0, 0, 294), OffsetRange("a", 1, 0, 353), OffsetRange("a", 2, 0, 353)]
    assert len(split_for_min_partitions(ranges, 7)) == 7


def test_min_partitions_below_the_range_count_changes_nothing():
    ranges = [OffsetRange("a", 0, 0, 10), OffsetRange("a", 1, 0, 10)]
    assert split_for_min_partitions(ranges, 2) == ranges
    assert split_for_min_partitions(ranges, None) == ranges


def test_a_range_never_splits_below_one_record():
    assert split_for_min_partitions([OffsetRange("a", 0, 5, 8)], 10) == [
        OffsetRange("a", 0, 5, 6),
        OffsetRange("a", 0, 6, 7),
        OffsetRange("a", 0, 7, 8),
    ]


@given(sizes=st.lists(st.integers(1, 10_000), min_size=1, max_size=8), wanted=st.integers(1, 64))
def test_splits_cover_every_range_exactly_and_reach_the_minimum(sizes, wanted):
    ranges = [OffsetRange("t", p, 1000 * p, 1000 * p + size) for p, size in enumerate(sizes)]
    pieces = split_for_min_partitions(ranges, wanted)
    assert len(pieces) >= min(wanted, sum(sizes))
    for r in ranges:
        mine = [p for p in pieces if p.partition == r.partition]
        assert mine[0].from_offset == r.from_offset and mine[-1].until_offset == r.until_offset
        assert all(a.until_offset == b.from_offset for a, b in itertools.pairwise(mine))
        assert all(p.size > 0 for p in mine)
    assert split_for_min_partitions(ranges, wanted) == pieces  # deterministic


# ---- maxOffsetsPerTrigger -----------------------------------------------------------------------


def test_rate_limit_splits_in_proportion_to_lag():
    end = rate_limit({A0: 0, A1: 0, A2: 0}, {A0: 600, A1: 300, A2: 100}, 100)
    assert end == {A0: 60, A1: 30, A2: 10}


def test_rate_limit_hands_the_remainder_to_the_largest_fractions():
    end = rate_limit({A0: 0, A1: 0, A2: 0}, {A0: 1, A1: 1, A2: 1}, 2)
    assert end == {A0: 1, A1: 1, A2: 0}


def test_rate_limit_without_limit_or_when_all_fits():
    assert rate_limit({A0: 0}, {A0: 5}, None) == {A0: 5}
    assert rate_limit({A0: 0}, {A0: 5}, 10) == {A0: 5}


@given(lags=st.lists(st.integers(0, 5000), min_size=1, max_size=6), limit=st.integers(1, 10_000))
def test_rate_limit_reads_exactly_the_limit_and_never_past_the_end(lags, limit):
    tps = [TopicPartition("t", p) for p in range(len(lags))]
    start = {tp: 7 * p for p, tp in enumerate(tps)}
    upper = {tp: start[tp] + lag for tp, lag in zip(tps, lags)}
    end = rate_limit(start, upper, limit)
    assert sum(end[tp] - start[tp] for tp in tps) == min(limit, sum(lags))
    assert all(start[tp] <= end[tp] <= upper[tp] for tp in tps)


# ---- streaming ----------------------------------------------------------------------------------


def test_a_new_partition_enters_at_earliest_with_an_empty_range():
    step = plan_stream_end({A0: 10}, [A0, A1], earliest={A0: 0, A1: 3}, latest={A0: 20, A1: 9})
    assert step.end == {A0: 20, A1: 3} and not step.losses
    assert plan_stream_ranges({A0: 10}, step.end) == [OffsetRange("a", 0, 10, 20)]
    # The next batch reads it from the checkpointed offset.
    assert plan_stream_ranges(step.end, {A0: 20, A1: 9}) == [OffsetRange("a", 1, 3, 9)]


def test_available_now_target_caps_the_end_and_defers_later_partitions():
    step = plan_stream_end(
        {A0: 10}, [A0, A1], earliest={A0: 0, A1: 0}, latest={A0: 50, A1: 9}, target={A0: 30}
    )
    assert step.end == {A0: 30}


def test_a_vanished_partition_is_reported_as_loss():
    step = plan_stream_end({A0: 10, A1: 4}, [A0], earliest={A0: 0}, latest={A0: 10})
    assert step.end == {A0: 10}
    assert "a-1 no longer exists" in step.losses[0]


def test_a_truncated_partition_restarts_at_earliest_and_is_reported():
    step = plan_stream_end({A0: 90}, [A0], earliest={A0: 0}, latest={A0: 40})
    assert step.end == {A0: 0} and "before the checkpointed offset 90" in step.losses[0]
    assert plan_stream_ranges({A0: 90}, step.end) == []


def test_stream_rate_limit_applies_across_partitions():
    step = plan_stream_end(
        {A0: 0, A1: 0}, [A0, A1], earliest={A0: 0, A1: 0}, latest={A0: 300, A1: 100}, max_rows=40
    )
    assert step.end == {A0: 30, A1: 10}


def test_json_round_trip_is_kafka_shaped():
    offsets = {A1: 7, A0: 3, TopicPartition("b", 0): 1}
    assert offsets_to_json(offsets) == {"a": {"0": 3, "1": 7}, "b": {"0": 1}}
    assert offsets_from_json(offsets_to_json(offsets)) == offsets
