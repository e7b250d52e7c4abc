"""A crash at every step of a cleaning round leaves a correct log at the next open.

Each test stops the round with an exception at one fault point (``swap.STEPS``), abandons the
partition log without closing it (no flush, no clean-shutdown marker: what kill -9 leaves, the
page cache aside), and reopens the directory: the loader must finish or discard the half-done
swap, and the log must read back either as before the round or as after it -- every key's latest
value at its offset, no record lost or duplicated, every batch valid.
"""

from __future__ import annotations

import pytest

from storage_node.log import files
from storage_node.log.cleaner import swap

from .compaction_kit import clean, compacted_log, keyed_batch, latest_per_key, records_of


class SimulatedCrash(Exception):
    pass


def _crash_at(step: str, nth: int = 1):
    seen = {"count": 0}

    def on_step(name: str) -> None:
        if name == step:
            seen["count"] += 1
            if seen["count"] == nth:
                raise SimulatedCrash(step)

    return on_step


def _fill(partition_log, clock):
    produced = []
    for i in range(40):
        # Keys 0-3 are overwritten all the time; key "last-<i>" records are written once, so the
        # segments they sit in keep records whatever happens.
        records = [(b"k%d" % (i % 4), b"v%d" % i), (b"k%d" % ((i + 1) % 4), b"w%d" % i)]
        if i % 10 == 0:
            records.append((b"once-%d" % i, b"x"))
        info = partition_log.append(keyed_batch(records, timestamp=clock.time_ms()))
        produced += [(info.first_offset + j, k, v) for j, (k, v) in enumerate(records)]
    partition_log.roll()
    return produced


def _leftovers(directory):
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.name.endswith((files.CLEANED_FILE_SUFFIX, files.SWAP_FILE_SUFFIX))
    )


#: A crash here leaves the log as it was: the first group's swap was not committed yet.
_BEFORE_THE_COMMIT_POINT = {(swap.STEP_CLEANED_WRITTEN, 1), (swap.STEP_SWAP_LOG_RENAMED, 1)}


@pytest.mark.parametrize(
    ("step", "nth"),
    [(step, 1) for step in swap.STEPS] + [(swap.STEP_OLD_SEGMENT_DELETED, 2), (swap.STEP_CLEANED_WRITTEN, 2)],
)
def test_a_crash_at_any_step_of_a_clean_leaves_a_correct_log(tmp_path, clock, step, nth):
    directory = tmp_path / "t-0"
    partition_log = compacted_log(directory, clock, segment_bytes=500)
    produced = _fill(partition_log, clock)
    before = records_of(partition_log)
    end = partition_log.log_end_offset
    assert len(partition_log.segments) > 4

    with pytest.raises(SimulatedCrash):
        clean(partition_log, on_step=_crash_at(step, nth))
    # Abandoned, as a killed process leaves it (the handles die with the object).
    del partition_log

    reopened = compacted_log(directory, clock, segment_bytes=500)
    assert _leftovers(directory) == []
    after = records_of(reopened)
    offsets = [offset for offset, _, _ in after]
    assert offsets == sorted(set(offsets)), "offsets must only increase, never repeat"
    assert reopened.log_end_offset == end
    latest = latest_per_key(produced)
    assert {key: (offset, value) for offset, key, value in after if offset == latest[key][0]} == latest
    produced_at = {offset: (key, value) for offset, key, value in produced}
    assert all(produced_at[offset] == (key, value) for offset, key, value in after)
    assert set(offsets) <= {offset for offset, _, _ in before}
    if (step, nth) in _BEFORE_THE_COMMIT_POINT:
        assert after == before, "an unfinished swap is discarded whole"
    else:
        assert len(after) < len(before), "a committed swap is completed"

    # And the next round finishes the job from whatever state the crash left.
    while clean(reopened) is not None:
        pass
    assert {key: (offset, value) for offset, key, value in records_of(reopened)} == latest
