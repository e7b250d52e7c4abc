"""RepeatedLog: a repeating message is logged once, then with a count (issue item 8: etcd-outage floods)."""

from __future__ import annotations

import logging

from services.log_limit import RepeatedLog


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_repeats_within_the_interval_are_counted_not_logged(caplog):
    clock = _Clock()
    limited = RepeatedLog(logging.getLogger("test.repeats"), 20.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.repeats"):
        for attempt in range(100):  # a retry every 0.5 s for 50 s
            limited.warning("etcd not reachable (%s); retrying", f"attempt {attempt}")
            clock.now += 0.5
    assert _lines(caplog) == [
        "etcd not reachable (attempt 0); retrying",
        "etcd not reachable (attempt 40); retrying (39 more in the last 20s)",
        "etcd not reachable (attempt 80); retrying (39 more in the last 20s)",
    ]
    assert all(record.levelno == logging.WARNING for record in caplog.records)


def test_ended_reports_the_pending_count_and_rearms(caplog):
    clock = _Clock()
    limited = RepeatedLog(logging.getLogger("test.ended"), 30.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.ended"):
        for _ in range(5):
            limited.warning("down: %s", "EOF")
            clock.now += 1
        limited.ended()
        limited.ended()  # nothing left to report
        assert limited.warning("down: %s", "again")  # a new outage is logged at once
    assert _lines(caplog) == ["down: EOF", "down: EOF (4 more in the last 5s)", "down: again"]


def test_messages_are_told_apart_by_format_or_key(caplog):
    clock = _Clock()
    limited = RepeatedLog(logging.getLogger("test.keys"), 30.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.keys"):
        limited.info("a %s", 1)
        limited.info("b %s", 1)
        limited.info("a %s", 2)
        limited.info("lease %x lost", 1, key="lease-1")
        limited.info("lease %x lost", 2, key="lease-2")
        limited.ended("a %s")
    assert _lines(caplog) == ["a 1", "b 1", "lease 1 lost", "lease 2 lost", "a 2 (1 more in the last 0s)"]
