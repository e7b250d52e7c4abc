"""``LogCleaner``: which partition it cleans, its threads, its throttle, failing partitions."""

from __future__ import annotations

import time

import pytest

from storage_node.log.cleaner.manager import CleanerSettings, LogCleaner
from storage_node.log.cleaner.throttle import Throttler

from .compaction_kit import compacted_log, keyed_batch, records_of


def _dirty_log(directory, clock, keys: int, rounds: int, **overrides):
    partition_log = compacted_log(directory, clock, topic=directory.name.rsplit("-", 1)[0], **overrides)
    for i in range(rounds):
        partition_log.append(keyed_batch([(b"k%d" % (i % keys), b"v%d" % i)], timestamp=clock.time_ms()))
    partition_log.roll()
    return partition_log


def test_the_dirtiest_due_compacted_partition_is_cleaned_first(tmp_path, clock):
    lightly = _dirty_log(tmp_path / "a-0", clock, keys=2, rounds=60, min_cleanable_dirty_ratio=0.01)
    heavily = _dirty_log(tmp_path / "b-0", clock, keys=2, rounds=60, min_cleanable_dirty_ratio=0.01)
    not_compacted = _dirty_log(tmp_path / "c-0", clock, keys=1, rounds=60, cleanup_policy="delete")
    cleaner = LogCleaner(lambda: [lightly, heavily, not_compacted], CleanerSettings(), time_ms=clock.time_ms)
    assert cleaner.clean_once() and cleaner.clean_once()  # both, once
    for i in range(60):
        heavily.append(keyed_batch([(b"k%d" % (i % 2), b"w%d" % i)], timestamp=clock.time_ms()))
    lightly.append(keyed_batch([(b"k0", b"w")], timestamp=clock.time_ms()))
    heavily.roll()
    lightly.roll()
    assert cleaner.clean_once()
    assert len(records_of(heavily)) == 2, "the dirtier partition first"
    assert len(records_of(lightly)) == 3
    assert cleaner.clean_once()
    assert len(records_of(lightly)) == 2
    assert not cleaner.clean_once(), "nothing is dirty any more; the delete topic is never cleaned"
    assert len(records_of(not_compacted)) == 60


def test_min_cleanable_dirty_ratio_holds_a_partition_back(tmp_path, clock):
    partition_log = _dirty_log(tmp_path / "a-0", clock, keys=2, rounds=60, min_cleanable_dirty_ratio=0.9)
    cleaner = LogCleaner(lambda: [partition_log], CleanerSettings(), time_ms=clock.time_ms)
    assert cleaner.clean_once()
    # A little new dirty data: its share of the cleanable bytes stays below 0.9.
    partition_log.append(keyed_batch([(b"k0", b"again")], timestamp=clock.time_ms()))
    partition_log.roll()
    assert not cleaner.clean_once()
    assert 0 < cleaner.dirty_ratios()[("a", 0)] < 0.9
    progress = cleaner.progress("a", 0)
    assert progress is not None and progress.rounds == 1 and progress.bytes_read > progress.bytes_written


def test_max_compaction_lag_forces_a_clean_below_the_ratio(tmp_path, clock):
    partition_log = _dirty_log(
        tmp_path / "a-0", clock, keys=2, rounds=60, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=1000
    )
    cleaner = LogCleaner(lambda: [partition_log], CleanerSettings(), time_ms=clock.time_ms)
    assert cleaner.clean_once()
    partition_log.append(keyed_batch([(b"k0", b"again")], timestamp=clock.time_ms()))
    partition_log.roll()
    assert not cleaner.clean_once()
    clock.advance(1001)
    assert cleaner.clean_once()
    assert [v for _, _, v in records_of(partition_log)] == [b"v59", b"again"]


def test_the_threads_clean_in_the_background_and_stop(tmp_path, clock):
    partition_log = _dirty_log(tmp_path / "a-0", clock, keys=3, rounds=90)
    cleaner = LogCleaner(
        lambda: [partition_log], CleanerSettings(threads=2, backoff_ms=10), time_ms=clock.time_ms
    )
    cleaner.start()
    try:
        deadline = time.monotonic() + 10
        while len(records_of(partition_log)) > 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(records_of(partition_log)) == 3
    finally:
        cleaner.stop()
    assert all(not t.is_alive() for t in cleaner._threads)


def test_a_partition_whose_round_fails_is_skipped_and_the_others_cleaned(tmp_path, clock):
    broken = _dirty_log(tmp_path / "a-0", clock, keys=1, rounds=60)
    healthy = _dirty_log(tmp_path / "b-0", clock, keys=1, rounds=30)
    first = broken.segments[0]
    data = bytearray(first.log.path.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: it no longer decodes
    first.log.path.write_bytes(bytes(data))
    cleaner = LogCleaner(lambda: [broken, healthy], CleanerSettings(), time_ms=clock.time_ms)
    assert not cleaner.clean_once()  # the broken one (dirtiest, ratio 1.0, listed first) fails
    assert cleaner.clean_once()  # then the healthy one
    assert len(records_of(healthy)) == 1
    assert not cleaner.clean_once()  # the broken one is left alone for a while


@pytest.mark.parametrize(
    "bad", [{"threads": 0}, {"dedupe_buffer_size": 100}, {"io_max_bytes_per_second": -1}]
)
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=r"log\.cleaner"):
        CleanerSettings(**bad)


def test_the_throttle_sleeps_to_keep_the_rate():
    now = [0.0]
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    throttler = Throttler(1000, monotonic=lambda: now[0], sleep=sleep)
    throttler.maybe_throttle(500)
    assert slept == [0.5]
    throttler.maybe_throttle(500)
    assert sum(slept) == pytest.approx(1.0)
    assert not Throttler(0, monotonic=lambda: now[0], sleep=sleep).maybe_throttle(10**9)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--log-cleaner-threads", "0"),
        ("--log-cleaner-io-max-bytes-per-second", "-5"),
        ("--log-cleaner-backoff-ms", "0"),
    ],
)
def test_a_storage_node_with_bad_cleaner_settings_refuses_to_start(tmp_path, capsys, flag, value):
    from storage_node.main import main

    assert (
        main(["--node-id", "0", "--standalone", "true", "--log-dirs", str(tmp_path / "d"), flag, value]) == 2
    )
    assert "log.cleaner" in capsys.readouterr().err
